"""Long-CLIP's recipe on the embedded data: a model trained on short captions, its text positions stretched to a longer
context and fine-tuned on long captions, against the same fine-tuning without stretching and against training at the
long context from scratch; softmax and linear_affine_nodenom text towers.

    python -m scripts.long_clip [--size demo-w32] [--base-steps 800] [--tune-steps 400] [--context 168] [--keep 8]
                                [--attentions softmax linear_affine_nodenom] [--out DIR]

Per text attention (the image tower softmax in every run), four runs of the size:
- base: the short-caption data (python -m data.synthetic, one shape a caption, 6-16 tokens) at the size's context;
- fine-tuned, context kept: base (model.pretrained) fine-tuned on the long-caption data (data.synthetic --captions
  long, 84-162 tokens) at the size's context, the captions cut to it (and counted);
- fine-tuned, stretched: the same at --context tokens, the text position table stretched on load keeping its first
  --keep positions (model.text_pos_keep: Long-CLIP's knowledge-preserved stretching, models/pretrained.py);
- scratch: the long-caption data at --context tokens from a fresh model, for base + fine-tuning steps.
Each is evaluated on the long-caption retrieval set (groups of four images that differ only in the sixth shape,
described after at least 80 tokens: a 16-token text tower can only guess within a group) as text-to-image R@1, and
zero-shot on the short-caption classes (top-1). Learning rates: the shapes study's sweep's choices at demo-w32
(softmax 2e-3, linear_affine_nodenom 1e-3: demo-w32's rate x configs/study/full.yaml's lr_scale), a quarter of it for
fine-tuning. Writes OUT/long_clip.md and .json (train/long_clip.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from data import make_synthetic
from train.long_clip import RATES, evaluate, jobs_of, write
from train.study_local import run_jobs


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="demo-w32")
    p.add_argument("--base-steps", type=int, default=800)
    p.add_argument("--tune-steps", type=int, default=400)
    p.add_argument("--context", type=int, default=168, help="the long context (the long captions: 84-162 tokens)")
    p.add_argument("--keep", type=int, default=8, help="model.text_pos_keep when stretching")
    p.add_argument("--attentions", nargs="+", default=list(RATES))
    p.add_argument("--train-samples", type=int, default=32000)
    p.add_argument("--eval-per-class", type=int, default=20, help="zero-shot images a class; retrieval: 24x this")
    p.add_argument("--out", default=f"runs/long-clip-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    return p.parse_args(argv)


def make_data(out: Path, args) -> dict[str, Path]:
    short, long = out / "data-short", out / "data-long"
    common = {"val_samples": 64, "eval_per_class": args.eval_per_class, "image_size": 32, "seed": 0}
    make_synthetic(short, train_samples=args.train_samples, **common)
    make_synthetic(long, train_samples=args.train_samples, captions="long", **common)
    return {"short": short, "long": long}


def main(argv=None) -> Path:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    start = time.perf_counter()
    data = make_data(out, args)
    jobs = jobs_of(out, data, args)
    run_jobs(jobs, parallel=2, threads=1, report=lambda m: print(m, file=sys.stderr))
    results = {job.attention: evaluate(job.run_dir, data) for job in jobs}
    return write(out, args, results, time.perf_counter() - start)


if __name__ == "__main__":
    main()
