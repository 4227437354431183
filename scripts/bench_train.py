"""Seconds per training step (forward, loss, backward, AdamW step) of our CLIP against open_clip's, and per attention.

    python scripts/bench_train.py [--batch-size 8] [--steps 3] [--sizes ViT-S-16,ViT-B-16] [--image-sizes 224,448]
                                  [--attention-batch-size 2] [--threads 1] [--out docs]
    python -m scripts.bench_train --device cuda     # batch 64 / 16, 224, 448 and 896 px, bf16 attention part

Part 1: ViT-S-16 and ViT-B-16 with softmax attention, ours (models.build_clip + train.loss.ClipLoss) against
open_clip's own (open_clip.create_model + open_clip.loss.ClipLoss), on the same batch at 224 px, fp32 and bf16
autocast. Part 2: ViT-S-16 with each image attention (text tower softmax, so only the image attention
changes) at each resolution: on the CPU every registered one in fp32, batch 2 to keep the run under 10
minutes; on a GPU softmax and the three linear ones in bf16. One intra-op thread by default on the CPU: on a
shared CPU, idle threads' spin-waits make multi-threaded timings erratic. One warm-up step, then `--steps`
timed rounds in which the contenders take turns (order reversed every other round); the fastest step is
kept, since load from other jobs only adds time. Timer and memory probe per device (train/bench/probes.py):
on a GPU CUDA events and torch.cuda.max_memory_allocated (peak above what the model held before the step); a
contender that runs out of memory is reported as such. Writes <out>/bench_train[_cuda].csv, .md and .png
(train/bench/training.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from eval import pages
from models.attention import ATTENTIONS
from models.attention.ops import dispatch
from train.bench import probes, training

DOCS = Path(__file__).resolve().parents[1] / "docs"


GPU_DEFAULTS = dict(batch_size=64, attention_batch_size=16, image_sizes="224,448,896", steps=5)
GPU_ATTENTIONS = ["softmax", *dispatch.linear_ops()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch-size", type=int, help="part 1 (default 8 on the CPU, 64 on a GPU)")
    parser.add_argument("--steps", type=int, help="timed rounds (default 3 on the CPU, 5 on a GPU)")
    parser.add_argument("--sizes", default="ViT-S-16,ViT-B-16")
    parser.add_argument("--attention-size", default="ViT-S-16")
    parser.add_argument(
        "--attentions", help="part 2, comma-separated (default: every image attention; on a GPU softmax + the linear)"
    )
    parser.add_argument("--image-sizes", help="part 2 (default 224,448 on the CPU, 224,448,896 on a GPU)")
    parser.add_argument("--attention-batch-size", type=int, help="part 2 (default 2 on the CPU, 16 on a GPU)")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    parser.add_argument("--out", default=str(DOCS), help="folder for bench_train[_cuda].csv/.md/.png")
    args = parser.parse_args(argv)
    args.command = pages.command("scripts.bench_train", sys.argv[1:] if argv is None else argv)
    cpu = dict(batch_size=8, attention_batch_size=2, image_sizes="224,448", steps=3)
    for key, value in (GPU_DEFAULTS if args.device == "cuda" else cpu).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    names = args.attentions.split(",") if args.attentions else GPU_ATTENTIONS if args.device == "cuda" else None
    image_tower = [n for n, cls in ATTENTIONS.items() if cls.supports_bidirectional]  # deltanet is causal only
    args.attention_names = sorted(set(names or image_tower) | {"softmax"})  # softmax: the peer of every ratio
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    probe = probes.probe(args.device)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = training.ours_vs_open_clip(args.sizes.split(","), args.batch_size, args.steps, probe) if args.sizes else []
    with tempfile.TemporaryDirectory() as folder:
        image_sizes = [int(p) for p in args.image_sizes.split(",")]
        part = (args.attention_size, args.attention_names, image_sizes, args.attention_batch_size, args.steps)
        rows += training.attentions(*part, probe, Path(folder))
    training.write_outputs(rows, args, probe, time.perf_counter() - start)
    print(f"wrote {args.out}/bench_train*.md, .csv and .png in {(time.perf_counter() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
