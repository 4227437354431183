"""What a linearisation step costs against a training step of the student alone: the measurements and the page of
scripts/bench_distill.py (what it times and how: its docstring).

    rows = distill_step.measure("ViT-S-16", "linear_affine_nodenom", steps=5, batch=None, probe=probe, folder=tmp)
    distill_step.write(rows, args, probe.device, minutes)     # <out>/bench_distill[_cuda].csv and .md
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import torch
from safetensors.torch import save_file

from eval import pages
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
    """<out>/bench_distill[_cuda].csv and .md; returns the .md. args: the script's (attention, steps, out, argv)."""
    out, stem = Path(args.out), "bench_distill" if device == "cpu" else "bench_distill_cuda"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    title = "A linearisation step against a training step of the student"
    header = pages.header(title, pages.command("scripts.bench_distill", args.argv), device) + (
        f"\nTorch {torch.__version__}. Student: "
        f"{args.attention} in both towers; teacher: softmax, same size. A step = zero_grad, forward, loss, backward, "
        f"gradient norm, AdamW (train.loop's functions); training = the student alone on the contrastive loss, "
        "transfer = stage 1 (teacher forward + per-layer output MSE, attention parameters only), distill = stage 2 "
        f"(teacher forward + contrastive, embedding and similarity terms, all parameters). Median of {args.steps} "
        f"rounds after one warm-up, the kinds taking turns. Total {minutes:.1f} min."
    )
    lines = [
        header,
        "",
        f"| size | batch | step | s/step | / training step | within the {AIM}x aim |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    for r in rows:
        verdict = "" if r["kind"] == "training" else ("yes" if r["vs_training"] <= AIM else "no")
        lines.append(
            f"| {r['size']} | {r['batch']} | {r['kind']} | {r['s_per_step']:.3f} | {r['vs_training']:.2f} | {verdict} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return out / f"{stem}.md"
