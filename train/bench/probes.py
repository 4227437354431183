"""What the benchmarks need to know about the device they time: a timer, a peak-memory probe, out-of-memory
recognition, the machine's reference rates (fp32 GEMM on a CPU, copy bandwidth on a GPU), and a race of
contenders taking turns.

    probe = probes.probe("cuda")              # or "cpu"; a clear one-line error when there is no such device
    seconds = probe.time(step)                # CUDA events around step() on a GPU, perf_counter on the CPU
    extra_mb = probe.peak_mb(step)            # torch.cuda.max_memory_allocated, or the process's VmHWM on Linux
    probes.race({"ours": step, "peer": other}, rounds=3, probe=probe)   # {name: (fastest s, peak MB)}

Everything else in the benchmarks is device-independent and tested on the CPU.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import torch

from eval import machine


class CPUProbe:
    """perf_counter timing; peak memory = resident-set high-water mark (VmHWM, reset through clear_refs)."""

    device = "cpu"

    def sync(self) -> None:
        pass

    def time(self, fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def peak_mb(self, fn) -> float | None:
        """Resident-set high-water mark during fn(), minus the resident set before it; None off Linux (fn still runs).

        It sees torch's CPU allocations, which tracemalloc does not."""
        gc.collect()
        try:
            Path("/proc/self/clear_refs").write_text("5")
            before = memory_kb("VmRSS")
        except OSError:
            fn()
            return None
        fn()
        return (memory_kb("VmHWM") - before) / 1024

    def free(self) -> None:
        gc.collect()

    def describe(self) -> str:
        return machine.describe(self.device)

    def rates(self, quick: bool = False) -> dict:
        """The machine's fp32 and bf16 GEMM rates (GFLOP/s), measured now in bounded time (eval/machine.py: a
        small product first; on small matrices when `quick`); an emulated bf16 is NaN, its line in "skipped"."""
        n, skipped = 1024 if quick else 4096, machine.emulated(self.device)
        bf16 = float("nan") if "bfloat16" in skipped else machine.gemm_rate(self.device, torch.bfloat16, n)[0]
        return {"gemm": machine.gemm_rate(self.device, torch.float32, n)[0], "gemm_bf16": bf16, "skipped": skipped}


class CUDAProbe(CPUProbe):
    """CUDA events timing; peak memory = torch.cuda.max_memory_allocated above what was allocated before."""

    device = "cuda"

    def sync(self) -> None:
        torch.cuda.synchronize()

    def time(self, fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def peak_mb(self, fn) -> float:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20

    def free(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()

    def rates(self, quick: bool = False) -> dict:
        """Copy bandwidth (GB/s, bytes read + written) and bf16 GEMM rate (GFLOP/s), measured now."""
        bf16 = machine.gemm_rate(self.device, torch.bfloat16, 2048 if quick else 8192)[0]
        return {"bandwidth": copy_gbs(self), "gemm_bf16": bf16, "skipped": {}}


def probe(device: str):
    """The probe of `device` ("cpu" or "cuda"); a one-line error naming the fix when it is not there."""
    if device == "cpu":
        return CPUProbe()
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(
                "error: --device cuda, but torch sees no CUDA GPU here; run on a GPU machine or --device cpu"
            )
        return CUDAProbe()
    raise SystemExit(f"error: unknown --device {device!r}; use cpu or cuda")


def is_oom(err: BaseException) -> bool:
    """An allocation that failed: torch's OutOfMemoryError (CUDA), MemoryError, or the CPU allocator's message."""
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "not enough memory" in str(err)


def memory_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def copy_gbs(probe, n_bytes: int = 2**30) -> float:
    """Device-to-device copy of n_bytes: bytes read + written per second (GB/s), best of 5."""
    src = torch.empty(n_bytes, dtype=torch.uint8, device=probe.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(probe.time(lambda: dst.copy_(src)) for _ in range(5))
    return 2 * n_bytes / best / 1e9


OOM = "out of memory"


def race(steps: dict, rounds: int, probe) -> dict[str, tuple[float, float | None]]:
    """(fastest seconds per step, peak extra MB) of each contender over `rounds` after one warm-up step each (the
    memory run), or (nan, nan) for one that ran out of memory (left out of the later rounds).

    The contenders take turns within a round, in reversed order every other round; the minimum is kept
    because on a shared machine other jobs only ever add time (as `timeit` advises)."""
    peaks = {name: guarded(lambda step=step: probe.peak_mb(step), probe) for name, step in steps.items()}
    order, times = [name for name in steps if peaks[name] is not OOM], {name: [] for name in steps}
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(guarded(lambda name=name: probe.time(steps[name]), probe))
    nan = float("nan")
    return {name: (nan, nan) if peaks[name] is OOM or OOM in t else (min(t), peaks[name]) for name, t in times.items()}


def guarded(measure, probe):
    """measure(), or OOM when it runs out of memory (the memory is freed); other errors propagate."""
    try:
        return measure()
    except Exception as err:  # only out-of-memory is reported; anything else is re-raised
        if not is_oom(err):
            raise
    probe.free()
    return OOM
