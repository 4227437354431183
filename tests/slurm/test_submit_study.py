"""train.submit study: a study config's grid (train/study.py, the one the local runner trains) as job arrays; its
learning-rate sweep first, then the grid with the chosen rates, the sweep's chosen runs not trained twice.
sbatch is a stand-in here (tests/slurm/conftest.py)."""

import csv
import json
import re

import pytest
import yaml

from scripts import demo
from tests.speed import frozen_heap, quick_polls  # noqa: F401 (fixtures)
from train.lr_sweep import grid, sweep_jobs
from train.study import data_paths, jobs_of, load_study
from train.study_local import run_jobs
from train.study_slurm import study_arrays
from train.submit import main

CPU = ["--gpus-per-node", "0", "--procs-per-node", "1", "--time", "5"]


def write_study(tmp_path, sweep: bool):
    study = {
        "data": {"train_samples": 128, "val_samples": 32, "eval_per_class": 2, "image_size": 32, "shard_size": 64},
        "attentions": ["softmax", "linear_affine_nodenom"],
        "sizes": {"demo-w16": {"optim.lr": 4e-3}, "demo-w32": {"optim.lr": 3e-3}},
        "run": {
            "train.max_steps": 4,
            "eval.every": 2,
            "optim.warmup_steps": 1,
            "data.workers": 0,
            "data.batch_size": 16,
            "eval.batch_size": 16,
        },
        "budgets": {"fractions": [0.5], "cooldown": 0.25},
        "lr_sweep": {"size": "demo-w16", "scales": [0.5, 1.0]} if sweep else None,
        "launch": "fork",
        "fits": {"n_boot": 20, "frontier_bins": 3},
        "bench": ["--quick", "--variants", "softmax", "--sizes", "77"],
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_the_grid_is_the_local_runners_grid_with_budget_branches_chained_per_task(tmp_path, capsys, fake_sbatch):
    path, out = write_study(tmp_path, sweep=False), tmp_path / "study"
    main(["study", str(path), "--out", str(out), *CPU, "--dry-run"])
    text = capsys.readouterr().out
    local = jobs_of(load_study(path), out, {"train": "t", "val": "v", "eval": "e"}, 0)
    mains = [j for j in local if j.after is None]
    assert re.findall(r"#SBATCH --array=(\S+)", text) == [f"0-{len(mains) - 1}"] * 2  # runs, budget-1
    assert text.count("--dependency=aftercorr:<job id of runs>") == 1
    assert not fake_sbatch.exists()
    # task i of budget-1 branches off task i of runs, which keeps that checkpoint; every task resumes when requeued
    runs, branches = (
        re.findall(r"^  (\d+)\) TRAIN_ARGS=\((.*)\) ;;$", part, re.M) for part in text.split("#!/bin/bash")[1:]
    )
    for (i, run), (j, branch) in zip(runs, branches, strict=True):
        run_dir = re.search(r"train.run_dir=(\S+)", run).group(1)
        assert i == j and f"train.branch_from={run_dir}/checkpoints/step_" in branch
        assert run.endswith("train.resume=auto") and branch.endswith("train.resume=auto")
    assert [re.search(r"train.run_dir=\S+/runs/(\S+)", r).group(1) for _, r in runs] == [j.run_dir.name for j in mains]


@pytest.mark.usefixtures("frozen_heap", "quick_polls")  # tests/speed.py: the analysis's benchmark, the polls
def test_a_study_with_a_sweep_submits_the_sweep_then_the_grid_with_the_chosen_rates(tmp_path, capsys, fake_sbatch):
    path, out = write_study(tmp_path, sweep=True), tmp_path / "study"
    main(["study", str(path), "--out", str(out), *CPU])
    printed = capsys.readouterr().out
    assert "submit the same command again" in printed
    with open(out / "manifest.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["array"] for r in rows} == {"lr-sweep"} and len(rows) == 4  # 2 attentions x 2 scales at demo-w16
    # the sweep's runs trained (here by the local runner), the same command submits the grid
    study = load_study(path)
    arrays = study_arrays(study, out, 0)
    assert [a.name for a in arrays] == ["lr-sweep"]
    sweep = [job for _, job in sweep_jobs(study, out, data_paths(out / "data"), 0)]
    run_jobs(sweep, parallel=2, threads=1, launch="fork")
    arrays = study_arrays(load_study(path), out, 0)
    names = [a.name for a in arrays]
    assert names == ["runs", "budget-1", "budget-1-reused"], names
    # the chosen sweep runs are the grid's runs at demo-w16: not trained again, their branches start at once
    assert len(arrays[0].tasks) == 2 and all("demo-w32" in str(t.run_dir) for t in arrays[0].tasks)
    assert all("lr_sweep" in t.info["branch_from"] for t in arrays[2].tasks)
    assert arrays[2].after is None and arrays[1].after == "runs"
    # the grid's tasks trained (here by the local runner), the folder is analysed as a study trained here would be
    _, to_run, _ = grid(load_study(path), out, data_paths(out / "data"), 0)
    run_jobs(to_run, parallel=2, threads=1, launch="fork")
    demo.main(["--study", str(path), "--out", str(out), "--reanalyse"])
    report = (out / "report.md").read_text()
    assert "trained as Slurm job arrays" in report and "## Learning rate per attention" in report
    assert len(json.loads((out / "runs.json").read_text())) == 4


def test_runs_with_fewer_budgets_keep_each_branch_paired_with_its_own_run():
    """A size whose budget fractions round to the same step has fewer branches: budget k's array holds the runs
    that have a k-th budget, as the first tasks of `runs`, so aftercorr pairs each branch with its run."""
    from pathlib import Path

    from train.study import Job
    from train.study_slurm import grid_arrays

    def job(name, budgets):
        main = Job(name, "softmax", Path(f"/r/{name}"), ["python", "-m", "train", "c.yaml", "x=1"])
        main.budgets = [
            Job(
                name, "softmax", Path(f"/r/{name}-budget{s}"), ["python", "-m", "train", "c.yaml", f"s={s}"], after=main
            )
            for s in budgets
        ]
        return main

    small, big = job("small", [2]), job("big", [330, 670])
    jobs = [small, *small.budgets, big, *big.budgets]
    arrays = {a.name: [t.run_dir.name for t in a.tasks] for a in grid_arrays(jobs, jobs)}
    assert arrays == {
        "runs": ["big", "small"],
        "budget-1": ["big-budget330", "small-budget2"],
        "budget-2": ["big-budget670"],
    }
