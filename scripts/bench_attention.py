"""Forward + backward (and, on a GPU, forward-only) time and peak memory of the attentions on q, k, v [B, H, N, D].

    .venv/bin/python -m scripts.bench_attention                 # CPU, full run, about 10 minutes on 2 cores
    .venv/bin/python -m scripts.bench_attention --quick         # a smoke run in seconds
    python -m scripts.bench_attention --device cuda             # GPU: B=4, H=8, D=64, bf16 and fp32, N up to 4e6

Times the attention math only (q, k, v require grad; forward, then backward of a fixed random gradient), best
of several repeats within a per-point budget, softmax through torch SDPA as the peer: on a GPU pinned to its
FLASH backend (FlashAttention-2; fp32, which it lacks, on the memory-efficient one). The linear ops run the
implementation the dispatcher picks (`--impl`, default auto; the impl column says which ran). A point whose
predicted time is over --max-seconds is not run: its time is extrapolated from the largest measured point of the
same line, O(N^p) with p = 1 for linear variants and 2 for the others, and marked. A point that runs out of
memory is reported as such (and the larger N of its line are not tried); it never stops the run. Timer and
memory probe per device (scripts/bench_device.py): perf_counter and the resident-set high-water mark on the CPU,
CUDA events and torch.cuda.max_memory_allocated on a GPU, both above what the inputs hold. Reference rates are
measured in the same run: fp32 GEMM on the CPU (linear variants report GFLOP/s counting the matmuls of the linear
algorithm: non-causal 12 N D^2 per head for forward + backward, causal 12 N (C D + D^2) with chunks of C tokens),
copy bandwidth on a GPU (linear variants report GB/s of their least traffic: q, k, v read and o written forward,
and q, k, v, dL/do read and three gradients written backward). Writes <out>.csv, <out>.png, <out>.md.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from contextlib import nullcontext

import pandas as pd
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.attention import ATTENTIONS, build_attention
from models.attention.linear import LinearAttention
from models.attention.ops import dispatch
from scripts import bench_attention_report as report
from scripts import bench_device

CHUNK = 64
DEFAULTS = {  # per device: batch, heads, head size, sizes, extra sizes for linear variants, variants
    "cpu": dict(batch=1, heads=6, head_dim=64, sizes=[77, 197, 577, 1024, 4096, 16384, 65536], long=[131072]),
    "cuda": dict(
        batch=4,
        heads=8,
        head_dim=64,
        sizes=[77, 197, 577, 1024, 4096, 16384, 65536, 262144, 1048576, 4000000],
        long=[],
        variants=["softmax", "linear_affine_nodenom", "linear_affine", "linear_elu"],
    ),
}
PASSES = ("fwd+bwd", "fwd")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--batch", type=int, help="B (default 1 on the CPU, 4 on a GPU)")
    p.add_argument("--heads", type=int, help="H (default 6 on the CPU, 8 on a GPU)")
    p.add_argument("--head-dim", type=int, help="D (default 64)")
    p.add_argument("--sizes", type=int, nargs="+", help="sequence lengths for every variant")
    p.add_argument("--long-sizes", type=int, nargs="*", help="extra lengths for linear variants only")
    p.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16", "float16"), help="default: see --bf16-*")
    p.add_argument("--bf16-variants", nargs="*", default=["softmax", "linear_affine_nodenom", "linear_affine"])
    p.add_argument("--bf16-max-n", type=int, default=16384, help="CPU: largest N timed in bf16")
    p.add_argument("--passes", nargs="+", choices=PASSES, help="default: fwd+bwd on the CPU, both on a GPU")
    p.add_argument(
        "--variants", nargs="*", default=None, help="registry names (default: all; on a GPU softmax + linear)"
    )
    p.add_argument("--impl", default="auto", help="implementation of the linear ops (ops/dispatch.py)")
    p.add_argument("--budget", type=float, default=1.5, help="seconds of repeats per point (at least 3 repeats)")
    p.add_argument("--max-seconds", type=float, default=4.0, help="extrapolate a point predicted to take longer")
    p.add_argument("--total-minutes", type=float, default=9.0, help="after this, remaining points are extrapolated")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice, all cores)")
    p.add_argument("--out", default=None, help="output path without extension (default docs/bench_attention[_cuda])")
    p.add_argument("--quick", action="store_true", help="tiny sizes and budgets, for a smoke test")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    quick = dict(sizes=[77, 300], long_sizes=[1024]) if args.quick else {}
    for key, value in DEFAULTS[args.device].items():
        name = {"long": "long_sizes"}.get(key, key)
        if getattr(args, name, None) is None:
            setattr(args, name, quick.get(name, value))
    args.passes = args.passes or (["fwd+bwd"] if args.device == "cpu" else list(PASSES))
    args.out = args.out or ("docs/bench_attention" if args.device == "cpu" else "docs/bench_attention_cuda")
    if args.quick:
        args.budget, args.max_seconds, args.bf16_max_n = 0.05, 2.0, 300
    args.deadline = time.perf_counter() + 60 * args.total_minutes
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def dtypes_for(name: str, args) -> list[tuple[torch.dtype, int]]:
    """(dtype, largest N) pairs a variant is timed in: --dtypes everywhere, else fp32 (+ bf16 for --bf16-variants up
    to --bf16-max-n) on the CPU, bf16 and fp32 on a GPU."""
    if args.dtypes:
        return [(getattr(torch, d), 1 << 62) for d in args.dtypes]
    if args.device == "cuda":
        pairs = [(torch.bfloat16, 1 << 62), (torch.float32, 1 << 62)]
    else:
        pairs = [(torch.float32, 1 << 62)] + ([(torch.bfloat16, args.bf16_max_n)] if name in args.bf16_variants else [])
    return pairs


def peer_backends(dtype: torch.dtype) -> list[SDPBackend]:
    """SDPA's backend for the softmax peer on a GPU: FlashAttention-2, or for fp32 (which it lacks) memory-efficient."""
    return [SDPBackend.EFFICIENT_ATTENTION] if dtype == torch.float32 else [SDPBackend.FLASH_ATTENTION]


