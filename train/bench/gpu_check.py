"""The GPU training check: the real loop (train.loop.Trainer, accelerate, DDP / FSDP) on synthetic batches, one check
in fresh processes at a time; the checks and the page of scripts/gpu_train_check.py (what it runs: its docstring).

    row = gpu_check.launch(spec, 2, timeout=600, entry=["-m", "scripts.gpu_train_check", "--worker"])
    gpu_check.worker(spec)                        # in each launched process: one rank of the check
    gpu_check.write_report(rows, out, "cuda", command)     # out/gpu_train_check.csv and .md

The import path needs neither open_clip nor webdataset: torch, accelerate, safetensors, numpy, tqdm and PyYAML are
enough.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from eval import pages
from models import ModelConfig, build_clip, gmacs_per_sample, run_folder
from models.config import resolved_size
from train.bench import fsdp_on_cpu
from train.config import OptimConfig, TrainConfig
from train.dist import StopFlag, make_accelerator, shard_model
from train.log import RunLog
from train.loop import DataStream, Trainer
from train.loss import ClipLoss
from train.optim import build_optimizer

REPO = Path(__file__).resolve().parents[2]
LOG_EVERY = 5
FIELDS = [
    "check",
    "model",
    "distributed",
    "processes",
    "device",
    "precision",
    "batch_per_gpu",
    "steps",
    "samples_per_s",
    "samples_per_s_per_gpu",
    "tflops_per_gpu",
    "max_memory_gb",
    "first_loss",
    "last_loss",
    "seconds",
    "status",
]


class SyntheticData:
    """What train.loop.DataStream reads from data.TrainData: this rank's fixed batch, repeated without end.

    images [b, 3, S, S] ~ N(0, 1); tokens [b, L]: random ids, the end-of-text id (the vocabulary's largest, where
    the text tower pools) at L/2, zeros after it."""

    def __init__(self, cfg: ModelConfig, batch: int, seed: int, pin: bool):
        size = resolved_size(cfg)
        pixels, length, vocab = (
            size["vision_cfg"]["image_size"],
            size["text_cfg"]["context_length"],
            size["text_cfg"]["vocab_size"],
        )
        g = torch.Generator().manual_seed(seed)
        images = torch.randn(batch, 3, pixels, pixels, generator=g)
        tokens = torch.zeros(batch, length, dtype=torch.long)
        tokens[:, : length // 2] = torch.randint(1, vocab - 1, (batch, length // 2), generator=g)
        tokens[:, length // 2] = vocab - 1
        if pin:  # as the DataLoader does on GPUs: the copy to the device does not block the host
            images, tokens = images.pin_memory(), tokens.pin_memory()
        self.loader = itertools.repeat((images, tokens))

    def set_epoch(self, epoch: int) -> None:
        pass

    def skipped(self) -> dict[str, int]:
        return {}

    def state_dict(self) -> dict:
        return {}


def quiet_log(cfg: TrainConfig, main: bool) -> RunLog:
    """The run's metrics.jsonl, no wandb, no progress bar."""
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    return RunLog(
        Path(cfg.run_dir),
        {},
        main=main,
        wandb_mode="disabled",
        project="",
        name=None,
        total_steps=cfg.max_steps,
        start_step=0,
        progress=False,
    )


