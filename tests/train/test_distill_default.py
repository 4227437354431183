"""A teacher without distill.stage runs both stages, train.max_steps split 25 / 75 between attention transfer and
distillation, and says so in one line; a stage the config names behaves as before (issue 44)."""

import logging

import pytest
import yaml

from tests.train.common import run, save_teacher, tiny_config, train_records
from train import stages
from train.config import ConfigError, load_config

LINEAR = ["model.image_attention=linear_affine_nodenom", "model.text_attention=linear_affine_nodenom"]


def load(tmp_path, *overrides):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {warmup_steps: 1}\ntrain: {max_steps: 100}\n")
    return load_config([str(path), *overrides])


def steps(cfg) -> tuple:
    return cfg.distill.stage, cfg.distill.transfer_steps, cfg.train.max_steps


def test_a_teacher_alone_runs_both_stages_with_a_quarter_of_the_steps_for_transfer(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="train.config"):
        cfg = load(tmp_path, "distill.teacher=t.safetensors")
    assert steps(cfg) == ("both", 25, 75)
    assert caplog.messages == [
        "distill: teacher given without distill.stage: running both stages, 25 steps of attention transfer then 75 "
        "of distillation (set distill.stage to choose)"
    ]
    assert steps(load(tmp_path, "distill.teacher=t", "train.max_steps=10")) == ("both", 3, 7)  # 2.5 rounds up
    assert steps(load(tmp_path, "distill.teacher=t", "train.max_steps=2")) == ("both", 1, 1)
    assert steps(load(tmp_path, "distill.teacher=t", "distill.transfer_steps=40")) == ("both", 40, 60)
    with pytest.raises(ConfigError, match=r"1 step of transfer leave none for distillation; raise train.max_steps"):
        load(tmp_path, "distill.teacher=t", "train.max_steps=1")
    with pytest.raises(ConfigError, match=r"distill.transfer_steps=-1 is out of range"):
        load(tmp_path, "distill.teacher=t", "distill.transfer_steps=-1")


def test_a_named_stage_or_no_teacher_keeps_the_config(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="train.config"):
        assert steps(load(tmp_path, "distill.teacher=t", "distill.stage=transfer")) == ("transfer", 0, 100)
        assert steps(load(tmp_path, "distill.teacher=t", "distill.stage=distill")) == ("distill", 0, 100)
        both = load(tmp_path, "distill.teacher=t", "distill.stage=both", "distill.transfer_steps=5")
        assert steps(both) == ("both", 5, 100)  # train.max_steps are stage 2's, as before
        assert steps(load(tmp_path)) == (None, 0, 100)
    assert caplog.messages == []


def test_each_stage_gets_its_share_of_the_steps(tmp_path, monkeypatch):
    """The stages are processes of their own, started from the user's arguments: the split is passed on to them."""
    cfg = load(tmp_path, "distill.teacher=t", "train.run_dir=runs/r")
    commands = []
    monkeypatch.setattr(stages, "run_stage", lambda command: commands.append(command) or 0)
    assert stages.run_both(cfg, [str(tmp_path / "c.yaml"), "distill.teacher=t", "train.run_dir=runs/r"]) == 0
    first, second = (load_config(command[3:]) for command in commands)
    assert (first.distill.stage, first.train.max_steps, first.train.run_dir) == ("transfer", 25, "runs/r/transfer")
    assert (second.distill.stage, second.train.max_steps, second.train.run_dir) == ("distill", 75, "runs/r")


def test_a_run_with_a_teacher_alone_trains_both_stages(tmp_path, synthetic, capsys):
    """4 steps: 1 of attention transfer in RUN/transfer, then 3 of distillation from it in RUN."""
    teacher = save_teacher(tmp_path / "teacher.safetensors")
    config = tiny_config(tmp_path, synthetic, optim={"warmup_steps": 0})
    assert run(config, f"distill.teacher={teacher}", *LINEAR) == 0
    assert "running both stages, 1 step of attention transfer then 3 of distillation" in capsys.readouterr().err
    first, second = tmp_path / "run" / "transfer", tmp_path / "run"
    assert [r["step"] for r in train_records(first)] == [1]
    assert all(any(k.startswith("transfer/mse/") for k in r) for r in train_records(first))
    assert [r["step"] for r in train_records(second)] == [1, 2, 3]
    saved = yaml.safe_load((second / "config.yaml").read_text())
    assert saved["distill"]["stage"] == "distill" and saved["model"]["pretrained"] == str(first)
