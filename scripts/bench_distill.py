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
<out>/bench_distill[_cuda].csv and .md (train/bench/distill_step.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from train.bench import distill_step, probes

REPO = Path(__file__).resolve().parents[1]


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
    args.argv = sys.argv[1:]
    probe = probes.probe(args.device)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    start, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            rows += distill_step.measure(size, args.attention, args.steps, args.batch, probe, Path(folder))
    path = distill_step.write(rows, args, args.device, (time.perf_counter() - start) / 60)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
