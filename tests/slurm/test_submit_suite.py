"""`python -m train.submit suite`: the suite is checked before anything is queued, the job script runs one torchrun
per node with `-m eval.suite` for each checkpoint (against stand-in srun/scontrol/torchrun, no Slurm needed)."""

import os
import shlex
import subprocess

import pytest

from tests.eval import evalsets
from train.slurm import Resources
from train.submit import main
from train.submit_suite import render_suite


@pytest.fixture
def run_and_suite(tmp_path):
    run = evalsets.tiny_run(tmp_path / "run")
    (tmp_path / "data").mkdir()
    (tmp_path / "suite.yaml").write_text(f"datasets:\n  imagenet-v2: {tmp_path / 'data'}\n")
    return run, tmp_path / "suite.yaml"


def test_suite_job_is_written_and_submitted(run_and_suite, tmp_path, capsys, monkeypatch, stub_bin):
    monkeypatch.setenv("PATH", f"{stub_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(stub_bin.parent / "calls.log"))
    run, spec = run_and_suite
    checkpoint = run / "checkpoints" / "step_00000005"
    resources = ["--nodes", "2", "--gpus-per-node", "4", "--time", "30", "--batch-size", "128"]
    main(
        ["suite", str(checkpoint), str(run), "--suite", str(spec), "--dataset", f"coco={tmp_path / 'data'}", *resources]
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "submitted job 1001" and out[1] == f"results: {run / 'eval'} {run / 'eval'}"
    script = next((run / "eval").glob("suite-*.sbatch")).read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:4" in script
    assert f"CHECKPOINTS=({checkpoint} {run})" in script and "OUTPUTS=('' '')" in script
    suite_args = ["--suite", str(spec), "--dataset", f"coco={tmp_path / 'data'}", "--batch-size", "128"]
    assert f"SUITE_ARGS=({shlex.join([*suite_args, '--workers', '4'])})" in script
    assert "--nproc_per_node=4" in script and "-m eval.suite" in script


def test_suite_job_at_another_size_passes_the_flags_to_eval_suite(run_and_suite, capsys):
    run, spec = run_and_suite
    main(
        [
            "suite",
            str(run),
            "--suite",
            str(spec),
            "--time",
            "30",
            "--image-size",
            "64",
            "--context-length",
            "48",
            "--dry-run",
        ]
    )
    script = capsys.readouterr().out
    line = next(line for line in script.splitlines() if line.startswith("SUITE_ARGS=("))
    assert shlex.split(line.removeprefix("SUITE_ARGS=(").removesuffix(")"))[-4:] == [
        "--image-size",
        "64",
        "--context-length",
        "48",
    ]
    assert not (run / "eval").exists()  # a dry run queues and writes nothing


@pytest.mark.parametrize(
    "args, words",
    [
        (["--dataset", "coco"], "must be NAME=PATH"),
        (["--dataset", "coco=/no/such/folder"], "does not exist"),
        ([], "no data sets"),
        (["--dataset", "x=.", "--gpus-per-node", "2", "--procs-per-node", "3"], "differs from --gpus-per-node"),
    ],
)
def test_bad_suite_is_refused_before_queueing(run_and_suite, args, words, capsys):
    run, _ = run_and_suite
    with pytest.raises(SystemExit, match=words):
        main(["suite", str(run), "--time", "10", *args])
    assert not (run / "eval").exists()


def test_job_runs_torchrun_on_every_node_for_each_checkpoint(tmp_path, stub_bin):
    targets = [tmp_path / "run-a", tmp_path / "run-b"]
    res = Resources(time="20", nodes=2, gpus_per_node=8, procs_per_node=8)
    args = ["--suite", "/suites/s.yaml", "--workers", "2"]
    script = render_suite(targets, ["", str(tmp_path / "out-b")], args, res, tmp_path, bin_dir=stub_bin)
    (tmp_path / "job.sbatch").write_text(script)
    env = {
        **os.environ,
        "STUB_LOG": str(stub_bin.parent / "calls.log"),
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NODELIST": "gpu-[001-002]",
        "SLURM_NNODES": "2",
    }
    done = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "evaluated 2 checkpoint(s), 0 failed" in done.stdout
    launches = sorted(
        line for line in (stub_bin.parent / "calls.log").read_text().splitlines() if line.startswith("torchrun")
    )
    assert len(launches) == 4
    for target, out, port in (
        (targets[0], "", 20000 + 777 * 64 % 20000),
        (targets[1], f" --out {tmp_path / 'out-b'}", 20000 + (777 * 64 + 1) % 20000),
    ):
        mine = [line for line in launches if f"-m eval.suite {target}{out} --suite /suites/s.yaml --workers 2 " in line]
        assert len(mine) == 2, launches
        for rank, line in enumerate(sorted(mine)):
            assert (
                f"--nnodes=2 --nproc_per_node=8 --node_rank={rank} --master_addr=gpu-001.ib --master_port={port}"
                in line
            )
