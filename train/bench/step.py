"""The main job's training step, this tree against a baseline commit's, as whole `python -m train` processes: the
measurements and the page of scripts/bench_step.py (what it times and how: its docstring).

    trees = {"baseline": step.baseline_tree("8fc8415", tmp), "ours": step.REPO}
    best = step.race(trees, "softmax", shards, 200, parallel=2, rounds=2, tmp=tmp)   # {name: (samples/s, CPU s)}
    step.write(rows, args, settings, minutes)              # <out>/bench_step.csv, .json and .md
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from eval import pages, study_page
from models import run_folder

REPO = Path(__file__).resolve().parents[2]
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
    records = [json.loads(line) for line in (run_dir / run_folder.METRICS).read_text().splitlines()]
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


def write(rows: list[dict], args, settings: dict, minutes: float) -> Path:
    """<out>/bench_step.csv, .json (the header's stamp, the arguments and settings the page reads, the rows) and .md
    (its findings kept); returns the .md. args: the script's (baseline, steps, rounds, out); settings: each tree's
    study `run:`."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    meta = {"baseline": args.baseline, "steps": args.steps, "rounds": args.rounds, "settings": settings}
    page = out / "bench_step.md"
    return pages.write_page(page, rebuild, pages.stamp(), meta | {"minutes": minutes}, rows)


def rebuild(page: Path) -> str:
    """bench_step.md written from bench_step.json beside it, with its findings section."""
    return study_page.with_findings(page, markdown(pages.load_data(page)))


def markdown(saved: dict) -> str:
    meta, rows = saved["meta"], saved["rows"]
    argv = ["--steps", str(meta["steps"]), "--rounds", str(meta["rounds"]), "--baseline", meta["baseline"]]
    header = pages.header(
        "The main job's training step: ours against the baseline commit",
        pages.command("scripts.bench_step", argv),
        made=saved["made"],
    ) + (
        "\nOurs = that commit, baseline = the commit of `--baseline`; "
        f"demo-w64, batch 64, 32 px, 4,000 training samples ({meta['steps'] * 64 / 4000:.1f} epochs), 1 torch thread "
        f"per run, each tree's study settings (`run:` of configs/study/demo.yaml: ours {meta['settings']['ours']}, "
        f"baseline {meta['settings']['baseline']}), no evaluation; fastest of {meta['rounds']} rounds; total "
        f"{meta['minutes']:.1f} min."
    )
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
    return "\n".join(lines) + "\n"