def make_step(name: str, causal: bool, n: int, dtype: torch.dtype, passes: str, args):
    """(step, clear, impl): a closure running the variant's attention math once at length n, one releasing the
    input gradients, and the implementation the dispatcher chose ("" for variants without one)."""
    cls, device = ATTENTIONS[name], args.device
    options = {"max_length": n} if "max_length" in inspect.signature(cls.__init__).parameters else {}
    if name in dispatch.TABLES:
        options["impl"] = args.impl
    layer = build_attention(name, args.heads * args.head_dim, args.heads, causal=causal, **options)
    layer = layer.to(device, dtype)
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=passes == "fwd+bwd") for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=dtype)
    pinned = name == "softmax" and device == "cuda"
    impl = dispatch.resolve(name, args.impl, q, causal) if name in dispatch.TABLES else ""

    def step():
        with sdpa_kernel(peer_backends(dtype)) if pinned else nullcontext():
            if passes == "fwd":
                with torch.no_grad():
                    layer.attention(q, k, v, None)
            else:
                layer.attention(q, k, v, None).backward(grad)

    def clear():
        q.grad = k.grad = v.grad = None
        layer.zero_grad(set_to_none=True)

    return step, clear, impl


def time_point(step, clear, probe, budget: float) -> tuple[float, float, int, float | None]:
    """(best seconds, median seconds, repeats, peak MB) of step() after one warm-up run; the memory run is timed too.

    Gradients are released before each step, outside the timing, so every step allocates them afresh.
    """
    step()
    clear()
    start = time.perf_counter()
    peak = probe.peak_mb(step)
    times = [time.perf_counter() - start]
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 50):
        clear()
        times.append(probe.time(step))
    times.sort()
    return times[0], times[len(times) // 2], len(times), peak


def traffic_bytes(passes: str, n: int, dtype: torch.dtype, args) -> int:
    """The least memory traffic of one step: 4 [B, H, N, D] tensors forward, 7 more backward."""
    tensors = 4 if passes == "fwd" else 11
    return tensors * args.batch * args.heads * n * args.head_dim * torch.finfo(dtype).bits // 8


def linear_flops(causal: bool, n: int, args) -> float:
    per_token = 12 * (CHUNK * args.head_dim + args.head_dim**2) if causal else 12 * args.head_dim**2
    return args.batch * args.heads * n * per_token


def predict(points: list[tuple[int, float]], n: int, power: int) -> float:
    """Time at n from the largest measured (N, seconds), as O(N^power)."""
    n1, t1 = points[-1]
    return t1 * (n / n1) ** power


def measure(row: dict, name: str, causal: bool, n: int, dtype, passes: str, probe, args) -> float | None:
    """Runs one point into row (time, memory, impl; or the out-of-memory status); its best seconds, or None."""
    try:
        step, clear, impl = make_step(name, causal, n, dtype, passes, args)
        best, median, reps, peak = time_point(step, clear, probe, args.budget)
    except Exception as err:  # only out-of-memory is reported; anything else is re-raised
        if not bench_device.is_oom(err):
            raise
        row.update(status="out of memory")
        return None
    finally:
        step = clear = None
        probe.free()
    row.update(time_ms=1e3 * best, median_ms=1e3 * median, reps=reps, peak_mb=peak, impl=impl, status="")
    return best


def bench_line(name: str, causal: bool, dtype: torch.dtype, passes: str, sizes: list[int], probe, args) -> list[dict]:
    """Rows for one variant / mode / dtype / pass over all sizes: measured, extrapolated or out of memory."""
    rows, measured, out_of_memory = [], [], False
    is_linear = issubclass(ATTENTIONS[name], LinearAttention)
    power = 1 if is_linear else 2  # other variants are assumed quadratic: a safe side for softmax-like ones
    for n in sizes:
        row = dict(variant=name, mode="causal" if causal else "full", dtype=str(dtype).removeprefix("torch."))
        row.update(passes=passes, N=n, extrapolated="", status="")
        guess = predict(measured, n, power) if measured else 0.0
        late = time.perf_counter() > args.deadline
        if out_of_memory:
            row.update(status="out of memory (at a smaller N)")
        elif len(measured) > 1 and (guess > args.max_seconds or late):
            row.update(time_ms=1e3 * guess, extrapolated=f"O(N^{power})" + (" (out of time)" if late else ""))
        elif late:
            continue
        else:
            best = measure(row, name, causal, n, dtype, passes, probe, args)
            out_of_memory = best is None
            measured += [] if best is None else [(n, best)]
        if is_linear and "time_ms" in row:
            seconds = row["time_ms"] / 1e3
            row["gbs"] = traffic_bytes(passes, n, dtype, args) / seconds / 1e9
            row["gflops"] = linear_flops(causal, n, args) / seconds / 1e9 if passes == "fwd+bwd" else float("nan")
        rows.append(row)
        print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


def run(args) -> tuple[pd.DataFrame, dict]:
    probe = bench_device.probe(args.device)
    default = DEFAULTS[args.device].get("variants")
    first = [n for n in ("softmax", "linear_affine_nodenom") if n in ATTENTIONS]
    names = args.variants or default or first + sorted(set(ATTENTIONS) - set(first))
    info = dict(load_start=os.getloadavg()[0], threads=torch.get_num_threads(), machine=probe.describe())
    info.update(probe.rates(args.quick))
    print(", ".join(f"{k}={v:.4g}" for k, v in info.items() if isinstance(v, float)), info["machine"], flush=True)
    rows, emulated = [], info["skipped"]  # bf16's rate (always probed) and each dtype asked for: one line each
    info["skipped"] = {k: v for k, v in emulated.items() if k == "bfloat16"}
    for line in info["skipped"].values():
        print(line, flush=True)
    for name in names:
        sizes = args.sizes + (args.long_sizes if issubclass(ATTENTIONS[name], LinearAttention) else [])
        for causal in (False, True) if ATTENTIONS[name].supports_causal else (False,):
            for dtype, max_n in dtypes_for(name, args):
                if (dtype_name := str(dtype).removeprefix("torch.")) in emulated:  # one line, in the report too
                    if dtype_name not in info["skipped"]:
                        print(emulated[dtype_name], flush=True)
                    info["skipped"][dtype_name] = emulated[dtype_name]
                    continue
                for passes in args.passes:
                    rows += bench_line(name, causal, dtype, passes, [n for n in sizes if n <= max_n], probe, args)
    if args.device == "cpu":
        info.update(report.cpu_extras(args))
    frame, info["load_end"] = pd.DataFrame(rows), os.getloadavg()[0]
    return report.add_ratios(frame, info), info


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    frame, info = run(args)
    report.write(frame, info, args)


if __name__ == "__main__":
    main()
