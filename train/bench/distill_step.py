"""What a linearisation step costs against a training step of the student alone: the measurements and the page of
scripts/bench_distill.py (what it times and how: its docstring).

    rows = distill_step.measure("ViT-S-16", "linear_affine_nodenom", steps=5, batch=None, probe=probe, folder=tmp)
    distill_step.write(rows, args, probe.device, minutes)     # <out>/bench_distill[_cuda].csv, .json and .md
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import torch
from safetensors.torch import save_file

from eval import pages, study_page
from models import ModelConfig, build_clip
from models.clip import image_size, tokenizer
from train import distill
from train.config import load_config
from train.dist import make_accelerator
from train.loop import clip_gradients, compute_gradients, objective_gradients
from train.loss import build_loss
from train.main import build_model
from train.optim import build_optimizer

REPO = Path(__file__).resolve().parents[2]
KINDS = ("training", "transfer", "distill")
BATCH = {
    "cpu": {"demo-w64": 64, "ViT-S-16": 8, "ViT-B-16": 4},
    "cuda": {"demo-w64": 512, "ViT-S-16": 128, "ViT-B-16": 64},
}
AIM = 1.6  # issue 24: a linearisation step costs at most 1.6x a training step of the student alone
FIELDS = ["size", "batch", "kind", "s_per_step", "vs_training"]


def config(size: str, attention: str, kind: str, teacher: Path, folder: Path, device: str):
    overrides = [
        f"model.name={size}",
        f"model.image_attention={attention}",
        f"model.text_attention={attention}",
        f"data.train_shards={folder / 'unused.tar'}",
        "eval.dataset=null",
        "eval.val_shards=null",
        f"train.run_dir={folder / kind}",
        f"train.precision={'bf16' if device == 'cuda' else 'fp32'}",
    ]
    if kind != "training":
        overrides += [f"distill.teacher={teacher}", f"distill.stage={kind}"]
    return load_config([str(REPO / "configs/demo.yaml"), *overrides])


def stepper(cfg, accelerator, batch):
    """A function that takes one optimizer step of this config's run (train.loop.Trainer.step without its logging)."""
    model = build_model(cfg.model, cfg.train.loss, False)
    objective = distill.objective(cfg, model, accelerator) if cfg.distill.teacher else None
    optimizer, _ = build_optimizer(model, cfg.optim, cfg.train.max_steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss_fn = build_loss(cfg.train.loss, siglip_exchange=cfg.train.siglip_exchange)

    def step():
        optimizer.zero_grad(set_to_none=True)
        if objective is None:
            compute_gradients(accelerator, model, loss_fn, [batch])
        else:
            objective_gradients(accelerator, model, objective, [batch])
        clip_gradients(accelerator, model, None)
        optimizer.step()

    return step


def measure(size: str, attention: str, steps: int, batch: int | None, probe, folder: Path) -> list[dict]:
    """Rows of one size: seconds per step of each kind and its ratio to the training step."""
    device = probe.device
    teacher = folder / f"{size}-teacher.safetensors"
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in build_clip(ModelConfig(name=size)).state_dict().items()}, str(teacher))
    cfgs = {kind: config(size, attention, kind, teacher, folder, device) for kind in KINDS}
    accelerator = make_accelerator(cfgs["training"].train)
    n, model_cfg = batch or BATCH[device].get(size, 8), cfgs["training"].model
    pixels = image_size(model_cfg)
    tokens = tokenizer(model_cfg)(["a photo of a small red square on a blue background"] * n)
    batch = (torch.randn(n, 3, pixels, pixels, device=accelerator.device), tokens.to(accelerator.device))
    steppers = {kind: stepper(cfg, accelerator, batch) for kind, cfg in cfgs.items()}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for round_ in range(steps + 1):
        for kind, step in steppers.items():
            seconds = probe.time(step)
            if round_:  # the first round warms up
                times[kind].append(seconds)
    median = {kind: statistics.median(t) for kind, t in times.items()}
    rows = [dict(zip(FIELDS, (size, n, kind, s, s / median["training"]))) for kind, s in median.items()]
    for r in rows:
        print(f"{size} batch {n}: {r['kind']} {r['s_per_step']:.3f} s/step ({r['vs_training']:.2f}x)", flush=True)
    return rows


def write(rows: list[dict], args, device: str, minutes: float) -> Path:
    """<out>/bench_distill[_cuda].csv, .json (the header's stamp, the arguments the page reads, the rows) and .md (its
    findings kept); returns the .md. args: the script's (attention, steps, out, argv)."""
    out, stem = Path(args.out), "bench_distill" if device == "cpu" else "bench_distill_cuda"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    meta = {"argv": args.argv, "attention": args.attention, "steps": args.steps, "aim": AIM}
    meta |= {"torch": torch.__version__, "minutes": minutes}
    page = out / f"{stem}.md"
    return pages.write_page(page, rebuild, pages.stamp(device), meta, rows)


def rebuild(page: Path) -> str:
    """bench_distill[_cuda].md written from the JSON beside it, with its findings section."""
    return study_page.with_findings(page, markdown(pages.load_data(page)))


def markdown(saved: dict) -> str:
    meta, aim = saved["meta"], saved["meta"]["aim"]
    title = "A linearisation step against a training step of the student"
    what_ran = pages.command("scripts.bench_distill", meta["argv"])
    header = pages.header(title, what_ran, made=saved["made"]) + (
        f"\nTorch {meta['torch']}. Student: {meta['attention']} in both towers; teacher: softmax, same size. A step = "
        "zero_grad, forward, loss, backward, gradient norm, AdamW (train.loop's functions); training = the student "
        "alone on the contrastive loss, transfer = stage 1 (teacher forward + per-layer output MSE, attention "
        "parameters only), distill = stage 2 (teacher forward + contrastive, embedding and similarity terms, all "
        f"parameters). Median of {meta['steps']} rounds after one warm-up, the kinds taking turns. Total "
        f"{meta['minutes']:.1f} min."
    )
    lines = [
        header,
        "",
        f"| size | batch | step | s/step | / training step | within the {aim}x aim |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    for r in saved["rows"]:
        verdict = "" if r["kind"] == "training" else ("yes" if r["vs_training"] <= aim else "no")
        lines.append(
            f"| {r['size']} | {r['batch']} | {r['kind']} | {r['s_per_step']:.3f} | {r['vs_training']:.2f} | {verdict} |"
        )
    return "\n".join(lines) + "\n"
