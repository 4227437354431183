"""Both linearisation stages from one config: `distill.stage: both` runs stage 1 (attention transfer), then stage 2
(distillation) from its result, one `python -m train` process after the other (issue 24).

    distill: {teacher: open_clip:ViT-B-16:laion400m_e32, stage: both, transfer_steps: 2000, transfer_lr: 1.0e-3}
    train: {run_dir: runs/vit_b16_linearise, max_steps: 10000}    # stage 2's steps; optim: stage 2's rate

Stage 1 trains in RUN_DIR/transfer for distill.transfer_steps steps at distill.transfer_lr (optim.lr when unset)
with distill.transfer_warmup_steps of warm-up, without activation checkpointing (it feeds each layer the teacher's
hidden states); stage 2 trains in RUN_DIR with `model.pretrained: RUN_DIR/transfer` and every other setting of the
config. Both stages get the parent's run folder and steps as overrides (`pinned`): a null train.run_dir is named
once, by the parent, and so is the default split of train.max_steps when a teacher comes without distill.stage.
Each stage is an ordinary run, with its own checkpoints, resume and summary: a job that is stopped and requeued
(exit code 75) resumes the stage it was in, and a finished stage 1 has nothing to do.

Why one process per stage, not both in one: accelerate keeps one state per process and tears the process group down
at the end of a run, and DDP (and FSDP) wrap the parameters that train when the model is wrapped, which differ
between the stages. Under torchrun or srun each rank runs the stages in turn; its child inherits the rank's
environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), so the children of all ranks form the job's process group, once
per stage. SIGTERM and SIGUSR1 (pre-emption, Slurm's warning) are passed on to the running stage.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys

from train.config import Config

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
log = logging.getLogger(__name__)


def stage_overrides(cfg: Config) -> list[list[str]]:
    """The overrides that turn the config into stage 1, then stage 2 (applied after the user's own)."""
    d, run_dir = cfg.distill, str(cfg.train.run_dir).rstrip("/")
    transfer_dir = f"{run_dir}/transfer"
    stage1 = [
        "distill.stage=transfer",
        f"train.max_steps={d.transfer_steps}",
        f"optim.lr={d.transfer_lr if d.transfer_lr is not None else cfg.optim.lr}",
        f"train.run_dir={transfer_dir}",
        "model.grad_checkpointing=false",
    ]
    if d.transfer_warmup_steps is not None:
        stage1.append(f"optim.warmup_steps={d.transfer_warmup_steps}")
    if cfg.train.stage_dir:
        stage1.append(f"train.stage_dir={str(cfg.train.stage_dir).rstrip('/')}/transfer")
    stage2 = ["distill.stage=distill", f"model.pretrained={transfer_dir}"]
    return [stage1, stage2]


def pinned(cfg: Config) -> list[str]:
    """What the parent resolved, as overrides for both stages, which would otherwise resolve it again: the run folder
    (a null train.run_dir is named from the time) and the steps of each stage (a teacher without distill.stage splits
    train.max_steps, config.default_stages). The folder JSON-quoted, so any path reads back as the same string."""
    return [
        f"train.run_dir={json.dumps(str(cfg.train.run_dir))}",
        "distill.stage=both",
        f"distill.transfer_steps={cfg.distill.transfer_steps}",
        f"train.max_steps={cfg.train.max_steps}",
    ]


def run_stage(command: list[str]) -> int:
    """Run one stage as a child process, passing SIGTERM/SIGUSR1 on to it; its exit code."""
    child = subprocess.Popen(command)
    previous = {sig: signal.signal(sig, lambda signum, frame: child.send_signal(signum)) for sig in SIGNALS}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_both(cfg: Config, argv: list[str]) -> int:
    """Stage 1, then (if it finished) stage 2; the first non-zero exit code stops it (75: requeue and resume)."""
    log.info("run folder: %s (stage 1 in its transfer/)", cfg.train.run_dir)
    for number, extra in enumerate(stage_overrides(cfg), start=1):
        log.info("linearisation stage %d of 2: %s", number, " ".join(extra))
        code = run_stage([sys.executable, "-m", "train", *argv, *pinned(cfg), *extra])
        if code != 0:
            return code
    log.info("run folder: %s", cfg.train.run_dir)
    return 0
