"""Where a run reports: RUN/metrics.jsonl, wandb and a tqdm bar, all from rank 0 only."""

from __future__ import annotations

import json
import math
import netrc
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tqdm import tqdm

from models import layout
from train.config import ConfigError


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
        self.path = Path(run_dir) / layout.METRICS
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
        """A line on stderr that does not break the bar (rank 0 only)."""
        if self.main:
            tqdm.write(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.run is not None:
            self.run.finish()


def start_wandb(run_dir: Path, config: dict, mode: str, project: str, name: str | None):
    """A wandb run that continues the same id when the run directory is resumed."""
    import wandb

    id_file = run_dir / layout.WANDB_ID
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
