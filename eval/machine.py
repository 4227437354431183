"""The machine a measurement ran on, and which dtypes it runs natively.

    machine.describe("cpu")                   # "AMD EPYC (x86_64), 2 torch threads; bf16 native, fp16 emulated"
    machine.emulated("cpu")                   # {"float16": "fp16 GEMM 3 GFLOP/s against fp32's 100 ... skipped"}
    machine.gemm_rate("cpu", torch.float32, 4096)   # GFLOP/s, in bounded time on any CPU

A CPU without native bf16 (AVX2 only: no AVX512-BF16, no AMX) runs bf16 matrix products through an emulation
about 76x slower than fp32, and the same CPU model name can come with or without it. So every rate is probed on
a small product first (SMALL x SMALL, a fraction of a second), a large product is timed only where the small
rate predicts it finishes within `max_seconds`, and a dtype whose small rate is under EMULATED_BELOW of fp32's is
emulated, as is one whose native instructions the x86 CPU's flags lack (NATIVE_FLAGS: a timing probe on a loaded
machine can misread); benchmarks skip it with the one line `emulated()` gives, in their output and on their page.

`CLIP_BF16_EMULATED=1` makes the probe report bf16 as emulated (the path of a CPU without it, on one that has
it); `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's own variable, set before Python starts) makes the CPU really emulate it.
"""

from __future__ import annotations

import functools
import os
import platform
import resource
import time
from pathlib import Path

import torch

SMALL = 256  # the first probe of every dtype: 34 MFLOP, 0.05 s even at 0.7 GFLOP/s
EMULATED_BELOW = 0.25  # of fp32's rate
FORCE_ENV = "CLIP_BF16_EMULATED"
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux) and its architecture."""
    name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    arch = platform.machine()
    return f"{name} ({arch})" if name and name != arch else arch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_gemm(device: str, dtype: torch.dtype, n: int, seconds: float) -> float:
    """GFLOP/s of the fastest n x n product: one warm-up, then repeats for `seconds` (at least two)."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    torch.mm(a, b)
    sync(device)
    best, start, runs = float("inf"), time.perf_counter(), 0
    while runs < 2 or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best, runs = min(best, time.perf_counter() - t), runs + 1
    return 2 * n**3 / best / 1e9


@functools.cache
def small_rate(device: str, dtype: torch.dtype) -> float:
    """GFLOP/s at SMALL x SMALL, measured once per process in about a fifth of a second."""
    return timed_gemm(device, dtype, SMALL, 0.2)


def gemm_rate(device: str, dtype: torch.dtype, n: int, max_seconds: float = 4.0) -> tuple[float, int]:
    """(GFLOP/s, size measured): at n where the small probe predicts 4 products of n finish within max_seconds,
    else the small probe's rate at SMALL."""
    rate = small_rate(device, dtype)
    if n <= SMALL or 4 * 2 * n**3 / (rate * 1e9) > max_seconds:
        return rate, SMALL
    return timed_gemm(device, dtype, n, max_seconds / 4), n


def emulated(device: str = "cpu") -> dict[str, str]:
    """{dtype name: the one line saying why it is skipped} for each reduced-precision dtype this CPU emulates
    (GEMM rate under EMULATED_BELOW of fp32's, or bf16 under CLIP_BF16_EMULATED=1); empty on a GPU."""
    if not device.startswith("cpu"):
        return {}
    out = dict(measured_emulated(device))
    if os.environ.get(FORCE_ENV, "") not in ("", "0") and "bfloat16" not in out:
        rate = small_rate(device, torch.bfloat16)
        out["bfloat16"] = f"bf16 skipped: reported as emulated ({FORCE_ENV}=1; measured {rate:.0f} GFLOP/s)"
    return out


# x86 CPU flags of each reduced precision's native matrix products; a CPU whose /proc/cpuinfo lists none of them
# emulates it, however the timing probe reads on a loaded machine (an oversubscribed fp32 probe can read 100x slow)
NATIVE_FLAGS = {"bfloat16": {"avx512_bf16", "amx_bf16"}, "float16": {"avx512_fp16", "amx_fp16"}}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The x86 CPU's flags from /proc/cpuinfo; empty where there is none (not Linux, not x86: the probe decides)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


@functools.cache
def measured_emulated(device: str) -> dict[str, str]:
    fp32, out, flags = small_rate(device, torch.float32), {}, cpu_flags()
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        if flags and not NATIVE_FLAGS[name] & flags:
            wanted = " or ".join(sorted(NATIVE_FLAGS[name]))
            out[name] = f"{SHORT[name]} skipped: this CPU emulates it (no {wanted} in /proc/cpuinfo's flags)"
            continue
        rate = small_rate(device, dtype)
        if rate < EMULATED_BELOW * fp32:
            out[name] = (
                f"{SHORT[name]} skipped: this CPU emulates it ({SHORT[name]} GEMM {rate:.1f} GFLOP/s against fp32's "
                f"{fp32:.0f} at {SMALL} x {SMALL}, under 1/{round(1 / EMULATED_BELOW)})"
            )
    return out


def dtype_support(device: str = "cpu") -> str:
    """ "bf16 native, fp16 emulated" (CPU); "bf16 native, fp16 native" on a GPU."""
    skipped = emulated(device)
    return ", ".join(f"{SHORT[d]} {'emulated' if d in skipped else 'native'}" for d in ("bfloat16", "float16"))


def describe(device: str = "cpu") -> str:
    """The machine as every page header names it: CPU model, threads, and which reduced precisions are native;
    on a GPU its name, memory, SMs and CUDA version."""
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs), CUDA {torch.version.cuda}"
    cores = os.cpu_count()
    return f"{cpu_model()}, {cores} cores, {torch.get_num_threads()} torch threads; {dtype_support(device)}"


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
