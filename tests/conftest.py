import contextlib
import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
# The C kernels wherever they apply, on every CPU (auto leaves the non-causal ones out without AVX-512F), so the
# suite runs them on any machine; tests/models/test_attention_dispatch.py checks auto's choice without it.
os.environ.setdefault("CLIP_CPU_KERNEL", "1")
# Without a GPU the Triton kernels run in Triton's interpreter; triton.jit reads this when a kernel is defined,
# so it must be set before anything imports models.attention.ops (tests/models/test_triton.py checks it took).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Tiny models gain nothing from intra-op threads, and torch's pool busy-waits when the cores are
    shared (data workers, a second rank): one thread makes these tests many times faster. Reset for
    every test, so a test that changes it (a benchmark's --threads) leaks nothing."""
    torch.manual_seed(0)
    torch.set_num_threads(1)


# The real Slurm cluster is one session fixture: its tests form one xdist scope, so one worker brings it up.
CLUSTER_MODULES = (
    "tests/slurm/test_cluster.py",
    "tests/slurm/test_cluster_sweeps.py",
    "tests/slurm/test_suite_cluster.py",
)
# The longest scopes go first, so the two workers finish together (pytest --durations on this machine).
LONG_FIRST = (
    *CLUSTER_MODULES,
    "tests/scripts/test_demo.py",
    "tests/train/test_distributed_fsdp.py",
    "tests/models/test_triton_compile.py",
    "tests/train/test_preemption.py",
    "tests/eval/test_sharding.py",
    "tests/train/test_distributed.py",
    "tests/train/test_distill_distributed.py",
    "tests/train/test_untrusted_metadata.py",
    "tests/train/test_full_disk.py",
)


# Long scopes that are not marked `trains` (or are, further down): placed after LONG_FIRST, before the many short ones.
LONG_TOO = (
    "tests/test_wheel.py",
    "tests/train/test_rank_faults.py",
    "tests/scripts/test_gpu_train_check.py",
    "tests/train/test_siglip_exchange.py",
    "tests/train/test_stages.py",
    "tests/train/test_distill_default.py",
    "tests/scripts/test_optimizer_study.py",
)


# Modules that train, launch processes or bring up a cluster: marked `trains`; `make test-fast` leaves them out.
TRAINS = (
    *LONG_FIRST,
    "tests/train/test_train.py",
    "tests/train/test_remote.py",
    "tests/train/test_run_summary.py",
    "tests/train/test_checkpoint_verify.py",
    "tests/train/test_cli_errors.py",
    "tests/train/test_branch.py",
    "tests/train/test_distill.py",
    "tests/train/test_stages.py",
    "tests/train/test_step_efficiency.py",
    "tests/scripts/test_gpu_train_check.py",
    "tests/scripts/test_bench_attention.py",
    "tests/scripts/test_bench_train.py",
    "tests/scripts/test_bench_long.py",
    "tests/scripts/test_bench_distill.py",
    "tests/scripts/test_rope_resolution.py",
    "tests/eval/test_zeroshot.py",
    "tests/eval/test_numbered_folders.py",
    "tests/data/test_epochs.py",
    "tests/train/test_run_folder.py",
    "tests/train/test_logging.py",
    "tests/train/test_distill_default.py",
    "tests/train/test_schedule_change.py",
)


RAM_DISK = Path("/dev/shm")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Test folders in RAM (/dev/shm) where it has room, unless --basetemp says otherwise: tiny runs write and fsync
    50 MB checkpoints, which on a virtual disk take longer than their training. One folder per session (the pid),
    so that two sessions at once never share one; folders of sessions that have ended are removed."""
    if config.option.basetemp or hasattr(config, "workerinput") or not RAM_DISK.is_dir():
        return  # xdist workers get theirs from the controller
    if shutil.disk_usage(RAM_DISK).free < 4 << 30:
        return
    for old in RAM_DISK.glob(f"pytest-{os.getuid()}-*"):
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(old.name.rsplit("-", 1)[1]), 0)  # raises when that session has ended
            continue
        shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(RAM_DISK / f"pytest-{os.getuid()}-{os.getpid()}")


def pytest_sessionfinish(session, exitstatus):
    """A green session's RAM folder goes at once; a failed one's stays until the next session starts."""
    basetemp, worker = session.config.option.basetemp, hasattr(session.config, "workerinput")
    if exitstatus == 0 and basetemp and Path(basetemp).parent == RAM_DISK and not worker:
        shutil.rmtree(basetemp, ignore_errors=True)


def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate((*LONG_FIRST, *LONG_TOO))}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    for item in items:
        if item.nodeid.split("::")[0] in TRAINS:
            item.add_marker(pytest.mark.trains)


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs `pytest -n 2 --dist loadscope`: the tests of one module run on one worker, so a module
    fixture is built once, and the cluster modules share one scope. The scopes go out in the collection's order
    (LONG_FIRST, then LONG_TOO, then the rest): xdist's --loadscope-reorder, on by default, would hand them out by
    number of tests instead, leaving long modules with few tests (the wheel, the rank faults) to the end."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "slurm-cluster" if nodeid.startswith(CLUSTER_MODULES) else super()._split_scope(nodeid)

    return Scheduling(config, log)
