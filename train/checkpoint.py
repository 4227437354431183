"""Saving training checkpoints and resuming from them; the layout and what "complete" means are models/run_folder.py's.

Save: every rank writes into `checkpoints/.tmp_step_X/` (accelerate's `save_state`, its data position), rank 0
the model and meta.json; rank 0 then finishes the folder (manifest with every file's SHA-256, fsync, rename,
`latest`), prunes old ones and, for a remote run directory, uploads it (train/storage.py). A crash or kill -9
during the write leaves only a `.tmp_*` folder that resume ignores and the next save deletes. Storage that refuses
a write (full, over quota or the file-size limit, failing) stops the run on every rank with one line that names
the file, the cause and the checkpoint kept; the `.tmp_*` folder is removed. A failed upload is a warning and the
checkpoint stays local until one is uploaded; train.max_failed_uploads of them in a row stop the run on every rank
with one line (train/storage.py).

Resume: rank 0 picks the checkpoint (`train.resume` auto | none | PATH | URL; auto = the newest that passes
`models.run_folder.check`, each one skipped reported in one line that names the file) and tells the other ranks;
every rank then loads it. Nothing runs code from a file: the model is safetensors, accelerate 1.15 loads the
rest with `torch.load(weights_only=True)`, the manifest check refuses a replaced file before that, and the
pickles that FSDP's sharded state is read through are checked to hold only their own types (on every rank, again
just before the load). A random-state file that is missing, bad or not applied is a warning: the run resumes with
fresh random numbers.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import SAFE_WEIGHTS_NAME, broadcast_object_list, gather_object
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException

from models import run_folder
from models.run_folder import META, MODEL, STATE, CheckpointError, is_url, read_meta  # noqa: F401 - read_meta: API
from train.dist import sum_over_ranks
from train.storage import RunStorage, UploadError

UPLOADS = "uploads: "  # marks an UploadError's line among the failures that the ranks exchange


def save_checkpoint(
    accelerator: Accelerator,
    model,
    storage: RunStorage | Path,
    meta: dict,
    data_state: dict,
    keep_last: int,
    keep_steps=(),
    weights: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write a complete checkpoint for meta["step"] (call on every rank); returns its local folder.
    Checkpoints of `keep_steps` are never pruned (branch points of cooldown runs). `weights`: more safetensors files
    rank 0 writes, by name (models.run_folder.EMA: train/ema.py's state_dict, {} on the other ranks). Storage that
    refuses a write (full, over quota, over the file-size limit, failing) raises CheckpointWriteError on every rank,
    after the temporary folder is removed."""
    storage = storage if isinstance(storage, RunStorage) else RunStorage.of(str(storage))
    tmp = run_folder.tmp_folder(storage.local, meta["step"])
    name = run_folder.step_name(meta["step"])
    state_dict = unwrapped_state_dict(accelerator, model)  # collective under FSDP: the full dict lands on rank 0
    broken = accelerator.is_main_process and not all(
        torch.isfinite(t).all() for t in state_dict.values() if t.is_floating_point()
    )
    if sum_over_ranks(accelerator, {"broken": int(broken)})["broken"]:  # every rank raises, none waits forever
        raise RuntimeError(f"refusing to write checkpoint {name}: the model holds NaN or Inf weights")
    main = accelerator.is_main_process
    # three stages, each ended by all ranks together (in place of a barrier), so that a failed write stops all alike
    together(accelerator, tmp, lambda: main and empty_folder(tmp))
    files = {MODEL: state_dict, **(weights or {})}
    together(accelerator, tmp, lambda: write_files(accelerator, tmp, files, meta, data_state))
    together(accelerator, tmp, lambda: main and complete(storage, tmp, keep_last, keep_steps))
    return tmp.with_name(name)


def empty_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def write_files(accelerator: Accelerator, tmp: Path, files: dict[str, dict], meta: dict, data_state: dict) -> None:
    """This rank's files of the checkpoint in `tmp`: accelerate's state and data position; rank 0 also the model
    (and any other weights: `files`, state dicts by file name) and meta.json."""
    try:
        accelerator.save_state(str(tmp / STATE), safe_serialization=True)  # its errors name no file: newest_file
    except SafetensorError as e:  # safetensors removes a file it fails to write: accelerate's only such file
        e.filename = str(tmp / STATE / SAFE_WEIGHTS_NAME)
        raise
    run_folder.write_json(tmp / run_folder.data_state_name(accelerator.process_index), data_state)
    if accelerator.is_main_process:
        for name, state_dict in files.items():
            try:
                save_file(state_dict, str(tmp / name))
            except (OSError, SafetensorError) as e:
                e.filename = getattr(e, "filename", None) or str(tmp / name)
                raise
        run_folder.write_json(tmp / META, meta)


