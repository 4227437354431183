"""The study's Slurm runner: the grid of a study config (train/study.py, the same runs the local runner
train/study_local.py trains) as job arrays.

    python -m train.submit study configs/study/demo.yaml --out runs/demo-slurm --time 30 [--seed 1] [--quick]

The study's data set is made in OUT/data first (as the local runner does), then:
- with `lr_sweep:` and no finished sweep in OUT/lr_sweep: one array `lr-sweep`, one task per sweep run; submit the
  same command again once it has finished: the sweep chooses each attention's rate (train/lr_sweep.py) and the grid
  follows;
- the grid: array `runs`, one task per (size, attention) run (the biggest sizes first), and per shorter budget k
  (`budgets:`) an array `budget-k` whose task i branches off task i of `runs` once it has completed
  (--dependency=aftercorr); a run the sweep already trained is not trained again, and its branches (array
  `budget-k-reused`) start at once.
OUT/manifest.csv maps every array task to its run, as `train.submit sweep` does; submitting again resumes each run
where it stopped. The analysis runs on the finished folder: `python -m scripts.demo --out OUT --reanalyse`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from train.lr_sweep import grid, sweep_jobs
from train.slurm import (
    SubmitError,
    add_resource_arguments,
    check_path,
    load_checked,
    resources_from,
    with_loader_cpus,
)
from train.study import REPO, Job, StudyError, data_paths, finished, jobs_of, load_study, make_data
from train.sweep import Array, Task, submit_all


def task(job: Job) -> Task:
    """The array task of a study run: its overrides of the study's run config (python -m train's own argv)."""
    info = {"size": job.size, "attention": job.attention}
    branch = [a.partition("=")[2] for a in job.argv if a.startswith("train.branch_from=")]
    # a requeued or resubmitted task resumes where it stopped (the local runner starts each run once: resume none)
    return Task(job.run_dir, [*job.argv[4:], "train.resume=auto"], {**info, "branch_from": branch[0] if branch else ""})


def grid_arrays(jobs: list[Job], to_run: list[Job]) -> list[Array]:
    """`runs`, then per budget k the branches of the runs in `runs` (aftercorr) and of the reused ones (at once).
    The runs with the most budgets come first, so that budget k's tasks, those of the runs that have a k-th budget,
    are the first tasks of `runs` and aftercorr pairs each with its own run (sizes whose budget fractions round to
    the same step have fewer)."""
    mains = sorted((j for j in to_run if j.after is None), key=lambda j: -len(j.budgets))
    arrays = [Array("runs", [task(j) for j in mains])] if mains else []
    depth = max((len(j.budgets) for j in jobs if j.after is None), default=0)
    for k in range(depth):
        chained = [task(j.budgets[k]) for j in mains if len(j.budgets) > k]
        reused = [task(j.budgets[k]) for j in jobs if j.after is None and j.reused and len(j.budgets) > k]
        arrays += [Array(f"budget-{k + 1}", chained, after="runs")] if chained else []
        arrays += [Array(f"budget-{k + 1}-reused", reused)] if reused else []
    return arrays


def study_arrays(study, out: Path, seed: int) -> list[Array]:
    """The arrays to submit now: the learning-rate sweep's while it has not run, else the grid's."""
    paths = data_paths(out / "data") if (out / "data" / "train").is_dir() else make_data(out / "data", study, seed)
    if not study.lr_sweep:
        jobs = jobs_of(study, out, paths, seed)
        return grid_arrays(jobs, jobs)
    pairs = sweep_jobs(study, out, paths, seed)
    if not all(finished(job.run_dir) for _, job in pairs):
        return [Array("lr-sweep", [task(job) for _, job in pairs])]
    jobs, to_run, _ = grid(study, out, paths, seed)
    return grid_arrays(jobs, to_run)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m train.submit study", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("study", type=Path, help="a study config, e.g. configs/study/demo.yaml")
    parser.add_argument("--out", type=Path, required=True, help="the study's folder (data, runs, manifest.csv)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data set and of every run")
    parser.add_argument("--quick", action="store_true", help="the study's quick: settings (checks the pipeline)")
    parser.add_argument("--max-running", type=int, default=0, help="at most this many tasks of an array at once")
    add_resource_arguments(parser)
    return parser.parse_args(argv)


def main_study(argv: list[str]) -> None:
    args = parse(argv)
    try:
        study = load_study(args.study, quick=args.quick)
    except StudyError as e:
        raise SubmitError(str(e)) from None
    if any(option.startswith(("--array", "--dependency")) for option in args.sbatch_arg):
        raise SubmitError("a study sets --array and --dependency itself; drop them from --sbatch-arg")
    out = check_path(args.out.absolute())
    arrays = study_arrays(study, out, args.seed)
    config = REPO / study.run_config
    res = resources_from(args)
    for array in arrays:
        for i, one in enumerate(array.tasks):
            try:
                cfg = load_checked(config, one.overrides, schedule=True)
            except SubmitError as e:
                raise SubmitError(f"array {array.name}, task {i} ({one.run_dir.name}): {e}") from None
            res = with_loader_cpus(res, cfg.data.workers)
    submit_all(arrays, config, res, out, args)
    if arrays and arrays[0].name == "lr-sweep":
        print(f"the learning-rate sweep first: submit the same command again once array {arrays[0].name} has finished")
