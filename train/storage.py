"""Where a run's files live: its local run directory, or a local staging folder mirrored to an fsspec URL.

`train.run_dir` a local or mounted path: files are written in place; a checkpoint becomes visible by a rename
(models/run_folder.py). `train.run_dir` an fsspec URL (s3://bucket/prefix, gs://..., file:///...): every file is
written to a local staging folder first (`train.stage_dir`; default `<tmp>/clip-attention-stage/<name>-<hash>`),
and rank 0 uploads each finished checkpoint, then the run's files (config.yaml, metrics.jsonl, ...):

    1. delete RUN/checkpoints/step_X/manifest.json if an earlier attempt left one (the folder is then incomplete)
    2. upload every file of the checkpoint but its manifest, to their final keys
    3. upload manifest.json: from now on the checkpoint exists for readers
    4. write RUN/checkpoints/latest; delete complete checkpoints beyond train.keep_last (each manifest first)

Object stores have no rename: on S3 "renaming" a prefix copies and deletes every object, and a reader could
see half of it. So nothing is renamed; the manifest, uploaded last, is the completion marker, and a reader
trusts a remote checkpoint only when the manifest is there, names only files inside its folder, and every file
it lists has the listed size, then checks every SHA-256 after downloading it (models.run_folder.check). S3 is
read-after-write consistent, and each object (multipart ones included) appears whole or not at all, so a half
upload is never taken for a checkpoint. Pruning counts only complete remote checkpoints toward keep_last;
incomplete folders older than the newest complete one are deleted uncounted, newer ones are left alone.

When the storage goes away: every transfer (each upload, listing and download) that fails with a transient
error (OSError but for a missing file, refused access or a full local disk; botocore's and aiohttp's connection
errors) is retried with exponential backoff (1, 2, 4, ... s, at most 60 s apart) for `train.storage_retry_s`
seconds, one warning line per retry naming the URL and the attempt (0: only the file system's own retries).
- An upload that still fails is a warning: training goes on, the checkpoint stays in the staging folder, and
  every checkpoint not uploaded yet stays there too (`pending`; RUN/checkpoints/uploaded in the staging folder
  names the newest one on the remote). The next upload sends the newest checkpoint first, then the earlier
  pending ones, newest first, as many as keep_last leaves room for; the staging folder then keeps only the
  newest. `train.max_failed_uploads` failed uploads in a row stop the run with one line (`UploadError`) that
  names the URL, the count, the checkpoints kept locally and the fix: rerun once the storage is back; resume
  (train.resume=auto) takes a pending local checkpoint newer than the remote's newest, and uploads it.
- A download that still fails during resume stops the run with one line naming the URL (`StorageError`).
The staging folder keeps only the newest checkpoint once it is uploaded; the remote keeps train.keep_last. With
several nodes, train.stage_dir must be a folder every node sees (rank 0 uploads every rank's files), as a local
run_dir must be.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import TypeVar

from models import run_folder
from models.run_folder import (
    CHECKPOINTS,
    LATEST,
    MANIFEST,
    METRICS,
    RUN_FILES,
    UPLOADED,
    WANDB_ID,
    Check,
    CheckpointError,
    is_url,
)
from train.log import LOG_FILE

T = TypeVar("T")
FIRST_WAIT_S, MAX_WAIT_S = 1.0, 60.0
# errors of a request that a retry cannot mend: the file is not there, access is refused, the local disk is full
LASTING = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
LOCAL_DISK = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


class StorageError(CheckpointError):
    """A download from the remote run directory failed after retries; the message names the URL."""


class UploadError(CheckpointError):
    """train.max_failed_uploads uploads in a row failed; the message names the URL, the kept checkpoints, the fix."""


def transient(error: BaseException) -> bool:
    """Whether a failed request may work when tried again: an OSError of the network or the server, or a connection
    error of botocore (S3) or aiohttp (most other fsspec back ends)."""
    if isinstance(error, LASTING) or (isinstance(error, OSError) and error.errno in LOCAL_DISK):
        return False
    kinds: tuple[type, ...] = (OSError,)
    botocore = sys.modules.get("botocore.exceptions")  # only a loaded module can have raised its errors
    if botocore is not None:
        kinds += (botocore.ConnectionError, botocore.HTTPClientError)
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None:
        kinds += (aiohttp.ClientError,)
    return isinstance(error, kinds)


def retrying(what: str, fn: Callable[[], T], seconds: float) -> T:
    """fn(), tried again after 1, 2, 4, ... s (at most 60 s apart) while it raises a `transient` error and
    `seconds` have not passed since the first try; one warning line per retry names `what` and the attempt. The
    last error is raised as it is."""
    deadline = time.monotonic() + seconds
    for attempt in count(1):
        try:
            return fn()
        except Exception as e:
            wait = min(FIRST_WAIT_S * 2 ** (attempt - 1), MAX_WAIT_S, deadline - time.monotonic())
            if wait <= 0 or not transient(e):
                raise
            run_folder.warn(
                f"{what} failed ({run_folder.first_line(e)}); attempt {attempt}, trying again in {wait:.1f} s "
                f"(train.storage_retry_s={seconds:g})"
            )
            time.sleep(wait)


def default_stage(url: str) -> Path:
    """<tmp>/clip-attention-stage/<last part of the URL>-<hash of the URL>: the same URL, the same folder."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1]) or "run"
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / "clip-attention-stage" / f"{name}-{digest}"


