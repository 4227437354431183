"""The run directory and its checkpoints: the one module that knows their layout and what "complete" means.

    RUN/                                 train.run_dir (a remote URL is staged locally first: train/storage.py)
        config.yaml  git_commit.txt  metrics.jsonl  [wandb_id.txt]  [study_times.json: a study's run]
        checkpoints/
            step_00000100/
                model.safetensors        the CLIP state dict (open_clip key names): what eval and pretrained read
                [ema.safetensors]        the EMA of the weights, the same keys (runs with train.ema.decay > 0)
                meta.json                {"step", "samples_seen", "epoch", "bad_steps", "config"}
                data_state_<rank>.json   the data-stream position of each rank
                state/                   accelerate's save_state: model, optimizer, scheduler, [scaler], RNG per rank
                manifest.json            size and SHA-256 of every other file; written last
            latest                       name of the newest step folder (for people: readers verify instead)
            [uploaded]                   a remote run's staging folder: the newest step folder on the remote

Complete means: manifest.json lists at least REQUIRED (and EMA for a run whose meta.json config keeps an EMA of
the weights), and every file it lists is there with its size and SHA-256. Every file that resume loads is
covered, so a truncated, flipped or replaced file (a pickle that would run code included) is found before
anything is loaded. The random-state files are the exception: a bad one only costs the exact replay of random
augmentations, so it is reported (`Check.optional`) and the checkpoint still counts. Folders written before
manifests existed are checked by loading each file instead (json, safetensors header,
`torch.load(weights_only=True)`), which is slower and refuses the same replaced, truncated or garbled files (a
flipped byte inside a tensor needs the manifest's SHA-256). With or without a manifest (which shows a file
unchanged, not who wrote it), the `.metadata` files of FSDP's sharded state, which torch.distributed.checkpoint
unpickles as they are, are read by an unpickler that builds only their own types, and the non-tensor entries they
list are loaded with weights_only=True (`dcp_load`), before anything loads them.

Readers of the weights alone (eval, pretrained loading) given a checkpoint folder check just meta.json and
model.safetensors (a copy of those two is enough); given a run directory they take the newest complete
checkpoint, the one resume takes.

Writers build a checkpoint in `checkpoints/.tmp_step_*/` and `finish` it: manifest, fsync, rename, `latest`.
This module imports nothing else of the project (models/, eval/ and train/ all read checkpoints through it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import re
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

CHECKPOINTS, LATEST, MANIFEST = "checkpoints", "latest", "manifest.json"
UPLOADED = "uploaded"  # train/storage.py: in a remote run's staging folder, what the remote holds
# the run directory's own files (train/ writes them, eval/ and the scripts read them)
CONFIG, SUMMARY, GIT_COMMIT = "config.yaml", "summary.json", "git_commit.txt"
STUDY_TIMES = "study_times.json"  # a study's run: its wall and CPU seconds as the study measured them
METRICS, WANDB_ID = "metrics.jsonl", "wandb_id.txt"
RUN_FILES = (CONFIG, SUMMARY, GIT_COMMIT, METRICS, WANDB_ID)
META, MODEL, STATE = "meta.json", "model.safetensors", "state"
EMA = "ema.safetensors"  # train.ema's weights (train/ema.py)
STEP_DIR = re.compile(r"^step_(\d{8})$")
TMP_PREFIX = ".tmp_"
# written under DDP and FSDP alike (FSDP stores the model and optimizer as sharded folders instead)
REQUIRED = (META, MODEL, "data_state_0.json", "state/scheduler.bin")
OPTIONAL = re.compile(r"^state/random_states_\d+\.pkl$")
CHANGED = "differs from its SHA-256 in manifest.json (changed or corrupt)"


class CheckpointError(ValueError):
    """A checkpoint (or weights file) that cannot be used; the message names the file and the fix."""


@dataclass
class Check:
    """The verdict on one checkpoint folder: `problem` (None = usable) and bad optional files by name."""

    problem: str | None = None
    optional: dict[str, str] = field(default_factory=dict)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def data_state_name(rank: int) -> str:
    return f"data_state_{rank}.json"


def rng_name(rank: int) -> str:
    return f"{STATE}/random_states_{rank}.pkl"


def is_url(path) -> bool:
    """Whether a run directory is an fsspec URL (s3://, gs://, file://, ...) rather than a local path."""
    return "://" in str(path)


# ---- writing


def write_json(path: Path, obj) -> None:
    try:
        with open(path, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:  # a failed write() names no file
        e.filename = e.filename or str(path)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` by a file holding `text`; a write the storage refuses leaves no `.tmp` file and names it."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        e.filename = e.filename or str(tmp)
        raise


def fsync_tree(folder: Path) -> None:
    for path in [*sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError as e:  # an I/O error of the disk: name the file it concerns
            e.filename = str(path)
            raise
        finally:
            os.close(fd)


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def hash_all(folder: Path, names: list[str]) -> dict[str, str]:
    """SHA-256 of each named file; hashlib releases the GIL on large buffers, so a few threads hash side by side."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(names, pool.map(lambda name: sha256(folder / name), names)))


def files_of(folder: Path) -> list[str]:
    """Every file under `folder` but the manifest, as sorted POSIX paths relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> dict:
    """Hash every file of a finished checkpoint folder into manifest.json (the last file written)."""
    digests = hash_all(folder, files_of(folder))
    manifest = {
        "format": 1,
        "files": {n: {"size": (folder / n).stat().st_size, "sha256": d} for n, d in digests.items()},
    }
    write_json(folder / MANIFEST, manifest)
    return manifest


def tmp_folder(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{TMP_PREFIX}{step_name(step)}"


def finish(tmp: Path) -> Path:
    """Make a fully written `.tmp_step_*` folder a checkpoint: manifest, fsync, rename, `latest`."""
    write_manifest(tmp)
    fsync_tree(tmp)  # the rename must not make visible files that a power loss could still lose
    final = tmp.with_name(tmp.name.removeprefix(TMP_PREFIX))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_text_atomic(final.parent / LATEST, final.name)
    return final


def prune(run_dir: Path, keep_last: int, keep: Path | None = None, keep_steps=()) -> list[Path]:
    """Delete all but the newest `keep_last` step folders (always keeping `keep`, the one just written, and those of
    `keep_steps`, not counted) and the temporary folders of interrupted writes. The manifest goes first, so a
    deletion cut short leaves a folder that counts as incomplete."""
    kept = {step_name(step) for step in keep_steps}
    others = [p for p in step_folders(run_dir) if p.name not in kept and (keep is None or p.name != Path(keep).name)]
    root = Path(run_dir) / CHECKPOINTS
    stale = [p for p in root.iterdir() if p.name.startswith(TMP_PREFIX)] if root.is_dir() else []
    just_written = keep is not None and Path(keep).name not in kept  # it counts as one of the newest keep_last
    gone = others[keep_last - just_written :] + stale
    for old in gone:
        (old / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(old, ignore_errors=True)
    return gone


# ---- reading and verifying


def step_folders(run_dir: Path) -> list[Path]:
    """The step_* folders of RUN/checkpoints, newest first (complete or not)."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted((p for p in root.iterdir() if STEP_DIR.match(p.name)), reverse=True) if root.is_dir() else []


def read_meta(folder: Path) -> dict:
    return json.loads((Path(folder) / META).read_text())


def meta_problem(folder: Path) -> str | None:
    try:
        meta = read_meta(folder)
    except (OSError, ValueError) as e:
        return f"{META} is not readable JSON ({first_line(e)})"
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k), int) for k in ("step", "samples_seen")):
        return f"{META} lacks an integer step and samples_seen"
    if not isinstance(meta.get("config"), dict) or not isinstance(meta["config"].get("model"), dict):
        return f"{META} holds no config.model (not written by this project's trainer)"
    return None


def listed_problems(manifest, sizes: dict[str, int]) -> dict[str, str]:
    """Problems visible without reading any file: manifest structure, missing files, sizes (also on remote
    storage). `sizes` maps each file present to its size. Keys name the file (or the manifest)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and "size" in e for e in files.values()):
        return {MANIFEST: "is not a manifest written by this project"}
    outside = [name for name in files if not inside(name)]
    if outside:  # before any file is looked at: a reader must never open, hash or download such a path
        return {MANIFEST: f"lists {outside[0]!r}, a path that leaves the checkpoint folder (refused)"}
    bad = {name: "is not listed in manifest.json" for name in REQUIRED if name not in files}
    for name, entry in files.items():
        if name not in sizes:
            bad[name] = "is missing"
        elif sizes[name] != entry["size"]:
            bad[name] = f"has {sizes[name]} bytes where manifest.json says {entry['size']} (truncated or replaced)"
    return bad


def inside(name: str) -> bool:
    """Whether a file name of a manifest stays inside its checkpoint folder: a relative POSIX path of plain parts
    (no absolute path, drive, backslash, `..`, `.` or empty part)."""
    parts = name.split("/")
    return bool(name) and "\\" not in name and ":" not in parts[0] and all(p not in ("", ".", "..") for p in parts)


def verdict(bad: dict[str, str]) -> Check:
    """Split file problems into the one that makes the checkpoint unusable and those of optional files."""
    hard = [name for name in bad if not OPTIONAL.match(name)]
    problem = f"{hard[0]} {bad[hard[0]]}" if hard else None
    return Check(problem, {name: reason for name, reason in bad.items() if OPTIONAL.match(name)})


def check(folder: Path) -> Check:
    """Verify a checkpoint folder (see the module docstring). Every problem names the file."""
    folder = Path(folder)
    if not folder.is_dir():
        return Check("no such folder")
    if not (folder / MANIFEST).is_file():
        return check_by_loading(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return Check(f"{MANIFEST} is not readable JSON ({first_line(e)})")
    sizes = {name: (folder / name).stat().st_size for name in files_of(folder)}
    result = verdict(listed_problems(manifest, sizes))
    if result.problem:
        return result
    bad = dict(result.optional)
    digests = hash_all(folder, [name for name in manifest["files"] if name not in bad])
    bad.update({name: CHANGED for name, digest in digests.items() if digest != manifest["files"][name].get("sha256")})
    result = verdict(bad)
    if result.problem:
        return result
    return Check(
        meta_problem(folder) or ema_problem(folder, manifest["files"]) or sharded_problem(folder), result.optional
    )


def ema_problem(folder: Path, listed) -> str | None:
    """Why the checkpoint of a run that keeps an EMA of the weights (its meta.json's train.ema.decay > 0) lacks
    EMA, or None; `listed`: the names in its manifest (the file's size and SHA-256 are checked with the others)."""
    train = read_meta(folder)["config"].get("train")
    ema = train.get("ema") if isinstance(train, dict) else None
    if not isinstance(ema, dict) or not ema.get("decay") or EMA in listed:
        return None
    where = "is not listed in manifest.json" if (Path(folder) / EMA).is_file() else "is missing"
    return f"{EMA} {where} (the run keeps an EMA of the weights, train.ema.decay={ema['decay']})"


def file_problem(folder: Path, name: str) -> str | None:
    """Why one file of a checkpoint is bad (missing, or not what manifest.json lists), or None; cheap for a
    small file such as a random state. Without a manifest the file is loaded instead."""
    path = Path(folder) / name
    if not path.is_file():
        return "is missing"
    try:
        entry = json.loads((Path(folder) / MANIFEST).read_text())["files"].get(name)
    except (OSError, ValueError, KeyError, AttributeError):
        return load_problem(path)
    if entry is None:
        return "is not listed in manifest.json"
    size = path.stat().st_size
    if size != entry.get("size"):
        return f"has {size} bytes where manifest.json says {entry.get('size')} (truncated or replaced)"
    return None if sha256(path) == entry.get("sha256") else CHANGED


def check_by_loading(folder: Path) -> Check:
    """The check of a folder without manifest.json (written before manifests): load every file once."""
    bad = {name: "is missing" for name in (*REQUIRED, rng_name(0)) if not (folder / name).is_file()}
    if not verdict(bad).problem:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            reason = load_problem(path)
            name = path.relative_to(folder).as_posix()
            if reason:
                bad[name] = reason
                if not OPTIONAL.match(name):
                    break
    result = verdict(bad)
    if result.problem:
        return result
    present = [EMA] if (folder / EMA).is_file() else []
    return Check(meta_problem(folder) or ema_problem(folder, present), result.optional)


def load_problem(path: Path) -> str | None:
    """Why one file does not load safely, or None; torch files load with weights_only=True (no code runs)."""
    try:
        if path.name.endswith(DCP_METADATA):
            dcp_load(path)
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".safetensors":
            # the header must parse and its tensors must cover the file exactly: truncation or garbage fails
            with safe_open(str(path), "pt"):
                pass
        elif path.suffix in (".bin", ".pt", ".pth", ".pkl"):
            torch_load(path)
    except Exception as e:  # a damaged file raises many kinds of errors; each becomes one line
        return f"does not load ({first_line(e)})"
    return None


def torch_load(path: Path):
    """torch.load with weights_only=True, allowing the numpy types of accelerate's random-state files."""
    from accelerate.utils import load

    return load(str(path), map_location="cpu", weights_only=True)


# torch.distributed.checkpoint's index of a sharded folder (FSDP's model and optimizer state): a plain pickle
DCP_METADATA = ".metadata"


class DCPMetadataUnpickler(pickle.Unpickler):
    """Builds only what a torch.distributed.checkpoint .metadata file holds (`dcp_globals`); any other global
    (os.system, builtins.eval, ...) is refused before it is called."""

    def find_class(self, module: str, name: str):
        found = dcp_globals().get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not a type of torch.distributed.checkpoint metadata")
        return found


@functools.cache
def dcp_globals() -> dict[tuple[str, str], object]:
    """(module, name) -> object of each global a .metadata pickle names: the metadata dataclasses, torch's dtypes,
    Size and layouts (a layout is torch.serialization._get_layout of its name), and the path of its storage_meta."""
    import collections
    import pathlib

    import torch
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint import metadata as m

    kinds = (m.Metadata, m.MetadataIndex, m.StorageMeta, m.TensorStorageMetadata, m.BytesStorageMetadata)
    kinds += (m.ChunkStorageMetadata, m.TensorProperties, m._MEM_FORMAT_ENCODING, filesystem._StorageInfo)
    kinds += (torch.Size, torch.serialization._get_layout, collections.OrderedDict, pathlib.PurePosixPath)
    kinds += (pathlib.PosixPath,)
    found = {(kind.__module__, kind.__qualname__): kind for kind in kinds}
    found.update({("torch", n): v for n, v in vars(torch).items() if isinstance(v, torch.dtype)})
    return found


def dcp_load(path: Path) -> None:
    """Read a sharded folder's .metadata and load each non-tensor entry it lists, without running code from either;
    raises on anything else. torch.distributed.checkpoint reads them with pickle.load and torch.load(weights_only=
    False), and a manifest beside them shows only that they are unchanged since it was written, not who wrote it."""
    import io

    import torch
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    with open(path, "rb") as f:
        metadata = DCPMetadataUnpickler(f).load()
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise ValueError("not torch.distributed.checkpoint Metadata")
    for index, item in metadata.storage_data.items():
        if isinstance(metadata.state_dict_metadata.get(index.fqn), TensorStorageMetadata):
            continue  # read by torch.load(weights_only=True)
        if item.transform_descriptors:  # the bytes loaded would not be those checked here
            raise ValueError(f"entry {index.fqn} is stored through {item.transform_descriptors}")
        with open(path.parent / item.relative_path, "rb") as f:
            f.seek(item.offset)
            torch.load(io.BytesIO(f.read(item.length)), map_location="cpu", weights_only=True)


def sharded_problem(folder: Path) -> str | None:
    """Why a .metadata file of the checkpoint, or a non-tensor entry it lists, would run code or does not load
    (`dcp_load`), or None. Cheap: tensors are not read."""
    for path in sorted(Path(folder).rglob("*" + DCP_METADATA)):
        reason = load_problem(path)
        if reason:
            return f"{path.relative_to(folder).as_posix()} {reason}"
    return None


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160]}" if text else type(error).__name__


def newest_complete(run_dir: Path, report: Callable[[str], None] = warn) -> tuple[Path, Check] | None:
    """The newest checkpoint of a run that passes `check`; every one skipped on the way is reported."""
    for folder in step_folders(run_dir):
        result = check(folder)
        if result.problem is None:
            return folder, result
        report(f"skipping checkpoint {folder}: {result.problem}")
    return None


def weights_problem(folder: Path) -> str | None:
    """Why a folder does not hold usable model weights and meta (meta.json + model.safetensors, checked against
    the manifest when there is one, else loaded): what eval and pretrained loading read, and all they need."""
    for name in (META, MODEL):
        reason = file_problem(folder, name)
        if reason:
            return f"{name} {reason}"
    return meta_problem(folder)


def find_checkpoint(path: Path, report: Callable[[str], None] = warn) -> Path:
    """The weights to read from `path`: a checkpoint folder itself (its meta.json and model.safetensors verified:
    a copy of just those two is enough), or the newest complete checkpoint of a run directory (the one
    train.resume=auto would pick)."""
    path = Path(path)
    if (path / META).is_file() or (path / MODEL).is_file():
        problem = weights_problem(path)
        if problem:
            raise CheckpointError(f"checkpoint {path}: {problem}; pass another checkpoint folder")
        return path
    found = newest_complete(path, report)
    if found is None:
        what = (
            "has no complete checkpoint (each one is named above with its problem)"
            if step_folders(path)
            else f"is neither a checkpoint folder ({META}, {MODEL}, ...) nor a run directory with checkpoints/step_*"
        )
        raise CheckpointError(f"{path} {what}; pass a run directory or checkpoint folder written by python -m train")
    return found[0]
