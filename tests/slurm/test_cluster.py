"""Jobs on a real one-host Slurm cluster of 2 virtual nodes (the slurm_cluster fixture of conftest.py).

Each wait is bounded; a job that fails or hangs is cancelled and its .out file shown in the failure."""
import subprocess
import time
from pathlib import Path

import pytest

from train.submit import Resources, render_train, submit

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def job_info(job_id: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30).stdout
    return dict(token.split("=", 1) for token in out.split() if "=" in token)


def job_output(job_id: str, run_dir: Path) -> str:
    path = run_dir / f"slurm-{job_id}.out"
    return path.read_text() if path.exists() else f"(no {path})"


def wait_for(job_id: str, run_dir: Path, timeout: float, until=lambda info: info.get("JobState") in FINAL) -> dict:
    """Poll the job until `until(info)`; on timeout cancel it and fail with its output."""
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(job_id)
        if until(info):
            return info
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], timeout=30)
            pytest.fail(f"job {job_id} still {info.get('JobState')} ({info.get('Reason')}) after {timeout:.0f}s; "
                        f"its output:\n{job_output(job_id, run_dir)}")
        time.sleep(0.3)


def assert_completed(info: dict, job_id: str, run_dir: Path) -> None:
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
        f"job {job_id} ended {info['JobState']} exit {info['ExitCode']}; its output:\n{job_output(job_id, run_dir)}"


def test_rendezvous_on_two_nodes(slurm_cluster, torchrun_stub, tmp_path, monkeypatch):
    """Real sbatch/srun/scontrol with a stand-in torchrun: one task per node, node ranks 0 and 1, the first
    node's address and the port 20000 + job id % 20000."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("STUB_LOG", str(log))
    run_dir = tmp_path / "run"
    res = Resources(time="5", nodes=2, gpus_per_node=0, procs_per_node=3, partition="debug")
    script = render_train(Path("/configs/tiny.yaml"), [f"train.run_dir={run_dir}"], run_dir, res, bin_dir=torchrun_stub)
    job_id = submit(script, run_dir / "train.sbatch", dry_run=False)
    assert_completed(wait_for(job_id, run_dir, timeout=60), job_id, run_dir)
    port = 20000 + int(job_id) % 20000
    launches = sorted(line for line in log.read_text().splitlines() if line.startswith("torchrun"))
    assert len(launches) == 2, log.read_text()
    for rank, line in enumerate(launches):
        assert f"--nnodes=2 --nproc_per_node=3 --node_rank={rank} --master_addr=127.0.0.1 --master_port={port}" in line
    assert f"world size 6, rendezvous 127.0.0.1:{port}" in job_output(job_id, run_dir)
