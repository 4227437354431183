"""A finished cosine run resumed with a longer train.max_steps: its learning rate jumps back up, which the run says
in one warning line (issue 49); a plain resume and a branched cooldown say nothing."""

from tests.train.common import run, tiny_config
from train.config import OptimConfig
from train.optim import schedule_change


def test_extending_a_finished_cosine_run_is_said_with_both_rates():
    saved = {"optim": {"lr": 5e-4, "warmup_steps": 10, "schedule": "cosine"}, "train": {"max_steps": 200}}
    line = schedule_change(saved, OptimConfig(lr=5e-4, warmup_steps=10), 400, 200)
    assert line.startswith("warning: resumed at step 200 under another schedule (train.max_steps 200 -> 400): ")
    assert "the learning rate moves from 3.42e-08 to 2.60e-04 at once" in line
    assert schedule_change(saved, OptimConfig(lr=5e-4, warmup_steps=10), 200, 100) is None  # the same schedule
    constant = {"optim": {"lr": 5e-4, "warmup_steps": 10, "schedule": "constant"}, "train": {"max_steps": 200}}
    assert schedule_change(constant, OptimConfig(lr=5e-4, warmup_steps=10, schedule="constant"), 400, 200) is None


def test_a_run_resumed_with_more_steps_warns_once(tmp_path, synthetic, capsys):
    config = tiny_config(tmp_path, synthetic, optim={"lr": 1.0e-3, "warmup_steps": 1})
    assert run(config, "train.max_steps=4") == 0
    capsys.readouterr()
    assert run(config, "train.max_steps=8") == 0
    err = capsys.readouterr().err
    assert err.count("warning: resumed at step 4 under another schedule (train.max_steps 4 -> 8") == 1
