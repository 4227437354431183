"""Render the batch scripts of slurm/ and submit them with sbatch: training, scaling-law sweeps, zero-shot evaluation,
the evaluation suite (train/submit_suite.py).

    python -m train.submit CONFIG --nodes N --gpus-per-node G --partition P --time T [--account A] [key=value ...]
    python -m train.submit CONFIG --gpus-per-node 0 --procs-per-node 2 --time 10 --dry-run    # CPU, print only
    python -m train.submit sweep CONFIG --sizes tiny-s,tiny-m --attentions softmax,linear_elu --samples 1000,2000 \\
        --time 30                                           # one job array (train/sweep.py)
    python -m train.submit sweep CONFIG --sizes tiny-s --cooldowns-at 1000,2000 --time 30    # cooldown branches
    python -m train.submit study configs/study/demo.yaml --out runs/demo-slurm --time 30   # train/study_slurm.py
    python -m train.submit eval RUN_OR_CHECKPOINT... --dataset DIR --time 20
    python -m train.submit suite RUN_OR_CHECKPOINT... --suite configs/eval_suite.yaml --gpus-per-node 8 --time 60

A training job runs one Slurm task per node; each task starts torchrun for the processes of its node, with
the rendezvous taken from Slurm's variables (slurm/train.sbatch); unless --cpus-per-task is given, that task asks
for procs-per-node x (data.workers + 1) CPUs, one for each process and each of its loader workers. `--dry-run`
prints the scripts instead of submitting them. The run directory is `train.run_dir` of the overrides or of the
config file, else runs/<config-stem>-<timestamp>; it is passed on as an absolute `train.run_dir=` override, so a
requeued job resumes there (train.resume=auto). The job runs in the current directory, like `python -m train` here.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from models.run_folder import is_url
from train.slurm import (
    REPO,
    Resources,
    SubmitError,
    add_resource_arguments,
    check_config_path,
    check_path,
    load_checked,
    read_yaml,
    render,
    render_train,
    resources_from,
    run_of,
    sbatch_options,
    submit,
    timestamp,
    with_loader_cpus,
)
from train.storage import RunStorage
from train.study_slurm import main_study
from train.submit_suite import main_suite
from train.sweep import main_sweep


def choose_run_dir(
    config: Path, overrides: list[str], stamp: str, stage_dir: str | None = None
) -> tuple[Path, list[str]]:
    """(absolute local folder of the job's script and Slurm log, overrides ending in `train.run_dir=<the run
    dir>`), see the module docstring: the run dir itself, or for a remote one (s3://...) its URL as given and
    train.stage_dir's local staging folder for the script and log."""
    given = [o.partition("=")[2] for o in overrides if o.startswith("train.run_dir=")]
    explicit = (read_yaml(config) or {}).get("train", {}) or {}
    chosen = given[-1] if given else explicit.get("run_dir") or f"runs/{config.stem}-{stamp}"
    kept = [o for o in overrides if not o.startswith("train.run_dir=")]
    if is_url(chosen):
        return check_path(RunStorage.of(chosen, stage_dir).local.absolute()), [*kept, f"train.run_dir={chosen}"]
    run_dir = Path(chosen).absolute()
    return check_path(run_dir), [*kept, f"train.run_dir={run_dir}"]


def submit_training(
    config: Path, overrides: list[str], res: Resources, dry_run: bool, stamp: str
) -> tuple[str | None, Path]:
    """Validate, render and submit one training job; returns (job id, run dir)."""
    cfg = load_checked(config, overrides, schedule=True)
    run_dir, overrides = choose_run_dir(config, overrides, stamp, cfg.train.stage_dir)
    script = render_train(config, overrides, run_dir, with_loader_cpus(res, cfg.data.workers))
    job_id = submit(script, run_dir / "train.sbatch", dry_run)
    if job_id:
        print(f"submitted job {job_id}\nrun dir: {overrides[-1].removeprefix('train.run_dir=')}")
    return job_id, run_dir


def main_train(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m train.submit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path, help="training config YAML, e.g. configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides for python -m train")
    add_resource_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    check_config_path(args.config)
    submit_training(args.config, args.overrides, resources_from(args), args.dry_run, timestamp())


def eval_output(target: Path, dataset: Path, out_dir: Path | None) -> Path:
    """Where the result JSON of one checkpoint goes: RUN/eval/zeroshot-<checkpoint>-<dataset>.json by default,
    which is where `python -m eval.scaling RUN` looks for eval results."""
    run, name = run_of(target)
    return (out_dir or run / "eval") / f"zeroshot-{name}-{dataset.name}.json"


def main_eval(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m train.submit eval",
        description="Submit zero-shot evaluation (python -m eval.zeroshot) of checkpoints; "
        "unknown options are passed on to eval.zeroshot.",
    )
    parser.add_argument("checkpoints", nargs="+", type=Path, help="checkpoint folders or run directories")
    parser.add_argument(
        "--dataset", required=True, type=Path, help="ImageFolder tree or clip_benchmark webdataset folder"
    )
    parser.add_argument("--out", type=Path, help="folder for the result JSONs (default: each run's eval/ folder)")
    add_resource_arguments(parser, training=False)
    args, eval_args = parser.parse_known_args(argv)
    if args.gpus_per_node > 1:
        raise SubmitError("eval.zeroshot uses one device; pass --gpus-per-node 1 (or 0 for the CPU)")
    if not args.dataset.is_dir():
        raise SubmitError(
            f"--dataset {args.dataset} is not a folder; give an ImageFolder tree or a clip_benchmark webdataset folder"
        )
    res = resources_from(args)
    targets = [p.absolute() for p in args.checkpoints]
    outputs = [eval_output(p, args.dataset, args.out and args.out.absolute()) for p in targets]
    log_dir = outputs[0].parent
    script = render(
        "eval.sbatch",
        {
            "job_name": f"clip-eval-{targets[0].name}",
            "time": res.time,
            "workdir": Path.cwd(),
            "repo": REPO,
            "out_dir": log_dir,
            "sbatch_options": sbatch_options(res),
            "bin_dir": Path(sys.executable).parent,
            "checkpoints": shlex.join(map(str, targets)),
            "outputs": shlex.join(map(str, outputs)),
            "eval_args": shlex.join(["--dataset", str(args.dataset.absolute()), *eval_args]),
        },
    )
    job_id = submit(script, log_dir / f"eval-{timestamp()}.sbatch", args.dry_run)
    if job_id:
        print(f"submitted job {job_id}\nresults: " + " ".join(map(str, outputs)))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = {"sweep": main_sweep, "study": main_study, "eval": main_eval, "suite": main_suite}
    command = commands.get(argv[0]) if argv else None
    try:
        command(argv[1:]) if command else main_train(argv)
    except SubmitError as e:
        raise SystemExit(f"train.submit: error: {e}") from None


if __name__ == "__main__":
    main()
