"""Sweeps as Slurm job arrays: one array task per run; cooldown branches off constant learning-rate runs.

    python -m train.submit sweep CONFIG --sizes tiny-s,tiny-m --attentions softmax,linear_elu --samples 1000,2000 \\
        --time 30
    python -m train.submit sweep CONFIG --sizes tiny-s,tiny-m --cooldowns-at 1000,2000,4000 --cooldown-fraction 0.2 \\
        --time 30
    python -m train.submit sweep SWEEP.yaml --time 30

A plain sweep is one job array, one task per point of sizes x attentions x samples seen.

With --cooldowns-at T1,T2,... (optimizer steps) each point of sizes x attentions is one constant-LR run plus, for
every T, a branch of length T: it starts from the constant run's checkpoint at step B = T - round(fraction x T)
and cools down over the last T - B steps (train/branch.py; Hägele et al. 2024). The constant run is a chain of
arrays `constant-B`, one per branch step B, each training to B and the next resuming there; task i of an array
waits for task i of the one before (`--dependency=aftercorr:JOB`). The array `cooldown-T` waits the same way for
`constant-B`. The constant runs keep their branch-step checkpoints from pruning (train.keep_steps).

Each array's script maps SLURM_ARRAY_TASK_ID to the arguments of one run; SWEEP_DIR/manifest.csv holds the same
mapping, one row per task (array, job_id, task_id, run_dir, ..., overrides). Submitting the same sweep again with
the same --sweep-dir resumes every run where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import math
import os
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from models import run_folder
from train import slurm

AXES = ("sizes", "attentions", "samples", "cooldowns_at")
MANIFEST_FIELDS = ("array", "job_id", "task_id", "run_dir", "size", "attention", "samples", "max_steps")
MANIFEST_FIELDS += ("branch_from", "log", "overrides")


@dataclass
class Task:
    """One run: its directory, its overrides for python -m train (ending in train.run_dir), manifest columns."""

    run_dir: Path
    overrides: list[str]
    info: dict


@dataclass
class Array:
    """One job array; task i starts after task i of the array `after` has completed (Slurm's aftercorr)."""

    name: str
    tasks: list[Task]
    after: str | None = None


def sweep_points(sizes: list[str], attentions: list[str], samples: list[int], samples_per_step: int) -> list[dict]:
    """The grid sizes x attentions x samples seen; each point has its name and its overrides for python -m train."""
    points = []
    for size, attention, seen in itertools.product(sizes or [None], attentions or [None], samples or [None]):
        overrides, parts, steps = [], [], ""
        if size is not None:
            overrides.append(f"model.name={size}")
            parts.append(size)
        if attention is not None:
            overrides += [f"model.image_attention={attention}", f"model.text_attention={attention}"]
            parts.append(attention)
        if seen is not None:
            steps = math.ceil(seen / samples_per_step)
            overrides.append(f"train.max_steps={steps}")
            parts.append(f"{seen}")
        name = "-".join(parts) or "run"
        points.append({"size": size or "", "attention": attention or "", "samples": seen or "", "max_steps": steps})
        points[-1].update(name=name, overrides=overrides)
    return points


def plain_arrays(points: list[dict], overrides: list[str], sweep_dir: Path) -> list[Array]:
    """One array, one task per point."""
    tasks = []
    for point in points:
        run_dir = sweep_dir / point["name"]
        info = {key: point[key] for key in ("size", "attention", "samples", "max_steps")}
        tasks.append(Task(run_dir, [*overrides, *point["overrides"], f"train.run_dir={run_dir}"], info))
    return [Array("train", tasks)]


def cooldown_plan(ends: list[int], fraction: float) -> dict[int, tuple[int, int]]:
    """{T: (branch step, cooldown steps)} for each run length T of --cooldowns-at."""
    if not 0 < fraction < 1:
        raise slurm.SubmitError(f"--cooldown-fraction {fraction} must lie between 0 and 1, e.g. 0.2")
    plan = {}
    for end in sorted(set(ends)):
        cooldown = round(fraction * end)
        if not 1 <= cooldown < end:
            raise slurm.SubmitError(
                f"--cooldowns-at {end} with --cooldown-fraction {fraction} gives a cooldown of {cooldown} steps; "
                f"it needs 1 to {end - 1}: raise the fraction or the step"
            )
        plan[end] = (end - cooldown, cooldown)
    return plan


def cooldown_arrays(
    points: list[dict], overrides: list[str], sweep_dir: Path, plan: dict, samples_per_step: int
) -> list[Array]:
    """The constant runs as a chain of arrays ending at each branch step, then one branch array per run length."""
    stops = sorted({stop for stop, _ in plan.values()})
    keep = f"train.keep_steps=[{','.join(map(str, stops))}]"
    arrays, previous = [], None
    for stop in stops:
        tasks = []
        for point in points:
            run_dir = sweep_dir / f"{point['name']}-constant"
            steps = ["optim.schedule=constant", f"train.max_steps={stop}", keep, f"train.run_dir={run_dir}"]
            info = {"size": point["size"], "attention": point["attention"], "max_steps": stop}
            tasks.append(Task(run_dir, [*overrides, *point["overrides"], *steps], info))
        arrays.append(Array(f"constant-{stop}", tasks, after=previous))
        previous = arrays[-1].name
    for end, (stop, cooldown) in plan.items():
        tasks = []
        for point in points:
            run_dir = sweep_dir / f"{point['name']}-cooldown{end}"
            parent = sweep_dir / f"{point['name']}-constant" / "checkpoints" / run_folder.step_name(stop)
            steps = ["optim.schedule=const-cooldown", f"optim.cooldown_steps={cooldown}", f"train.max_steps={end}"]
            steps += [f"train.branch_from={parent}", f"train.run_dir={run_dir}"]
            info = {"size": point["size"], "attention": point["attention"], "samples": end * samples_per_step}
            info.update(max_steps=end)
            tasks.append(Task(run_dir, [*overrides, *point["overrides"], *steps], {**info, "branch_from": parent}))
        arrays.append(Array(f"cooldown-{end}", tasks, after=f"constant-{stop}"))
    return arrays


def task_block(config: Path, tasks: list[Task]) -> str:
    """The bash that sets TRAIN_ARGS for $SLURM_ARRAY_TASK_ID (train.sbatch's {{train_args}})."""
    lines = ["# array task -> run (manifest.csv lists the same mapping)", 'case "${SLURM_ARRAY_TASK_ID:-}" in']
    for i, task in enumerate(tasks):
        lines.append(f"  {i}) TRAIN_ARGS=({shlex.join([str(config.absolute()), *task.overrides])}) ;;")
    lines.append("  *) echo \"[sbatch] no run for array task '${SLURM_ARRAY_TASK_ID:-}' in this script\"; exit 1 ;;")
    return "\n".join([*lines, "esac"])


def submit_array(
    array: Array, config: Path, res: slurm.Resources, sweep_dir: Path, job_ids: dict, dry_run: bool, max_running: int
) -> str | None:
    """Render and submit one array (--array=0-N, and aftercorr on its predecessor's job id); returns its job id."""
    options = [f"--array=0-{len(array.tasks) - 1}" + (f"%{max_running}" if max_running else "")]
    if array.after:
        options.append(f"--dependency=aftercorr:{job_ids.get(array.after) or f'<job id of {array.after}>'}")
    res = replace(res, sbatch_args=[*res.sbatch_args, *options])
    output = sweep_dir / "logs" / f"{array.name}-%A_%a.out"
    script = slurm.render_job(f"clip-{sweep_dir.name}-{array.name}", output, task_block(config, array.tasks), res)
    if not dry_run:
        output.parent.mkdir(parents=True, exist_ok=True)
    return slurm.submit(script, sweep_dir / f"{array.name}.sbatch", dry_run)


def manifest_rows(array: Array, job_id: str | None, sweep_dir: Path) -> list[dict]:
    rows = []
    for i, task in enumerate(array.tasks):
        log = sweep_dir / "logs" / f"{array.name}-{job_id}_{i}.out" if job_id else ""
        row = {"array": array.name, "job_id": job_id or "", "task_id": i, "run_dir": task.run_dir, "log": log}
        rows.append({**dict.fromkeys(MANIFEST_FIELDS, ""), **task.info, **row})
        rows[-1]["overrides"] = shlex.join(task.overrides)
    return rows


def write_manifest(rows: list[dict], path: Path | None) -> None:
    """manifest.csv (MANIFEST_FIELDS), replaced atomically; printed instead when path is None."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=MANIFEST_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    if path is None:
        print(text.getvalue(), end="")
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.getvalue())
    os.replace(tmp, path)


def submit_all(arrays: list[Array], config: Path, res: slurm.Resources, sweep_dir: Path, args) -> None:
    """Submit the arrays in order; the manifest is rewritten after each, so it lists whatever was submitted."""
    job_ids, rows = {}, []
    manifest = None if args.dry_run else sweep_dir / "manifest.csv"
    for array in arrays:
        try:
            job_ids[array.name] = submit_array(array, config, res, sweep_dir, job_ids, args.dry_run, args.max_running)
        except slurm.SubmitError as e:
            done = f"; submitted before it: {', '.join(job_ids)} (listed in {manifest})" if job_ids else ""
            raise slurm.SubmitError(f"{e}{done}") from None
        rows += manifest_rows(array, job_ids[array.name], sweep_dir)
        if manifest:
            manifest.parent.mkdir(parents=True, exist_ok=True)
            write_manifest(rows, manifest)
            print(f"submitted array job {job_ids[array.name]} ({len(array.tasks)} tasks): {array.name}")
    write_manifest(rows, None) if manifest is None else print(f"manifest: {manifest}")


def read_sweep_file(path: Path, args: argparse.Namespace) -> Path:
    """A sweep YAML {config, sizes, attentions, samples, cooldowns_at, cooldown_fraction, overrides}; flags given on
    the command line win."""
    spec = slurm.read_yaml(path) or {}
    unknown = sorted(set(spec) - {"config", "overrides", "cooldown_fraction", *AXES})
    if unknown or "config" not in spec:
        raise slurm.SubmitError(
            f"sweep file {path} needs 'config' and may hold {', '.join(AXES)}, cooldown_fraction, overrides; "
            f"got {unknown or 'no config'}"
        )
    for axis in AXES:
        if not getattr(args, axis) and spec.get(axis):
            setattr(args, axis, [str(v) for v in spec[axis]])
    if args.cooldown_fraction is None and spec.get("cooldown_fraction") is not None:
        args.cooldown_fraction = float(spec["cooldown_fraction"])
    args.overrides = [*(spec.get("overrides") or []), *args.overrides]
    config = Path(spec["config"])
    # relative to the current folder when it is there, else relative to the sweep file
    return config if config.is_absolute() or config.exists() else path.parent / config


def split(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def whole_numbers(values: list[str], flag: str) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise slurm.SubmitError(f"{flag} {','.join(values)} must be whole numbers, e.g. 1000,2000") from None


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m train.submit sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path, help="training config YAML, or a sweep YAML holding `config:` and axes")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides applied to every run")
    parser.add_argument("--sizes", type=split, default=[], help="model.name values, e.g. tiny-s,tiny-m")
    parser.add_argument(
        "--attentions", type=split, default=[], help="attention of both towers, e.g. softmax,linear_elu"
    )
    parser.add_argument("--samples", type=split, default=[], help="samples seen per run, e.g. 1000,2000")
    parser.add_argument(
        "--cooldowns-at",
        type=split,
        default=[],
        help="run lengths T in optimizer steps, e.g. 1000,2000,4000: one constant-LR run per point, and per T a "
        "branch off it that cools down over the last fraction of its T steps",
    )
    parser.add_argument("--cooldown-fraction", type=float, help="cooldown share of each T (default 0.2)")
    parser.add_argument("--max-running", type=int, default=0, help="at most this many tasks of an array at once")
    parser.add_argument("--sweep-dir", type=Path, help="where the runs and manifest.csv go (runs/sweep-<stem>-<time>)")
    slurm.add_resource_arguments(parser)
    return parser.parse_intermixed_args(argv)


def main_sweep(argv: list[str]) -> None:
    args = parse(argv)
    slurm.check_config_path(args.config)
    data = slurm.read_yaml(args.config) or {}
    config = read_sweep_file(args.config, args) if isinstance(data, dict) and "config" in data else args.config
    slurm.check_config_path(config)
    if not any(getattr(args, axis) for axis in AXES):
        raise slurm.SubmitError(
            "a sweep needs at least one of --sizes, --attentions, --samples, --cooldowns-at "
            "(or those keys in a sweep YAML)"
        )
    if args.samples and args.cooldowns_at:
        raise slurm.SubmitError("--samples and --cooldowns-at both set the run lengths; give one")
    ours = ("--array", "--dependency") if args.cooldowns_at else ("--array",)
    if any(option.startswith(ours) for option in args.sbatch_arg):
        raise slurm.SubmitError(f"this sweep sets {' and '.join(ours)} itself; drop it from --sbatch-arg")
    res, stamp = slurm.resources_from(args), slurm.timestamp()
    base = slurm.load_checked(config, args.overrides)
    res = slurm.with_loader_cpus(res, base.data.workers)
    per_step = base.data.batch_size * base.train.accum_freq
    sweep_dir = slurm.check_path((args.sweep_dir or Path(f"runs/sweep-{config.stem}-{stamp}")).absolute())
    if args.cooldowns_at:
        plan = cooldown_plan(whole_numbers(args.cooldowns_at, "--cooldowns-at"), args.cooldown_fraction or 0.2)
        points = sweep_points(args.sizes, args.attentions, [], per_step)
        arrays = cooldown_arrays(points, args.overrides, sweep_dir, plan, per_step)
    else:
        points = sweep_points(args.sizes, args.attentions, whole_numbers(args.samples, "--samples"), per_step)
        arrays = plain_arrays(points, args.overrides, sweep_dir)
    for array in arrays:
        for i, task in enumerate(array.tasks):
            try:
                slurm.load_checked(config, task.overrides, schedule=True)
                slurm.check_path(task.run_dir)
            except slurm.SubmitError as e:
                raise slurm.SubmitError(f"array {array.name}, task {i} ({task.run_dir.name}): {e}") from None
    submit_all(arrays, config, res, sweep_dir, args)
