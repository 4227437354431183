"""The main job: the whole softmax-vs-linear-attention scaling study on the embedded synthetic data.

    make demo                                            # = .venv/bin/python -m scripts.demo
    .venv/bin/python -m scripts.demo --quick             # the same pipeline in seconds (what the test runs)
    .venv/bin/python -m scripts.demo --seed 1 --out runs/demo-seed1
    .venv/bin/python -m scripts.demo --full                # 4 sizes spanning 13.5x (configs/study/sizes.yaml)

The study is configs/study/demo.yaml (train/study.py reads it): makes the synthetic shards, trains every (size,
attention) pair (train/study_local.py), fits power laws per attention and draws the figures (eval/study_analysis.py),
times the attention layers, and writes RUN/report.md (eval/study_report.py). Everything in the report comes from
this run. Scale it up by changing the configs only: README.md, "The real thing".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from eval import machine, study_analysis
from train.bench.attention import study_table
from train.linearise import Settings, linearise
from train.lr_sweep import choose, grid, reuse_chosen, sweep_jobs
from train.study import REPO, Study, StudyError, data_paths, done_before, jobs_of, load_study, make_data
from train.study_local import run_jobs

STUDY = REPO / "configs" / "study" / "demo.yaml"
FULL = REPO / "configs" / "study" / "sizes.yaml"  # claim (c)'s 4 sizes, rates swept at both ends (--full)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="run folder (default runs/demo-<UTC time>)")
    p.add_argument("--quick", action="store_true", help="a few steps per run: checks the pipeline, not the science")
    p.add_argument("--study", default=str(STUDY), help="the study config (default configs/study/demo.yaml)")
    p.add_argument("--full", action="store_true", help="the 4-size study: --study configs/study/sizes.yaml")
    p.add_argument("--seed", type=int, default=0, help="seed of the data set and of every run")
    p.add_argument("--sizes", nargs="+", help="model sizes to train (default: the study's)")
    p.add_argument("--attentions", nargs="+", help="registry names, used in both towers (default: the study's)")
    rates = "finished folders of the same study (or a page's data/): their sweeps' rates (first wins), no sweep"
    p.add_argument("--rates-from", nargs="+", help=rates)
    p.add_argument("--resume", action="store_true", help="keep the finished runs of --out trained with the same config")
    p.add_argument(
        "--reanalyse",
        action="store_true",
        help="fit and report the finished study in --out again, training nothing; give the options it ran with",
    )
    args = p.parse_args(argv)
    if args.reanalyse and not (args.out and (Path(args.out) / "data" / "eval").is_dir()):
        p.error("--reanalyse needs --out, a finished study folder (its data/ and runs/)")
    if args.full:
        args.study = str(FULL)
    return args


def stage(text: str) -> None:
    print(f"\n== {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def analyse(out: Path, study: Study, jobs, clock: dict, args: argparse.Namespace, sweep: list[dict] = ()) -> None:
    """Fits, figures, the attention benchmark and the report, from the finished runs."""
    stage("fitting scaling laws per attention")
    runs, fits, classes = study_analysis.figures(out, study, jobs)
    stage("timing the attention layers")
    bench = study_table(out, study.bench, again=not clock.get("final"))
    if not clock.get("final"):  # a re-analysis keeps the clock of the study's own run, and its machine
        clock.update(wall=time.perf_counter() - clock["wall"], cpu=machine.cpu_seconds() - clock["cpu"], final=True)
        clock["machine"] = machine.describe()
    study_analysis.write_report(out, study, runs, fits, classes, bench, clock, args, sweep)


def linearise_arm(out: Path, study: Study) -> None:
    """Issue 24's arm: the study's best softmax run linearised into each linear attention (train/linearise.py,
    with the study's `linearise:` settings and its runs' overrides), its section appended to the report."""
    if "softmax" not in study.attentions or len(study.attentions) < 2:
        print("   no linearisation arm: it needs softmax and a linear attention in the study", file=sys.stderr)
        return
    stage("linearising the best softmax run: attention transfer, then distillation, per linear attention")
    settings = Settings(study=out, out=out / "linearise", **study.linearise)
    linearise(settings, run=study.run, report=lambda m: print("   " + m, file=sys.stderr))
    study_analysis.append_linearise(out)


def reanalyse(out: Path, study: Study, args: argparse.Namespace) -> Path:
    """The analysis of a finished study folder again: its runs rebuilt from the study config, their times and the
    study's clock from the files it wrote (none for a study trained by `train.submit study`)."""
    jobs, _, sweep = grid(study, out, data_paths(out / "data"), args.seed)
    sweep = sweep or study.adopted
    clock = study_analysis.saved_times(out, jobs, study=Path(args.study).name)
    analyse(out, study, jobs, clock, args, sweep)
    study_analysis.append_linearise(out)
    print(f"\nreport: {out / 'report.md'}", flush=True)
    return out


