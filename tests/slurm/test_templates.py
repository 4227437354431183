"""The sbatch templates: what they render to, and what the rendered bash does, run against stand-in
scontrol/srun/torchrun/scancel (no Slurm needed)."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from train.slurm import Resources, SbatchTemplate, SubmitError, render_job, render_train, time_limit_seconds
from train.sweep import Task, task_block

CONFIG = Path("/configs/tiny.yaml")
RUN = Path("/runs/big")


def gpu_job(**changes) -> Resources:
    values = dict(time="2-00:00:00", nodes=4, gpus_per_node=8, procs_per_node=8, partition="gpu", account="clip")
    return Resources(**{**values, **changes})


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_four_nodes_of_eight_gpus_script():
    script = render_train(CONFIG, ["train.max_steps=100", f"train.run_dir={RUN}"], RUN, gpu_job())
    lines = sbatch_lines(script)
    for expected in [
        "--nodes=4",
        "--ntasks-per-node=1",
        "--gres=gpu:8",
        "--partition=gpu",
        "--account=clip",
        "--time=2-00:00:00",
        "--requeue",
        "--open-mode=append",
        "--signal=B:USR1@120",
        f"--output={RUN}/slurm-%j.out",
        f"--chdir={Path.cwd()}",
    ]:
        assert expected in lines, f"missing #SBATCH {expected} in {lines}"
    assert "WORLD_SIZE=32" in script.splitlines()
    launch = " ".join(script.split("torchrun ", 1)[1].split("\\\n"))
    assert re.search(r"--nnodes=4\s+--nproc_per_node=8\s+--node_rank=\"\$SLURM_NODEID\"", launch)
    assert '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT"' in launch
    assert "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))" in script
    assert f"TRAIN_ARGS=({CONFIG} train.max_steps=100 train.run_dir={RUN})" in script


def test_cpu_mode_has_no_gres_line():
    script = render_train(CONFIG, [], RUN, Resources(time="10", nodes=2, gpus_per_node=0, procs_per_node=3))
    lines = sbatch_lines(script)
    assert not any(line.startswith("--gres") for line in lines)
    assert not any(line.startswith(("--partition", "--account")) for line in lines)
    assert "--nproc_per_node=3" in script and "WORLD_SIZE=6" in script.splitlines()


def stub_env(stub_bin: Path, **extra) -> dict:
    return {
        **os.environ,
        "STUB_LOG": str(stub_bin.parent / "calls.log"),
        "SLURM_JOB_ID": "123457",
        "SLURM_JOB_NODELIST": "gpu-[001-004]",
        "SLURM_NNODES": "4",
        **extra,
    }


def write_script(tmp_path: Path, stub_bin: Path, overrides: list[str], res: Resources) -> Path:
    path = tmp_path / "job.sbatch"
    path.write_text(render_train(CONFIG, overrides, RUN, res, bin_dir=stub_bin))
    return path


def array_script(tmp_path: Path, stub_bin: Path) -> Path:
    """A 2-node job array of three runs, rendered as `python -m train.submit sweep` does."""
    tasks = [
        Task(Path(f"/runs/p{i}"), [f"model.name=tiny-{s}", f"train.run_dir=/runs/p{i}"], {})
        for i, s in enumerate("sml")
    ]
    path = tmp_path / "array.sbatch"
    res = gpu_job(nodes=2, sbatch_args=["--array=0-2"])
    path.write_text(
        render_job("clip-sweep", tmp_path / "logs" / "a-%A_%a.out", task_block(CONFIG, tasks), res, stub_bin)
    )
    return path


def calls(stub_bin: Path) -> list[str]:
    return (stub_bin.parent / "calls.log").read_text().splitlines()


def test_four_node_environment(tmp_path, stub_bin):
    """Each node's torchrun gets its node rank, the first node's address and the job's port."""
    overrides = ["train.wandb_name=a run with spaces", "train.max_steps=7"]
    script = write_script(tmp_path, stub_bin, overrides, gpu_job())
    done = subprocess.run(["bash", str(script)], env=stub_env(stub_bin), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "world size 32, rendezvous gpu-001.ib:23457" in done.stdout
    launches = sorted(c for c in calls(stub_bin) if c.startswith("torchrun"))
    assert len(launches) == 4
    for rank, line in enumerate(launches):
        assert f"--nnodes=4 --nproc_per_node=8 --node_rank={rank} " in line
        assert "--master_addr=gpu-001.ib --master_port=23457" in line
        assert line.endswith(f"-m train {CONFIG} {' '.join(overrides)} MASTER_ADDR=gpu-001.ib MASTER_PORT=23457")
    assert not any(c.startswith(("scancel", "scontrol requeue")) for c in calls(stub_bin))


def start_batch(script: Path, env: dict, stub_bin: Path, tasks: int) -> subprocess.Popen:
    """The batch script in the background, once each of its `tasks` stand-in torchruns has started (10 s at most)."""
    batch = subprocess.Popen(
        ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    pids = stub_bin.parent / "calls.log.pids"
    deadline = time.monotonic() + 10
    while not (pids.exists() and len(pids.read_text().split()) == tasks) and time.monotonic() < deadline:
        time.sleep(0.05)
    return batch


@pytest.mark.parametrize("array", [False, True], ids=["job", "array-task"])
def test_usr1_is_forwarded_then_the_job_requeued(tmp_path, stub_bin, array):
    """USR1 to the batch shell -> scancel --signal=USR1 on the job's steps -> the job requeues itself. An array task
    names itself ARRAYJOB_TASK, so the signal and the requeue concern that task only."""
    env = stub_env(stub_bin, SLURM_NNODES="2", STUB_SECONDS="20")
    job = "123457"
    if array:
        # Slurm gives the array's last task the array's own job id, which also names the whole array
        script, job = array_script(tmp_path, stub_bin), "123457_2"
        env.update(SLURM_ARRAY_TASK_ID="2", SLURM_ARRAY_JOB_ID="123457")
    else:
        script = write_script(tmp_path, stub_bin, [], gpu_job(nodes=2))
    batch = start_batch(script, env, stub_bin, tasks=2)
    batch.send_signal(signal.SIGUSR1)
    output, _ = batch.communicate(timeout=15)
    assert batch.returncode == 0, output
    log = calls(stub_bin)
    assert f"scancel --signal=USR1 {job}" in log
    assert sum("got USR1" in c for c in log) == 2
    assert log[-1] == f"scontrol requeue {job}"
    assert f"requeueing job {job}" in output


def test_term_reaches_every_task_and_the_job_is_requeued(tmp_path, stub_bin):
    """A pre-emption's SIGTERM goes from Slurm to the batch shell and to every task at once: the shell outlives it,
    signals nobody again (a second signal would cut torchrun's grace time short) and requeues the job."""
    script = write_script(tmp_path, stub_bin, [], gpu_job(nodes=2))
    batch = start_batch(script, stub_env(stub_bin, SLURM_NNODES="2", STUB_SECONDS="20"), stub_bin, tasks=2)
    batch.send_signal(signal.SIGTERM)
    for pid in (stub_bin.parent / "calls.log.pids").read_text().split():
        os.kill(int(pid), signal.SIGTERM)
    output, _ = batch.communicate(timeout=15)
    assert batch.returncode == 0, output
    log = calls(stub_bin)
    assert sum("got TERM" in c for c in log) == 2
    assert not any(c.startswith("scancel") for c in log)
    assert log[-1] == "scontrol requeue 123457"
    assert "TERM: the training step checkpoints" in output and "requeueing job 123457" in output


@pytest.mark.parametrize("exit_code", [0, 1])
def test_no_requeue_without_preemption(tmp_path, stub_bin, exit_code):
    script = write_script(tmp_path, stub_bin, [], gpu_job(nodes=1))
    env = stub_env(stub_bin, SLURM_NNODES="1", STUB_RC=str(exit_code))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == exit_code
    assert not any("requeue" in c for c in calls(stub_bin))
    assert f"finished with exit code {exit_code}" in done.stdout


def test_template_fields_leave_bash_alone():
    assert (
        SbatchTemplate("x={{name}} y=$HOME ${A:-b} $((1 + 2))").substitute(name="v") == "x=v y=$HOME ${A:-b} $((1 + 2))"
    )
    with pytest.raises(KeyError):
        SbatchTemplate("{{missing}}").substitute({})
    with pytest.raises(ValueError):
        SbatchTemplate("{{Bad Field}}").substitute({})


@pytest.mark.parametrize(
    "text,seconds",
    [("90", 5400), ("5:30", 330), ("01:00:00", 3600), ("1-12", 129600), ("2-00:30", 174600), ("1-00:00:10", 86410)],
)
def test_time_limit_seconds(text, seconds):
    assert time_limit_seconds(text) == seconds


def test_bad_time_limit_names_the_formats():
    with pytest.raises(SubmitError, match="HH:MM:SS"):
        time_limit_seconds("1h")


def test_array_task_trains_its_own_run(tmp_path, stub_bin):
    script = array_script(tmp_path, stub_bin)
    assert "#SBATCH --array=0-2" in script.read_text()
    env = stub_env(stub_bin, SLURM_NNODES="2", SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_JOB_ID="123450")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "job 123450_1 start 0:" in done.stdout
    launches = [c for c in calls(stub_bin) if c.startswith("torchrun")]
    assert len(launches) == 2
    assert all(f"-m train {CONFIG} model.name=tiny-m train.run_dir=/runs/p1 MASTER_ADDR" in line for line in launches)


def test_array_task_without_a_run_fails_before_training(tmp_path, stub_bin):
    script = array_script(tmp_path, stub_bin)
    env = stub_env(stub_bin, SLURM_NNODES="2", SLURM_ARRAY_TASK_ID="3", SLURM_ARRAY_JOB_ID="123450")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "no run for array task '3' in this script" in done.stdout
    assert not (stub_bin.parent / "calls.log").exists()
