"""Cooldown branches: a new run that starts from a checkpoint of another (constant learning-rate) run.

One long constant-LR run yields a point of the scaling curve at every length T it passes: a branch loads the
constant run's checkpoint at step T - C (model, optimizer, scheduler, RNG and data position) and trains to
train.max_steps = T with optim.schedule=const-cooldown, the last C steps cooling down (Hägele et al. 2024,
"Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations", sec. 3):

    python -m train configs/tiny.yaml optim.schedule=constant train.max_steps=320 train.keep_steps=[160,240] \\
        train.run_dir=runs/const
    python -m train configs/tiny.yaml optim.schedule=const-cooldown optim.cooldown_steps=40 train.max_steps=200 \\
        train.branch_from=runs/const/checkpoints/step_00000160 train.run_dir=runs/const-cooldown200

The step counter and samples seen continue from the checkpoint. A requeued or rerun branch resumes from its
own newest checkpoint (train.resume=auto), never from the parent again.
"""

from __future__ import annotations

import math
from pathlib import Path

from models.run_folder import CheckpointError
from train.checkpoint import problem, read_meta, resolve
from train.config import Config, ConfigError, OptimConfig, to_dict
from train.optim import lr_multiplier, schedule_arguments
from train.storage import RunStorage

# what a branch may change in the optim section: how the schedule ends, nothing else
SCHEDULE_KEYS = {"schedule", "cooldown_shape", "cooldown_fraction", "cooldown_steps", "min_lr_ratio"}


def starting_point(cfg: Config, storage: RunStorage, accelerator=None) -> tuple[Path | None, bool]:
    """(the checkpoint folder to load or None, whether it is another run's branch point); raises ConfigError."""
    if cfg.train.branch_from and cfg.train.resume not in ("auto", "none"):
        raise ConfigError(
            f"train.branch_from={cfg.train.branch_from} and train.resume={cfg.train.resume} both name a checkpoint "
            "to start from; keep one"
        )
    try:
        own = resolve(cfg.train.resume, storage, accelerator)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    if not cfg.train.branch_from or own is not None:
        return own, False
    parent = Path(cfg.train.branch_from)
    check_parent(parent)
    check_branch(cfg, read_meta(parent))
    return parent, True


def check_parent(folder: Path) -> None:
    """A loadable checkpoint folder, not a run directory or anything else."""
    if (folder / "checkpoints").is_dir():
        raise ConfigError(
            f"train.branch_from={folder} is a run directory; name one of its checkpoints, "
            f"e.g. train.branch_from={folder / 'checkpoints' / 'step_00001000'}"
        )
    reason = problem(folder) if folder.is_dir() else "no such folder"
    if reason:
        raise ConfigError(
            f"train.branch_from={folder} is not a loadable checkpoint ({reason}); point it at a step_* folder"
        )


def check_branch(cfg: Config, meta: dict) -> None:
    """The branch continues the parent's training: the same model and optimizer settings, a step before
    train.max_steps, and the same learning rate at the branch point (so the cooldown starts at or after it)."""
    step, parent = meta["step"], meta["config"]
    if step >= cfg.train.max_steps:
        raise ConfigError(
            f"train.branch_from is at step {step}, not before train.max_steps={cfg.train.max_steps}; "
            "raise train.max_steps or branch from an earlier checkpoint"
        )
    mine = to_dict(cfg)
    for section, free in (("model", {"pretrained", "text_pos_keep", "pretrained_fresh"}), ("optim", SCHEDULE_KEYS)):
        ours, theirs = mine[section], parent[section]
        changed = sorted(k for k in (ours.keys() & theirs.keys()) - free if ours[k] != theirs[k])
        if changed:
            values = ", ".join(f"{section}.{k}={theirs[k]!r}" for k in changed)
            raise ConfigError(
                f"train.branch_from: the parent run has {values}; a branch keeps the parent's model and optimizer "
                f"and may change only optim.{', optim.'.join(sorted(SCHEDULE_KEYS))}"
            )
    parent_optim = OptimConfig(**{k: v for k, v in parent["optim"].items() if k in mine["optim"]})
    before = lr_multiplier(step, **schedule_arguments(parent_optim, parent["train"]["max_steps"]))
    after = lr_multiplier(step, **schedule_arguments(cfg.optim, cfg.train.max_steps))
    if not math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-12):
        raise ConfigError(
            f"train.branch_from: at the branch point (step {step}) the learning rate is {before:.4g} x optim.lr in "
            f"the parent run (optim.schedule={parent_optim.schedule}) but {after:.4g} x in this one; branch from a "
            "constant-LR run's checkpoint at or before the start of this run's cooldown"
        )