def complete(storage: RunStorage, tmp: Path, keep_last: int, keep_steps) -> None:
    """Rank 0, once every file is written: finish the folder, prune the old ones or upload a remote run's."""
    final = run_folder.finish(tmp)
    if storage.remote:
        upload(storage, final, keep_last, keep_steps)
    else:
        run_folder.prune(storage.local, keep_last, keep=final, keep_steps=keep_steps)


class CheckpointWriteError(CheckpointError):
    """The storage refused a checkpoint's write; the message names the file, the cause and the checkpoint kept."""


def together(accelerator: Accelerator, tmp: Path, write) -> None:
    """Run this rank's part of a checkpoint write, then wait for every rank's. A storage failure on any rank
    removes `tmp` and raises CheckpointWriteError on every rank (other errors propagate as they are)."""
    failure = None
    try:
        write()
    except UploadError as e:  # the checkpoint is written and kept: the line is complete as it is
        failure = f"{UPLOADS}{e}"
    except (OSError, RuntimeError, SafetensorError, CheckpointException) as e:
        cause = write_failure(e)
        if cause is None:
            raise
        failure = f"{cause} (writing {getattr(e, 'filename', None) or newest_file(tmp) or tmp})"
    if accelerator.num_processes > 1:
        failure = next((f for f in gather_object([failure]) if f), None)
    if failure is None:
        return
    if failure.startswith(UPLOADS):
        raise UploadError(failure.removeprefix(UPLOADS))
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    # the manifest is written last: the newest folder with one is the newest complete checkpoint as written
    kept = next(
        (p.name for p in run_folder.step_folders(tmp.parent.parent) if (p / run_folder.MANIFEST).is_file()), None
    )
    name = tmp.name.removeprefix(run_folder.TMP_PREFIX)
    if kept == name:  # complete and renamed (models.run_folder.finish): what failed is the `latest` file after it
        cause, latest = failure.split(" (writing ", 1)[0], tmp.parent / run_folder.LATEST
        raise CheckpointWriteError(f"checkpoint {name} written, but not {latest}: {cause}; a rerun resumes from {name}")
    raise CheckpointWriteError(
        f"checkpoint {name} not written: {failure}; its partial folder is "
        "removed; kept checkpoint: " + (f"{kept} (a rerun resumes from it)" if kept else "none (a rerun starts afresh)")
    )


STORAGE_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large (over the file-size limit, ulimit -f)",
}
# torch.save's C++ writer keeps no errno: a short write is "unexpected pos ..." from inline_container.cc
TORCH_WRITE_FAILED = re.compile(r"inline_container|PytorchStreamWriter|cannot be opened")


def write_failure(e: BaseException) -> str | None:
    """The cause of a failed checkpoint write when the storage refused it, in words; None for any other error."""
    if isinstance(e, CheckpointException):  # torch.distributed.checkpoint (FSDP): the failures of all ranks
        causes = [write_failure(error) for error, _ in e.failures.values()]
        return next((c for c in causes if c), None)
    code = e.errno if isinstance(e, OSError) else None
    if isinstance(e, SafetensorError):  # the OS error is in its text: "I/O error: File too large (os error 27)"
        found = re.search(r"os error (\d+)|Os \{ code: (\d+)", str(e))
        code = int(found[1] or found[2]) if found else None
    elif isinstance(e, RuntimeError) and not TORCH_WRITE_FAILED.search(str(e)):
        return None
    if code is None:
        return (
            run_folder.first_line(e) if isinstance(e, OSError) else "the write failed (disk full or file-size limit?)"
        )
    return STORAGE_CAUSES.get(code) or os.strerror(code).lower()


def newest_file(folder: Path) -> Path | None:
    """The file written last under `folder`: the one that accelerate's save_state was writing when it failed
    (its errors name none). File times tick coarsely (a few ms): of two as new, the later inode is the newer file."""
    files = [p for p in Path(folder).rglob("*") if p.is_file()] if Path(folder).is_dir() else []
    return max(files, key=lambda p: (p.stat().st_mtime_ns, p.stat().st_ino), default=None)


