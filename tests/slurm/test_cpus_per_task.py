"""--cpus-per-task of the rendered jobs: one task per node runs torchrun for all its processes, so the task asks for
procs-per-node x (data.workers + 1) CPUs unless the command gives --cpus-per-task (issue 49)."""

import os
import subprocess
from pathlib import Path

import pytest

from tests.slurm.jobs import assert_completed, job_output, wait_for
from tests.slurm.test_templates import RUN, calls, sbatch_lines
from train.slurm import Resources, render_train, submit, with_loader_cpus
from train.submit import main

LAION = Path(__file__).resolve().parents[2] / "configs" / "vit_b16_laion400m.yaml"


def dry_run(capsys, monkeypatch, tmp_path, argv: list[str]) -> list[str]:
    monkeypatch.chdir(tmp_path)
    main([*argv, "--time", "60", "--dry-run"])
    return sbatch_lines(capsys.readouterr().out)


@pytest.mark.parametrize("workers,cpus", [(8, 72), (0, 8)])
def test_eight_gpus_ask_for_a_cpu_per_process_and_loader(capsys, monkeypatch, tmp_path, workers, cpus):
    """configs/base/laion400m.yaml's 8 loader workers on 8 GPUs: 8 x (8 + 1); without workers still 1 per process."""
    lines = dry_run(capsys, monkeypatch, tmp_path, [str(LAION), "--gpus-per-node", "8", f"data.workers={workers}"])
    assert [line for line in lines if line.startswith("--cpus-per-task")] == [f"--cpus-per-task={cpus}"]
    assert "--ntasks-per-node=1" in lines


def test_given_cpus_per_task_wins(capsys, monkeypatch, tmp_path):
    lines = dry_run(capsys, monkeypatch, tmp_path, [str(LAION), "--gpus-per-node", "8", "--cpus-per-task", "32"])
    assert [line for line in lines if line.startswith("--cpus-per-task")] == ["--cpus-per-task=32"]


def test_suite_job_counts_its_workers(capsys, monkeypatch, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    argv = ["suite", str(run), "--dataset", f"x={tmp_path}", "--gpus-per-node", "4", "--workers", "2"]
    lines = dry_run(capsys, monkeypatch, tmp_path, argv)
    assert "--cpus-per-task=12" in lines


def test_srun_steps_get_the_jobs_cpus(tmp_path, stub_bin):
    """Slurm >= 22.05 no longer hands sbatch's --cpus-per-task to srun; the script passes it on through
    SRUN_CPUS_PER_TASK (here: a stand-in torchrun that logs what it sees)."""
    res = with_loader_cpus(Resources(time="10", nodes=1, gpus_per_node=2, procs_per_node=2), workers=3)
    script = tmp_path / "job.sbatch"
    script.write_text(render_train(Path("/configs/tiny.yaml"), [], RUN, res, bin_dir=stub_bin))
    torchrun = stub_bin / "torchrun"
    torchrun.write_text(
        torchrun.read_text().replace("echo $$", 'echo "cpus ${SRUN_CPUS_PER_TASK:-unset}" >>"$STUB_LOG"\necho $$', 1)
    )
    env = {
        **os.environ,
        "STUB_LOG": str(tmp_path / "calls.log"),
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "gpu-001",
        "SLURM_NNODES": "1",
        "SLURM_CPUS_PER_TASK": "8",
    }
    env.pop("SRUN_CPUS_PER_TASK", None)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --cpus-per-task=8" in script.read_text().splitlines()
    assert "cpus 8" in calls(stub_bin)


def test_training_step_gets_the_cpus_on_a_real_cluster(slurm_cluster, torchrun_stub, tmp_path, monkeypatch):
    """Real sbatch/srun take the rendered line: each node's step starts with the job's 3 CPUs per task
    (3 processes x (0 workers + 1)) and SRUN_CPUS_PER_TASK set, which task binding on Slurm >= 22.05 reads."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("STUB_LOG", str(log))
    stub = torchrun_stub / "torchrun"
    seen = 'echo "cpus $SLURM_CPUS_PER_TASK ${SRUN_CPUS_PER_TASK:-unset}" >>"$STUB_LOG"'
    stub.write_text(stub.read_text().replace("echo $$", f"{seen}\necho $$", 1))
    run_dir = tmp_path / "run"
    res = with_loader_cpus(Resources(time="5", nodes=2, gpus_per_node=0, procs_per_node=3, partition="debug"), 0)
    script = render_train(Path("/configs/tiny.yaml"), [f"train.run_dir={run_dir}"], run_dir, res, bin_dir=torchrun_stub)
    job_id = submit(script, run_dir / "train.sbatch", dry_run=False)
    assert_completed(wait_for(job_id, run_dir, timeout=60), job_id, run_dir)
    lines = [line for line in log.read_text().splitlines() if line.startswith("cpus")]
    assert lines == ["cpus 3 3", "cpus 3 3"], (lines, job_output(job_id, run_dir))


def test_sweep_jobs_ask_for_their_loaders_cpus(capsys, monkeypatch, tmp_path):
    """A sweep's arrays render through the same rule: 8 GPUs x (8 workers + 1)."""
    argv = ["sweep", str(LAION), "--attentions", "softmax,linear_affine_nodenom", "--samples", "1000000"]
    lines = dry_run(capsys, monkeypatch, tmp_path, [*argv, "--gpus-per-node", "8", "data.workers=8"])
    assert {line for line in lines if line.startswith("--cpus-per-task")} == {"--cpus-per-task=72"}
