"""Pre-emption and crashes: SIGUSR1/SIGTERM -> checkpoint + exit 75; kill -9 anywhere, even inside a checkpoint
write."""

import os
import random
import signal
import subprocess
import time

import pytest
import torch

from tests.train.common import TORCHRUN, checkpoints, cli, finish, run, tiny_config, train_records, weights
from train.checkpoint import CRASH_HOOK, problem


def wait_for_step(proc: subprocess.Popen, run_dir, step: int, timeout: float = 180) -> None:
    """Poll metrics.jsonl until it holds `step` (log_every=1)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in train_records(run_dir)):
            return
        assert proc.poll() is None, f"exited early with {proc.returncode}: {proc.stderr.read()[-3000:]}"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"step {step} not reached in {timeout} s")


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_signal_writes_a_checkpoint_and_exits_75(tmp_path, synthetic, capsys, sig):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 100})
    proc = cli([str(path)])
    wait_for_step(proc, tmp_path / "run", 2)
    proc.send_signal(sig)
    code, _, err = finish(proc)
    assert code == 75, err[-2000:]
    stopped = train_records(tmp_path / "run")[-1]["step"]
    assert f"signal {int(sig)} received: checkpoint at step {stopped}, exiting with 75" in err
    assert [p.name for p in checkpoints(tmp_path / "run")] == [f"step_{stopped:08d}"]
    assert problem(checkpoints(tmp_path / "run")[0]) is None
    assert run(path, f"train.max_steps={stopped + 2}") == 0
    assert f"at step {stopped} " in capsys.readouterr().err
    assert [r["step"] for r in train_records(tmp_path / "run")] == list(range(1, stopped + 3))


def test_all_ranks_stop_at_the_same_step(tmp_path, synthetic):
    """SIGUSR1 reaches one of two ranks only; the all-reduced flag stops both after the same step."""
    proc = cli([str(tiny_config(tmp_path, synthetic, train={"max_steps": 100}))], launcher=TORCHRUN)
    wait_for_step(proc, tmp_path / "run", 2)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2
    os.kill(int(workers[-1]), signal.SIGUSR1)
    code, _, err = finish(proc)
    assert code != 0 and "exitcode  : 75" in err  # torchrun reports the workers' 75 and fails itself
    stopped = train_records(tmp_path / "run")[-1]["step"]
    folder = checkpoints(tmp_path / "run")[-1]
    assert folder.name == f"step_{stopped:08d}" and problem(folder) is None
    assert (folder / "data_state_1.json").is_file() and (folder / "state" / "random_states_1.pkl").is_file()


def test_kill_9_and_crash_in_checkpoint_write_then_resume_equals_uninterrupted(tmp_path, synthetic):
    settings = {"max_steps": 8, "save_every": 2, "keep_last": 2, "deterministic": True}
    (tmp_path / "ref").mkdir()
    reference = tiny_config(tmp_path / "ref", synthetic, train=settings)
    assert run(reference) == 0
    path = tiny_config(tmp_path, synthetic, train=settings)
    kill_at = random.randint(2, 5)
    print(f"kill -9 after step {kill_at}")

    proc = cli([str(path)])
    wait_for_step(proc, tmp_path / "run", kill_at)
    os.kill(proc.pid, signal.SIGKILL)
    finish(proc)
    assert all(problem(p) is None for p in checkpoints(tmp_path / "run"))

    code, _, err = finish(cli([str(path)], env={CRASH_HOOK: "6"}))  # dies inside the write of step 6
    assert code == 9, err[-2000:]
    assert (tmp_path / "run" / "checkpoints" / ".tmp_step_00000006").is_dir()
    assert [p.name for p in checkpoints(tmp_path / "run")][-1] == "step_00000004"
    assert all(problem(p) is None for p in checkpoints(tmp_path / "run"))

    assert run(path) == 0
    assert [r["step"] for r in train_records(tmp_path / "run")] == list(range(1, 9))
    final, expected = weights(checkpoints(tmp_path / "run")[-1]), weights(checkpoints(tmp_path / "ref" / "run")[-1])
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    assert [r["loss"] for r in train_records(tmp_path / "run")] == [
        r["loss"] for r in train_records(tmp_path / "ref" / "run")
    ]
