"""The main job: the whole softmax-vs-linear-attention study on the embedded synthetic data.

    make demo                                   # = .venv/bin/python -m scripts.demo
    .venv/bin/python -m scripts.demo --quick    # the same pipeline in seconds (what the test runs)

Makes the synthetic shards, trains a tiny CLIP for every (size, attention) pair with the same
attention in both towers, evaluates each zero-shot on the synthetic eval set, fits power laws per
attention (zero-shot error against non-embedding parameters at the end of training, and the
compute frontier of error against GMACs x samples seen over all evaluations), times the attention
layers, and writes RUN/report.md with the PNG plots beside it. Everything in the report comes from
this run. Scale it up by changing the config only: README.md, "The real thing".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from data import make_synthetic
from eval.scaling import ScalingInputError, fit, format_table, plot
from models import ModelConfig, build_clip, summary
from scripts import bench_attention
from train.main import main as train_main

SIZES = ["tiny-s", "tiny-m", "tiny-l"]
ATTENTIONS = ["softmax", "linear_affine", "linear_affine_nodenom"]


@dataclass
class Plan:
    """How big the study is: `full` fits ~15 minutes on 2 CPU cores, `quick` a few seconds a run."""

    train_samples: int
    eval_per_class: int
    steps: int
    eval_every: int
    batch_size: int
    bench_sizes: list[int]
    n_boot: int


FULL = Plan(
    train_samples=20000,
    eval_per_class=10,
    steps=400,
    eval_every=100,
    batch_size=64,
    bench_sizes=[77, 197, 1024, 4096],
    n_boot=1000,
)
QUICK = Plan(
    train_samples=256, eval_per_class=2, steps=4, eval_every=2, batch_size=16, bench_sizes=[77, 197], n_boot=50
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="run folder (default runs/demo-<UTC time>)")
    p.add_argument("--quick", action="store_true", help="a few steps per run: checks the pipeline, not the science")
    p.add_argument("--sizes", nargs="+", default=SIZES, help="model sizes (configs/models/*.json or open_clip names)")
    p.add_argument("--attentions", nargs="+", default=ATTENTIONS, help="registry names, used in both towers")
    return p.parse_args(argv)


def stage(text: str) -> None:
    print(f"\n== {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def train_run(out: Path, shards: str, size: str, attention: str, plan: Plan) -> dict:
    """Train and evaluate one tiny CLIP; returns its row of the report."""
    run_dir = out / "runs" / f"{size}-{attention}"
    start = time.perf_counter()
    code = train_main(
        [
            "configs/demo.yaml",
            f"model.name={size}",
            f"model.image_attention={attention}",
            f"model.text_attention={attention}",
            f"data.train_shards={shards}",
            f"data.batch_size={plan.batch_size}",
            f"eval.dataset={out / 'data' / 'eval'}",
            f"train.max_steps={plan.steps}",
            f"eval.every={plan.eval_every}",
            f"train.run_dir={run_dir}",
            "train.resume=none",
        ]
    )
    if code != 0:
        raise SystemExit(f"training {size} with {attention} stopped with exit code {code}; see {run_dir}")
    seconds = time.perf_counter() - start
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    sizes = summary(build_clip(ModelConfig(name=size, image_attention=attention, text_attention=attention)))
    evals = [m for m in metrics if "zeroshot/top1" in m]
    losses = [m for m in metrics if "loss" in m]
    return {
        "size": size,
        "attention": attention,
        "run_dir": str(run_dir),
        "train_seconds": seconds,
        "params": sizes["total"],
        "params_without_token_embedding": sizes["without_token_embedding"],
        "gmacs_per_sample": sizes["gmacs"],
        "final_loss": losses[-1]["loss"],
        "top1": evals[-1]["zeroshot/top1"],
        "top5": evals[-1]["zeroshot/top5"],
        "curve": [(m["samples_seen"], m["zeroshot/top1"]) for m in evals],
    }


def scaling_fits(runs: list[dict], out: Path, n_boot: int) -> list[tuple[str, dict | None, str]]:
    """Two fits per attention: error vs parameters at the end, and the compute frontier over all evals."""
    final = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in runs])
    final["error"] = 1 - final["top1"]
    curve = pd.DataFrame(
        [
            {"attention": r["attention"], "size": r["size"], "error": 1 - top1, "compute": r["gmacs_per_sample"] * seen}
            for r in runs
            for seen, top1 in r["curve"]
            if seen > 0
        ]
    )
    sizes_per_attention = max(2, len(runs) // len(set(final["attention"])))
    jobs = [
        ("params", final, "params_without_token_embedding", None),
        ("compute", curve, "compute", sizes_per_attention),
    ]
    results = []
    for name, frame, x, bins in jobs:
        try:
            report = fit(
                frame,
                x,
                "error",
                group="attention",
                frontier_bins=bins,
                n_boot=n_boot,
                reference="softmax" if "softmax" in set(frame["attention"]) else None,
            )
        except ScalingInputError as e:
            results.append((name, None, f"not fitted: {e}"))
            continue
        plot(report, frame, out / f"scaling_{name}.png")
        (out / f"scaling_{name}.json").write_text(json.dumps(report, indent=2))
        results.append((name, report, format_table(report)))
    return results


def attention_table(out: Path, sizes: list[int]) -> str:
    bench_attention.main(
        [
            "--sizes",
            *map(str, sizes),
            "--long-sizes",
            "--bf16-variants",
            "--budget",
            "0.3",
            "--max-seconds",
            "2",
            "--out",
            str(out / "bench_attention"),
        ]
    )
    lines = (out / "bench_attention.md").read_text().splitlines()[1:]  # its title: the report's section says it
    return "\n".join("#" + line if line.startswith("#") else line for line in lines) + "\n"  # its sections nest


def report_md(runs: list[dict], fits: list, bench: str, plan: Plan, seconds: float) -> str:
    rows = [
        "| size | attention | params (no embedding) | zero-shot top-1 | top-5 | final loss | training time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows += [
        f"| {r['size']} | {r['attention']} | {r['params_without_token_embedding'] / 1e6:.3f}M | "
        f"{100 * r['top1']:.1f}% | {100 * r['top5']:.1f}% | {r['final_loss']:.3f} | {r['train_seconds']:.0f} |"
        for r in runs
    ]
    parts = [
        f"# Softmax vs linear attention on the synthetic data\n\nMade by `python -m scripts.demo` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC in {seconds / 60:.1f} minutes: {plan.steps} steps of "
        f"batch {plan.batch_size} per run, the same attention in both towers, zero-shot on 24 colour+shape "
        f"classes (chance 4.2%).\n",
        "## Runs\n",
        "\n".join(rows) + "\n",
    ]
    for name, report, table in fits:
        title = {
            "params": "zero-shot error vs non-embedding parameters (end of training)",
            "compute": "compute frontier: zero-shot error vs GMACs x samples seen (every evaluation)",
        }[name]
        parts += [f"## Scaling fit: {title}\n", f"```\n{table}\n```\n"]
        if report is not None:
            parts.append(f"![{name}](scaling_{name}.png)\n")
    parts += ["## Attention layers (forward + backward, B=1, H=6, D=64, fp32, this machine)\n", bench]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    out = Path(args.out or f"runs/demo-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    stage(f"making the synthetic data set in {out / 'data'}")
    shards = make_synthetic(out / "data", train_samples=plan.train_samples, eval_per_class=plan.eval_per_class)
    runs = []
    for i, (size, attention) in enumerate([(s, a) for s in args.sizes for a in args.attentions], 1):
        stage(f"run {i}/{len(args.sizes) * len(args.attentions)}: {size} with {attention} attention")
        runs.append(train_run(out, shards, size, attention, plan))
        print(
            f"   top-1 {100 * runs[-1]['top1']:.1f}%  loss {runs[-1]['final_loss']:.3f}  "
            f"{runs[-1]['train_seconds']:.0f} s",
            file=sys.stderr,
        )
    stage("fitting scaling laws per attention")
    fits = scaling_fits(runs, out, plan.n_boot)
    stage("timing the attention layers")
    bench = attention_table(out, plan.bench_sizes)
    (out / "runs.json").write_text(json.dumps(runs, indent=2))
    (out / "report.md").write_text(report_md(runs, fits, bench, plan, time.perf_counter() - start))
    print(f"\nreport: {out / 'report.md'}", flush=True)
    return out


if __name__ == "__main__":
    main()
