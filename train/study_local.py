"""The study's local runner: its runs as `python -m train` processes on this machine, `jobs` at a time, each with
`threads_per_job` threads, started as forks of this process (train/forked.py) or fresh interpreters; the first
failure stops them all. The Slurm runner of the same grid is train/sweep.py. Forked runs that keep their shards in
memory (data.workers 0, data.cache_mb) find them read and decoded once, by this process (data/cache.py: preload).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from models.run_folder import STUDY_TIMES, write_text_atomic
from train.forked import fork_train
from train.study import REPO, Job


def start(job: Job, threads: int, launch: str = "exec") -> None:
    """Start the job's `python -m train ...`: a fresh interpreter (exec), or a fork of this process (fork:
    train/forked.py, without the imports' seconds)."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    threads_env = {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env = {**os.environ, **threads_env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if launch == "fork" and job.argv[1:3] == ["-m", "train"]:
        job.process = fork_train(job.argv[3:], REPO, env, job.run_dir / "train.log", threads)
    else:
        log = open(job.run_dir / "train.log", "w")  # noqa: SIM115 (closed when the child has it)
        job.process = subprocess.Popen(job.argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
    job.started = time.perf_counter()


def reap(running: list[Job]) -> Job | None:
    """A finished job (with its own CPU time, children included, from wait4), or None if all still run."""
    for job in running:
        pid, status, usage = os.wait4(job.process.pid, os.WNOHANG)
        if pid:
            job.process.returncode = os.waitstatus_to_exitcode(status)
            job.wall_seconds = time.perf_counter() - job.started
            job.cpu_seconds = usage.ru_utime + usage.ru_stime
            return job
    return None


def write_times(job: Job) -> None:
    """The finished run's wall and CPU seconds in its own folder (STUDY_TIMES), where a study resumed or run in parts
    reads them (eval/study_analysis.py run_times): its last runs.json holds only the runs of its last part."""
    times = {"wall_seconds": job.wall_seconds, "cpu_seconds": job.cpu_seconds}
    write_text_atomic(job.run_dir / STUDY_TIMES, json.dumps(times))


def ready_to_start(job: Job) -> bool:
    """A run, or a branch whose run has finished well (or was trained by the sweep)."""
    after = job.after
    return after is None or after.reused or (after.process is not None and after.process.returncode == 0)


def preload_data(jobs: list[Job], report=print, workers: int = 1) -> None:
    """Read and decode, in this process (`workers` forked helpers decoding), the training shards of the runs that will
    be its forks and keep their shards in memory (data.workers 0, data.cache_mb > 0), and tokenize their captions
    once per tokenizer: each run then skips reading, decoding and tokenizing its first epoch (data/cache.py,
    models/preprocess.py)."""
    from data.cache import DECODED, PRELOADED, preload
    from data.sources import expand_spec
    from models import tokenizer, tokenizer_key
    from models.preprocess import share_rows
    from train.config import load_config

    started, kept, wanted, models = time.perf_counter(), 0.0, {}, {}
    for job in jobs:
        if job.argv[1:3] != ["-m", "train"]:
            continue
        cfg = load_config(job.argv[3:], warn=False)
        if cfg.data.workers == 0 and cfg.data.cache_mb > 0:
            key = (cfg.data.train_shards, cfg.data.max_image_pixels, cfg.data.max_caption_bytes)
            wanted[key] = max(wanted.get(key, 0), cfg.data.cache_mb)
            models.setdefault(tokenizer_key(cfg.model), (cfg.model, cfg.data.train_shards))
    for (spec, max_pixels, max_caption_bytes), max_mb in wanted.items():
        kept += preload(expand_spec(spec)[0], max_mb, max_pixels, max_caption_bytes, workers)
    captions = 0
    for key, (model, spec) in models.items():
        samples = [s for url in expand_spec(spec)[0] for s in PRELOADED.get(url, ())]
        captions = share_rows(key, tokenizer(model), [s[DECODED][1] for s in samples if DECODED in s])
    if kept:
        seconds = time.perf_counter() - started
        report(
            f"training shards read and decoded once for the runs: {kept:.0f} MB, {captions} distinct captions "
            f"tokenized for each of {len(models)} sizes, in {seconds:.0f} s"
        )


def run_jobs(jobs: list[Job], parallel: int, threads: int, report=print, launch: str = "exec") -> list[float]:
    """Run every job, `parallel` at a time; stop all on the first failure. Returns the 1-minute load averages
    sampled while they ran (how busy the machine was)."""
    if launch == "fork":
        preload_data(jobs, report, workers=max(parallel * threads, 1))
    waiting, running, loads, done = list(jobs), [], [], 0
    sampled = time.perf_counter() - 1.0  # the first poll samples
    # A terminated study stops its runs too (the finally below), instead of leaving them running.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        while waiting or running:
            ready = [j for j in waiting if ready_to_start(j)]
            while ready and len(running) < parallel:
                running.append(ready.pop(0))
                waiting.remove(running[-1])
                start(running[-1], threads, launch)
            finished = reap(running)
            if finished is None:
                # a finished run's core is idle until the next poll: poll every 0.1 s (a 1-s poll left a core idle
                # 0.5 s per run on average), sample the load once a second
                if time.perf_counter() - sampled >= 1.0:
                    loads.append(os.getloadavg()[0])
                    sampled = time.perf_counter()
                time.sleep(0.1)
                continue
            running.remove(finished)
            done += 1
            if finished.process.returncode != 0:
                raise SystemExit(
                    f"training {finished.size} with {finished.attention} stopped with exit code "
                    f"{finished.process.returncode}; see {finished.run_dir / 'train.log'}"
                )
            write_times(finished)
            report(
                f"run {done}/{len(jobs)} done: {finished.size} {finished.attention} in "
                f"{finished.wall_seconds:.0f} s ({finished.cpu_seconds:.0f} CPU s)"
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
        for job in running:
            job.process.terminate()
            job.process.wait()
    return loads
