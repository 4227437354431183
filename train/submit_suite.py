"""`python -m train.submit suite`: the evaluation suite of checkpoints as one Slurm job (slurm/eval_suite.sbatch).

    python -m train.submit suite RUN_OR_CHECKPOINT... --suite configs/eval_suite.yaml --gpus-per-node 8 --time 60
    python -m train.submit suite RUN --dataset imagenet-v2=/data/v2 --nodes 2 --gpus-per-node 8 --time 30 \\
        --sbatch-arg=--dependency=afterok:JOB
    python -m train.submit suite RUN --suite configs/eval_suite.yaml --image-size 448 --time 60   # at another size

Each checkpoint is evaluated by all nodes x procs-per-node processes of the job (eval.sharding). The suite is
checked here (names, options, paths) so a bad one is refused before it queues. Results go to each run's
eval/<checkpoint>/ (the job log to the first run's eval/), or with --out to OUT/<run>-<checkpoint>/.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from eval.datasets import EvalInputError
from eval.suite import read_suite
from train import slurm


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m train.submit suite",
        description="Submit the evaluation suite (python -m eval.suite) of checkpoints as one job.",
    )
    parser.add_argument("checkpoints", nargs="+", type=Path, help="checkpoint folders or run directories")
    parser.add_argument("--suite", type=Path, help="suite YAML (see configs/eval_suite.yaml)")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=PATH", help="repeatable")
    parser.add_argument("--out", type=Path, help="results to OUT/<run>-<checkpoint>/ (default: RUN/eval/<checkpoint>/)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch and process")
    parser.add_argument("--workers", type=int, default=4, help="data-loading workers per process")
    parser.add_argument("--image-size", type=int, help="evaluate at this resolution (position table resampled)")
    parser.add_argument("--context-length", type=int, help="evaluate at this text length (positions stretched)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--procs-per-node", type=int, help="evaluating processes per node (default: one per GPU)")
    slurm.add_resource_arguments(parser, training=False)
    return parser.parse_args(argv)


def render_suite(
    targets: list[Path],
    outputs: list[str],
    suite_args: list[str],
    res: slurm.Resources,
    log_dir: Path,
    bin_dir: Path | None = None,
) -> str:
    """slurm/eval_suite.sbatch for `python -m eval.suite TARGET [--out OUTPUT] SUITE_ARGS` of each target."""
    return slurm.render(
        "eval_suite.sbatch",
        {
            "job_name": f"clip-suite-{targets[0].name}",
            "nodes": res.nodes,
            "procs_per_node": res.procs_per_node,
            "time": res.time,
            "workdir": Path.cwd(),
            "repo": slurm.REPO,
            "log_dir": log_dir,
            "sbatch_options": slurm.sbatch_options(res),
            "bin_dir": bin_dir or Path(sys.executable).parent,
            "checkpoints": shlex.join(map(str, targets)),
            "outputs": shlex.join(outputs),
            "suite_args": shlex.join(suite_args),
        },
    )


def main_suite(argv: list[str]) -> None:
    args = parse_args(argv)
    try:
        read_suite(args.suite and str(args.suite), args.dataset)
    except EvalInputError as e:
        raise slurm.SubmitError(str(e)) from None
    res = slurm.with_loader_cpus(slurm.resources_from(args), args.workers)
    targets = [p.absolute() for p in args.checkpoints]
    runs = [slurm.run_of(p) for p in targets]
    outputs = [str(args.out.absolute() / f"{run.name}-{name}") if args.out else "" for run, name in runs]
    log_dir = args.out.absolute() if args.out else runs[0][0] / "eval"
    suite_args = ["--suite", str(args.suite.absolute())] if args.suite else []
    for pair in args.dataset:
        name, _, path = pair.partition("=")
        suite_args += ["--dataset", f"{name}={Path(path).absolute()}"]
    suite_args += ["--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    for flag, value in (("--image-size", args.image_size), ("--context-length", args.context_length)):
        suite_args += [flag, str(value)] if value else []
    script = render_suite(targets, outputs, suite_args, res, log_dir)
    job_id = slurm.submit(script, log_dir / f"suite-{slurm.timestamp()}.sbatch", args.dry_run)
    if job_id:
        print(f"submitted job {job_id}\nresults: " + " ".join(o or str(r / "eval") for o, (r, _) in zip(outputs, runs)))
