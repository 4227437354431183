"""Where a run's files live: its local run directory, or a local staging folder mirrored to an fsspec URL.

`train.run_dir` a local or mounted path: files are written in place; a checkpoint becomes visible by a rename
(models/layout.py). `train.run_dir` an fsspec URL (s3://bucket/prefix, gs://..., file:///...): every file is
written to a local staging folder first (`train.stage_dir`; default `<tmp>/clip-attention-stage/<name>-<hash>`),
and rank 0 uploads each finished checkpoint, then the run's files (config.yaml, metrics.jsonl, ...):

    1. delete RUN/checkpoints/step_X/manifest.json if an earlier attempt left one (the folder is then incomplete)
    2. upload every file of the checkpoint but its manifest, to their final keys
    3. upload manifest.json: from now on the checkpoint exists for readers
    4. write RUN/checkpoints/latest; delete checkpoints beyond train.keep_last (each manifest first)

Object stores have no rename: on S3 "renaming" a prefix copies and deletes every object, and a reader could
see half of it. So nothing is renamed; the manifest, uploaded last, is the completion marker, and a reader
trusts a remote checkpoint only when the manifest is there and every file it lists has the listed size, then
checks every SHA-256 after downloading it (models.layout.check). S3 is read-after-write consistent, and each
object (multipart ones included) appears whole or not at all, so a half upload is never taken for a
checkpoint. Resume (train.resume=auto) downloads the newest complete remote checkpoint into the staging folder.
The staging folder keeps only the newest checkpoint; the remote keeps train.keep_last. With several nodes,
train.stage_dir must be a folder every node sees (rank 0 uploads every rank's files), as a local run_dir must be.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from models import layout
from models.layout import CHECKPOINTS, LATEST, MANIFEST, METRICS, RUN_FILES, WANDB_ID, Check, is_url
from train.log import LOG_FILE


def default_stage(url: str) -> Path:
    """<tmp>/clip-attention-stage/<last part of the URL>-<hash of the URL>: the same URL, the same folder."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1]) or "run"
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / "clip-attention-stage" / f"{name}-{digest}"


