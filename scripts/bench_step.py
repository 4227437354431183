"""The main job's training step, today's code against a baseline commit: samples/s of `python -m train` on the
embedded data, as the study runs it.

    .venv/bin/python -m scripts.bench_step [--baseline 8fc8415] [--steps 200] [--rounds 2] [--out docs]

Each contender is a whole `python -m train configs/demo.yaml` process (model demo-w64, batch 64, the same
attention in both towers, one torch thread, no evaluation, and the data settings its tree's study gives every
run: `run:` of configs/study/demo.yaml, e.g. no worker process and the sample cache), run from this tree ("ours")
or from the baseline commit's tree (`git archive`, "baseline"), on the same 4,000 samples (200 steps: 3.2 epochs,
the mean of the study's budgets). Two settings: one run alone, and two identical runs at once on the 2 cores, as
the study runs them (`jobs: 2`). A run's speed is the median of the samples/s the trainer
logs (train.log_every steps apart; the first interval, with the warm-up, left out), and its CPU seconds per
1,000 samples come from the process and its data worker (wait4), start-up included. The contenders take
turns, in reversed order every other round, and the fastest round is kept. Writes <out>/bench_step.csv and .md
(train/bench/step.py).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from data import make_synthetic
from train.bench import step


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="8fc8415", help="the commit to compare with")
    parser.add_argument("--attentions", nargs="+", default=["softmax", "linear_affine_nodenom"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(step.REPO / "docs"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = make_synthetic(tmp / "data", train_samples=4000, val_samples=64, eval_per_class=1, image_size=32)
        trees = {"baseline": step.baseline_tree(args.baseline, tmp), "ours": step.REPO}
        settings = {name: step.study_run(tree) for name, tree in trees.items()}
        for setting, parallel in (("one run alone", 1), ("two runs at once", 2)):
            for attention in args.attentions:
                best = step.race(trees, attention, shards, args.steps, parallel, args.rounds, tmp)
                for name, (rate, cpu) in best.items():
                    speedup = rate / best["baseline"][0]
                    rows.append(dict(zip(step.FIELDS, (setting, attention, name, rate, cpu, speedup))))
                print(
                    f"{setting}, {attention}: ours {best['ours'][0]:.0f} samples/s, "
                    f"baseline {best['baseline'][0]:.0f}: {rows[-1]['speedup']:.2f}x",
                    flush=True,
                )
    path = step.write(rows, args, settings, (time.perf_counter() - start) / 60)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
