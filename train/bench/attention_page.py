"""The page of the attention benchmark (train/bench/attention.py, scripts/bench_attention.py): ratios to the softmax
peer, the aims checked on the run's own numbers, the Markdown tables and the plot. Device-independent.

The page is written from its data: <out>.csv (every point) and <out>.json (the header's stamp - commit, date,
machine, load - the machine's probes and the arguments the page reads), with the page's "## Findings" section (written
by a person) kept after the header; `rebuild(page)` writes it again from those two files alone
(tests/test_docs_regenerate.py compares it with the committed page)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from eval import pages, study_page
from models.attention.ops import dispatch

# (variant, mode, dtype, N, what, target, test): "time / softmax" tests the ratio, "softmax / time" its inverse
AIMS = {
    "cpu": [
        ("linear_affine_nodenom", "full", "float32", 197, "time / softmax", "<= 0.6", lambda r: r <= 0.6),
        ("linear_affine_nodenom", "full", "float32", 4096, "softmax / time", ">= 40", lambda r: 1 / r >= 40),
        ("linear_affine_nodenom", "full", "float32", 65536, "softmax / time", ">= 300", lambda r: 1 / r >= 300),
        *(
            (op, "causal", "float32", 77, "time / softmax", "<= 1.5", lambda r: r <= 1.5)
            for op in dispatch.linear_ops()
        ),
    ],
    "cuda": [
        ("linear_affine_nodenom", "full", "bfloat16", 4000000, "softmax / time", ">= 1000", lambda r: 1 / r >= 1000),
        ("linear_affine_nodenom", "full", "bfloat16", 197, "time / softmax", "<= 1", lambda r: r <= 1),
        *((op, "causal", "bfloat16", 77, "time / softmax", "<= 1", lambda r: r <= 1) for op in dispatch.linear_ops()),
    ],
}
dispatch.known_ops({aim[0] for device in AIMS.values() for aim in device}, "the attention page's aims")


def add_ratios(frame: pd.DataFrame, info: dict) -> pd.DataFrame:
    """ratio_to_softmax: time / time of SDPA softmax in the same mode, dtype, pass and N (< 1 is faster), SDPA's
    time from the same point's alternating steps where the point has one (peer_ms, up to --paired-max-n), else from
    softmax's own row; the fraction of the machine's GEMM rate (CPU) or copy bandwidth (GPU) the linear variants
    reach."""
    for column in ("time_ms", "peak_mb", "gbs", "gflops", "impl", "peer_ms"):
        if column not in frame:
            frame[column] = float("nan") if column != "impl" else ""
    keys = ["mode", "dtype", "passes", "N"]
    peer = frame[frame.variant == "softmax"].set_index(keys)["time_ms"]
    own_row = peer.reindex(pd.MultiIndex.from_frame(frame[keys])).to_numpy()
    paired = frame["peer_ms"].to_numpy(dtype=float)
    frame["ratio_to_softmax"] = frame["time_ms"].to_numpy() / np.where(np.isnan(paired), own_row, paired)
    if "gemm" in info:
        frame["gemm_fraction"] = frame["gflops"] / frame["dtype"].map(
            {"float32": info["gemm"], "bfloat16": info["gemm_bf16"]}
        )
    if "bandwidth" in info:
        frame["bandwidth_fraction"] = frame["gbs"] / info["bandwidth"]
    return frame


def aims(frame: pd.DataFrame, device: str = "cpu") -> list[str]:
    """Markdown lines checking the project's speed aims on this run's numbers (forward + backward)."""
    rows, main = [], frame[frame.passes == "fwd+bwd"].set_index(["variant", "mode", "dtype", "N"])
    for variant, mode, dtype, n, what, target, test in AIMS[device]:
        if (variant, mode, dtype, n) not in main.index:
            continue
        row = main.loc[(variant, mode, dtype, n)]
        label = f"{variant} {mode} {dtype}: {what} at N = {n}"
        if row.status:
            rows.append(f"| {label} | {target} | {row.status} | MISSED |")
        elif pd.notna(row.ratio_to_softmax):
            value = row.ratio_to_softmax if what.startswith("time") else 1 / row.ratio_to_softmax
            note = " (softmax extrapolated)" if main.loc[("softmax", mode, dtype, n)].extrapolated else ""
            rows.append(
                f"| {label} | {target} | {value:.3g}{note} | {'met' if test(row.ratio_to_softmax) else 'MISSED'} |"
            )
    if device == "cpu":
        rows += cpu_efficiency_aims(frame[frame.passes == "fwd+bwd"])
    return ["| aim | target | measured | |", "|---|---|---|---|", *rows] if rows else []


def cpu_efficiency_aims(frame: pd.DataFrame) -> list[str]:
    """Non-causal fp32 linear_affine_nodenom: at least half the GEMM rate at N >= 16384, peak memory linear in N."""
    line = frame[
        (frame.variant == "linear_affine_nodenom") & (frame["mode"] == "full") & (frame.dtype == "float32")
    ].set_index("N")
    long, rows = line[(line.index >= 16384) & (line.extrapolated == "")], []
    if len(long) and "gemm_fraction" in long:
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
    return rows


def md_table(frame: pd.DataFrame, index: bool = True) -> str:
    """A Markdown table (pandas' to_markdown needs the tabulate package, which the project does not pin)."""
    frame = frame.reset_index() if index else frame

    def fmt(x) -> str:
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def cell(row) -> str:
    if row.status:
        return "OOM"
    ratio = "" if pd.isna(row.ratio_to_softmax) or row.variant == "softmax" else f" ({row.ratio_to_softmax:.3g}x)"
    return f"{row.time_ms:.4g}{'*' if row.extrapolated else ''}{ratio}"


def wide(part: pd.DataFrame, values) -> pd.DataFrame:
    """Rows "variant mode", one column per N."""
    table = part.assign(line=part.variant + " " + part["mode"], text=values)
    pivot = table.pivot(index="line", columns="N", values="text").fillna("")
    pivot.index.name, pivot.columns = "variant mode \\ N", [str(n) for n in pivot.columns]
    return pivot


def paired_note(args) -> str:
    """What the ratios of the paired points mean (pages made before --paired-max-n existed have none)."""
    if not getattr(args, "paired_max_n", None) or not getattr(args, "with_softmax", False):
        return ""
    return (
        f"; up to N = {args.paired_max_n:,} the variant's steps alternate with SDPA's and the ratio is to SDPA's "
        "best over the same repeats (the CSV's peer_ms), so a drift in the machine's speed during the run does not "
        "enter it"
    )


def header(info: dict, args, made: dict | None = None) -> list[str]:
    shape = f"B={args.batch}, H={args.heads}, D={args.head_dim}"
    what_ran = pages.command("scripts.bench_attention", getattr(args, "argv", None))
    title = "Attention benchmark: forward + backward on q, k, v [B, H, N, D]"
    lines = [
        pages.header(title, what_ran, load=info.get("load_end"), where=info["machine"], made=made),
        f"torch {info.get('torch', torch.__version__)}; {shape}. All numbers come from this one run, so the ratios are "
        f"side by side on the same machine. Time: best of repeats within {args.budget} s per point, in ms; (r x) is "
        f"the ratio to SDPA softmax in the same mode, dtype, pass and N{paired_note(args)}; * = extrapolated, not "
        "run; OOM = out of memory (see the script's docstring).",
        "",
    ]
    if args.device == "cuda":
        return [
            *lines,
            f"GPU copy bandwidth: {info['bandwidth']:.0f} GB/s (read + write); bf16 GEMM: "
            f"{info['gemm_bf16'] / 1e3:.0f} TFLOP/s. Softmax peer: SDPA pinned to FlashAttention-2 (bf16, fp16) or "
            "its memory-efficient kernel (fp32, which flash lacks). Linear ops: impl column of the CSV.",
        ]
    skipped = info.get("skipped", {})  # bf16 and each dtype asked for that this CPU emulates, one line each
    bf16 = "" if "bfloat16" in skipped else f"; bf16 GEMM: {info['gemm_bf16']:.0f} GFLOP/s"
    return [
        *lines,
        *(f"{line}." for line in skipped.values()),
        *([""] if skipped else []),
        f"Machine fp32 GEMM: {info['gemm']:.0f} GFLOP/s{bf16}. Causal chunkwise "
        f"form (forward + backward of chunked.causal_linear, N={info['chunk_n']}): cumsum over chunk states "
        f"{info['chunk_cumsum_ms']:.1f} ms vs Python loop over chunks {info['chunk_loop_ms']:.1f} ms.",
        "",
        f"1-minute load average at start / end: {info['load_start']:.1f} / {info['load_end']:.1f} (other jobs share "
        "the cores; with more runnable threads than cores, every multi-threaded op waits for both of its threads "
        "to be scheduled, which penalises many small ops far more than a few large ones, so under load the "
        "benchmark is best run with --threads 1).",
    ]


def markdown(frame: pd.DataFrame, info: dict, args, made: dict | None = None) -> str:
    lines, checks = header(info, args, made), aims(frame, args.device)
    if checks:
        where = info.get("kernel", "the implementations the dispatcher picks")
        lines += ["", "## Aims (forward + backward)", "", f"Linear ops computed by {where}.", "", *checks]
    for (dtype, passes), part in frame.groupby(["dtype", "passes"], sort=False):
        lines += ["", f"## {dtype}, {passes}: time in ms (ratio to softmax)", ""]
        lines.append(md_table(wide(part, part.apply(cell, axis=1))))
    fraction = "gemm_fraction" if args.device == "cpu" else "bandwidth_fraction"
    rate = "gflops" if args.device == "cpu" else "gbs"
    long = frame[frame[rate].notna() & (frame.N >= 16384) & (frame.extrapolated == "") & (frame.status == "")]
    if len(long):
        shown = long[["variant", "mode", "dtype", "passes", "N", "time_ms", rate, fraction, "peak_mb"]]
        lines += ["", f"## Linear variants at N >= 16384: achieved {rate} and {fraction}", "", md_table(shown, False)]
    measured = frame[frame.peak_mb.notna()]
    memory = measured.assign(
        line=measured.variant + " " + measured["mode"] + " " + measured.dtype + " " + measured.passes
    )
    memory = memory.pivot(index="line", columns="N", values="peak_mb")
    memory.index.name, memory.columns = "variant mode dtype pass \\ N", [str(n) for n in memory.columns]
    lines += [
        "",
        "## Peak extra memory (MB) during one step",
        "",
        "Above the memory held with q, k, v and the output gradient alive and no input gradients; it includes the "
        "output and the three input gradients (4 [B, H, N, D] tensors). On the CPU, 0 means it fit in memory the "
        "process already held (small N, or blocks under glibc's mmap threshold reused).",
        "",
        md_table(memory.round(1).astype(object).where(memory.notna(), "")),
    ]
    return "\n".join(lines) + "\n"


def plot(frame: pd.DataFrame, path: Path, title: str, dtype: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = frame[(frame.passes == "fwd+bwd") & (frame.status == "")]
    dtype = dtype if (main.dtype == dtype).any() else main.dtype.iloc[0]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    lines = main[main.dtype == dtype].groupby(["variant", "mode"], sort=True)
    colours = plt.cm.tab20(range(len(lines)))
    for colour, ((name, mode), line) in zip(colours, lines):
        style = dict(color="black" if name == "softmax" else colour, linestyle="--" if "softmax" in name else "-")
        style["marker"] = "s" if mode == "causal" else "o"
        drawn = ax.plot(line.N, line.time_ms, markersize=3, label=f"{name} ({mode})", **style)
        extra = line[line.extrapolated != ""]
        ax.plot(extra.N, extra.time_ms, "x", color=drawn[0].get_color(), markersize=8)
    ax.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="forward + backward time (ms)")
    ax.set_title(f"{title}, {dtype}; x = extrapolated", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


WRITER = "train.bench.attention_page"  # in <out>.json: what writes the page again (tests/test_docs_regenerate.py)
# what the page reads of the benchmark's arguments (saved in <out>.json with the stamp and the probes)
PAGE_ARGS = ("batch", "heads", "head_dim", "budget", "device", "argv", "paired_max_n", "with_softmax")


# the CSV's numeric columns (an empty cell is NaN there; in the text columns it stays '')
NUMERIC = (
    "time_ms",
    "median_ms",
    "peak_mb",
    "gbs",
    "gflops",
    "ratio_to_softmax",
    "peer_ms",
    "gemm_fraction",
    "bandwidth_fraction",
)


def read_back(csv: Path) -> pd.DataFrame:
    """The frame as its CSV holds it (empty cells as '', numbers at the CSV's precision): the page is written from
    this, so that writing it again from the CSV gives the same text."""
    frame = pd.read_csv(csv, keep_default_na=False, na_values={c: [""] for c in NUMERIC})
    for column in ("extrapolated", "status", "impl"):
        if column in frame:
            frame[column] = frame[column].astype(str)
    return frame


def write(frame: pd.DataFrame, info: dict, args) -> Path:
    """<out>.csv, <out>.json, <out>.png and <out>.md (keeping the page's findings); returns the .md."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out.with_suffix(".csv"), index=False, float_format="%.6g")
    made = pages.stamp(load=info.get("load_end"), where=info["machine"])
    saved = {"writer": WRITER, "made": made, "info": {**info, "torch": torch.__version__}}
    saved["args"] = {k: getattr(args, k, None) for k in PAGE_ARGS}
    out.with_suffix(".json").write_text(json.dumps(saved, indent=1, default=str))
    title = f"attention math, B={args.batch} H={args.heads} D={args.head_dim}, {info['machine']}"
    plot(frame, out.with_suffix(".png"), title, "bfloat16" if args.device == "cuda" else "float32")
    page = out.with_suffix(".md")
    page.write_text(rebuild(page))
    print(f"wrote {out}.csv, {out}.json, {out}.png, {out}.md")
    return page


def rebuild(page: Path) -> str:
    """The page written from <page>.csv and <page>.json, with its committed findings section."""
    page = Path(page)
    saved = json.loads(page.with_suffix(".json").read_text())
    text = markdown(read_back(page.with_suffix(".csv")), saved["info"], SimpleNamespace(**saved["args"]), saved["made"])
    return study_page.page_text(text, page.stem, study_page.findings_of(page))
