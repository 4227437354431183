"""Where linear attention pays, on the whole model: training-step time and peak memory against sequence length.

    python -m scripts.bench_long [--size ViT-S-16] [--image-sizes 224,448,1024,2048] [--text-lengths 77,248,1024,4096]
                                 [--attentions softmax,<every linear op>]
                                 [--block-above 4200] [--steps 2] [--threads 2] [--device cpu] [--bf16] [--out docs]

A step is forward, loss, backward and AdamW (train.optim's groups) of the image tower alone (batch 1, its
embedding's squared mean as the loss), of the text tower alone (batch 2), and of the whole CLIP at one long
setting (`--clip`, default 1024 px with 248 tokens, batch 2, ClipLoss), each attention in place of softmax (torch
SDPA) in every layer, with and without activation checkpointing. Past `--block-above` tokens a whole tower would
take minutes per step on a CPU: one transformer block is timed instead and the step extrapolated as layers x
block (marked "block x L" in the table; the patch embedding, norms and head, under 1% there, are left out).

The FLOP-model bound of a ratio is the forward multiply-adds per token and layer, 12 C^2 (projections and MLP of
ratio 4) plus the token mixing: 2 N C for softmax (QK^T and AV), 2 C D for a linear attention (phi(K)^T V and
Q S, D the head width); backward scales both sides alike. One warm-up step (the memory run), then `--steps`
timed rounds with the contenders taking turns; the fastest step is kept (train.bench.probes.race). Writes
<out>/bench_long.csv, .md and .png (step time against tokens, log-log, with the fitted slope of each line;
train/bench/long.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from eval import machine
from models.attention.ops import dispatch
from train.bench import long, probes

DOCS = Path(__file__).resolve().parents[1] / "docs"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="ViT-S-16")
    p.add_argument("--image-sizes", default="224,448,1024,2048")
    p.add_argument("--text-lengths", default="77,248,1024,4096")
    p.add_argument("--clip", default="1024,248", help="PIXELS,TOKENS of the whole-CLIP step ('' to skip)")
    p.add_argument("--attentions", default="softmax," + ",".join(dispatch.linear_ops()))
    p.add_argument("--block-above", type=int, default=4200, help="tokens past which one block is timed x layers")
    p.add_argument("--steps", type=int, default=2, help="timed rounds")
    p.add_argument("--threads", type=int, default=2, help="CPU intra-op threads")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the GPU form: scripts/gpu_check.sh)")
    p.add_argument("--bf16", action="store_true", help="forward under bf16 autocast (as training on GPUs)")
    p.add_argument("--out", default=str(DOCS))
    args = p.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    args.attentions = args.attentions.split(",")
    if "softmax" not in args.attentions:
        p.error("--attentions must include softmax: every ratio is against it")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    probe, start, rows = probes.probe(args.device), time.perf_counter(), []
    args.skipped = machine.emulated(args.device).get("bfloat16", "") if args.bf16 else ""
    if args.skipped:  # bf16 autocast on a CPU that emulates bf16 would take hours: fp32 instead, said once
        print(f"{args.skipped}; --bf16 ignored, fp32 timed", flush=True)
        args.bf16 = False
    for tower, lengths in (("image", args.image_sizes), ("text", args.text_lengths)):
        for length in (int(x) for x in lengths.split(",") if x):
            rows += long.measure(args, tower, length, probe)
            print(f"{tower} {length}: done at {time.perf_counter() - start:.0f} s", flush=True)
    if args.clip:
        rows += long.clip_rows(args, probe)
    long.write(rows, args, probe, time.perf_counter() - start)
    return Path(args.out) / "bench_long.md"


if __name__ == "__main__":
    main()
