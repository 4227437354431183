"""Checkpoints that are either complete or invisible, and resuming from the newest complete one.

Layout of RUN/checkpoints/:

    step_00000100/
        model.safetensors   the unwrapped, uncompiled CLIP state dict (open_clip key names)
        meta.json           {"step", "samples_seen", "epoch", "config"}; written last
        state/              accelerate's save_state: model, optimizer, scheduler, scaler, RNG of every rank
        data_state_<rank>.json   the data-stream position of each rank
    latest                  text file: the folder name of the newest complete checkpoint

Everything is written into `.tmp_step_00000100/` and renamed at the end, so a crash or `kill -9` during
the write leaves only a `.tmp_*` folder that resume ignores. Loading never unpickles code: the model is
safetensors, and accelerate 1.15's `load_state` calls `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_file, save_file

from train.dist import sum_over_ranks

STEP_DIR = re.compile(r"^step_(\d{8})$")
# present under DDP and FSDP alike (FSDP stores the model and optimizer as sharded folders instead)
REQUIRED = ("meta.json", "model.safetensors", "data_state_0.json", "state/scheduler.bin", "state/random_states_0.pkl")
CRASH_HOOK = "CLIP_TRAIN_CRASH_IN_SAVE"  # test hook: os._exit inside the write of the checkpoint at this step


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def save_checkpoint(
    accelerator: Accelerator, model, run_dir: Path, meta: dict, data_state: dict, keep_last: int, keep_steps=()
) -> Path:
    """Write a complete checkpoint for meta["step"] (call on every rank); returns its folder.
    Checkpoints of `keep_steps` are never pruned (branch points of cooldown runs)."""
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / step_name(meta["step"]), root / f".tmp_{step_name(meta['step'])}"
    state_dict = unwrapped_state_dict(accelerator, model)  # collective under FSDP: the full dict lands on rank 0
    broken = accelerator.is_main_process and not all(
        torch.isfinite(t).all() for t in state_dict.values() if t.is_floating_point()
    )
    if sum_over_ranks(accelerator, {"broken": int(broken)})["broken"]:  # every rank raises, none waits forever
        raise RuntimeError(f"refusing to write checkpoint {final.name}: the model holds NaN or Inf weights")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "state"), safe_serialization=True)
    write_json(tmp / f"data_state_{accelerator.process_index}.json", data_state)
    if accelerator.is_main_process:
        save_file(state_dict, str(tmp / "model.safetensors"))
        if os.environ.get(CRASH_HOOK) == str(meta["step"]):
            os._exit(9)
        write_json(tmp / "meta.json", meta)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        fsync_tree(tmp)  # the rename must not make visible files that a power loss could still lose
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_text_atomic(root / "latest", final.name)
        prune(root, keep_last, keep_steps)
    accelerator.wait_for_everyone()
    return final


def unwrapped_state_dict(accelerator: Accelerator, model) -> dict[str, torch.Tensor]:
    """The plain CLIP state dict on rank 0 (full even under FSDP), without DDP/compile prefixes."""
    state = accelerator.get_state_dict(model)
    return {k.replace("_orig_mod.", ""): v.detach().cpu().contiguous() for k, v in (state or {}).items()}


def write_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


def fsync_tree(folder: Path) -> None:
    for path in [*sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prune(root: Path, keep_last: int, keep_steps=()) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (not counting those of `keep_steps`, which stay),
    and temporary folders left by crashes."""
    kept = {step_name(step) for step in keep_steps}
    steps = sorted(p for p in root.iterdir() if STEP_DIR.match(p.name) and p.name not in kept)
    stale = [p for p in root.iterdir() if p.name.startswith(".tmp_step_")]
    for old in steps[: max(0, len(steps) - keep_last)] + stale:
        shutil.rmtree(old, ignore_errors=True)


def problem(folder: Path) -> str | None:
    """Why `folder` is not a loadable checkpoint, or None when it is complete and sound."""
    missing = [name for name in REQUIRED if not (folder / name).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if not isinstance(meta.get("step"), int):
            return "meta.json has no integer step"
        weights = load_file(str(folder / "model.safetensors"))
    except Exception as e:  # a truncated or garbled file raises many kinds of errors
        return f"unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    if not weights:
        return "model.safetensors is empty"
    return None


def find_resume(run_dir: Path) -> Path | None:
    """The newest complete checkpoint in RUN/checkpoints; incomplete or corrupt ones are reported and skipped."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    candidates = sorted((p for p in root.iterdir() if STEP_DIR.match(p.name)), reverse=True)
    for folder in candidates:
        reason = problem(folder)
        if reason is None:
            return folder
        warnings.warn(f"skipping checkpoint {folder}: {reason}", stacklevel=2)
    return None


def resolve(resume: str, run_dir: Path) -> Path | None:
    """train.resume (auto | none | PATH) -> the checkpoint folder to load, or None to start fresh."""
    if resume == "none":
        return None
    if resume == "auto":
        return find_resume(run_dir)
    folder = Path(resume)
    reason = problem(folder) if folder.is_dir() else "no such folder"
    if reason:
        raise ValueError(
            f"train.resume={resume} is not a loadable checkpoint ({reason}); "
            "point it at a step_* folder or use train.resume=auto"
        )
    return folder


def read_meta(folder: Path) -> dict:
    return json.loads((Path(folder) / "meta.json").read_text())


def load_checkpoint(accelerator: Accelerator, folder: Path) -> tuple[dict, dict]:
    """Restore model, optimizer, scheduler, scaler and RNG from `folder`; returns (meta, this rank's data state)."""
    accelerator.load_state(str(folder / "state"))
    meta = read_meta(folder)
    # a rank that did not exist when the checkpoint was written continues from rank 0's position (approximately)
    data_file = folder / f"data_state_{accelerator.process_index}.json"
    data_state = json.loads((data_file if data_file.is_file() else folder / "data_state_0.json").read_text())
    return meta, data_state
