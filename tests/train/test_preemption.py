"""Pre-emption, crashes and resume: SIGUSR1/SIGTERM -> checkpoint + exit 75; kill -9 anywhere, even inside a
checkpoint write; a resumed run equals the uninterrupted one from every checkpoint, on 2 processes, from
train.resume=PATH, and with evaluation and random augmentation on."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from models.run_folder import read_meta, step_name
from tests.train.common import TORCHRUN, checkpoints, cli, finish, metrics, run, tiny_config, train_records, weights
from train.checkpoint import problem

DETERMINISTIC = {"max_steps": 8, "save_every": 1, "keep_last": 8, "deterministic": True}


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


def crashed_copy(reference: Path, step: int, run_dir: Path) -> Path:
    """The run directory a crash right after the checkpoint of `step` leaves: that checkpoint, metrics beyond it."""
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / step_name(step), run_dir / "checkpoints" / step_name(step))
    shutil.copy(reference / "metrics.jsonl", run_dir / "metrics.jsonl")
    return run_dir


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Every step's loss and the final weights are bit for bit those of the reference run."""
    losses = [(r["step"], r["loss"]) for r in train_records(run_dir)]
    assert losses == [(r["step"], r["loss"]) for r in train_records(reference)]
    final, expected = weights(checkpoints(run_dir)[-1]), weights(checkpoints(reference)[-1])
    assert all(torch.equal(final[k], expected[k]) for k in expected)


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


def test_resume_from_each_checkpoint_equals_uninterrupted(tmp_path, synthetic):
    """Kill points inside and on the boundary of a shuffle block (64 samples = 4 steps of 16): a resume that
    lost or repeated one sample would show in the losses of every point but those on a boundary."""
    reference = tiny_config(tmp_path, synthetic, train=DETERMINISTIC)
    assert run(reference) == 0
    for step in (1, 2, 3, 5, 6):
        resumed = crashed_copy(tmp_path / "run", step, tmp_path / f"resumed-{step}")
        assert run(reference, f"train.run_dir={resumed}") == 0
        assert_same_run(resumed, tmp_path / "run")
        shutil.rmtree(resumed)  # 50 MB a checkpoint: keep the suite's disk footprint small


