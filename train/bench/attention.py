"""Forward + backward (and, on a GPU, forward-only) time and peak memory of the attentions on q, k, v [B, H, N, D]:
the measurements of scripts/bench_attention.py (what it times and how: that script's docstring).

    args = attention.parse_args(["--quick", "--out", "runs/x/bench_attention"])   # the script's arguments
    frame, info = attention.run(args)         # one row per variant, mode, dtype, pass and N; the machine's rates
    attention.page(argv)                      # both, and attention_page.write: <out>.csv, .png and .md

The arguments live here, not in the script, because a study's `bench:` list (configs/study/*.yaml) is written in
them and scripts/demo.py runs it. Device-specific parts go through train/bench/probes.py; the CPU extras (fresh
pages, the chunk loop) are measured here too.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pandas as pd
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.attention import ATTENTIONS, build_attention
from models.attention.linear import LinearAttention
from models.attention.ops import cpu_build, dispatch
from models.attention.ops.chunked import causal_linear
from models.attention.ops.common import fresh
from train.bench import attention_page, probes

CHUNK = 64
DEFAULTS = {  # per device: batch, heads, head size, sizes, extra sizes for linear variants, variants
    "cpu": dict(batch=1, heads=6, head_dim=64, sizes=[77, 197, 577, 1024, 4096, 16384, 65536], long=[131072]),
    "cuda": dict(
        batch=4,
        heads=8,
        head_dim=64,
        sizes=[77, 197, 577, 1024, 4096, 16384, 65536, 262144, 1048576, 4000000],
        long=[],
        variants=["softmax", *dispatch.linear_ops()],
    ),
}
PASSES = ("fwd+bwd", "fwd")
BF16_VARIANTS = ["softmax", *dispatch.known_ops(["linear_affine_nodenom", "linear_affine"], "BF16_VARIANTS")]
DESCRIPTION = "Forward + backward (and, on a GPU, forward-only) time and peak memory of the attentions."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--batch", type=int, help="B (default 1 on the CPU, 4 on a GPU)")
    p.add_argument("--heads", type=int, help="H (default 6 on the CPU, 8 on a GPU)")
    p.add_argument("--head-dim", type=int, help="D (default 64)")
    p.add_argument("--sizes", type=int, nargs="+", help="sequence lengths for every variant")
    p.add_argument("--long-sizes", type=int, nargs="*", help="extra lengths for linear variants only")
    p.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16", "float16"), help="default: see --bf16-*")
    p.add_argument("--bf16-variants", nargs="*", default=BF16_VARIANTS)
    p.add_argument("--bf16-max-n", type=int, default=16384, help="CPU: largest N timed in bf16")
    p.add_argument("--passes", nargs="+", choices=PASSES, help="default: fwd+bwd on the CPU, both on a GPU")
    p.add_argument(
        "--variants", nargs="*", default=None, help="registry names (default: all; on a GPU softmax + linear)"
    )
    p.add_argument("--impl", default="auto", help="implementation of the linear ops (ops/dispatch.py)")
    p.add_argument("--budget", type=float, default=1.5, help="seconds of repeats per point (at least 3 repeats)")
    p.add_argument(
        "--paired-max-n",
        type=int,
        default=1025,
        help="up to this N each variant's steps alternate with SDPA softmax's, the ratio taken from the pair",
    )
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


def time_pair(step, clear, peer, peer_clear, probe, budget: float) -> tuple[float, float, int, float | None, float]:
    """time_point's (best, median, repeats, peak MB) of step() with step() and peer() timed alternately, and the best
    seconds of peer() over the same window: on a machine whose speed drifts (other jobs, shared hosts) the two bests
    come from the same minutes, where timing the peer alone earlier in the run can differ by a third at 77 tokens."""
    peer()
    peer_clear()
    best_peer = float("inf")

    def both():
        nonlocal best_peer
        peer_clear()
        best_peer = min(best_peer, probe.time(peer))

    def timed_step():
        both()
        clear()
        return probe.time(step)

    step()
    clear()
    start = time.perf_counter()
    peak = probe.peak_mb(step)
    times = [time.perf_counter() - start]
    while len(times) < 3 or (time.perf_counter() - start < 2 * budget and len(times) < 50):
        times.append(timed_step())
    times.sort()
    return times[0], times[len(times) // 2], len(times), peak, best_peer


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
    paired = name != "softmax" and n <= args.paired_max_n and getattr(args, "with_softmax", False)
    try:
        step, clear, impl = make_step(name, causal, n, dtype, passes, args)
        if paired:
            peer, peer_clear, _ = make_step("softmax", causal, n, dtype, passes, args)
            best, median, reps, peak, peer_best = time_pair(step, clear, peer, peer_clear, probe, args.budget)
            row.update(peer_ms=1e3 * peer_best)
        else:
            best, median, reps, peak = time_point(step, clear, probe, args.budget)
    except Exception as err:  # only out-of-memory is reported; anything else is re-raised
        if not probes.is_oom(err):
            raise
        row.update(status="out of memory")
        return None
    finally:
        step = clear = peer = peer_clear = None
        probe.free()
    row.update(time_ms=1e3 * best, median_ms=1e3 * median, reps=reps, peak_mb=peak, impl=impl, status="")
    return best


def bench_line(name: str, causal: bool, dtype: torch.dtype, passes: str, sizes: list[int], probe, args) -> list[dict]:
    """Rows for one variant / mode / dtype / pass over all sizes: measured, extrapolated or out of memory."""
    rows, measured, out_of_memory = [], [], False
    is_linear = issubclass(ATTENTIONS[name], LinearAttention)  # its traffic and FLOPs are known (traffic_bytes)
    power = ATTENTIONS[name].time_power  # O(N) or O(N^2) (models/attention/base.py)
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


def cpu_extras(args) -> dict:
    """Which kernels ran, the cost of fresh pages, and the chunkwise form against a Python loop over chunks."""
    chunk_n = 1024 if args.quick else 16384
    cumsum_ms, loop_ms = chunk_loop_ms(chunk_n, args)
    kernel = (
        "the fused C kernels (models/attention/ops/<op>/*_cpu.c non-causal, ops/causal_cpu.c causal up to 256 "
        "tokens; the CSV's impl column says which ran)"
        if cpu_build.library()
        else "PyTorch ops (dispatch.torch_path; no C kernel was built)"
    )
    info = dict(kernel=kernel, fresh_ms_per_100mb=fresh_page_ms(repeats=3 if args.quick else 9), chunk_n=chunk_n)
    return info | dict(chunk_cumsum_ms=cumsum_ms, chunk_loop_ms=loop_ms)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def fresh_page_ms(n_bytes: int = 100 * 2**20, repeats: int = 9) -> float:
    """ms to allocate and first write a new tensor of n_bytes, minus the same write into an old one: page faults."""
    like, shape = torch.empty(1), (n_bytes // 4,)
    old = torch.empty(shape).fill_(0)
    pairs = [(timed(lambda: fresh(like, *shape).fill_(1)), timed(lambda: old.fill_(1))) for _ in range(repeats)]
    return 1e3 * sorted(new - reused for new, reused in pairs)[len(pairs) // 2]  # the median: single runs are noisy


def chunk_loop_ms(n: int, args, chunk: int = 64) -> tuple[float, float]:
    """Forward + backward of causal_linear with its cumsum over chunk states vs a Python loop carrying the state."""
    G, D = args.batch * args.heads, args.head_dim
    qf, kf, v = (torch.randn(G, n, D, requires_grad=True) for _ in range(3))

    def looped():
        state, outs = qf.new_zeros(G, D, D), []
        keep = torch.ones(chunk, chunk, dtype=torch.bool).tril()
        for q_c, k_c, v_c in zip(qf.split(chunk, 1), kf.split(chunk, 1), v.split(chunk, 1)):
            scores = (q_c @ k_c.transpose(1, 2)).masked_fill(~keep[: q_c.shape[1], : q_c.shape[1]], 0)
            outs.append(scores @ v_c + q_c @ state)
            state = state + k_c.transpose(1, 2) @ v_c
        return torch.cat(outs, 1)

    grad, out = torch.randn_like(v), []
    for fn in (lambda: causal_linear(qf, kf, v, chunk_size=chunk), looped):
        fn().backward(grad)
        out.append(1e3 * min(timed(lambda fn=fn: fn().backward(grad)) for _ in range(3)))
    return out[0], out[1]


def run(args) -> tuple[pd.DataFrame, dict]:
    """Every line's rows and the machine's info. The objects alive before it (the imports', a study's) are frozen out
    of the garbage collector meanwhile: each point's gc.collect (probes) then walks only the benchmark's own objects
    (0.24 s a point with torch and open_clip imported, about half the quick benchmark's time)."""
    gc.freeze()
    try:
        return measure_all(args)
    finally:
        gc.unfreeze()


def measure_all(args) -> tuple[pd.DataFrame, dict]:
    probe = probes.probe(args.device)
    default = DEFAULTS[args.device].get("variants")
    first = [n for n in ("softmax", "linear_affine_nodenom") if n in ATTENTIONS]
    names = args.variants or default or first + sorted(set(ATTENTIONS) - set(first))
    args.with_softmax = "softmax" in names  # the page's ratios: pairs with SDPA only where softmax has its own rows
    info = dict(load_start=os.getloadavg()[0], threads=torch.get_num_threads(), machine=probe.describe())
    info.update(probe.rates(args.quick))
    print(", ".join(f"{k}={v:.4g}" for k, v in info.items() if isinstance(v, float)), info["machine"], flush=True)
    rows, emulated = [], info["skipped"]  # bf16's rate (always probed) and each dtype asked for: one line each
    info["skipped"] = {k: v for k, v in emulated.items() if k == "bfloat16"}
    for line in info["skipped"].values():
        print(line, flush=True)
    for name in names:
        sizes = args.sizes + (args.long_sizes if issubclass(ATTENTIONS[name], LinearAttention) else [])
        cls = ATTENTIONS[name]
        for causal in [c for c in (False, True) if (cls.supports_causal if c else cls.supports_bidirectional)]:
            for dtype, max_n in dtypes_for(name, args):
                if (dtype_name := str(dtype).removeprefix("torch.")) in emulated:  # one line, in the report too
                    if dtype_name not in info["skipped"]:
                        print(emulated[dtype_name], flush=True)
                    info["skipped"][dtype_name] = emulated[dtype_name]
                    continue
                for passes in args.passes:
                    rows += bench_line(name, causal, dtype, passes, [n for n in sizes if n <= max_n], probe, args)
    if args.device == "cpu":
        info.update(cpu_extras(args))
    frame, info["load_end"] = pd.DataFrame(rows), os.getloadavg()[0]
    return attention_page.add_ratios(frame, info), info


def page(argv: list[str]) -> Path:
    """The whole benchmark with the script's arguments `argv`: measured, then written (<out>.csv, .png, .md)."""
    args = parse_args(argv)
    frame, info = run(args)
    return attention_page.write(frame, info, args)


def study_table(out: Path, args: list[str], again: bool = True) -> str:
    """scripts.bench_attention with a study's arguments (scripts.demo's report); its Markdown table, headings nested
    one level. Not `again`: the table the study's own run measured, where it has one (a re-analysis times nothing)."""
    if again or not (out / "bench_attention.md").is_file():
        page([*map(str, args), "--out", str(out / "bench_attention")])
    _title, _header, *body = (out / "bench_attention.md").read_text().split("\n\n")  # the report's header covers them
    command = f"`python -m scripts.bench_attention {' '.join(map(str, args))}`"
    lines = "\n\n".join([command, *body]).splitlines()
    return "\n".join("#" + line if line.startswith("#") else line for line in lines) + "\n"  # its sections nest