@dataclass
class RunStorage:
    """`local`: the folder everything is written to; `remote`: the fsspec URL it is mirrored to, or None."""

    local: Path
    remote: str | None = None

    @classmethod
    def of(cls, run_dir: str, stage_dir: str | None = None) -> RunStorage:
        if not is_url(run_dir):
            return cls(Path(run_dir))
        url = str(run_dir).rstrip("/")
        return cls(Path(stage_dir) if stage_dir else default_stage(url), url)

    def filesystem(self):
        """(fsspec file system, path of the run directory on it)."""
        import fsspec

        return fsspec.core.url_to_fs(self.remote)

    def check_reachable(self) -> str | None:
        """Why the remote run directory cannot be used (unknown protocol, no credentials, ...), or None."""
        if self.remote is None:
            return None
        try:
            fs, root = self.filesystem()
            fs.exists(f"{root}/{CHECKPOINTS}")
        except Exception as e:  # ImportError for a protocol without its package, botocore errors, OSError ...
            return layout.first_line(e)
        return None

    def upload_checkpoint(self, folder: Path, keep_last: int, keep_steps=()) -> None:
        """Steps 1-4 of the module docstring for one finished local checkpoint folder."""
        if self.remote is None:
            return
        fs, root = self.filesystem()
        dest = f"{root}/{CHECKPOINTS}/{folder.name}"
        if fs.exists(f"{dest}/{MANIFEST}"):
            fs.rm_file(f"{dest}/{MANIFEST}")
        names = layout.files_of(folder)
        for parent in sorted({f"{dest}/{n}".rsplit("/", 1)[0] for n in names}):
            fs.makedirs(parent, exist_ok=True)  # a folder on file systems that have them, nothing on object stores
        fs.put([str(folder / n) for n in names], [f"{dest}/{n}" for n in names])
        fs.put_file(str(folder / MANIFEST), f"{dest}/{MANIFEST}")
        fs.pipe_file(f"{root}/{CHECKPOINTS}/{LATEST}", (folder.name + "\n").encode())
        kept = {folder.name, *(layout.step_name(step) for step in keep_steps)}
        older = [name for name in self.remote_steps(fs, root) if name not in kept]
        for old in older[keep_last - 1 :]:
            fs.rm_file(f"{root}/{CHECKPOINTS}/{old}/{MANIFEST}")
            fs.rm(f"{root}/{CHECKPOINTS}/{old}", recursive=True)

    def upload_run_files(self) -> None:
        """config.yaml, summary.json, git_commit.txt, metrics.jsonl, wandb_id.txt, out.log, whichever exist (each
        whole)."""
        if self.remote is None:
            return
        fs, root = self.filesystem()
        fs.makedirs(root, exist_ok=True)
        for name in (*RUN_FILES, LOG_FILE):
            if (self.local / name).is_file():
                fs.put_file(str(self.local / name), f"{root}/{name}")

    def pull_run_files(self) -> None:
        """Start from the remote's metrics.jsonl, wandb id and log (a new node's staging folder is empty); before
        anything is logged to the local copy."""
        if self.remote is None:
            return
        fs, root = self.filesystem()
        self.local.mkdir(parents=True, exist_ok=True)
        for name in (METRICS, WANDB_ID, LOG_FILE):
            if fs.isfile(f"{root}/{name}"):
                fs.get_file(f"{root}/{name}", str(self.local / name))

    @staticmethod
    def remote_steps(fs, root: str) -> list[str]:
        """Names of the remote step_* folders, newest first."""
        base = f"{root}/{CHECKPOINTS}"
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)] if fs.isdir(base) else []
        return sorted((n for n in names if layout.STEP_DIR.match(n)), reverse=True)

    def remote_problem(self, fs, folder: str) -> tuple[str | None, dict]:
        """(why a remote step folder is not a complete upload, its manifest), from a listing and the manifest."""
        try:
            manifest = json.loads(fs.cat_file(f"{folder}/{MANIFEST}"))
        except FileNotFoundError:
            return f"{MANIFEST} is missing (an upload or a deletion that did not finish)", {}
        except ValueError as e:
            return f"{MANIFEST} is not readable JSON ({layout.first_line(e)})", {}
        listing = fs.find(folder, detail=True)
        sizes = {path[len(folder) + 1 :]: info["size"] for path, info in listing.items() if info["type"] == "file"}
        return layout.verdict(layout.listed_problems(manifest, sizes)).problem, manifest

    def fetch(self, fs, folder: str, manifest: dict) -> Path:
        """The remote checkpoint `folder` as a local folder of the staging area (reused when already there)."""
        local = self.local / CHECKPOINTS / folder.rsplit("/", 1)[-1]
        if (local / MANIFEST).is_file() and json.loads((local / MANIFEST).read_text()) == manifest:
            return local
        tmp = local.with_name(layout.TMP_PREFIX + local.name)
        shutil.rmtree(tmp, ignore_errors=True)
        names = [*manifest["files"], MANIFEST]
        for name in names:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        fs.get([f"{folder}/{n}" for n in names], [str(tmp / n) for n in names])
        shutil.rmtree(local, ignore_errors=True)
        tmp.rename(local)
        return local

    def newest_complete(self, report: Callable[[str], None] = layout.warn) -> tuple[Path, Check] | None:
        """The newest complete checkpoint, local folder and verdict; a remote one is downloaded first."""
        if self.remote is None:
            return layout.newest_complete(self.local, report)
        fs, root = self.filesystem()
        for name in self.remote_steps(fs, root):
            folder = f"{root}/{CHECKPOINTS}/{name}"
            local, result = self.fetch_checked(fs, folder)
            if result.problem is None:
                return local, result
            report(f"skipping checkpoint {fs.unstrip_protocol(folder)}: {result.problem}")
        return None

    def fetch_checked(self, fs, folder: str) -> tuple[Path | None, Check]:
        """A remote checkpoint folder downloaded into the staging folder and verified there."""
        problem, manifest = self.remote_problem(fs, folder)
        if problem is not None:
            return None, Check(problem)
        local = self.fetch(fs, folder, manifest)
        result = layout.check(local)
        if result.problem is not None:
            result.problem += f" (found after downloading it to {local})"
        return local, result

    def fetch_url(self, url: str) -> tuple[Path | None, Check]:
        """train.resume=URL of one checkpoint folder: downloaded and verified into the staging folder."""
        import fsspec

        fs, folder = fsspec.core.url_to_fs(url.rstrip("/"))
        return self.fetch_checked(fs, folder)
