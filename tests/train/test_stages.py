"""train/stages.py: `distill.stage: both` runs attention transfer, then distillation from it, from one config."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.train.common import checkpoints, run, save_teacher, tiny_config, train_records, weights
from train.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_both_stages_from_one_config(tmp_path, synthetic):
    """Stage 1 in RUN/transfer (its own steps and rate, only the attention trains), stage 2 in RUN from it (the
    config's steps and rate, the whole student trains)."""
    teacher_file = save_teacher(tmp_path / "teacher.safetensors")
    config = tiny_config(tmp_path, synthetic, optim={"lr": 2e-3, "warmup_steps": 1}, train={"max_steps": 3})
    both = [
        f"distill.teacher={teacher_file}",
        "distill.stage=both",
        "distill.transfer_steps=2",
        "distill.transfer_lr=5e-3",
        "distill.transfer_warmup_steps=0",
        "model.image_attention=linear_affine_nodenom",
        "model.text_attention=linear_affine_nodenom",
    ]
    assert run(config, *both) == 0
    first, second = tmp_path / "run" / "transfer", tmp_path / "run"
    stage1 = yaml.safe_load((first / "config.yaml").read_text())
    assert stage1["distill"]["stage"] == "transfer" and stage1["optim"]["lr"] == 5e-3
    assert stage1["train"]["max_steps"] == 2 and stage1["optim"]["warmup_steps"] == 0
    assert [r["step"] for r in train_records(first)] == [1, 2]
    assert all(any(k.startswith("transfer/mse/") for k in r) for r in train_records(first))
    stage2 = yaml.safe_load((second / "config.yaml").read_text())
    assert stage2["distill"]["stage"] == "distill" and stage2["optim"]["lr"] == 2e-3
    assert stage2["model"]["pretrained"] == str(first)
    assert [r["step"] for r in train_records(second)] == [1, 2, 3]
    assert all("distill/similarity" in r for r in train_records(second))
    teacher, after1, after2 = (
        load_file(str(teacher_file)),
        weights(checkpoints(first)[-1]),
        weights(checkpoints(second)[-1]),
    )
    key = "visual.conv1.weight"
    assert torch.equal(after1[key], teacher[key]) and not torch.equal(after2[key], teacher[key])


def test_both_stages_need_a_teacher_and_transfer_steps(tmp_path, synthetic):
    config = tiny_config(tmp_path, synthetic)
    with pytest.raises(ConfigError, match=r"distill.stage=both .* needs distill.teacher and distill.transfer_steps"):
        run(config, "distill.stage=both", "distill.transfer_steps=5")
    with pytest.raises(ConfigError, match=r"distill.transfer_lr"):
        run(config, "distill.transfer_lr=-1")


def test_a_stop_signal_reaches_the_running_stage(tmp_path):
    """Slurm's warning (SIGUSR1) to the job's process goes on to the stage's process, which checkpoints and exits
    75 (here: a stand-in that exits 75 on SIGUSR1); the job then exits 75 too, to be requeued."""
    ready = tmp_path / "ready"
    child = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75)); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    job = f"import sys; from train.stages import run_stage; sys.exit(run_stage([sys.executable, '-c', {child!r}]))"
    parent = subprocess.Popen([sys.executable, "-c", job], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the stage never started"
        os.kill(parent.pid, signal.SIGUSR1)
        assert parent.wait(timeout=30) == 75
    finally:
        parent.kill()
