"""What a linearisation step costs against a training step of the student alone (issue 24's aim: <= 1.6x, the
teacher's forward pass included), side by side in one run.

    .venv/bin/python -m scripts.bench_distill [--sizes demo-w64 ViT-S-16 ViT-B-16] [--steps 5] [--device cuda]

For each size, one student (Eq. 7, `linear_affine_nodenom`, in both towers; --attention for another) takes three
kinds of optimizer step through the trainer's own functions (train.loop: zero_grad, gradients, gradient norm,
AdamW), on the same batch of real tokens and random pixels:
  training: the contrastive loss of the student alone (a run without `distill:`);
  transfer: stage 1 (the teacher's forward pass recording every attention layer, the student's forward pass on the
            teacher's layer inputs, the summed per-layer MSE; only the attention parameters train);
  distill:  stage 2 (the teacher's forward pass, the student's, the contrastive + embedding + similarity terms; the
            whole student trains).
The teacher is a softmax CLIP of the student's size loaded through `distill.teacher` from a safetensors file, as
a run loads it (random weights: the cost does not depend on them). Batch 64 at demo-w64 (the study's), 8 at
ViT-S-16 and 4 at ViT-B-16 on the CPU (fp32, --threads); on a GPU batch 128 / 64 and bf16 autocast. One warm-up
step of each kind, then --steps rounds in which the kinds take turns; the median step of each is kept. Writes
<out>/bench_distill[_cuda].csv and .md.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from eval import pages
from models import ModelConfig, build_clip
from models.clip import image_size, tokenizer
from scripts import bench_device
from train import distill
from train.config import load_config
from train.dist import make_accelerator
from train.loop import clip_gradients, compute_gradients, objective_gradients
from train.loss import build_loss
from train.main import build_model
from train.optim import build_optimizer

REPO = Path(__file__).resolve().parents[1]
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
    loss_fn = build_loss(cfg.train.loss)

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


def write(rows: list[dict], out: Path, stem: str, header: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
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


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["demo-w64", "ViT-S-16", "ViT-B-16"])
    parser.add_argument("--batch", type=int, help="default: 64 / 8 / 4 (CPU) for the default sizes, else 8")
    parser.add_argument("--attention", default="linear_affine_nodenom", help="the student's attention")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=str(REPO / "docs"))
    args = parser.parse_args(argv)
    probe = bench_device.probe(args.device)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    start, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            rows += measure(size, args.attention, args.steps, args.batch, probe, Path(folder))
    title = "A linearisation step against a training step of the student"
    header = pages.header(title, pages.command("scripts.bench_distill", sys.argv[1:]), probe.device) + (
        f"\nTorch {torch.__version__}. Student: "
        f"{args.attention} in both towers; teacher: softmax, same size. A step = zero_grad, forward, loss, backward, "
        f"gradient norm, AdamW (train.loop's functions); training = the student alone on the contrastive loss, "
        "transfer = stage 1 (teacher forward + per-layer output MSE, attention parameters only), distill = stage 2 "
        f"(teacher forward + contrastive, embedding and similarity terms, all parameters). Median of {args.steps} "
        f"rounds after one warm-up, the kinds taking turns. Total {(time.perf_counter() - start) / 60:.1f} min."
    )
    path = write(rows, Path(args.out), "bench_distill" if args.device == "cpu" else "bench_distill_cuda", header)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
