"""Jobs on a real one-host Slurm cluster of 2 virtual nodes (the slurm_cluster fixture of conftest.py).

Each wait is bounded; a job that fails or hangs is cancelled and its .out file shown in the failure."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.slurm.jobs import CPU_JOB, REPO, TINY, assert_completed, job_output, submit_command, wait_for
from train.slurm import Resources, render_train, submit

PREEMPT_STEPS = 40


def test_rendezvous_on_two_nodes(slurm_cluster, torchrun_stub, tmp_path, monkeypatch):
    """Real sbatch/srun/scontrol with a stand-in torchrun: one task per node, node ranks 0 and 1, the first
    node's address and the port 20000 + job id % 20000."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("STUB_LOG", str(log))
    run_dir = tmp_path / "run"
    res = Resources(time="5", nodes=2, gpus_per_node=0, procs_per_node=3, partition="debug")
    script = render_train(Path("/configs/tiny.yaml"), [f"train.run_dir={run_dir}"], run_dir, res, bin_dir=torchrun_stub)
    job_id = submit(script, run_dir / "train.sbatch", dry_run=False)
    assert_completed(wait_for(job_id, run_dir, timeout=60), job_id, run_dir)
    port = 20000 + int(job_id) % 20000
    launches = sorted(line for line in log.read_text().splitlines() if line.startswith("torchrun"))
    assert len(launches) == 2, log.read_text()
    for rank, line in enumerate(launches):
        assert f"--nnodes=2 --nproc_per_node=3 --node_rank={rank} --master_addr=127.0.0.1 --master_port={port}" in line
    assert f"world size 6, rendezvous 127.0.0.1:{port}" in job_output(job_id, run_dir)


def submit_tiny(run_dir: Path, resources: list[str], overrides: list[str]) -> str:
    """python -m train.submit configs/tiny.yaml (CPU, partition debug) -> the job id it printed."""
    out = submit_command(
        [str(REPO / "configs" / "tiny.yaml"), *CPU_JOB, *resources, *TINY, *overrides, f"train.run_dir={run_dir}"]
    )
    assert f"run dir: {run_dir}" in out
    return re.search(r"submitted job (\d+)", out).group(1)


def latest_checkpoint(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()


@pytest.fixture(scope="module")
def tiny_jobs(slurm_cluster, shards, tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """The jobs of the tests below, submitted together so they run side by side: name -> (job id, run dir or,
    for "eval", the folder of its results). "preempted" is long enough to be signalled by the first test."""
    jobs = {}
    for name, resources, steps in [
        ("preempted", ["--procs-per-node", "1"], PREEMPT_STEPS),
        ("single", ["--procs-per-node", "1"], 4),
        ("two-nodes", ["--nodes", "2", "--procs-per-node", "1"], 3),
    ]:
        run_dir = tmp_path_factory.mktemp(name) / "run"
        jobs[name] = (
            submit_tiny(run_dir, resources, [f"data.train_shards={shards}", f"train.max_steps={steps}"]),
            run_dir,
        )
    single_job, single_dir = jobs["single"]
    out = submit_command(
        [
            "eval",
            str(single_dir),
            "--dataset",
            str(Path(shards).parent.parent / "eval"),
            *CPU_JOB[:-1],
            f"--sbatch-arg=--dependency=afterok:{single_job}",
            "--workers",
            "0",
            "--batch-size",
            "32",
        ]
    )
    jobs["eval"] = re.search(r"submitted job (\d+)", out).group(1), single_dir / "eval"
    yield jobs
    for _, run_dir in jobs.values():  # checkpoints of 50 MB each
        shutil.rmtree(run_dir, ignore_errors=True)


def finished(tiny_jobs, name: str) -> Path:
    """Wait for one of tiny_jobs to complete; returns its run dir."""
    job_id, run_dir = tiny_jobs[name]
    assert_completed(wait_for(job_id, run_dir, timeout=200), job_id, run_dir)
    return run_dir


def test_usr1_checkpoints_requeues_and_resumes(tiny_jobs):
    """USR1 to the batch shell, as Slurm sends it before the time limit: the run checkpoints, exits 75, the job
    is requeued and the second start continues from that checkpoint to the end."""
    job_id, run_dir = tiny_jobs["preempted"]
    metrics = run_dir / "metrics.jsonl"
    wait_for(job_id, run_dir, timeout=150, until=lambda info: metrics.exists() and metrics.stat().st_size > 0)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True, timeout=30)
    info = wait_for(job_id, run_dir, timeout=200)
    assert_completed(info, job_id, run_dir)
    output = job_output(job_id, run_dir)
    assert info["Restarts"] == "1" and f"requeueing job {job_id}" in output, output
    # with save_every above max_steps, the only checkpoints are the pre-emption's and the final one
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert len(saved) == 2 and saved[1] == f"step_{PREEMPT_STEPS:08d}", saved
    assert saved[0] < saved[1], "training was not stopped early; raise PREEMPT_STEPS"
    assert saved[0] in output.split("requeueing", 1)[1], f"the second start did not resume from {saved[0]}:\n{output}"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, PREEMPT_STEPS + 1))
    assert [r["end"] for r in records if "end" in r] == ["preempted", "done"]  # one skip summary per start


def test_tiny_training_finishes_with_a_checkpoint(tiny_jobs):
    run_dir = finished(tiny_jobs, "single")
    meta = json.loads((latest_checkpoint(run_dir) / "meta.json").read_text())
    assert meta["step"] == 4 and meta["samples_seen"] == 32
    assert (latest_checkpoint(run_dir) / "model.safetensors").is_file()


def test_eval_job_after_training_writes_zero_shot_results(tiny_jobs):
    """The eval job waits for the training job (--dependency=afterok) and evaluates its latest checkpoint."""
    finished(tiny_jobs, "single")
    job_id, results = tiny_jobs["eval"]
    assert_completed(wait_for(job_id, results, timeout=150), job_id, results)
    result = json.loads((results / "zeroshot-latest-eval.json").read_text())
    assert result["num_images"] == 24 and 0 <= result["top1"] <= result["top5"] <= 1


def test_two_nodes_train_as_one_world_of_two(tiny_jobs):
    job_id, run_dir = tiny_jobs["two-nodes"]
    finished(tiny_jobs, "two-nodes")
    checkpoint = latest_checkpoint(run_dir)
    # accelerate's save_state writes one random_states_<rank>.pkl per process: two files = two processes
    assert sorted(p.name for p in checkpoint.rglob("random_states_*.pkl")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
    assert "2 node(s) x 1 process(es) = world size 2" in job_output(job_id, run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3] and records[-1]["end"] == "done"