def train_run(spec: dict) -> dict | None:
    """One check in this process (one rank of it): -> its CSV row on rank 0, None elsewhere."""
    out = Path(spec["out"])
    cfg = TrainConfig(
        run_dir=str(out / "runs" / spec["check"]),
        max_steps=spec["steps"],
        log_every=LOG_EVERY,
        save_every=0,
        keep_last=1,
        precision=spec["precision"],
        distributed=spec["distributed"],
        cpu=spec["device"] == "cpu",
        progress=False,
    )
    start = time.perf_counter()
    accelerator = make_accelerator(cfg)
    model_cfg = ModelConfig(name=spec["model"], grad_checkpointing=spec["distributed"] == "fsdp")
    model = build_clip(model_cfg)
    gmacs = gmacs_per_sample(model)["gmacs_per_sample"]
    if accelerator.distributed_type.name == "FSDP":
        model = shard_model(model, cfg, accelerator.device.type)
    cuda = accelerator.device.type == "cuda"
    optimizer, schedule = build_optimizer(model, OptimConfig(lr=1e-4, warmup_steps=2), spec["steps"])
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    data = SyntheticData(model_cfg, spec["batch"], seed=accelerator.process_index, pin=cuda)
    log = quiet_log(cfg, accelerator.is_main_process)
    config = {"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(cfg)}
    stop = StopFlag()
    try:
        Trainer(
            accelerator,
            model,
            optimizer,
            schedule,
            ClipLoss(),
            DataStream(data, accelerator.device),
            cfg,
            log,
            config,
            clip_norm=1.0,
            gmacs_per_sample=gmacs,
        ).run(stop)
    finally:
        stop.restore()
    accelerator.wait_for_everyone()  # ranks tear the process group down together (gloo aborts a rank that leaves early)
    accelerator.end_training()
    if not accelerator.is_main_process:
        return None
    metrics = Path(cfg.run_dir) / run_folder.METRICS
    return summarise(spec, metrics, accelerator.num_processes, time.perf_counter() - start)


def summarise(spec: dict, metrics: Path, processes: int, seconds: float) -> dict:
    """A CSV row from the run's metrics.jsonl: speed from the logging intervals after the first."""
    lines = metrics.read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "loss" in r]  # not the end-of-run summary
    steady = records[1:] or records

    def mean(key: str) -> float | str:
        values = [r[key] for r in steady if r.get(key) is not None]
        return float(f"{statistics.fmean(values):.4g}") if values else ""

    return {
        **{k: spec[k] for k in ("check", "model", "distributed", "device", "precision", "steps")},
        "processes": processes,
        "batch_per_gpu": spec["batch"],
        "samples_per_s": mean("samples_per_s"),
        "samples_per_s_per_gpu": mean("samples_per_s_per_gpu"),
        "tflops_per_gpu": mean("tflops_per_gpu"),
        "max_memory_gb": round(records[-1]["max_memory_gb"], 2) if "max_memory_gb" in records[-1] else "",
        "first_loss": round(records[0]["loss"], 4),
        "last_loss": round(records[-1]["loss"], 4),
        "seconds": round(seconds, 1),
        "status": "ok",
    }


def worker(spec: dict) -> None:
    """One rank of a check, in a process `launch` started: rank 0 writes its row to out/rows/<check>.json."""
    if spec["device"] == "cpu":  # FSDP through the hook accelerate needs on the CPU (train/bench/fsdp_on_cpu.py)
        fsdp_on_cpu.install()
    row = train_run(spec)
    if row is not None:
        (Path(spec["out"]) / "rows").mkdir(parents=True, exist_ok=True)
        (Path(spec["out"]) / "rows" / f"{spec['check']}.json").write_text(json.dumps(row))


def launch(spec: dict, processes: int, timeout: float, entry: list[str]) -> dict:
    """Run one check in fresh processes (torchrun for several), each `python ENTRY SPEC-JSON` (the entry point's
    arguments up to the spec, ending in its worker flag); returns its row, or a failed row with the error."""
    worker = [*entry, json.dumps(spec)]
    command = [sys.executable, *(["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"])]
    command = command + worker if processes > 1 else [sys.executable, *worker]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if spec["device"] == "cpu":  # CPU ranks never share a GPU
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    row_file = Path(spec["out"]) / "rows" / f"{spec['check']}.json"
    if done.returncode != 0 or not row_file.is_file():
        lines = [line for line in done.stderr.strip().splitlines() if line.strip("= ")] or ["no output"]
        last = next((line for line in reversed(lines) if "Error" in line), lines[-1])  # not torchrun's banner
        print("\n".join(lines[-80:]), file=sys.stderr)
        print(f"{spec['check']}: failed with exit code {done.returncode}: {last}", file=sys.stderr)
        return {**spec, "processes": processes, "status": f"failed ({done.returncode}): {last[:200]}"}
    return json.loads(row_file.read_text())


def write_report(rows: list[dict], out: Path, device: str, command: str) -> Path:
    """DIR/gpu_train_check.csv and .md; returns the .md. command: what ran, as the page's header shows it."""
    with open(out / "gpu_train_check.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        pages.header("GPU training check", command, device),
        f"Torch {torch.__version__}. Synthetic batches; speed from the logging intervals after the first; "
        "TFLOP/s = 6 x GMACs x samples/s.",
        "",
        "| " + " | ".join(FIELDS) + " |",
        "| " + " | ".join("---" for _ in FIELDS) + " |",
    ]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in FIELDS) + " |" for r in rows]
    (out / "gpu_train_check.md").write_text("\n".join(lines) + "\n")
    return out / "gpu_train_check.md"
