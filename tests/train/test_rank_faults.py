"""A rank that hangs or dies in a 2-process gloo run: the job ends in bounded time, in one line that names the
timeout and the rank (train.dist_timeout_s), instead of holding every GPU of the job for an hour."""

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.train.common import TORCHRUN, checkpoints, cli, finish, tiny_config
from tests.train.test_preemption import wait_for_step
from train.checkpoint import problem
from train.dist import collective_failure

pytestmark = pytest.mark.trains

# torchrun sends SIGTERM to the ranks still running when one fails and SIGKILL 30 s later (a fixed 30 s: its
# --shutdown-timeout only applies to signals torchrun itself receives); a stopped rank goes away at the SIGKILL
TORCHRUN_STOP_S = 30
TIMEOUT_S = 8  # train.dist_timeout_s of the hang test: well above a tiny step on a loaded 2-core machine


def workers_by_rank(proc: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of torchrun's worker processes, read from their environment."""
    pids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, timeout=10).stdout.split()
    ranks = {}
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_text().split("\0")
        env = dict(item.split("=", 1) for item in environ if "=" in item)
        ranks[int(env["RANK"])] = int(pid)
    assert sorted(ranks) == [0, 1], ranks
    return ranks


def start(tmp_path, synthetic, timeout_s: float, save_every: int = 0) -> tuple[subprocess.Popen, dict[int, int]]:
    """A long 2-rank run, once both ranks are training (step 3 logged)."""
    train = {"max_steps": 10_000, "dist_timeout_s": timeout_s, "save_every": save_every}
    proc = cli([str(tiny_config(tmp_path, synthetic, train=train))], launcher=TORCHRUN)
    wait_for_step(proc, tmp_path / "run", 3)
    return proc, workers_by_rank(proc)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to what is left of the run's process group (its own session), if anything is."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def gone(pid: int, timeout: float) -> bool:
    """Whether process PID ended (or became a zombie) within TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.2)
    return False


def test_a_stopped_rank_ends_the_job_after_the_timeout_in_one_line(tmp_path, synthetic):
    """SIGSTOP on rank 1: rank 0 gives up after train.dist_timeout_s and exits; torchrun then sends SIGTERM to
    the stopped rank and SIGKILL 30 s later. The test sends that SIGKILL itself once rank 0 is gone, instead of
    waiting out torchrun's fixed 30 s."""
    proc, ranks = start(tmp_path, synthetic, timeout_s=TIMEOUT_S)
    try:
        os.kill(ranks[1], signal.SIGSTOP)
        stopped = time.monotonic()
        assert gone(ranks[0], TIMEOUT_S + 60), "rank 0 did not give up on its stopped peer"
        elapsed = time.monotonic() - stopped
        with contextlib.suppress(ProcessLookupError):
            os.kill(ranks[1], signal.SIGKILL)
        code, _, err = finish(proc, timeout=TORCHRUN_STOP_S + 30)
    finally:
        kill_group(proc)  # the stopped rank too, whatever happened
    assert code != 0
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 20, (elapsed, err[-4000:])
    assert error_lines(err) == [
        f"error: rank 0: a collective waited more than train.dist_timeout_s={TIMEOUT_S} s for rank 1, which stopped "
        "answering (hung, stopped, or its node lost); the job stops instead of holding its GPUs. See that rank's log; "
        "raise train.dist_timeout_s if a training step can legitimately take that long"
    ], err[-3000:]


def test_a_killed_rank_ends_the_job_within_30_s_and_the_rerun_resumes(tmp_path, synthetic):
    """SIGKILL on rank 1 with the default train.dist_timeout_s (600 s): its peer sees the connection close at once.
    The same command again (what a requeue under train.max_restarts runs) resumes from the newest complete
    checkpoint."""
    proc, ranks = start(tmp_path, synthetic, timeout_s=600, save_every=2)
    try:
        os.kill(ranks[1], signal.SIGKILL)
        killed = time.monotonic()
        code, _, err = finish(proc, timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        kill_group(proc)
    assert code != 0 and elapsed < 30, (elapsed, err[-3000:])
    assert len(error_lines(err)) <= 1, err[-3000:]
    kept = checkpoints(tmp_path / "run")[-1]
    assert problem(kept) is None
    step = int(kept.name.removeprefix("step_"))
    rerun = cli([str(tmp_path / "config.yaml"), f"train.max_steps={step + 1}"], launcher=TORCHRUN)
    code, _, err = finish(rerun, timeout=120)
    assert code == 0, err[-3000:]
    assert f"resumed from {kept} at step {step}" in err


@pytest.mark.parametrize(
    "text, fault",
    [
        ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete", "waited"),
        ("Application timeout caused pair closure", "waited"),  # gloo's, from DDP's all-reduce in a backward
        ("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:10373.", "closed its connection"),
        ("CUDA out of memory", None),
    ],
)
def test_collective_failures_are_told_apart_from_other_errors(text, fault):
    line = collective_failure(RuntimeError(text), 600)
    assert (line is None) if fault is None else (fault in line and line.startswith("rank 0: "))
