"""Where the main job's tiny training step spends its time: the model's step by op group (torch.profiler), the data
worker's work per batch by stage, one evaluation, and the fixed cost of a training process.

    .venv/bin/python -m scripts.profile_step [--size demo-w64] [--attentions softmax linear_affine_nodenom]

In this process on one torch thread, as the study runs each run (`threads_per_job: 1`); the data stages are timed
on the same shards the study trains from, with data.workers=0 (in a run they happen in its one data worker, in
parallel with the model's step, on the other core). Writes <out>/profile_step.md and .csv (train/bench/profiling.py).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from data import make_synthetic
from train.bench import profiling


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="demo-w64")
    parser.add_argument("--attentions", nargs="+", default=["softmax", "linear_affine_nodenom"])
    parser.add_argument("--out", default=str(profiling.REPO / "docs"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = make_synthetic(tmp / "data", train_samples=2000, val_samples=512, eval_per_class=30, image_size=32)
        for attention in args.attentions:
            per_step, groups = profiling.model_step(profiling.config(args.size, attention, shards, tmp / "run"))
            rows.append({"part": f"model step, {attention}", "what": "total", "ms": per_step})
            rows += [{"part": f"model step, {attention}", "what": g, "ms": ms} for g, ms in groups.items()]
        stages = profiling.data_stages(
            profiling.config(args.size, args.attentions[0], shards, tmp / "run"), tmp / "data"
        )
        rows += [{"part": "data worker, per batch", "what": s, "ms": ms} for s, ms in stages.items()]
        costs = profiling.process_costs(shards, tmp / "runs", tmp / "data")
        rows += [{"part": "per training process", "what": w, "ms": s * 1e3} for w, s in costs.items()]
    path = profiling.write(rows, Path(args.out), args.size, (time.perf_counter() - started) / 60)
    print(f"wrote {path}")
    return Path(args.out)


if __name__ == "__main__":
    main()
