"""Fixtures that cut a test's waiting without changing what it runs: tests/scripts/conftest.py uses both for every
script test; a test elsewhere that runs a study or a benchmark in-process names them."""

import gc
import time

import pytest

from train import study_local


@pytest.fixture
def frozen_heap():
    """The objects alive before the test (torch, pandas, matplotlib, pytest: ~500k) kept out of the gc.collect()
    the benchmarks' probes run around every point (train/bench/probes.py): 0.2 s a call otherwise, most of a quick
    benchmark (scripts.bench_attention, bench_long, bench_train, and a study's analysis). Garbage made during the
    test is still collected."""
    gc.freeze()
    yield
    gc.unfreeze()


class _QuickPolls:
    """train.study_local's `time`, its wait between two looks at the running runs cut from 1 s to 0.1 s."""

    perf_counter = staticmethod(time.perf_counter)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, 0.1))


@pytest.fixture
def quick_polls(monkeypatch):
    """run_jobs (scripts.demo and its linearisation arm, scripts.rope_resolution, a study's local runs) sees a
    finished run within 0.1 s instead of 1 s, so the next run starts and the study ends up to 0.9 s sooner each
    time."""
    monkeypatch.setattr(study_local, "time", _QuickPolls)