def train(jobs: list, study: Study, what: str, clock: dict, out: Path) -> None:
    if clock.get("resume"):  # --resume: finished runs of the same config stay (their times are not on this clock)
        kept = [j for j in jobs if done_before(j)]
        study_analysis.run_times(out, kept)  # their own wall and CPU seconds, as the last runs.json holds them
        for job in kept:
            job.reused = True
        jobs, clock["resumed"] = [j for j in jobs if not j.reused], clock.get("resumed", 0) + len(kept)
    stage(what)  # the study's runs on this machine; the load averages while they ran go on the clock
    report = lambda m: print("   " + m, file=sys.stderr)  # noqa: E731
    clock["load"] += run_jobs(jobs, study.jobs, study.threads_per_job, report=report, launch=study.launch)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    try:
        study = load_study(args.study, quick=args.quick, rates_from=args.rates_from)
    except StudyError as e:
        raise SystemExit(f"error: {e}") from None
    study.sizes = {s: study.sizes.get(s, {}) for s in args.sizes} if args.sizes else study.sizes
    study.attentions = args.attentions or study.attentions
    out = Path(args.out or f"runs/demo-{datetime.now(UTC):%Y%m%d-%H%M%S}").resolve()
    if args.reanalyse:
        return reanalyse(out, study, args)
    out.mkdir(parents=True, exist_ok=True)
    clock = {"wall": time.perf_counter(), "cpu": machine.cpu_seconds(), "load": [os.getloadavg()[0]]}
    clock["resume"], clock["study"] = args.resume, Path(args.study).name  # a re-analysis reads only its own study's
    stage(f"making the synthetic data set in {out / 'data'}")
    paths = make_data(out / "data", study, args.seed, report=lambda m: print("   " + m, file=sys.stderr))
    sweep = list(study.adopted)  # the rows of another study's sweep whose rates this one trains with (rates_from)
    if study.lr_sweep:
        pairs = sweep_jobs(study, out, paths, args.seed)
        what = f"learning-rate sweep: {len(pairs)} runs at {study.lr_sweep['size']}"
        train([job for _, job in pairs], study, what, clock, out)
        sweep = choose(study, pairs)
    jobs = jobs_of(study, out, paths, args.seed)  # with the rates the sweep chose
    to_run = reuse_chosen(sweep, pairs, jobs) if study.lr_sweep else jobs
    reused = f" ({len(jobs) - len(to_run)} trained by the sweep)" if len(to_run) < len(jobs) else ""
    each = f"{study.jobs} at a time on {study.threads_per_job} thread(s) each"
    train(to_run, study, f"training {len(to_run)} runs{reused}, {each}", clock, out)
    analyse(out, study, jobs, clock, args, sweep)
    if study.linearise:
        linearise_arm(out, study)
    print(f"\nreport: {out / 'report.md'}", flush=True)
    return out


if __name__ == "__main__":
    main()