@dataclass
class RunStorage:
    """`local`: the folder everything is written to; `remote`: the fsspec URL it is mirrored to, or None;
    `retry_s`, `max_failed_uploads`: train.storage_retry_s and train.max_failed_uploads."""

    local: Path
    remote: str | None = None
    retry_s: float = 0.0
    max_failed_uploads: int = 3

    @classmethod
    def of(cls, run_dir: str, stage_dir: str | None = None, retry_s: float = 0.0, max_failed_uploads: int = 3):
        if not is_url(run_dir):
            return cls(Path(run_dir))
        url = str(run_dir).rstrip("/")
        return cls(Path(stage_dir) if stage_dir else default_stage(url), url, retry_s, max_failed_uploads)

    @classmethod
    def from_config(cls, train_cfg) -> RunStorage:
        """The storage of a TrainConfig (train.run_dir, stage_dir, storage_retry_s, max_failed_uploads)."""
        c = train_cfg
        return cls.of(c.run_dir, c.stage_dir, c.storage_retry_s, c.max_failed_uploads)

    def filesystem(self):
        """(fsspec file system, path of the run directory on it)."""
        import fsspec

        return fsspec.core.url_to_fs(self.remote)

    def retry(self, what: str, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) through `retrying` for train.storage_retry_s."""
        return retrying(what, functools.partial(fn, *args, **kwargs), self.retry_s)

    def check_reachable(self) -> str | None:
        """Why the remote run directory cannot be used (unknown protocol, no credentials, ...), or None."""
        if self.remote is None:
            return None
        try:
            fs, root = self.filesystem()
            fs.exists(f"{root}/{CHECKPOINTS}")
        except Exception as e:  # ImportError for a protocol without its package, botocore errors, OSError ...
            return run_folder.first_line(e)
        return None

    def pending(self) -> list[Path]:
        """The staging folder's checkpoints that are not on the remote yet (newer than checkpoints/uploaded),
        newest first."""
        marker = self.local / CHECKPOINTS / UPLOADED
        uploaded = marker.read_text().strip() if marker.is_file() else ""
        return [p for p in run_folder.step_folders(self.local) if p.name > uploaded]

    def mark_uploaded(self, name: str) -> None:
        marker = self.local / CHECKPOINTS / UPLOADED
        if not marker.is_file() or marker.read_text().strip() < name:
            marker.parent.mkdir(parents=True, exist_ok=True)
            run_folder.write_text_atomic(marker, name)

    def upload_checkpoint(self, folder: Path, keep_last: int, keep_steps=()) -> None:
        """Steps 1-4 of the module docstring for the newest finished local checkpoint `folder`, then for the earlier
        ones not uploaded yet (newest first, as many as keep_last leaves room for, and every one of keep_steps: a
        cooldown branch's starting point). Raises the first failure after retries; `pending` then tells what is
        still to upload (the marker moves past `folder` only once the earlier ones are up too)."""
        if self.remote is None:
            return
        fs, root = self.filesystem()
        protected = {run_folder.step_name(step) for step in keep_steps}
        older = [p for p in self.pending() if p.name < folder.name]
        earlier = older[: keep_last - 1] + [p for p in older[keep_last - 1 :] if p.name in protected]
        self.put_checkpoint(fs, root, folder)
        latest = f"{root}/{CHECKPOINTS}/{LATEST}"
        self.retry(f"writing {self.remote}/{CHECKPOINTS}/{LATEST}", fs.pipe_file, latest, f"{folder.name}\n".encode())
        for old in earlier:
            self.put_checkpoint(fs, root, old)
        self.mark_uploaded(folder.name)
        self.prune_remote(fs, root, keep_last, protected)

    def put_checkpoint(self, fs, root: str, folder: Path) -> None:
        """Steps 1-3: the files of a local checkpoint folder, its manifest last."""
        dest = f"{root}/{CHECKPOINTS}/{folder.name}"
        url = f"{self.remote}/{CHECKPOINTS}/{folder.name}"
        if self.retry(f"listing {url}", fs.exists, f"{dest}/{MANIFEST}"):
            self.retry(f"deleting {url}/{MANIFEST}", fs.rm_file, f"{dest}/{MANIFEST}")
        names = run_folder.files_of(folder)
        for parent in sorted({f"{dest}/{n}".rsplit("/", 1)[0] for n in names}):
            fs.makedirs(parent, exist_ok=True)  # a folder on file systems that have them, nothing on object stores
        sources, targets = [str(folder / n) for n in names], [f"{dest}/{n}" for n in names]
        self.retry(f"upload of {url}", fs.put, sources, targets)
        self.retry(f"upload of {url}/{MANIFEST}", fs.put_file, str(folder / MANIFEST), f"{dest}/{MANIFEST}")

    def prune_remote(self, fs, root: str, keep_last: int, protected: set[str]) -> None:
        """Delete remote checkpoints beyond the newest keep_last complete ones (those of `protected` neither counted
        nor deleted), and incomplete folders older than the newest complete one, uncounted (an upload or deletion
        that did not finish; newer ones may be an upload under way)."""
        kept, seen_complete = 0, False
        for name in self.remote_steps(fs, root):
            folder = f"{root}/{CHECKPOINTS}/{name}"
            complete = self.remote_problem(fs, folder)[0] is None
            seen_complete |= complete
            if name in protected or (complete and kept < keep_last) or not seen_complete:
                kept += complete and name not in protected
                continue
            url = f"{self.remote}/{CHECKPOINTS}/{name}"
            if complete:
                self.retry(f"deleting {url}/{MANIFEST}", fs.rm_file, f"{folder}/{MANIFEST}")
            self.retry(f"deleting {url}", fs.rm, folder, recursive=True)

    def upload_run_files(self) -> None:
        """config.yaml, summary.json, git_commit.txt, metrics.jsonl, wandb_id.txt, out.log, whichever exist (each
        whole). A failure after retries is a warning: each checkpoint's upload sends them again."""
        if self.remote is None:
            return
        try:
            fs, root = self.filesystem()
            fs.makedirs(root, exist_ok=True)
            for name in (*RUN_FILES, LOG_FILE):
                if (self.local / name).is_file():
                    self.retry(f"upload of {self.remote}/{name}", fs.put_file, str(self.local / name), f"{root}/{name}")
        except Exception as e:  # network and credential errors of any fsspec back end
            run_folder.warn(f"upload of the run's files to {self.remote} failed ({run_folder.first_line(e)})")

    def pull_run_files(self) -> None:
        """Start from the remote's metrics.jsonl, wandb id and log (a new node's staging folder is empty); before
        anything is logged to the local copy. A download that fails after retries is a StorageError."""
        if self.remote is None:
            return
        fs, root = self.filesystem()
        self.local.mkdir(parents=True, exist_ok=True)
        for name in (METRICS, WANDB_ID, LOG_FILE):
            url = f"{self.remote}/{name}"
            with downloading(url, self.retry_s):
                if self.retry(f"listing {url}", fs.isfile, f"{root}/{name}"):
                    self.retry(f"download of {url}", fs.get_file, f"{root}/{name}", str(self.local / name))

    def remote_steps(self, fs, root: str) -> list[str]:
        """Names of the remote step_* folders, newest first."""
        base = f"{root}/{CHECKPOINTS}"
        url = f"{self.remote or fs.unstrip_protocol(root)}/{CHECKPOINTS}"
        there = self.retry(f"listing {url}", fs.isdir, base)
        listed = self.retry(f"listing {url}", fs.ls, base, detail=False) if there else []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in listed]
        return sorted((n for n in names if run_folder.STEP_DIR.match(n)), reverse=True)

    def remote_problem(self, fs, folder: str) -> tuple[str | None, dict]:
        """(why a remote step folder is not a complete upload, its manifest), from a listing and the manifest."""
        url = fs.unstrip_protocol(folder)
        try:
            manifest = json.loads(self.retry(f"download of {url}/{MANIFEST}", fs.cat_file, f"{folder}/{MANIFEST}"))
        except FileNotFoundError:
            return f"{MANIFEST} is missing (an upload or a deletion that did not finish)", {}
        except ValueError as e:
            return f"{MANIFEST} is not readable JSON ({run_folder.first_line(e)})", {}
        listing = self.retry(f"listing {url}", fs.find, folder, detail=True)
        sizes = {path[len(folder) + 1 :]: info["size"] for path, info in listing.items() if info["type"] == "file"}
        return run_folder.verdict(run_folder.listed_problems(manifest, sizes)).problem, manifest

    def fetch(self, fs, folder: str, manifest: dict) -> Path:
        """The remote checkpoint `folder` as a local folder of the staging area (reused when already there). Its
        manifest must have passed `remote_problem` (which refuses a file name outside the folder)."""
        local = self.local / CHECKPOINTS / folder.rsplit("/", 1)[-1]
        if (local / MANIFEST).is_file() and json.loads((local / MANIFEST).read_text()) == manifest:
            return local
        names = [*manifest["files"], MANIFEST]
        if not all(map(run_folder.inside, names)):  # remote_problem refuses these first: never write outside `tmp`
            raise CheckpointError(f"{fs.unstrip_protocol(folder)}: {MANIFEST} lists a path outside the folder")
        tmp = local.with_name(run_folder.TMP_PREFIX + local.name)
        shutil.rmtree(tmp, ignore_errors=True)
        for name in names:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        sources, targets = [f"{folder}/{n}" for n in names], [str(tmp / n) for n in names]
        self.retry(f"download of {fs.unstrip_protocol(folder)}", fs.get, sources, targets)
        shutil.rmtree(local, ignore_errors=True)
        tmp.rename(local)
        if self.remote is not None and folder.rsplit("/", 2)[0] == self.filesystem()[1]:
            self.mark_uploaded(local.name)  # a checkpoint of this run's remote: there already
        return local

    def newest_complete(self, report: Callable[[str], None] = run_folder.warn) -> tuple[Path, Check] | None:
        """The newest complete checkpoint, local folder and verdict; a remote one is downloaded first. For a remote
        run, a complete local checkpoint not uploaded yet (`pending`) wins over older remote ones. A download that
        fails after retries is a StorageError."""
        if self.remote is None:
            return run_folder.newest_complete(self.local, report)
        fs, root = self.filesystem()
        with downloading(f"{self.remote}/{CHECKPOINTS}", self.retry_s):
            remote = self.remote_steps(fs, root)
        local = {p.name: p for p in self.pending()}
        for name in sorted({*remote, *local}, reverse=True):
            if name in local:
                found, result, where = local[name], run_folder.check(local[name]), str(local[name])
            else:
                folder = f"{root}/{CHECKPOINTS}/{name}"
                where = fs.unstrip_protocol(folder)
                with downloading(where, self.retry_s):
                    found, result = self.fetch_checked(fs, folder)
            if result.problem is None:
                return found, result
            report(f"skipping checkpoint {where}: {result.problem}")
        return None

    def fetch_checked(self, fs, folder: str) -> tuple[Path | None, Check]:
        """A remote checkpoint folder downloaded into the staging folder and verified there."""
        problem, manifest = self.remote_problem(fs, folder)
        if problem is not None:
            return None, Check(problem)
        local = self.fetch(fs, folder, manifest)
        result = run_folder.check(local)
        if result.problem is not None:
            result.problem += f" (found after downloading it to {local})"
        return local, result

    def fetch_url(self, url: str) -> tuple[Path | None, Check]:
        """train.resume=URL of one checkpoint folder: downloaded and verified into the staging folder."""
        import fsspec

        fs, folder = fsspec.core.url_to_fs(url.rstrip("/"))
        with downloading(url, self.retry_s):
            return self.fetch_checked(fs, folder)


@contextmanager
def downloading(url: str, retry_s: float):
    """Turns a transfer error that outlasted the retries into a one-line StorageError naming `url`."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:
        if not (transient(e) or isinstance(e, OSError)):
            raise
        raise StorageError(
            f"download from {url} failed ({run_folder.first_line(e)}) after retrying for train.storage_retry_s="
            f"{retry_s:g} s; rerun when the storage is reachable, or raise train.storage_retry_s"
        ) from None
