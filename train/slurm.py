"""Slurm batch scripts: rendering slurm/*.sbatch with a job's resources, and submitting them with sbatch.

The machinery every `python -m train.submit` command shares (train/submit.py: training and evaluation jobs;
train/sweep.py: scaling-law sweeps as job arrays; train/submit_suite.py: the evaluation suite); it imports none
of them.
"""

from __future__ import annotations

import argparse
import re
import shlex
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from models import run_folder
from train.config import ConfigError, load_config
from train.config import read_yaml as read_config_yaml
from train.optim import check_optimizer, check_schedule

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "slurm"


class SubmitError(ValueError):
    """A problem with the submit command's input, reported as one line."""


class SbatchTemplate(string.Template):
    """string.Template with `{{name}}` fields, so the `$VARS` of the bash script need no escaping."""

    delimiter = "{{"
    pattern = r"\{\{(?:(?P<escaped>(?!))|(?P<named>[a-z_][a-z0-9_]*)\}\}|(?P<braced>(?!))|(?P<invalid>))"


def render(template: str, values: dict) -> str:
    """slurm/<template> with every `{{field}}` replaced; a missing field is a SubmitError."""
    text = (TEMPLATES / template).read_text()
    try:
        return SbatchTemplate(text).substitute({k: str(v) for k, v in values.items()})
    except KeyError as e:
        raise SubmitError(f"slurm/{template} needs the field {e.args[0]!r}; pass it to render()") from None
    except ValueError as e:
        raise SubmitError(f"slurm/{template}: {e}; fields look like {{{{name}}}} (lower case)") from None


@dataclass
class Resources:
    """What one job asks Slurm for; `procs_per_node` training processes start on each node."""

    time: str
    nodes: int = 1
    gpus_per_node: int = 1
    procs_per_node: int = 1
    partition: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    signal_seconds: int = 120
    sbatch_args: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def with_loader_cpus(res: Resources, workers: int) -> Resources:
    """`res` asking for procs_per_node x (workers + 1) CPUs per task unless --cpus-per-task was given: each node
    runs one task, torchrun's processes and each process's `workers` data-loading workers share it. Clusters
    that give a task one CPU by default would otherwise starve the loaders."""
    if res.cpus_per_task:
        return res
    return replace(res, cpus_per_task=res.procs_per_node * (max(workers, 0) + 1))


def sbatch_options(res: Resources) -> str:
    """The optional `#SBATCH` lines: no --gres line in CPU mode (gpus_per_node=0)."""
    lines = [f"--gres=gpu:{res.gpus_per_node}"] if res.gpus_per_node else []
    lines += [f"--partition={res.partition}"] if res.partition else []
    lines += [f"--account={res.account}"] if res.account else []
    lines += [f"--cpus-per-task={res.cpus_per_task}"] if res.cpus_per_task else []
    lines += res.sbatch_args
    return "\n".join(f"#SBATCH {line}" for line in lines)


