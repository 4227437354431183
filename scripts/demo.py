"""The main job: the whole softmax-vs-linear-attention scaling study on the embedded synthetic data.

    make demo                                            # = .venv/bin/python -m scripts.demo
    .venv/bin/python -m scripts.demo --quick             # the same pipeline in seconds (what the test runs)
    .venv/bin/python -m scripts.demo --seed 1 --out runs/demo-seed1
    .venv/bin/python -m scripts.demo --full                # twice each attention's budget (configs/study/full.yaml)

The study is configs/study/demo.yaml (grid of sizes x attentions, data, per-size settings, fits); each run is
`python -m train configs/demo.yaml ...`. Makes the synthetic shards (train, validation, zero-shot eval set),
trains every (size, attention) pair with the same attention in both towers, evaluating zero-shot and the
validation loss every eval.every steps, fits power laws per attention with eval.scaling (the compute frontier
of zero-shot error and of the validation loss over every evaluation of every run, and the end-of-training
error against parameters), times the attention layers, and writes RUN/report.md with its figures beside it.
Everything in the report comes from this run. Scale it up by changing the configs only: README.md, "The real
thing".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from data import make_synthetic
from eval.scaling import ScalingInputError, ScalingWarning, fit, format_table, load_points, plot
from models import layout
from scripts import bench_attention, demo_plots, demo_report, linearise
from scripts.demo_study import REPO, Study, StudyError, jobs_of, load_study, run_jobs, spec_of
from scripts.demo_sweep import choose, reuse_chosen, sweep_jobs

STUDY = REPO / "configs" / "study" / "demo.yaml"
FULL = REPO / "configs" / "study" / "full.yaml"  # twice the budgets, the main job's learning rates (--full)
ATTENTION, SIZE = demo_plots.ATTENTION, demo_plots.SIZE
COMPUTE_LABEL = "compute (GMACs x samples seen)"
VAL_LABEL = "validation loss (contrastive, batch 64)"
# name -> (x, y, points, x label, y label, what it is)
FITS = {
    "error_frontier": (
        "compute",
        "error",
        "all",
        COMPUTE_LABEL,
        "zero-shot top-1 error",
        "compute frontier of zero-shot error (every evaluation of every run)",
    ),
    "val_loss_frontier": (
        "compute",
        "val_loss",
        "all",
        COMPUTE_LABEL,
        "validation loss (contrastive)",
        "compute frontier of the validation loss (every evaluation of every run)",
    ),
    "error_params": (
        "params_without_token_embedding",
        "error",
        "last",
        "parameters without the token embedding",
        "zero-shot top-1 error",
        "zero-shot error against parameters at the end of training",
    ),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="run folder (default runs/demo-<UTC time>)")
    p.add_argument("--quick", action="store_true", help="a few steps per run: checks the pipeline, not the science")
    p.add_argument("--study", default=str(STUDY), help="the study config (default configs/study/demo.yaml)")
    p.add_argument("--full", action="store_true", help="the longer study: --study configs/study/full.yaml")
    p.add_argument("--seed", type=int, default=0, help="seed of the data set and of every run")
    p.add_argument("--sizes", nargs="+", help="model sizes to train (default: the study's)")
    p.add_argument("--attentions", nargs="+", help="registry names, used in both towers (default: the study's)")
    p.add_argument(
        "--reanalyse",
        action="store_true",
        help="fit and report the finished study in --out again (after a change to the analysis), training nothing; "
        "give the options it was run with",
    )
    args = p.parse_args(argv)
    if args.reanalyse and not (args.out and (Path(args.out) / "runs.json").is_file()):
        p.error("--reanalyse needs --out, a finished study folder (with its runs.json)")
    if args.full:
        args.study = str(FULL)
    return args


def stage(text: str) -> None:
    print(f"\n== {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def make_data(out: Path, study: Study, seed: int) -> dict[str, str]:
    """The embedded data set for this study: {"train", "val" (shard specs), "eval" (ImageFolder)}."""
    make_synthetic(out / "data", seed=seed, **study.data)
    return {
        "train": spec_of(out / "data" / "train"),
        "val": spec_of(out / "data" / "val"),
        "eval": str(out / "data" / "eval"),
    }


def points(jobs, y: str, which: str) -> pd.DataFrame:
    return load_points([job.run_dir for job in jobs], y=y, points=which)


def error_floor(classes: int, study: Study) -> float:
    """The zero-shot error a log-log fit or slope reads for an evaluation without a single mistake: half an image
    of the evaluation set (a continuity correction; 0 has no logarithm, and with n images an error below 1/n
    cannot be told from 0)."""
    return 0.5 / (classes * study.data.get("eval_per_class", 1))


def run_rows(jobs, floor: float = 0.0) -> list[dict]:
    """One row per (size, attention) for the report: size, cost, the final evaluation and the learning curve.

    With budgets (cooldown branches, configs/study/*.yaml `budgets:`), `budgets` lists [samples, top1, val_loss] at
    the end of each budget, and `curve` is those cooled-down ends: the error a model trained for that many samples
    reaches, which the multipliers and the flattening check read (the run's own evaluations at constant learning
    rate stay in `run_curve`)."""
    curves = points(jobs, "error", "all").set_index("@source")
    val = points(jobs, "val_loss", "all").set_index("@source")
    rows = []
    for job in [j for j in jobs if j.after is None]:
        curve = curves.loc[[str(job.run_dir)]].sort_values("samples_seen")
        losses = val.loc[[str(job.run_dir)]].sort_values("samples_seen")
        final = curve.iloc[-1]
        tail = curve.iloc[len(curve) // 2 :]
        rows.append(
            {
                "size": job.size,
                "attention": job.attention,
                "run_dir": str(job.run_dir),
                "wall_seconds": job.wall_seconds,
                "cpu_seconds": job.cpu_seconds,
                "samples_per_s": throughput(job.run_dir),
                "params_without_token_embedding": int(final["params_without_token_embedding"]),
                "gmacs_per_sample": float(final["gmacs_per_sample"]),
                "samples_seen": int(final["samples_seen"]),
                "top1": float(final["zeroshot/top1"]),
                "top5": float(final["zeroshot/top5"]),
                "val_loss": float(losses["val_loss"].iloc[-1]),
                "tail_slope": demo_plots.log_slope(tail["samples_seen"], np.maximum(1 - tail["zeroshot/top1"], floor)),
                "curve": [[int(s), float(t)] for s, t in zip(curve["samples_seen"], curve["zeroshot/top1"])],
                "val_curve": [[int(s), float(v)] for s, v in zip(losses["samples_seen"], losses["val_loss"])],
            }
        )
        if job.budgets:
            ends = [
                (curves.loc[[str(b.run_dir)]].sort_values("samples_seen").iloc[-1], val.loc[[str(b.run_dir)]])
                for b in [*job.budgets, job]
            ]
            rows[-1]["budgets"] = [
                [
                    int(c["samples_seen"]),
                    float(c["zeroshot/top1"]),
                    float(v.sort_values("samples_seen")["val_loss"].iloc[-1]),
                ]
                for c, v in ends
            ]
            rows[-1]["run_curve"], rows[-1]["curve"] = rows[-1]["curve"], [[s, t] for s, t, _ in rows[-1]["budgets"]]
            tail = rows[-1]["curve"][len(rows[-1]["curve"]) // 2 :]
            rows[-1]["tail_slope"] = demo_plots.log_slope([s for s, _ in tail], [max(1 - t, floor) for _, t in tail])
    return rows


def throughput(run_dir: Path) -> float:
    """The run's median training samples per second over its logged steps (runs share the cores alike)."""
    lines = (run_dir / layout.METRICS).read_text().splitlines()
    rates = [r["samples_per_s"] for r in map(json.loads, lines) if "samples_per_s" in r]
    return float(np.median(rates)) if rates else float("nan")


def scaling_fits(jobs, out: Path, study: Study, floor: float = 0.0) -> dict[str, dict]:
    """Every fit of FITS, per attention with softmax as the reference; its JSON and PNG beside the report. Zero-shot
    errors of 0 are read as `floor` (error_floor)."""
    options = study.fits
    results = {}
    for name, (x, y, which, xlabel, ylabel, _) in FITS.items():
        # a frontier sees every evaluation of every run and branch; "last" means each full-budget run's end
        frame = points(jobs if which == "all" else [j for j in jobs if j.after is None], y, which)
        if y == "error":  # the fit reads error = 1 - top1
            frame["zeroshot/top1"] = frame["zeroshot/top1"].clip(upper=1 - floor)
        bins = options.get("frontier_bins") if which == "all" else None
        form = options.get("forms", {}).get(name, "power")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ScalingWarning)
                report = fit(
                    frame,
                    x,
                    y,
                    group=ATTENTION,
                    form=form,
                    frontier_bins=bins,
                    n_boot=options.get("n_boot", 1000),
                    reference=reference(frame),
                )
        except ScalingInputError as e:
            results[name] = {"error": str(e)}
            continue
        colours = {a: demo_plots.colour(study.attentions, a) for a in study.attentions}
        plot(report, frame, out / f"{name}.png", xlabel, ylabel, colours)
        (out / f"{name}.json").write_text(json.dumps(report, indent=2))
        results[name] = report
    return results


def reference(frame: pd.DataFrame) -> str | None:
    return "softmax" if "softmax" in set(frame[ATTENTION]) else None


def attention_table(out: Path, args: list[str], again: bool = True) -> str:
    """scripts.bench_attention with the study's arguments; its Markdown table, headings nested one level. Not
    `again`: the table the study's own run measured, where it has one (a re-analysis times nothing)."""
    if again or not (out / "bench_attention.md").is_file():
        bench_attention.main([*map(str, args), "--out", str(out / "bench_attention")])
    lines = (out / "bench_attention.md").read_text().splitlines()[1:]  # its title: the report's section says it
    return "\n".join("#" + line if line.startswith("#") else line for line in lines) + "\n"  # its sections nest


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def analyse(out: Path, study: Study, jobs, clock: dict, args: argparse.Namespace, sweep: list[dict] = ()) -> None:
    """Fits, figures, the attention benchmark and the report, from the finished runs."""
    stage("fitting scaling laws per attention")
    classes = len((out / "data" / "eval" / "classnames.txt").read_text().splitlines())
    floor = error_floor(classes, study)
    runs, fits = run_rows(jobs, floor), scaling_fits(jobs, out, study, floor)
    mains = [j for j in jobs if j.after is None]  # the full-budget runs, not their cooldown branches
    label = {str(j.run_dir): j.size for j in mains}  # the study's size names (SIZE@RESpx with resolutions)
    curves = points(mains, "error", "all").assign(error=lambda d: 1 - d["zeroshot/top1"])
    losses = points(mains, "val_loss", "all")
    curves[SIZE], losses[SIZE] = curves["@source"].map(label), losses["@source"].map(label)
    panels = [(curves, "error", "zero-shot top-1 error"), (losses, "val_loss", VAL_LABEL)]
    demo_plots.learning_curves(panels, study.attentions, list(study.sizes), out / "learning_curves.png")
    finals = points(mains, "error", "last").assign(top1=lambda d: d["zeroshot/top1"])
    fitted = {name: f for name, f in fits.items() if "groups" in f}
    demo_plots.summary_figure(fitted, finals, study.attentions, out / "summary.png")
    stage("timing the attention layers")
    bench = attention_table(out, study.bench, again=not clock.get("final"))
    if not clock.get("final"):  # a re-analysis keeps the clock of the study's own run
        clock.update(wall=time.perf_counter() - clock["wall"], cpu=cpu_seconds() - clock["cpu"], final=True)
    (out / "clock.json").write_text(json.dumps(clock))
    (out / "runs.json").write_text(json.dumps(runs, indent=2))
    (out / "fits.json").write_text(json.dumps({n: demo_report.fit_digest(f) for n, f in fits.items()}, indent=2))
    (out / "lr_sweep.json").write_text(json.dumps(list(sweep), indent=2))
    text = demo_report.report_md(runs, fits, FITS, bench, study, args, clock, format_table, classes, list(sweep))
    (out / "report.md").write_text(text)


def linearise_arm(out: Path, study: Study) -> None:
    """Issue 24's arm: the study's best softmax run linearised into each linear attention (scripts/linearise.py,
    with the study's `linearise:` settings and its runs' overrides), its section appended to the report."""
    if "softmax" not in study.attentions or len(study.attentions) < 2:
        print("   no linearisation arm: it needs softmax and a linear attention in the study", file=sys.stderr)
        return
    stage("linearising the best softmax run: attention transfer, then distillation, per linear attention")
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in study.linearise.items()]
    argv = [str(out), *flags, "--out", str(out / "linearise")]
    md = linearise.main(argv, run=study.run, report=lambda m: print("   " + m, file=sys.stderr))
    with open(out / "report.md", "a") as f:
        f.write(demo_report.linearise_section(md.read_text()))


def reanalyse(out: Path, study: Study, args: argparse.Namespace) -> Path:
    """The analysis of a finished study folder again: its runs rebuilt from the study config, their times and the
    study's clock from the files it wrote (clock.json; from the report's first lines for folders older than it)."""
    paths = {k: spec_of(out / "data" / k) for k in ("train", "val")} | {"eval": str(out / "data" / "eval")}
    jobs = jobs_of(study, out, paths, args.seed)
    times = {r["run_dir"]: r for r in json.loads((out / "runs.json").read_text())}
    for job in jobs:
        if str(job.run_dir) in times:
            job.wall_seconds, job.cpu_seconds = (
                times[str(job.run_dir)]["wall_seconds"],
                times[str(job.run_dir)]["cpu_seconds"],
            )
    if (out / "clock.json").is_file():
        clock = json.loads((out / "clock.json").read_text())
    else:
        found = re.search(
            r"took ([\d.]+) minutes wall and ([\d.]+) CPU-minutes .* was ([\d.]+) on average \(max ([\d.]+)\)",
            (out / "report.md").read_text(),
        )
        wall, cpu, mean, top = (float(x) for x in found.groups())
        clock = {"wall": 60 * wall, "cpu": 60 * cpu, "load": [top, 2 * mean - top], "final": True}
    sweep = json.loads((out / "lr_sweep.json").read_text()) if (out / "lr_sweep.json").is_file() else []
    analyse(out, study, jobs, clock, args, sweep)
    if (out / "linearise" / "linearise.md").is_file():
        with open(out / "report.md", "a") as f:
            f.write(demo_report.linearise_section((out / "linearise" / "linearise.md").read_text()))
    print(f"\nreport: {out / 'report.md'}", flush=True)
    return out


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    try:
        study = load_study(args.study, quick=args.quick)
    except StudyError as e:
        raise SystemExit(f"error: {e}") from None
    study.sizes = {s: study.sizes.get(s, {}) for s in args.sizes} if args.sizes else study.sizes
    study.attentions = args.attentions or study.attentions
    out = Path(args.out or f"runs/demo-{datetime.now(UTC):%Y%m%d-%H%M%S}").resolve()
    if args.reanalyse:
        return reanalyse(out, study, args)
    out.mkdir(parents=True, exist_ok=True)
    clock = {"wall": time.perf_counter(), "cpu": cpu_seconds(), "load": [os.getloadavg()[0]]}
    stage(f"making the synthetic data set in {out / 'data'}")
    paths = make_data(out, study, args.seed)
    sweep = []
    if study.lr_sweep:
        pairs = sweep_jobs(study, out, paths, args.seed)
        stage(f"learning-rate sweep: {len(pairs)} runs at {study.lr_sweep['size']}")
        clock["load"] += run_jobs(
            [job for _, job in pairs],
            study.jobs,
            study.threads_per_job,
            report=lambda m: print("   " + m, file=sys.stderr),
            launch=study.launch,
        )
        sweep = choose(study, pairs)
    jobs = jobs_of(study, out, paths, args.seed)
    to_run = reuse_chosen(sweep, pairs, jobs) if study.lr_sweep else jobs
    reused = f" ({len(jobs) - len(to_run)} trained by the sweep)" if len(to_run) < len(jobs) else ""
    stage(f"training {len(to_run)} runs{reused}, {study.jobs} at a time on {study.threads_per_job} thread(s) each")
    clock["load"] += run_jobs(
        to_run,
        study.jobs,
        study.threads_per_job,
        report=lambda m: print("   " + m, file=sys.stderr),
        launch=study.launch,
    )
    analyse(out, study, jobs, clock, args, sweep)
    if study.linearise:
        linearise_arm(out, study)
    print(f"\nreport: {out / 'report.md'}", flush=True)
    return out


if __name__ == "__main__":
    main()
