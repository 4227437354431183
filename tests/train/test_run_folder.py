"""A run without train.run_dir gets a folder of its own, named from the config, the attentions and the time; every
run says its folder at its start and its end (issue 49)."""

import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.train.common import run, tiny_config
from train import stages
from train.config import ConfigError, load_config, name_run_dir
from train.config import default_run_dir as named

NOON = datetime(2024, 1, 2, 12, 0, 5)


def config_without_run_dir(tmp_path: Path, synthetic: dict, name: str = "exp", **train) -> Path:
    path = tiny_config(tmp_path, synthetic, train=train)
    raw = yaml.safe_load(path.read_text())
    del raw["train"]["run_dir"]
    out = tmp_path / f"{name}.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def test_the_default_folder_is_named_from_config_attentions_and_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text("model: {image_attention: linear_elu, text_attention: softmax}\n")
    cfg = load_config(["exp.yaml"])
    assert cfg.train.run_dir is None
    assert named(cfg, "exp.yaml", NOON) == "runs/exp-linear_elu-softmax-20240102-120005"
    (tmp_path / "runs" / "exp-linear_elu-softmax-20240102-120005").mkdir(parents=True)
    assert named(cfg, "exp.yaml", NOON) == "runs/exp-linear_elu-softmax-20240102-120005-2"
    cfg.model.image_attention = ["softmax", "linear_elu", "softmax"]
    assert named(cfg, "sub/exp.yaml", NOON) == "runs/exp-softmax+linear_elu-softmax-20240102-120005"


def test_a_given_folder_is_kept_and_several_processes_need_one(tmp_path):
    (tmp_path / "exp.yaml").write_text("train: {max_steps: 3}\n")
    cfg = load_config([str(tmp_path / "exp.yaml"), "train.run_dir=runs/mine"])
    name_run_dir(cfg, "exp.yaml", world_size=2)
    assert cfg.train.run_dir == "runs/mine"
    cfg = load_config([str(tmp_path / "exp.yaml")])
    with pytest.raises(ConfigError, match=r"train.run_dir is not set and this run has 2 processes"):
        name_run_dir(cfg, "exp.yaml", world_size=2)


def test_two_runs_without_run_dir_get_two_folders(tmp_path, synthetic, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = config_without_run_dir(tmp_path, synthetic, max_steps=1)
    assert run(config) == 0
    assert run(config) == 0
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(f.name.startswith("exp-softmax-softmax-20") for f in folders)
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if line.startswith("run folder: ")]
    assert said == [f"run folder: runs/{f.name}" for f in folders for _ in range(2)]
    done = [i for i, line in enumerate(lines) if line.startswith("done at step 1 ")]
    assert [i - 1 for i, line in enumerate(lines) if line in said][1::2] == done  # the end: right after the done line
    for folder in folders:
        saved = yaml.safe_load((folder / "config.yaml").read_text())
        assert saved["train"]["run_dir"] == f"runs/{folder.name}"
        assert (folder / "checkpoints" / "step_00000001").is_dir()


def test_both_stages_share_the_folder_the_parent_named(tmp_path, monkeypatch):
    """The stages run as processes of their own: each gets the parent's folder as an override, not a new name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(
        "distill: {teacher: teacher.safetensors, stage: both, transfer_steps: 2}\ntrain: {max_steps: 3}\n"
    )
    cfg = load_config(["exp.yaml"])
    name_run_dir(cfg, "exp.yaml", world_size=1)
    commands = []
    monkeypatch.setattr(stages, "run_stage", lambda command: commands.append(command) or 0)
    assert stages.run_both(cfg, ["exp.yaml"]) == 0
    children = [load_config(command[3:]) for command in commands]
    assert [c.train.run_dir for c in children] == [f"{cfg.train.run_dir}/transfer", cfg.train.run_dir]
    assert [c.distill.stage for c in children] == ["transfer", "distill"]
    assert all(command[:3] == [sys.executable, "-m", "train"] for command in commands)
