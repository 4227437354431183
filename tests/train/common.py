"""Helpers of the training tests: a tiny config on the session's synthetic data, in-process and CLI runs."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.state import AcceleratorState, GradientState
from safetensors.torch import load_file, save_file

import models
from train.main import main

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node",
    "2",
]  # two gloo processes


def tiny_config(tmp_path: Path, synthetic: dict, **sections) -> Path:
    """A YAML config of tiny-s on the synthetic shards (batch 16, fp32, CPU, no eval), updated per section.

    train.cpu=true: on a GPU machine too these runs are compared with CPU runs; GPU tests override it."""
    cfg = {
        "model": {"name": "tiny-s"},
        "data": {"train_shards": synthetic["train"], "batch_size": 16, "workers": 0, "shuffle_buffer": 64},
        "optim": {"lr": 1.0e-3, "warmup_steps": 2},
        "train": {
            "run_dir": str(tmp_path / "run"),
            "max_steps": 4,
            "log_every": 1,
            "save_every": 0,
            "progress": False,
            "wandb": "disabled",
            "augment": False,
            "cpu": True,
        },
        "eval": {"dataset": None},
    }
    for section, values in sections.items():
        cfg[section].update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextlib.contextmanager
def s3_filesystem(endpoint: str, **env: str):
    """The s3fs file system of a moto S3 server at `endpoint` with test credentials (and `env` on top), its bucket
    `runs` made; s3fs's cached instances are dropped on the way in and out."""
    settings = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        **env,
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in settings.items():
            patch.setenv(key, value)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        if not fs.exists("runs"):
            fs.mkdir("runs")
        yield fs
        s3fs.S3FileSystem.clear_instance_cache()


def save_teacher(path: Path) -> Path:
    """A tiny-s softmax CLIP (seed 0) saved as safetensors at `path`: the teacher of the distillation tests."""
    torch.manual_seed(0)
    teacher = models.create_model("tiny-s")
    save_file({k: v.contiguous() for k, v in teacher.state_dict().items()}, str(path))
    return path


def poison_steps(monkeypatch, steps: set[int]) -> None:
    """Fault injection for in-process runs: the loss of these optimizer steps (1-based, one micro-batch a step)
    is multiplied by NaN before the backward pass, so its gradients are NaN too."""
    import train.main

    real = train.main.build_loss

    def build(name: str, **kwargs):
        loss_fn, calls = real(name, **kwargs), [0]

        def poisoned(*args):
            calls[0] += 1
            loss = loss_fn(*args)
            return loss * float("nan") if calls[0] in steps else loss

        return poisoned

    monkeypatch.setattr(train.main, "build_loss", build)


def run(config: Path, *overrides: str) -> int:
    """main() in this process, from a fresh accelerate state (as `python -m train` starts)."""
    reset_accelerate()
    return main([str(config), *overrides])


def reset_accelerate() -> None:
    """Forget accelerate's process-wide state: it outlives an Accelerator and refuses other settings (another
    precision) in the next one, so in-process runs reset it; production runs one Accelerator per process."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def cli(
    args: list[str], *, env: dict | None = None, launcher: list[str] | None = None, module: str = "train", **kwargs
) -> subprocess.Popen:
    """`python -m MODULE ARGS` (or under a launcher such as torchrun) in a subprocess, from the repo root.

    MODULE is `train`, or an entry that wraps it with a test hook (scripts.fsdp_on_cpu, tests.train.crash_in_save).
    On the CPU unless ARGS say train.cpu=false (see `popen`)."""
    command = (launcher or [sys.executable]) + ["-m", module, *args]
    return popen(command, env=env, gpu="train.cpu=false" in args, **kwargs)


def popen(command: list[str], *, env: dict | None = None, gpu: bool = False, **kwargs) -> subprocess.Popen:
    """A subprocess from the repo root, in its own process group, with this checkout first on the path.

    Without `gpu` it sees no GPU (CUDA_VISIBLE_DEVICES=""): on a GPU machine two CPU ranks would otherwise
    both map to cuda:0, and a CPU test would silently train on the GPU."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    if not gpu:
        full_env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.Popen(
        command,
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a subprocess; killed (with its children, via its process group) on timeout."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s: {err[-3000:]}") from None
    return proc.returncode, out, err


def torchrun(args: list[str], *, module: str = "train", timeout: float = 240) -> None:
    """`python -m MODULE ARGS` on two gloo processes (TORCHRUN); fails the test with the end of its stderr unless
    it exits 0."""
    code, _, err = finish(cli(args, launcher=TORCHRUN, module=module), timeout=timeout)
    assert code == 0, err[-3000:]


def metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def train_records(run_dir: Path) -> list[dict]:
    """The per-step lines of metrics.jsonl (not the eval lines)."""
    return [r for r in metrics(run_dir) if "loss" in r]


def checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    return sorted(p for p in root.iterdir() if p.name.startswith("step_")) if root.is_dir() else []


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)