def test_kill_9_and_crash_in_checkpoint_write_then_resume_equals_uninterrupted(tmp_path, synthetic):
    settings = {**DETERMINISTIC, "save_every": 2, "keep_last": 2}
    (tmp_path / "ref").mkdir()
    reference = tiny_config(tmp_path / "ref", synthetic, train=settings)
    assert run(reference) == 0
    path = tiny_config(tmp_path, synthetic, train=settings)

    proc = cli([str(path)])
    wait_for_step(proc, tmp_path / "run", 3)
    os.kill(proc.pid, signal.SIGKILL)
    finish(proc)
    assert all(problem(p) is None for p in checkpoints(tmp_path / "run"))

    crash = subprocess.Popen(
        [sys.executable, "-m", "tests.train.crash_in_save", "6", str(path)],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    code, _, err = finish(crash)  # dies inside the write of step 6, before its manifest
    assert code == 9, err[-2000:]
    assert (tmp_path / "run" / "checkpoints" / ".tmp_step_00000006").is_dir()
    assert [p.name for p in checkpoints(tmp_path / "run")][-1] == "step_00000004"
    assert all(problem(p) is None for p in checkpoints(tmp_path / "run"))

    assert run(path) == 0
    assert [r["step"] for r in train_records(tmp_path / "run")] == list(range(1, 9))
    assert_same_run(tmp_path / "run", tmp_path / "ref" / "run")


def test_two_process_resume_equals_uninterrupted(tmp_path, synthetic):
    settings = {**DETERMINISTIC, "max_steps": 4, "save_every": 2, "keep_last": 2}
    path = tiny_config(tmp_path, synthetic, train=settings)
    code, _, err = finish(cli([str(path)], launcher=TORCHRUN))
    assert code == 0, err[-3000:]
    resumed = crashed_copy(tmp_path / "run", 2, tmp_path / "resumed")
    code, _, err = finish(cli([str(path), f"train.run_dir={resumed}"], launcher=TORCHRUN))
    assert code == 0, err[-3000:]
    assert f"resumed from {resumed / 'checkpoints' / 'step_00000002'} at step 2" in err
    assert_same_run(resumed, tmp_path / "run")


def test_resume_from_a_given_checkpoint_path(tmp_path, synthetic, capsys):
    path = tiny_config(tmp_path, synthetic, train={**DETERMINISTIC, "max_steps": 4})
    assert run(path) == 0
    given = tmp_path / "run" / "checkpoints" / "step_00000002"
    other = tmp_path / "branch"
    assert run(path, f"train.run_dir={other}", f"train.resume={given}") == 0
    assert f"resumed from {given} at step 2" in capsys.readouterr().err
    assert [r["step"] for r in train_records(other)] == [3, 4]
    assert [r["loss"] for r in train_records(other)] == [r["loss"] for r in train_records(tmp_path / "run")][2:]
    final, expected = weights(checkpoints(other)[-1]), weights(checkpoints(tmp_path / "run")[-1])
    assert all(torch.equal(final[k], expected[k]) for k in expected)


def test_resume_with_evaluation_and_augmentation_equals_uninterrupted(tmp_path, synthetic, monkeypatch):
    """The zero-shot evaluation every 2 steps leaves the training RNG as it found it, and the random crops are
    a function of each sample's place in the stream: a resumed run repeats them."""
    import train.main

    real, states = train.main.make_evaluator, []

    def make_evaluator(*args, **kwargs):
        evaluate = real(*args, **kwargs)

        def spied() -> dict:
            before = torch.get_rng_state()
            results = evaluate()
            states.append(torch.equal(before, torch.get_rng_state()))
            return results

        return spied

    monkeypatch.setattr(train.main, "make_evaluator", make_evaluator)
    settings = {**DETERMINISTIC, "max_steps": 6, "augment": True}
    evaluation = {"dataset": synthetic["eval"], "every": 2, "batch_size": 64}
    path = tiny_config(tmp_path, synthetic, train=settings, eval=evaluation)
    assert run(path) == 0
    assert states == [True, True, True]
    assert run(path, f"train.run_dir={tmp_path / 'plain'}", "train.augment=false") == 0
    losses = [r["loss"] for r in train_records(tmp_path / "run")]
    assert [r["loss"] for r in train_records(tmp_path / "plain")] != losses  # the crops are random indeed
    for step in (3, 4):
        resumed = crashed_copy(tmp_path / "run", step, tmp_path / f"resumed-{step}")
        assert run(path, f"train.run_dir={resumed}") == 0
        assert_same_run(resumed, tmp_path / "run")
        shutil.rmtree(resumed)


def signal_at_step(monkeypatch, step: int, sig: int = signal.SIGTERM) -> None:
    """Fault injection for one in-process run: `sig` to this process inside the loss of optimizer step `step`
    (1-based, one micro-batch a step), once; the stop flag reads it after that step's backward pass."""
    import train.main

    real, sent = train.main.build_loss, []

    def build(name: str, **kwargs):
        loss_fn, calls = real(name, **kwargs), [0]

        def signalling(*args):
            calls[0] += 1
            if calls[0] == step and not sent:
                sent.append(step)
                os.kill(os.getpid(), sig)
            return loss_fn(*args)

        return signalling

    monkeypatch.setattr(train.main, "build_loss", build)


def test_a_stop_at_the_last_step_defers_the_final_evaluation(tmp_path, synthetic, monkeypatch, capsys):
    """SIGTERM during step 5 of 5 with eval.every=0 (evaluate at the end only): the rerun finds the run at its last
    step and runs the final evaluation it owes (before: 'nothing to do' and no evaluation at all)."""
    signal_at_step(monkeypatch, 5)
    evaluation = {"dataset": synthetic["eval"], "every": 0, "batch_size": 64}
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 5}, eval=evaluation)
    assert run(path) == 75
    assert "step 5: evaluation deferred by the stop signal" in capsys.readouterr().err
    assert read_meta(checkpoints(tmp_path / "run")[-1])["eval_pending"] is True
    assert run(path) == 0
    assert [r["step"] for r in metrics(tmp_path / "run") if "zeroshot/top1" in r] == [5]


def test_a_stop_on_an_evaluation_step_saves_first_and_evaluates_on_resume(tmp_path, synthetic, monkeypatch, capsys):
    """SIGTERM during step 4, an evaluation step: the checkpoint of step 4 is written without evaluating (it must
    fit in the grace time), marked as owing that evaluation; the resumed run evaluates step 4 first."""
    signal_at_step(monkeypatch, 4)
    evaluation = {"dataset": synthetic["eval"], "every": 2, "batch_size": 64}
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 6}, eval=evaluation)
    assert run(path) == 75
    err = capsys.readouterr().err
    assert "step 4: evaluation deferred by the stop signal: it runs when the run resumes" in err
    assert f"signal {int(signal.SIGTERM)} received: checkpoint at step 4, exiting with 75" in err
    folder = checkpoints(tmp_path / "run")[-1]
    assert folder.name == "step_00000004" and problem(folder) is None
    assert read_meta(folder)["eval_pending"] is True
    evaluated = [r["step"] for r in metrics(tmp_path / "run") if "zeroshot/top1" in r]
    assert evaluated == [2]

    assert run(path) == 0
    records = metrics(tmp_path / "run")
    assert [r["step"] for r in records if "zeroshot/top1" in r] == [2, 4, 6]
    order = [("eval" if "zeroshot/top1" in r else "train", r["step"]) for r in records if "end" not in r]
    assert order.index(("eval", 4)) < order.index(("train", 5))
    assert read_meta(checkpoints(tmp_path / "run")[-1])["eval_pending"] is False