def upload(storage: RunStorage, folder: Path, keep_last: int, keep_steps=()) -> None:
    """Upload a finished checkpoint (and those an earlier failure kept local), then the run's files; the staging
    folder keeps the checkpoints not uploaded yet, or the newest. A failure after train.storage_retry_s is a
    warning (the next save uploads the newest again); train.max_failed_uploads in a row raise UploadError."""
    try:
        storage.upload_checkpoint(folder, keep_last, keep_steps)
        failure = None
    except Exception as e:  # network and credential errors of any fsspec back end
        failure = run_folder.first_line(e)
    pending = storage.pending()  # each a save whose upload failed, the newest first: the failures in a row
    run_folder.prune(storage.local, max(1, len(pending)), keep=folder)
    if failure and pending:
        names = ", ".join(p.name for p in reversed(pending))
        if len(pending) >= storage.max_failed_uploads:
            raise UploadError(
                f"{len(pending)} uploads in a row to {storage.remote} failed (train.max_failed_uploads="
                f"{storage.max_failed_uploads}), the last after retrying for train.storage_retry_s="
                f"{storage.retry_s:g} s: {failure}; checkpoints kept locally in {folder.parent}: {names}; rerun the "
                f"same command once the storage is reachable (it resumes from {pending[0].name} and uploads it)"
            )
        run_folder.warn(
            f"upload of {folder.name} to {storage.remote} failed ({failure}); it is kept in {folder} and "
            f"uploaded with the next checkpoint ({len(pending)} of train.max_failed_uploads="
            f"{storage.max_failed_uploads} in a row)"
        )
    elif failure:
        run_folder.warn(f"upload to {storage.remote} failed after {folder.name} was uploaded ({failure})")
    storage.upload_run_files()


def unwrapped_state_dict(accelerator: Accelerator, model) -> dict[str, torch.Tensor]:
    """The plain CLIP state dict on rank 0 (full even under FSDP), without DDP/compile prefixes."""
    state = accelerator.get_state_dict(model)
    return {k.replace("_orig_mod.", ""): v.detach().cpu().contiguous() for k, v in (state or {}).items()}


def pick(resume: str, storage: RunStorage) -> Path | None:
    """train.resume (auto | none | PATH | URL) -> the local checkpoint folder to load, or None to start fresh."""
    if resume == "none":
        return None
    if resume == "auto":
        found = storage.newest_complete()
        return found[0] if found else None
    folder, result = storage.fetch_url(resume) if is_url(resume) else (Path(resume), run_folder.check(Path(resume)))
    if result.problem:
        raise CheckpointError(
            f"train.resume={resume} is not a loadable checkpoint ({result.problem}); "
            "point it at a complete step_* folder or use train.resume=auto"
        )
    step = run_folder.read_meta(folder)["step"]
    if newer := newer_checkpoints(storage, step):
        raise CheckpointError(
            f"train.resume={resume} is step {step}, but this run folder holds newer checkpoints ({', '.join(newer)}) "
            f"that a requeue (train.resume=auto) would resume from and the next save's pruning would keep over it; "
            f"move them out of {storage.local / run_folder.CHECKPOINTS} or train into a new train.run_dir"
        )
    return folder


def newer_checkpoints(storage: RunStorage, step: int) -> list[str]:
    """The run's step folders past `step` that train.resume=auto could pick: local ones with their manifest (written
    last) and, for a remote run, the remote ones (a rollback to an older checkpoint must not leave them there)."""
    names = [p.name for p in run_folder.step_folders(storage.local) if (p / run_folder.MANIFEST).is_file()]
    if storage.remote is not None:
        names += storage.remote_steps(*storage.filesystem())
    return sorted({n for n in names if int(run_folder.STEP_DIR.match(n)[1]) > step})


def resolve(resume: str, storage: RunStorage | Path, accelerator: Accelerator | None = None) -> Path | None:
    """`pick` on rank 0 (it may hash and download gigabytes), shared with every rank; call on every rank.

    A CheckpointError is raised on every rank alike, so none is left waiting.
    """
    storage = storage if isinstance(storage, RunStorage) else RunStorage.of(str(storage))
    choice: list = [None]
    if accelerator is None or accelerator.is_main_process:
        try:
            folder = pick(resume, storage)
            choice = [None if folder is None else ("found", str(folder))]
        except CheckpointError as e:
            choice = [("error", str(e))]
    if accelerator is not None and accelerator.num_processes > 1:
        broadcast_object_list(choice, from_process=0)
    if choice[0] is None:
        return None
    kind, text = choice[0]
    if kind == "error":
        raise CheckpointError(text)
    return Path(text)


