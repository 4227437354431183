"""Sweeps on the real one-host cluster: a job array whose tasks each train their own run (one pre-empted and
requeued alone), and cooldown branches chained to their constant run with --dependency=aftercorr."""

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.slurm.jobs import CPU_JOB, REPO, TINY, finish, job_output, submit_command, wait_for

LONG_STEPS = 24  # the task that gets pre-empted
# ten Slurm jobs and a requeue: about 100 s of one test worker, too much for the 10-minute suite; the same Slurm
# mechanics (arrays, aftercorr chains, USR1 requeue) run in test_submit_study.py, test_cluster.py, test_restarts.py
pytestmark = pytest.mark.skipif(
    not os.environ.get("RUN_SLOW"), reason="two Slurm sweeps take ~100 s of a test worker; RUN_SLOW=1 runs them"
)


def submit_sweep(sweep_dir: Path, *args: str) -> dict[str, str]:
    """python -m train.submit sweep configs/tiny.yaml ... -> {array name: job id}."""
    out = submit_command(
        ["sweep", str(REPO / "configs" / "tiny.yaml"), *CPU_JOB, "--sweep-dir", str(sweep_dir), *TINY, *args]
    )
    assert "manifest: " in out, out
    return {name: job for job, name in re.findall(r"submitted array job (\d+) \(\d+ tasks\): (\S+)", out)}


@pytest.fixture(scope="module")
def sweeps(slurm_cluster, shards, tmp_path_factory) -> dict[str, tuple[Path, dict[str, str]]]:
    """Both sweeps, submitted together so they run side by side: name -> (sweep dir, {array: job id}).

    "array": samples 32 and 192 at batch 8, i.e. tasks of 4 and 24 steps. "cooldown": run lengths 8 and 16 with a
    quarter cooldown, branching at steps 6 and 12 of one constant run per attention; checkpoints every 2 steps,
    keep_last 2."""
    array_dir, cooldown_dir = tmp_path_factory.mktemp("array") / "sweep", tmp_path_factory.mktemp("cd") / "sweep"
    data = f"data.train_shards={shards}"
    yield {
        "array": (array_dir, submit_sweep(array_dir, data, "--samples", f"32,{LONG_STEPS * 8}")),
        "cooldown": (
            cooldown_dir,
            submit_sweep(
                cooldown_dir,
                data,
                "--attentions",
                "softmax,linear_affine_nodenom",
                "--cooldowns-at",
                "8,16",
                "--cooldown-fraction",
                "0.25",
                "train.save_every=2",
            ),
        ),
    }
    for folder in (array_dir, cooldown_dir):  # 900 MB of checkpoints
        shutil.rmtree(folder, ignore_errors=True)


def manifest(sweep_dir: Path) -> list[dict]:
    with open(sweep_dir / "manifest.csv") as f:
        return list(csv.DictReader(f))


def steps_and_lrs(run_dir: str) -> tuple[list[int], list[float]]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "lr" in r]  # not the end-of-run summary
    return [r["step"] for r in records], [r["lr"] for r in records]


def test_array_tasks_train_their_runs_and_a_preempted_task_requeues_alone(sweeps):
    sweep_dir, jobs = sweeps["array"]
    rows = manifest(sweep_dir)
    assert list(jobs) == ["train"] and [(r["job_id"], r["task_id"]) for r in rows] == [
        (jobs["train"], "0"),
        (jobs["train"], "1"),
    ]
    short, long = (f"{jobs['train']}_{i}" for i in (0, 1))
    metrics = Path(rows[1]["run_dir"]) / "metrics.jsonl"
    logs = sweep_dir / "logs"
    wait_for(long, logs, timeout=150, until=lambda info: metrics.exists() and metrics.stat().st_size > 0)
    subprocess.run(["scancel", "--signal=USR1", "--batch", long], check=True, timeout=30)
    info = finish(long, logs)
    assert info["Restarts"] == "1" and "requeueing job" in job_output(long, logs), job_output(long, logs)
    assert finish(short, logs)["Restarts"] == "0"
    assert steps_and_lrs(rows[0]["run_dir"])[0] == [1, 2, 3, 4]
    assert steps_and_lrs(rows[1]["run_dir"])[0] == list(range(1, LONG_STEPS + 1))
    saved = sorted(p.name for p in (Path(rows[1]["run_dir"]) / "checkpoints").glob("step_*"))
    assert len(saved) == 2 and saved[0] < saved[1] == f"step_{LONG_STEPS:08d}", "not pre-empted before the end"


def test_cooldown_branches_wait_for_their_constant_run_then_cool_down(sweeps):
    sweep_dir, jobs = sweeps["cooldown"]
    assert list(jobs) == ["constant-6", "constant-12", "cooldown-8", "cooldown-16"]
    logs = sweep_dir / "logs"
    rows = manifest(sweep_dir)
    tasks = {(r["array"], r["task_id"]): r for r in rows}
    ends = {}
    for array, task in [(a, t) for a in jobs for t in ("0", "1")]:
        info = finish(f"{jobs[array]}_{task}", logs, timeout=400)
        ends[array, task] = info["EndTime"]
        after = {"constant-12": "constant-6", "cooldown-8": "constant-6", "cooldown-16": "constant-12"}.get(array)
        if after:  # aftercorr: task i starts when task i of the array before it has completed
            assert info["StartTime"] >= ends[after, task], (array, task, info["StartTime"], ends[after, task])
    for task in ("0", "1"):
        parent = tasks["constant-12", task]["run_dir"]
        assert steps_and_lrs(parent) == (list(range(1, 13)), pytest.approx([5e-4] + [1e-3] * 11))
        # the branch points 6 and 12 (train.keep_steps), and the newest 2 others (keep_last 2) of 2, 4, 8, 10
        saved = sorted(int(p.name[5:]) for p in Path(parent, "checkpoints").glob("step_*"))
        assert saved == [6, 8, 10, 12]
        assert "resumed from" in job_output(f"{jobs['constant-12']}_{task}", logs)
        for end, lrs in ((8, [1e-3, 0.5e-3]), (16, [1e-3, 0.75e-3, 0.5e-3, 0.25e-3])):
            branch = tasks[f"cooldown-{end}", task]
            assert steps_and_lrs(branch["run_dir"]) == (list(range(end - len(lrs) + 1, end + 1)), pytest.approx(lrs))
            output = job_output(f"{jobs[f'cooldown-{end}']}_{task}", logs)
            assert f"branched from {branch['branch_from']} at step {end - len(lrs)}" in output, output
