"""Helpers of the tests that submit to the real one-host cluster: job state, bounded waits, the job's output, and
configs/tiny.yaml made small for CPU jobs."""

import contextlib
import io
import subprocess
import time
from pathlib import Path

import pytest

from train.submit import main

REPO = Path(__file__).resolve().parents[2]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}

# configs/tiny.yaml made small: batch 8, no periodic eval, a metrics line every step
# on the CPU (--gpus-per-node 0) also where the host has GPUs, so that the two "nodes" of this host never share cuda:0
TINY = [
    "train.cpu=true",
    "data.batch_size=8",
    "data.workers=0",
    "data.shuffle_buffer=64",
    "eval.dataset=null",
    "optim.warmup_steps=2",
    "train.log_every=1",
    "train.progress=false",
    "train.save_every=1000",
    "train.keep_last=2",
]
# CPU jobs on partition debug; 2 shared cores are slow with more than one thread per process
CPU_JOB = [
    "--gpus-per-node",
    "0",
    "--partition",
    "debug",
    "--time",
    "10",
    "--sbatch-arg=--export=ALL,OMP_NUM_THREADS=1",
]


def submit_command(argv: list[str]) -> str:
    """python -m train.submit ARGV in this process; returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return out.getvalue()


def job_info(job_id: str) -> dict:
    """`scontrol show job` of a job or of one array task (JOB_TASK) as a dict."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30).stdout
    return dict(token.split("=", 1) for token in out.split() if "=" in token)


def job_output(job_id: str, folder: Path) -> str:
    """The job's .out file: slurm-<id>.out of a training run, slurm-eval-<id>.out of an eval job,
    <array>-<job>_<task>.out of an array task."""
    for path in (folder / f"slurm-{job_id}.out", folder / f"slurm-eval-{job_id}.out", *folder.glob(f"*-{job_id}.out")):
        if path.exists():
            return path.read_text()
    return f"(no .out file of job {job_id} in {folder})"


def wait_for(job_id: str, folder: Path, timeout: float, until=lambda info: info.get("JobState") in FINAL) -> dict:
    """Poll the job until `until(info)`; on timeout cancel it and fail with its output (found in `folder`)."""
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(job_id)
        if until(info):
            return info
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], timeout=30)
            pytest.fail(
                f"job {job_id} still {info.get('JobState')} ({info.get('Reason')}) after {timeout:.0f}s; "
                f"its output:\n{job_output(job_id, folder)}"
            )
        time.sleep(0.3)


def assert_completed(info: dict, job_id: str, folder: Path) -> None:
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (
        f"job {job_id} ended {info['JobState']} exit {info['ExitCode']}; its output:\n{job_output(job_id, folder)}"
    )


def finish(job_id: str, folder: Path, timeout: float = 200) -> dict:
    """Wait for the job to end and check that it completed; returns its final info."""
    info = wait_for(job_id, folder, timeout)
    assert_completed(info, job_id, folder)
    return info
