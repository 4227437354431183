"""GPU training check: the real loop (train.loop.Trainer, accelerate, DDP / FSDP) for 20 steps on synthetic batches.

    python -m scripts.gpu_train_check --out DIR                  # on a GPU machine (called by scripts/gpu_check.sh)
    python -m scripts.gpu_train_check --out DIR --device cpu --model tiny-s --sharded-model tiny-m \\
        --steps 6 --batch 8 --precision fp32                     # the CPU rehearsal (tests/scripts)

1. `--model` (ViT-B-16) in bf16 with train.distributed=ddp: one process on one GPU;
2. `--sharded-model` (ViT-L-16, activation checkpointing) in bf16 with train.distributed=fsdp, one process per GPU
   under torchrun, when there are at least two GPUs; otherwise skipped with a line that says so. With
   `--device cpu` it runs on 2 gloo processes through the same FSDP path (train/bench/fsdp_on_cpu.py).

Each run: random images and token ids made once per rank and repeated (no data pipeline, no tokenizer), AdamW
(fused on CUDA), gradient clipping 1.0, metrics every 5 steps, a checkpoint at the end. DIR gets
gpu_train_check.csv and gpu_train_check.md: samples/s (all GPUs, and per GPU), model TFLOP/s per GPU (6 x
GMACs x samples/s) and peak GPU memory, from the logging intervals after the first (compilation and cuDNN
autotuning happen in the first), the loss at the first and last logging step, seconds. The import path needs
neither open_clip nor webdataset: torch, accelerate, safetensors, numpy, tqdm and PyYAML are enough (the checks:
train/bench/gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from eval import pages
from train.bench import gpu_check

WORKER = ["-m", "scripts.gpu_train_check", "--worker"]  # how each launched process runs one rank of a check


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_train_check.csv/.md and the runs")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", default="ViT-B-16", help="size of check 1 (ddp, one process)")
    parser.add_argument("--sharded-model", default="ViT-L-16", help="size of check 2 (fsdp over every GPU)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128, help="per GPU, check 1")
    parser.add_argument("--sharded-batch", type=int, default=64, help="per GPU, check 2")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per check")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one check's spec, JSON: the launched processes
    args = parser.parse_args(argv)
    if args.worker is None and args.out is None:
        parser.error("--out DIR is required")
    if args.device == "cuda" and args.worker is None and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible; on the CPU rehearse with --device cpu --model tiny-s")
    if args.steps < 2 * gpu_check.LOG_EVERY:
        parser.error(
            f"--steps must be >= {2 * gpu_check.LOG_EVERY}: speed is read from the logging intervals after the first"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        gpu_check.worker(json.loads(args.worker))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    common = {"out": str(args.out.resolve()), "device": args.device, "precision": args.precision, "steps": args.steps}
    first = {**common, "check": "ddp-1", "model": args.model, "distributed": "ddp", "batch": args.batch}
    rows = [gpu_check.launch(first, 1, args.timeout, WORKER)]
    gpus = torch.cuda.device_count() if args.device == "cuda" else 2
    sharded = {**common, "model": args.sharded_model, "batch": args.sharded_batch}
    if gpus >= 2:
        rows.append(
            gpu_check.launch({**sharded, "check": f"fsdp-{gpus}", "distributed": "fsdp"}, gpus, args.timeout, WORKER)
        )
    else:
        print(f"fsdp check skipped: FSDP shards over at least 2 GPUs, this machine has {gpus}")
        rows.append({**sharded, "check": "fsdp", "distributed": "fsdp", "status": f"skipped: {gpus} GPU"})
    command = pages.command("scripts.gpu_train_check", sys.argv[1:] if argv is None else argv)
    report = gpu_check.write_report(rows, args.out, args.device, command)
    print(report.read_text())
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
