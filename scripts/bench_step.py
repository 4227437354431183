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
turns, in reversed order every other round, and the fastest round is kept. Writes <out>/bench_step.csv and .md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from data import make_synthetic
from eval import pages
from models import layout

REPO = Path(__file__).resolve().parents[1]
FIELDS = ["setting", "attention", "contender", "samples_per_s", "cpu_s_per_1k", "speedup"]


def baseline_tree(commit: str, folder: Path) -> Path:
    """The files of `commit` (git archive) in folder/baseline."""
    tree = folder / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def study_run(tree: Path) -> dict:
    """The overrides the tree's study gives every run (`run:` of configs/study/demo.yaml), e.g. data.workers."""
    study = yaml.safe_load((tree / "configs/study/demo.yaml").read_text())
    return dict(study.get("run") or {})


def command(attention: str, shards: str, run_dir: Path, steps: int, study: dict) -> list[str]:
    overrides = {
        **study,
        "model.name": "demo-w64",
        "model.image_attention": attention,
        "model.text_attention": attention,
        "data.train_shards": shards,
        "eval.dataset": "null",
        "eval.val_shards": "null",
        "train.max_steps": steps,
        "train.run_dir": run_dir,
        "train.resume": "none",
        "train.progress": "false",
    }
    return [sys.executable, "-m", "train", "configs/demo.yaml", *(f"{k}={v}" for k, v in overrides.items())]


def launch(tree: Path, argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    return subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen, run_dir: Path) -> tuple[float, float]:
    """(median samples/s after the first logging interval, CPU seconds of the run and its workers)."""
    _, status, usage = os.wait4(process.pid, 0)
    err = process.stderr.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"a benchmark run failed:\n{err[-2000:]}")
    records = [json.loads(line) for line in (run_dir / layout.METRICS).read_text().splitlines()]
    rates = [r["samples_per_s"] for r in records if "samples_per_s" in r][1:]
    return statistics.median(rates), usage.ru_utime + usage.ru_stime


def measure(trees: dict, attention: str, shards: str, steps: int, parallel: int, tmp: Path) -> dict[str, tuple]:
    """{contender: (samples/s of one run, CPU s per 1,000 samples)} with `parallel` identical runs at once."""
    out = {}
    for name, tree in trees.items():
        runs = []
        for i in range(parallel):
            run_dir = tmp / f"{name}-{attention}-{parallel}-{i}-{time.monotonic_ns()}"
            runs.append((launch(tree, command(attention, shards, run_dir, steps, study_run(tree))), run_dir))
        results = [finish(process, run_dir) for process, run_dir in runs]
        rate = statistics.mean(r for r, _ in results)
        cpu = statistics.mean(c for _, c in results) / (steps * 64) * 1000
        out[name] = (rate, cpu)
    return out


def race(trees: dict, attention: str, shards: str, steps: int, parallel: int, rounds: int, tmp: Path) -> dict:
    """The fastest round of each contender (rounds alternate the order)."""
    best: dict[str, tuple] = {}
    for r in range(rounds):
        order = dict(list(trees.items())[:: 1 if r % 2 == 0 else -1])
        for name, result in measure(order, attention, shards, steps, parallel, tmp).items():
            if name not in best or result[0] > best[name][0]:
                best[name] = result
    return best


def write(rows: list[dict], out: Path, header: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        header,
        "",
        "| setting | attention | contender | samples/s per run | CPU s per 1,000 samples | speed-up |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if r["contender"] == "ours" else ""
        lines.append(
            f"| {r['setting']} | {r['attention']} | {r['contender']} | {r['samples_per_s']:.0f} | "
            f"{r['cpu_s_per_1k']:.1f} | {speedup} |"
        )
    (out / "bench_step.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="8fc8415", help="the commit to compare with")
    parser.add_argument("--attentions", nargs="+", default=["softmax", "linear_affine_nodenom"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "docs"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = make_synthetic(tmp / "data", train_samples=4000, val_samples=64, eval_per_class=1, image_size=32)
        trees = {"baseline": baseline_tree(args.baseline, tmp), "ours": REPO}
        settings = {name: study_run(tree) for name, tree in trees.items()}
        for setting, parallel in (("one run alone", 1), ("two runs at once", 2)):
            for attention in args.attentions:
                best = race(trees, attention, shards, args.steps, parallel, args.rounds, tmp)
                for name, (rate, cpu) in best.items():
                    speedup = rate / best["baseline"][0]
                    rows.append(dict(zip(FIELDS, (setting, attention, name, rate, cpu, speedup))))
                print(
                    f"{setting}, {attention}: ours {best['ours'][0]:.0f} samples/s, "
                    f"baseline {best['baseline'][0]:.0f}: {rows[-1]['speedup']:.2f}x",
                    flush=True,
                )
    argv = ["--steps", str(args.steps), "--rounds", str(args.rounds), "--baseline", args.baseline]
    header = pages.header(
        "The main job's training step: ours against the baseline commit", pages.command("scripts.bench_step", argv)
    ) + (
        f"\nOurs = that commit, baseline = {args.baseline}; "
        f"demo-w64, batch 64, 32 px, 4,000 training samples ({args.steps * 64 / 4000:.1f} epochs), 1 torch thread per "
        f"run, each tree's study settings (`run:` of configs/study/demo.yaml: ours {settings['ours']}, baseline "
        f"{settings['baseline']}), no evaluation; fastest of {args.rounds} rounds; total "
        f"{(time.perf_counter() - start) / 60:.1f} min."
    )
    out = Path(args.out)
    write(rows, out, header)
    print(f"wrote {out / 'bench_step.md'}")
    return out / "bench_step.md"


if __name__ == "__main__":
    main()
