"""Forward + backward time and peak memory of every registered attention on q, k, v [B, H, N, D].

    .venv/bin/python -m scripts.bench_attention                 # full run, about 10 minutes on 2 cores
    .venv/bin/python -m scripts.bench_attention --quick         # a smoke run in seconds

Times the attention math only (q, k, v require grad; forward, then backward of a fixed random
gradient), best of several repeats within a per-point budget, softmax through torch SDPA as the
peer. A point whose predicted time is over --max-seconds is not run: its time is extrapolated from
the two largest measured points of the same line, O(N^p) with p their slope rounded to 1 or 2, and
the row is marked extrapolated. Peak memory is the process's resident-set high-water mark (Linux
VmHWM, reset through /proc/self/clear_refs) during one forward + backward, minus the resident set
before it (inputs excluded): it sees torch's CPU allocations, which tracemalloc does not. The
machine's fp32 GEMM rate (a square torch.mm) is measured in the same run; linear variants report
their achieved GFLOP/s counting the matmuls of the linear algorithm (non-causal 12 N D^2 per head
for forward + backward, causal 12 N (C D + D^2) with chunks of C tokens).
Writes <out>.csv, <out>.png (log-log time vs N) and <out>.md (table with ratios to SDPA softmax).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import torch

from models.attention import ATTENTIONS, build_attention
from models.attention.linear import LinearAttention
from models.attention.ops import cpu_build
from models.attention.ops.chunked import causal_linear
from models.attention.ops.common import fresh

B, H, D, CHUNK = 1, 6, 64, 64
SIZES = [77, 197, 577, 1024, 4096, 16384, 65536]
LONG_SIZES = [131072]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="sequence lengths for every variant")
    p.add_argument(
        "--long-sizes", type=int, nargs="*", default=LONG_SIZES, help="extra lengths for linear variants only"
    )
    p.add_argument("--bf16-variants", nargs="*", default=["softmax", "linear_affine_nodenom", "linear_affine"])
    p.add_argument("--bf16-max-n", type=int, default=16384, help="largest N timed in bf16")
    p.add_argument("--variants", nargs="*", default=None, help="registry names (default: all)")
    p.add_argument("--budget", type=float, default=1.5, help="seconds of repeats per point (at least 2 repeats)")
    p.add_argument(
        "--max-seconds", type=float, default=4.0, help="extrapolate a point predicted to take longer than this"
    )
    p.add_argument("--total-minutes", type=float, default=9.0, help="after this, remaining points are extrapolated")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice, all cores)")
    p.add_argument("--out", default="docs/bench_attention", help="output path without extension")
    p.add_argument("--quick", action="store_true", help="tiny sizes and budgets, for a smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.long_sizes, args.budget, args.max_seconds, args.bf16_max_n = [77, 300], [1024], 0.05, 2.0, 300
    args.deadline = time.perf_counter() + 60 * args.total_minutes
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def memory_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_extra_mb(step, clear) -> float | None:
    """Resident-set high-water mark during step(), minus the resident set before it (inputs, no gradients); None off
    Linux."""
    clear()
    try:
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")
        before = memory_kb("VmRSS")
        step()
        return (memory_kb("VmHWM") - before) / 1024
    except OSError:
        step()
        return None


def make_step(name: str, causal: bool, n: int, dtype: torch.dtype):
    """A closure running forward + backward of the variant's attention math at length n."""
    cls = ATTENTIONS[name]
    options = {"max_length": n} if "max_length" in inspect.signature(cls.__init__).parameters else {}
    layer = build_attention(name, H * D, H, causal=causal, **options).to(dtype)
    q, k, v = (torch.randn(B, H, n, D, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(B, H, n, D, dtype=dtype)

    def step():
        layer.attention(q, k, v, None).backward(grad)

    def clear():
        q.grad = k.grad = v.grad = None
        layer.zero_grad(set_to_none=True)

    return step, clear


def time_point(step, clear, budget: float) -> tuple[float, float, int, float | None]:
    """(best seconds, median seconds, repeats, peak MB) of step() after one warm-up run; the memory run is timed too.

    Gradients are released before each step, outside the timing, so every step allocates them afresh.
    """
    step()
    start = time.perf_counter()
    peak = peak_extra_mb(step, clear)
    times = [time.perf_counter() - start]
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 50):
        clear()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[0], times[len(times) // 2], len(times), peak


def gemm_gflops(n: int = 4096, dtype: torch.dtype = torch.float32) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = min(timed(lambda: torch.mm(a, b)) for _ in range(5))
    return 2 * n**3 / best / 1e9


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def fresh_page_ms(n_bytes: int = 100 * 2**20) -> float:
    """ms to allocate and first write a new tensor of n_bytes, minus the same write into an old one: page faults."""
    like, shape = torch.empty(1), (n_bytes // 4,)
    old = torch.empty(shape).fill_(0)
    pairs = [(timed(lambda: fresh(like, *shape).fill_(1)), timed(lambda: old.fill_(1))) for _ in range(9)]
    return 1e3 * sorted(new - reused for new, reused in pairs)[len(pairs) // 2]  # the median: single runs are noisy


AIMS = [  # (what, N, aim, test): linear_affine_nodenom, non-causal, fp32, against SDPA softmax in the same run
    ("time / softmax", 197, "<= 0.6", lambda row: row.ratio_to_softmax <= 0.6),
    ("softmax / time", 4096, ">= 40", lambda row: 1 / row.ratio_to_softmax >= 40),
    ("softmax / time", 65536, ">= 300", lambda row: 1 / row.ratio_to_softmax >= 300),
]


def aims(frame: pd.DataFrame) -> list[str]:
    """Markdown lines checking the speed aims of linear_affine_nodenom (non-causal, fp32) on this run's numbers."""
    line = frame[
        (frame.variant == "linear_affine_nodenom") & (frame["mode"] == "full") & (frame.dtype == "float32")
    ].set_index("N")
    softmax = frame[(frame.variant == "softmax") & (frame["mode"] == "full") & (frame.dtype == "float32")].set_index(
        "N"
    )
    rows = []
    for what, n, aim, test in AIMS:
        if n in line.index and n in softmax.index:
            row = line.loc[n]
            value = row.ratio_to_softmax if what.startswith("time") else 1 / row.ratio_to_softmax
            note = " (softmax extrapolated)" if softmax.loc[n].extrapolated else ""
            rows.append(f"| {what} at N = {n} | {aim} | {value:.3g}{note} | {'met' if test(row) else 'MISSED'} |")
    long = line[(line.index >= 16384) & (line.extrapolated == "")]
    if len(long):
        worst = long.gemm_fraction.min()
        rows.append(
            f"| fraction of fp32 GEMM rate, N >= 16384 (lowest of {len(long)}) | >= 0.5 | {worst:.2f} | "
            f"{'met' if worst >= 0.5 else 'MISSED'} |"
        )
    memory = long.peak_mb.dropna().iloc[-2:]  # the two largest N: smaller tensors partly reuse heap memory already held
    if len(memory) > 1:
        growth = (memory.iloc[1] / memory.iloc[0]) / (memory.index[1] / memory.index[0])
        rows.append(
            f"| peak memory growth / N growth, N = {memory.index[0]} -> {memory.index[1]} | about 1 (linear) | "
            f"{growth:.2f} | {'met' if 0.8 <= growth <= 1.25 else 'MISSED'} |"
        )
    return ["| aim | target | measured | |", "|---|---|---|---|", *rows] if rows else []


def linear_flops(causal: bool, n: int) -> float:
    per_token = 12 * (CHUNK * D + D * D) if causal else 12 * D * D
    return B * H * n * per_token


def predict(points: list[tuple[int, float]], n: int, power: int) -> float:
    """Time at n from the largest measured (N, seconds), as O(N^power)."""
    n1, t1 = points[-1]
    return t1 * (n / n1) ** power


def bench_line(name: str, causal: bool, dtype: torch.dtype, sizes: list[int], args) -> list[dict]:
    """Rows for one variant / mode / dtype over all sizes, extrapolating the ones that would take too long."""
    rows, measured = [], []
    is_linear = issubclass(ATTENTIONS[name], LinearAttention)
    power = 1 if is_linear else 2  # other variants are assumed quadratic: a safe side for softmax-like ones
    for n in sizes:
        row = dict(variant=name, mode="causal" if causal else "full", dtype=str(dtype).removeprefix("torch."), N=n)
        guess = predict(measured, n, power) if measured else 0.0
        late = time.perf_counter() > args.deadline
        if len(measured) > 1 and (guess > args.max_seconds or late):
            row.update(time_ms=1e3 * guess, extrapolated=f"O(N^{power})" + (" (out of time)" if late else ""))
        elif late:
            continue
        else:
            best, median, reps, peak = time_point(*make_step(name, causal, n, dtype), args.budget)
            measured.append((n, best))
            row.update(time_ms=1e3 * best, median_ms=1e3 * median, reps=reps, peak_mb=peak, extrapolated="")
        if is_linear:
            row["gflops"] = linear_flops(causal, n) / (row["time_ms"] / 1e3) / 1e9
        rows.append(row)
        print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        gc.collect()
    return rows


def chunk_loop_ms(n: int = 16384) -> tuple[float, float]:
    """Forward + backward of causal_linear with its cumsum over chunk states vs a Python loop carrying the state."""
    qf, kf, v = (torch.randn(B * H, n, D, requires_grad=True) for _ in range(3))

    def looped():
        state, outs = qf.new_zeros(B * H, D, D), []
        keep = torch.ones(CHUNK, CHUNK, dtype=torch.bool).tril()
        for q_c, k_c, v_c in zip(qf.split(CHUNK, 1), kf.split(CHUNK, 1), v.split(CHUNK, 1)):
            scores = (q_c @ k_c.transpose(1, 2)).masked_fill(~keep[: q_c.shape[1], : q_c.shape[1]], 0)
            outs.append(scores @ v_c + q_c @ state)
            state = state + k_c.transpose(1, 2) @ v_c
        return torch.cat(outs, 1)

    grad, out = torch.randn_like(v), []
    for fn in (lambda: causal_linear(qf, kf, v, chunk_size=CHUNK), looped):
        fn().backward(grad)
        out.append(1e3 * min(timed(lambda fn=fn: fn().backward(grad)) for _ in range(3)))
    return out[0], out[1]


def run(args) -> tuple[pd.DataFrame, dict]:
    first = [n for n in ("softmax", "linear_affine_nodenom") if n in ATTENTIONS]
    names = args.variants or first + sorted(set(ATTENTIONS) - set(first))
    info = dict(load_start=os.getloadavg()[0], threads=torch.get_num_threads())
    info.update(gemm=gemm_gflops(), gemm_bf16=gemm_gflops(dtype=torch.bfloat16))
    print(
        f"fp32 GEMM {info['gemm']:.0f} GFLOP/s, bf16 GEMM {info['gemm_bf16']:.0f} GFLOP/s, {info['threads']} threads",
        flush=True,
    )
    rows = []
    for name in names:
        sizes = args.sizes + (args.long_sizes if issubclass(ATTENTIONS[name], LinearAttention) else [])
        for causal in (False, True) if ATTENTIONS[name].supports_causal else (False,):
            rows += bench_line(name, causal, torch.float32, sizes, args)
            if name in args.bf16_variants:
                rows += bench_line(name, causal, torch.bfloat16, [n for n in args.sizes if n <= args.bf16_max_n], args)
    info["kernel"] = (
        "the fused C kernel (models/attention/ops/linear_affine_nodenom/nodenom_cpu.c)"
        if cpu_build.library()
        else "PyTorch ops (ops/linear_affine_nodenom/torch.py; no C kernel was built)"
    )
    info["fresh_ms_per_100mb"] = fresh_page_ms()
    info["chunk_n"] = 4096 if args.quick else 16384
    info["chunk_cumsum_ms"], info["chunk_loop_ms"] = chunk_loop_ms(info["chunk_n"])
    frame, info["load_end"] = pd.DataFrame(rows), os.getloadavg()[0]
    if "gflops" in frame:
        frame["gemm_fraction"] = frame["gflops"] / frame["dtype"].map(
            {"float32": info["gemm"], "bfloat16": info["gemm_bf16"]}
        )
    return frame, info


def add_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """ratio_to_softmax: time / time of SDPA softmax in the same mode, dtype and N (< 1 is faster)."""
    peer = frame[frame.variant == "softmax"].set_index(["mode", "dtype", "N"])["time_ms"]
    keys = pd.MultiIndex.from_frame(frame[["mode", "dtype", "N"]])
    frame["ratio_to_softmax"] = frame["time_ms"].to_numpy() / peer.reindex(keys).to_numpy()
    return frame


def plot(frame: pd.DataFrame, path: Path, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    lines = frame[frame.dtype == "float32"].groupby(["variant", "mode"], sort=True)
    colours = plt.cm.tab20(range(len(lines)))
    for colour, ((name, mode), line) in zip(colours, lines):
        style = dict(color="black" if name == "softmax" else colour, linestyle="--" if "softmax" in name else "-")
        style["marker"] = "s" if mode == "causal" else "o"
        drawn = ax.plot(line.N, line.time_ms, markersize=3, label=f"{name} ({mode})", **style)
        extra = line[line.extrapolated != ""]
        ax.plot(extra.N, extra.time_ms, "x", color=drawn[0].get_color(), markersize=8)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length N",
        ylabel="forward + backward time (ms)",
        title=f"attention math, B={B} H={H} D={D}, fp32, CPU ({threads} threads); x = extrapolated",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def md_table(frame: pd.DataFrame, index: bool = True) -> str:
    """A Markdown table (pandas' to_markdown needs the tabulate package, which the project does not pin)."""
    frame = frame.reset_index() if index else frame

    def fmt(x) -> str:
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def cell(row) -> str:
    ratio = "" if pd.isna(row.ratio_to_softmax) or row.variant == "softmax" else f" ({row.ratio_to_softmax:.3g}x)"
    return f"{row.time_ms:.4g}{'*' if row.extrapolated else ''}{ratio}"


def markdown(frame: pd.DataFrame, info: dict, args) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Attention benchmark: forward + backward on q, k, v [B, H, N, D]",
        "",
        f"{when}; {platform.processor() or platform.machine()}, {info['threads']} CPU threads, "
        f"torch {torch.__version__}; "
        f"B={B}, H={H}, D={D}. All numbers come from one run of `python -m scripts.bench_attention`, so the ratios are "
        "side by side on the same (shared, noisy) machine. Time: best of repeats within "
        f"{args.budget} s per point, in ms; (r x) is the ratio to SDPA softmax in the same mode, dtype and N; "
        "* = extrapolated, not run (see the script's docstring).",
        "",
        f"Machine fp32 GEMM: {info['gemm']:.0f} GFLOP/s; bf16 GEMM: {info['gemm_bf16']:.0f} GFLOP/s. Causal chunkwise "
        f"form (forward + backward of chunked.causal_linear, N={info['chunk_n']}): "
        f"cumsum over chunk states {info['chunk_cumsum_ms']:.1f} ms vs Python loop over chunks "
        f"{info['chunk_loop_ms']:.1f} ms.",
        "",
        f"1-minute load average at start / end: {info['load_start']:.1f} / {info['load_end']:.1f} (other jobs share "
        "the cores; with more runnable threads than cores, every multi-threaded op waits for both of its threads "
        "to be scheduled, which penalises many small ops far more than a few large ones, so under load the "
        "benchmark is best run with --threads 1).",
    ]
    checks = aims(frame)
    if checks:
        lines += [
            "",
            "## Aims: linear_affine_nodenom, non-causal, fp32",
            "",
            f"Computed by {info['kernel']}. Outputs and gradients are new tensors every step, as in training; "
            f"first-touching new pages costs {info['fresh_ms_per_100mb']:.1f} ms per 100 MB here (2 MB pages; "
            "measured in this run), part of every variant's time.",
            "",
            *checks,
        ]
    for dtype, part in frame.groupby("dtype", sort=False):
        table = part.assign(line=part.variant + " " + part["mode"], text=part.apply(cell, axis=1))
        wide = table.pivot(index="line", columns="N", values="text").fillna("")
        wide.index.name, wide.columns = "variant mode \\ N", [str(n) for n in wide.columns]
        lines += ["", f"## {dtype}: time in ms (ratio to softmax)", "", md_table(wide)]
    linear = (
        frame[frame.gflops.notna() & (frame.N >= 16384) & (frame.extrapolated == "")]
        if "gflops" in frame
        else frame[:0]
    )
    if len(linear):
        shown = linear[["variant", "mode", "dtype", "N", "time_ms", "gflops", "gemm_fraction", "peak_mb"]]
        lines += [
            "",
            "## Linear variants at N >= 16384: achieved GFLOP/s (matmuls of the linear algorithm) and fraction of GEMM",
            "",
            md_table(shown, index=False),
        ]
    measured = frame[frame.peak_mb.notna()]
    memory = measured.assign(line=measured.variant + " " + measured["mode"] + " " + measured.dtype).pivot(
        index="line", columns="N", values="peak_mb"
    )
    memory.index.name, memory.columns = "variant mode dtype \\ N", [str(n) for n in memory.columns]
    lines += [
        "",
        "## Peak extra resident memory (MB) during one forward + backward",
        "",
        "Above the resident set with q, k, v and the output gradient alive and no input gradients; it "
        "includes the output and the three input gradients (4 [B, H, N, D] tensors). 0 means it fit in memory "
        "the process already held (small N, or blocks under glibc's mmap threshold reused).",
        "",
        md_table(memory.round(1).astype(object).where(memory.notna(), "")),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    frame, info = run(args)
    frame = add_ratios(frame)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out.with_suffix(".csv"), index=False, float_format="%.6g")
    plot(frame, out.with_suffix(".png"), info["threads"])
    out.with_suffix(".md").write_text(markdown(frame, info, args))
    print(f"wrote {out}.csv, {out}.png, {out}.md")


if __name__ == "__main__":
    main()