def time_limit_seconds(text: str) -> int:
    """Slurm's --time formats (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) -> seconds."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise SubmitError(f"--time {text!r} is not a Slurm time; use minutes, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if days is not None:
        return ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:
        return (a * 60 + b) * 60 + c
    return a * 60 + (b or 0)


def add_resource_arguments(parser: argparse.ArgumentParser, training: bool = True) -> None:
    parser.add_argument("--time", required=True, help="time limit: minutes, HH:MM:SS or D-HH:MM:SS")
    parser.add_argument("--partition", help="Slurm partition (default: the cluster's default)")
    parser.add_argument("--account", help="Slurm account to charge")
    parser.add_argument("--gpus-per-node", type=int, default=1, help="0 = CPU job without a --gres line")
    parser.add_argument(
        "--cpus-per-task",
        type=int,
        help="CPUs for each node's task, all its processes (default for a training job and a suite job: "
        "processes per node x (loader workers + 1))",
    )
    parser.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="extra sbatch option, e.g. --sbatch-arg=--qos=high (repeatable)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the batch script(s), submit nothing")
    if training:
        parser.add_argument("--nodes", type=int, default=1)
        parser.add_argument("--procs-per-node", type=int, help="training processes per node (default: one per GPU)")
        parser.add_argument(
            "--signal-seconds",
            type=int,
            default=120,
            help="USR1 this many seconds before the time limit: checkpoint, exit 75, requeue",
        )


def resources_from(args: argparse.Namespace) -> Resources:
    gpus = args.gpus_per_node
    procs = getattr(args, "procs_per_node", None) or max(gpus, 1)
    if gpus < 0 or procs < 1 or getattr(args, "nodes", 1) < 1:
        raise SubmitError("--nodes, --procs-per-node must be >= 1 and --gpus-per-node >= 0")
    if gpus and procs != gpus:
        raise SubmitError(
            f"--procs-per-node {procs} differs from --gpus-per-node {gpus}; training runs one process per GPU"
        )
    res = Resources(
        time=args.time,
        nodes=getattr(args, "nodes", 1),
        gpus_per_node=gpus,
        procs_per_node=procs,
        partition=args.partition,
        account=args.account,
        cpus_per_task=args.cpus_per_task,
        signal_seconds=getattr(args, "signal_seconds", 120),
        sbatch_args=list(args.sbatch_arg),
    )
    if getattr(args, "signal_seconds", 0) >= time_limit_seconds(args.time):
        raise SubmitError(f"--signal-seconds {res.signal_seconds} is not below the time limit {args.time}; lower it")
    return res


def load_checked(config: Path, overrides: list[str], schedule: bool = False):
    """The validated training config (train.config.load_config), so a bad override fails before queueing;
    with `schedule`, its learning-rate schedule is checked too (train.optim.check_schedule)."""
    try:
        cfg = load_config([str(config), *overrides])
        check_optimizer(cfg.optim)
        if schedule:
            check_schedule(cfg.optim, cfg.train.max_steps)
        return cfg
    except ConfigError as e:
        raise SubmitError(str(e)) from None


def check_path(path: Path) -> Path:
    """`path`, unless it holds whitespace, which an #SBATCH --output line cannot."""
    if re.search(r"\s", str(path)):
        raise SubmitError(f"{str(path)!r} holds whitespace, which #SBATCH --output cannot; pick another folder")
    return path


def read_yaml(path: Path):
    """The YAML of a config or sweep file; a file that is not YAML is a SubmitError naming it."""
    try:
        return read_config_yaml(path)
    except ConfigError as e:
        raise SubmitError(str(e)) from None


def render_train(config: Path, overrides: list[str], run_dir: Path, res: Resources, bin_dir: Path | None = None) -> str:
    """slurm/train.sbatch for `python -m train CONFIG overrides...` with the job's resources."""
    args = f"TRAIN_ARGS=({shlex.join([str(config.absolute()), *overrides])})"
    return render_job(f"clip-{run_dir.name}", run_dir / "slurm-%j.out", args, res, bin_dir)


def render_job(job_name: str, output: Path, train_args: str, res: Resources, bin_dir: Path | None = None) -> str:
    """slurm/train.sbatch with `train_args`, the bash that sets TRAIN_ARGS (one run, or one per array task)."""
    return render(
        "train.sbatch",
        {
            "job_name": job_name,
            "nodes": res.nodes,
            "procs_per_node": res.procs_per_node,
            "world_size": res.world_size,
            "time": res.time,
            "workdir": Path.cwd(),
            "repo": REPO,
            "output": output,
            "signal_seconds": res.signal_seconds,
            "sbatch_options": sbatch_options(res),
            "bin_dir": bin_dir or Path(sys.executable).parent,
            "train_args": train_args,
        },
    )


def submit(script: str, path: Path, dry_run: bool) -> str | None:
    """Print the script (dry run) or write it to `path` and sbatch it; returns the job id."""
    if dry_run:
        print(script)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    try:
        done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SubmitError(
            "sbatch not found; run on a Slurm login node (or scripts/slurm_local.sh up), or use --dry-run"
        ) from None
    if done.returncode != 0:
        raise SubmitError(f"sbatch {path} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def check_config_path(config: Path) -> None:
    if not config.is_file():
        raise SubmitError(f"config file {str(config)!r} does not exist; pick one of configs/*.yaml")


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def run_of(target: Path) -> tuple[Path, str]:
    """(run directory, checkpoint name or 'latest') of a checkpoint folder or a run directory."""
    if (target / run_folder.META).is_file() and target.parent.name == run_folder.CHECKPOINTS:
        return target.parent.parent, target.name
    if (target / run_folder.CHECKPOINTS).is_dir() or (target / "train.sbatch").is_file():
        # a submitted run may have no checkpoint yet: with --sbatch-arg=--dependency=afterok:JOB it will
        return target, "latest"
    raise SubmitError(
        f"{target} is neither a checkpoint folder (with meta.json) nor a run directory "
        "(with checkpoints/ or train.sbatch)"
    )
