"""RoPE against a learnable position table when a model trained at one resolution is evaluated at others.

    python -m scripts.rope_resolution [--data DIR] [--size demo-w32] [--steps 800] [--lr 2e-3] [--out DIR]

Trains the size twice on the embedded synthetic data (32 px), softmax in both towers: once with the learnable
image position table (`model.image_pos_embed: learnable`, open_clip's), once with 2-D axial RoPE
(`model.image_pos_embed: rope`); the same seed, data, schedule (cosine) and learning rate. Then evaluates
both zero-shot (python -m eval.zeroshot --image-size N) at the training resolution and at 1.5x and 2x: the
learnable table is resampled on load (bicubic, open_clip's resize_pos_embed), RoPE needs no table. The images
are upsampled by the eval transform, so the content is the same at every size; what changes is the patch
grid the model sees. No fine-tuning at the new size. Writes OUT/rope_resolution.md and .json (train/rope_resolution.py)
and the runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from data import make_synthetic
from train.rope_resolution import KINDS, write
from train.study import REPO, Job, overrides, spec_of
from train.study_local import run_jobs


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="a data.synthetic folder (train/, eval/); default: made in OUT/data (32 px)")
    p.add_argument("--size", default="demo-w32")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-sizes", default="32,48,64")
    p.add_argument("--finetune-steps", type=int, default=100, help="then fine-tune each at the largest size (0: not)")
    p.add_argument("--out", default=f"runs/rope-resolution-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    return p.parse_args(argv)


def main(argv=None) -> Path:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    start = time.perf_counter()
    data = Path(args.data) if args.data else out / "data"
    if not args.data:
        make_synthetic(data, train_samples=32000, val_samples=64, eval_per_class=30, image_size=32, seed=0)
    sizes = [int(s) for s in args.eval_sizes.split(",")]
    jobs = []
    for kind in KINDS:
        settings = {
            "model.name": args.size,
            "model.image_pos_embed": kind,
            "optim.lr": args.lr,
            "train.max_steps": args.steps,
            "data.train_shards": spec_of(data / "train"),
            "eval.dataset": str(data / "eval"),
            "eval.val_shards": None,
            "eval.every": 0,
            "train.run_dir": str(out / kind),
            "train.resume": "none",
            "train.progress": False,
        }
        jobs.append(Job(args.size, kind, out / kind, train_argv(settings)))
        if args.finetune_steps:  # from the run above, at the largest size: its table resampled on load
            tuned = settings | {"model.pretrained": str(out / kind), "model.image_size": max(sizes)}
            tuned |= {"train.max_steps": args.finetune_steps, "optim.warmup_steps": 10}
            tuned |= {"train.run_dir": str(out / f"{kind}-tuned")}
            jobs.append(Job(args.size, f"{kind} tuned", out / f"{kind}-tuned", train_argv(tuned), after=jobs[-1]))
    run_jobs(jobs, parallel=2, threads=1, report=lambda m: print(m, file=sys.stderr))
    results = {}
    for kind in KINDS:
        for size in sizes:
            results[kind, size] = zeroshot_top1(out / kind, data, size, out / f"{kind}-{size}px.json")
        if args.finetune_steps:
            results[f"{kind}-tuned", max(sizes)] = zeroshot_top1(
                out / f"{kind}-tuned", data, max(sizes), out / f"{kind}-tuned-{max(sizes)}px.json"
            )
    write(out, args, results, time.perf_counter() - start)
    return out / "rope_resolution.md"


def train_argv(settings: dict) -> list[str]:
    return [sys.executable, "-m", "train", "configs/demo.yaml", *overrides(settings)]


def zeroshot_top1(run: Path, data: Path, size: int, path: Path) -> float:
    command = [sys.executable, "-m", "eval.zeroshot", str(run), "--dataset", str(data / "eval")]
    command += ["--image-size", str(size), "--out", str(path)]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    return json.loads(path.read_text())["top1"]


if __name__ == "__main__":
    main()
