"""train.max_restarts in slurm/train.sbatch: a failed run (exit not 0 or 75) is requeued up to N times, counted in the
job's Comment, which outlives a requeue; pre-emptions do not count. Run against the stand-in Slurm commands, with the
real python reading the real config."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.test_templates import calls, gpu_job, stub_env
from train.slurm import render_train

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "tiny.yaml"


@pytest.fixture
def job(tmp_path, stub_bin):
    """A function running the job script of tiny.yaml with these overrides once, as Slurm starts a (re)queued job:
    returns (exit code, output); `python` is this interpreter, so the script reads the config for real."""
    (stub_bin / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    (stub_bin / "python").chmod(0o755)

    def start(overrides: list[str], rc: int) -> tuple[int, str]:
        script = tmp_path / "job.sbatch"
        res = gpu_job(nodes=1)
        script.write_text(render_train(CONFIG, [*overrides, "train.run_dir=/runs/r"], Path("/runs/r"), res, stub_bin))
        env = stub_env(stub_bin, SLURM_NNODES="1", STUB_RC=str(rc))
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout + done.stderr

    return start


def requeues(stub_bin: Path) -> int:
    return sum(c == "scontrol requeue 123457" for c in calls(stub_bin))


def test_a_failed_run_is_requeued_up_to_max_restarts(job, stub_bin):
    for restart in (1, 2):
        code, output = job(["train.max_restarts=2"], rc=1)
        assert code == 0, output
        assert f"training failed (exit 1): restart {restart} of train.max_restarts=2, requeueing job 123457" in output
        assert requeues(stub_bin) == restart
        assert f"scontrol update JobId=123457 Comment=failed_restarts={restart}" in calls(stub_bin)
    code, output = job(["train.max_restarts=2"], rc=1)
    assert code == 1 and requeues(stub_bin) == 2
    assert "training failed (exit 1) after 2 restart(s), all that train.max_restarts=2 allows: not requeued" in output
    assert "finished with exit code 1" in output


def test_preemptions_do_not_count_and_success_is_not_requeued(job, stub_bin):
    code, output = job(["train.max_restarts=1"], rc=75)
    assert code == 0 and requeues(stub_bin) == 1 and "stopped for pre-emption" in output
    assert not any(c.startswith("scontrol update") for c in calls(stub_bin))
    code, output = job(["train.max_restarts=1"], rc=1)
    assert code == 0 and requeues(stub_bin) == 2 and "restart 1 of train.max_restarts=1" in output
    code, output = job(["train.max_restarts=1"], rc=0)
    assert code == 0 and requeues(stub_bin) == 2 and "finished with exit code 0" in output


def test_by_default_a_failed_run_is_not_requeued(job, stub_bin):
    code, output = job([], rc=1)
    assert code == 1 and requeues(stub_bin) == 0
    assert "not requeued" not in output and "finished with exit code 1" in output
