"""Where a run reports: RUN/metrics.jsonl, wandb, a tqdm bar and log lines, all from rank 0 only.

Log lines: `python -m train` shows the INFO lines of the project's packages (train, models, data, eval: pretrained
loading, attention impls, the run's own messages) and every library's warnings on stderr, on rank 0 (other ranks:
warnings only), and appends the same lines with their time and level to RUN/out.log (LOG_FILE). The progress bar goes
to the console only; log lines pass it through tqdm.write, so the bar stays whole and the file never sees it.
"""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from models import run_folder
from train.config import ConfigError

LOG_FILE = "out.log"  # RUN/out.log, open_clip's name (RUN/train.log is what train/study_local.py captures)
PACKAGES = ("train", "models", "data", "eval")  # whose INFO lines a run shows; other libraries' from WARNING on
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger(__name__)


class Console(logging.Handler):
    """One line per record on the current sys.stderr, through tqdm.write so that a progress bar stays whole;
    INFO lines as they are, the others after their level (`warning: ...`)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            tqdm.write(
                text if record.levelno == logging.INFO else f"{record.levelname.lower()}: {text}", file=sys.stderr
            )
        except Exception:
            self.handleError(record)


@contextmanager
def console_logging(main: bool) -> Iterator[None]:
    """While it lasts, log lines show on stderr: INFO lines of PACKAGES on the main process (rank 0), warnings of
    every logger on all. Loggers and handlers are as before afterwards (tests run many trainings in one process)."""
    handler = Console(logging.INFO if main else logging.WARNING)
    unset = [logger for logger in map(logging.getLogger, PACKAGES) if logger.level == logging.NOTSET]
    for logger in unset:
        logger.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        for logger in unset:
            logger.setLevel(logging.NOTSET)


class RunFile(logging.FileHandler):
    """Appends to RUN/out.log once the run has made its folder; the lines before are held, then written first. A run
    refused before it starts (a bad checkpoint to branch from, ...) so leaves no folder behind."""

    def __init__(self, path: Path):
        super().__init__(path, encoding="utf-8", delay=True)
        self.held: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None and not Path(self.baseFilename).parent.is_dir():
            self.held.append(record)
            return
        for earlier in self.held:
            super().emit(earlier)
        self.held.clear()
        super().emit(record)


@contextmanager
def file_logging(path: Path | None) -> Iterator[None]:
    """While it lasts, every INFO line and above, with its time, level and logger, is appended to `path` (RunFile;
    None: nothing, as on ranks other than 0)."""
    if path is None:
        yield
        return
    handler = RunFile(path)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def logging_on() -> bool:
    """Whether console_logging is in effect (train.main sets it up; a script that drives a Trainer may not)."""
    return any(isinstance(h, Console) for h in logging.getLogger().handlers)


def check_wandb(mode: str) -> None:
    """Fail at once, before any work, when online logging cannot authenticate (wandb would otherwise prompt or hang)."""
    if mode != "online" or os.environ.get("WANDB_API_KEY"):
        return
    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai"):
            return
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    raise ConfigError(
        "train.wandb=online needs WANDB_API_KEY or `wandb login`; "
        "set it, or use train.wandb=offline (sync later) or disabled"
    )


def git_commit() -> str:
    """HEAD of the repository holding this package, with '-dirty' if tracked files changed, or 'unknown'."""
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop lines past `last_step` (written after the checkpoint a run resumes from), so steps never repeat."""
    if not path.is_file():
        return
    kept = [
        line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= last_step
    ]
    path.write_text("".join(line + "\n" for line in kept))


class RunLog:
    """metrics.jsonl + wandb + progress bar. On ranks other than 0 every method does nothing."""

    def __init__(
        self,
        run_dir: Path,
        config: dict,
        *,
        main: bool,
        wandb_mode: str,
        project: str,
        name: str | None,
        total_steps: int,
        start_step: int,
        progress: bool,
    ):
        self.main, self.run, self.bar = main, None, None
        self.path = Path(run_dir) / run_folder.METRICS
        if not main:
            return
        if wandb_mode != "disabled":
            self.run = start_wandb(Path(run_dir), config, wandb_mode, project, name)
        if progress:
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, record: dict) -> None:
        """Append one JSON line and send the same numbers to wandb."""
        if not self.main:
            return
        # strict JSON: a skipped step's NaN loss becomes null
        record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.run is not None:
            self.run.log(
                {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}, step=record["step"]
            )

    def progress(self, steps: int, **postfix) -> None:
        if self.bar is not None:
            self.bar.update(steps)
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def write(self, message: str) -> None:
        """A line for the user, rank 0 only: a log line (stderr and RUN/out.log) under train.main, else a line on
        stderr; either way through tqdm.write, which keeps the bar whole."""
        if not self.main:
            return
        if logging_on():
            log.info(message)
        else:
            tqdm.write(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.run is not None:
            self.run.finish()


def start_wandb(run_dir: Path, config: dict, mode: str, project: str, name: str | None):
    """A wandb run that continues the same id when the run directory is resumed."""
    import wandb

    id_file = run_dir / run_folder.WANDB_ID
    run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:8]
    id_file.write_text(run_id + "\n")
    settings = wandb.Settings(init_timeout=90, silent=True, x_disable_stats=True)
    return wandb.init(
        project=project,
        name=name or run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=config,
        mode=mode,
        settings=settings,
    )