def problem(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint, or None (models.run_folder.check)."""
    return run_folder.check(folder).problem


def load_checkpoint(accelerator: Accelerator, folder: Path) -> tuple[dict, dict]:
    """Restore model, optimizer, scheduler, scaler and RNG from `folder`; returns (meta, this rank's data state)."""
    rng_file = run_folder.rng_name(accelerator.process_index)
    bad_rng = run_folder.file_problem(folder, rng_file)
    before = rng_snapshot()
    refuse_foreign_pickles(accelerator, folder)
    try:
        accelerator.load_state(str(folder / STATE))
    except (Exception, CheckpointException) as e:  # e.g. an optimizer of another model: sound files that do not fit
        if isinstance(e, CheckpointException):  # FSDP's: the first rank's error
            e = next(iter(e.failures.values()))[0]
        raise CheckpointError(
            f"checkpoint {folder}: {STATE}/ does not load into this run ({run_folder.first_line(e)}); "
            "resume another checkpoint with train.resume=PATH or start afresh with train.resume=none"
        ) from None
    if bad_rng is None:
        bad_rng = rng_not_restored(folder / rng_file)
    if bad_rng is not None:
        rng_restore(before)
        run_folder.warn(
            f"random state not restored: {folder / rng_file} {bad_rng}; the run continues with fresh random "
            "numbers, so random augmentations differ from an uninterrupted run"
        )
    meta = run_folder.read_meta(folder)
    # a rank that did not exist when the checkpoint was written continues from rank 0's position (approximately)
    data_file = folder / run_folder.data_state_name(accelerator.process_index)
    data_state = json.loads((data_file if data_file.is_file() else folder / run_folder.data_state_name(0)).read_text())
    if accelerator.process_index == 0:
        data_state = with_vanished_ranks(folder, data_state, accelerator.num_processes)
    return meta, data_state


def with_vanished_ranks(folder: Path, state: dict, world: int) -> dict:
    """Rank 0's data state with the skip and caption counts of the ranks that wrote the checkpoint but are not in
    this job added in, so a job resumed on fewer ranks keeps its totals (and train.max_skip_fraction its ratio)."""
    state = dict(state)
    rank = world
    while (path := folder / run_folder.data_state_name(rank)).is_file():
        other = json.loads(path.read_text())
        for group in ("skipped", "captions"):
            mine = dict(state.get(group, {}))
            for key, count in other.get(group, {}).items():
                mine[key] = int(mine.get(key, 0)) + int(count)
            state[group] = mine
        rank += 1
    return state


def refuse_foreign_pickles(accelerator: Accelerator, folder: Path) -> None:
    """On every rank, just before torch.distributed.checkpoint unpickles them: the sharded state's .metadata files
    and non-tensor entries hold nothing but their own types (models.run_folder.sharded_problem)."""
    bad = run_folder.sharded_problem(folder)
    if sum_over_ranks(accelerator, {"bad": int(bad is not None)})["bad"]:  # every rank raises, none waits forever
        raise CheckpointError(
            f"checkpoint {folder}: {bad or 'a sharded state file is refused on another rank'}; resume another "
            "checkpoint with train.resume=PATH or start afresh with train.resume=none"
        )


def rng_not_restored(path: Path) -> str | None:
    """Why the torch random state now in use is not the one saved in `path` (accelerate only logs a failure)."""
    if not path.is_file():
        return "is missing (the checkpoint was written by fewer processes)"
    try:
        states = run_folder.torch_load(path)
        saved = states["torch_manual_seed"]
    except Exception as e:  # a damaged or foreign file
        return f"does not load ({run_folder.first_line(e)})"
    if not torch.equal(torch.get_rng_state(), saved):
        return "was not applied"
    if torch.cuda.is_available():  # accelerate applies the GPUs' after the CPU's, in the same try
        gpus, now = states.get("torch_cuda_manual_seed") or [], torch.cuda.get_rng_state_all()
        if len(gpus) != len(now) or not all(torch.equal(a, b) for a, b in zip(now, gpus, strict=True)):
            return f"was not applied on the GPUs ({len(gpus)} saved, {len(now)} visible)"
    return None


def rng_snapshot() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda  # noqa: NPY002


def rng_restore(snapshot: tuple) -> None:
    python, numpy_state, cpu, cuda = snapshot
    random.setstate(python)
    np.random.set_state(numpy_state)  # noqa: NPY002 - the global RNG accelerate restores
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
