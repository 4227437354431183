"""Loss against model size at equal training compute, over seeds: the reading of claim (c) that issue 45 allows
beside flattened runs ("or at equal compute: say which"), from seeds pages' data.

    python -m scripts.equal_compute docs/study_depth2_flat_seeds/data docs/study_depth2_seeds/data \
        --out docs/equal_compute.md

The studies given share seeds (the same data, initial weights and batch order at each seed, so a run that two of
them trained with the same settings is the same run); their runs are merged per seed, attention and size, with every
cooled-down budget end of each (its samples x the size's forward GMACs per image-text pair: its training compute, as
the studies count it). The reference is
the smallest size's budget end with the most compute; every larger size is read at its budget end nearest that
compute (within 2x; the page gives each one's compute over the reference's). Per attention and size: its validation
loss over the reference's, paired by seed (geometric mean over seeds and 95% Student-t interval, eval/seeds.py
spread), and, against softmax, the same ratio of each other attention over softmax's. Where the loss falls with
parameters at equal compute every larger size's interval lies below the reference; where it is level or rises, the
compute-optimal size lies at or below the smallest, and an exponent at that compute places the compute-optimal size
rather than measuring the loss against model size.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from eval import pages, seeds_page
from eval.scaling_plot import finish, plain_ticks
from eval.seeds import spread

FIGURE = "equal_compute.png"
WITHIN = 2.0  # a larger size's budget end counts only within this factor of the reference's compute


def merged(folders: list[Path]) -> dict[str, dict[tuple[str, str], dict]]:
    """{seed: {(attention, size): {"params", "gmacs", "ends": {samples: (top1, val_loss)}}}} over the seeds every
    folder has; a budget end two folders both hold is the first folder's."""
    loaded = [seeds_page.load_data(Path(f))[0] for f in folders]
    shared = set.intersection(*({s.seed for s in seeds} for seeds in loaded))
    out = {}
    for seeds in loaded:
        for s in (s for s in seeds if s.seed in shared):
            for run in s.runs:
                key = (run["attention"], run["size"])
                entry = out.setdefault(s.seed, {}).setdefault(key, {"ends": {}})
                entry |= {"params": run["params_without_token_embedding"], "gmacs": run["gmacs_per_sample"]}
                for samples, top1, loss in run.get("budgets") or []:
                    entry["ends"].setdefault(int(samples), (top1, loss))
    return {seed: out[seed] for seed in sorted(out, key=lambda s: (len(s), s))}


def seed_rows(runs: dict[tuple[str, str], dict], seed: str, left_out: list | None = None) -> list[dict]:
    """One row per attention and size at one seed: the reference (smallest size, most compute) and each larger
    size's budget end nearest its compute; a size with no end within WITHIN x of it goes to `left_out`."""
    rows = []
    for attention in sorted({a for a, _ in runs}):
        mine = sorted((v["params"], size, v) for (a, size), v in runs.items() if a == attention and v["ends"])
        if len(mine) < 2:
            continue
        ref_samples = max(mine[0][2]["ends"])
        ref_compute, ref_loss = ref_samples * mine[0][2]["gmacs"], mine[0][2]["ends"][ref_samples][1]
        for params, size, v in mine:
            samples = min(v["ends"], key=lambda n: abs(math.log(n * v["gmacs"] / ref_compute)))
            compute = samples * v["gmacs"]
            if abs(math.log(compute / ref_compute)) > math.log(WITHIN):
                if left_out is not None:
                    left_out.append((attention, size, f"{compute / ref_compute:.2f}x the reference's compute at best"))
                continue
            top1, loss = v["ends"][samples]
            rows.append({"seed": seed, "attention": attention, "size": size, "params": params, "samples": samples})
            rows[-1] |= {"compute": compute, "over_compute": compute / ref_compute, "val_loss": loss, "top1": top1}
            rows[-1] |= {"over_loss": loss / ref_loss, "reference": size == mine[0][1]}
    return rows


def per_size(rows: list[dict]) -> list[dict]:
    """Per attention and larger size: its loss over the reference's over seeds, and over softmax's same ratio."""
    out = []
    keys = sorted({(r["attention"] != "softmax", r["attention"], r["params"], r["size"]) for r in rows})
    for _, attention, params, size in (k for k in keys if k[3] not in reference_sizes(rows)):
        mine = {r["seed"]: r for r in rows if (r["attention"], r["size"]) == (attention, size)}
        ratio = spread([r["over_loss"] for r in mine.values()], log=True)
        row = {"attention": attention, "size": size, "params": params, "n": len(mine), "ratio": ratio.__dict__}
        row |= {"over_compute": float(np.mean([r["over_compute"] for r in mine.values()]))}
        row |= {"samples": sorted({r["samples"] for r in mine.values()})}
        soft = {r["seed"]: r for r in rows if (r["attention"], r["size"]) == ("softmax", size)}
        paired = [mine[s]["over_loss"] / soft[s]["over_loss"] for s in mine if s in soft]
        if attention != "softmax" and len(paired) == len(mine):
            row["vs_softmax"] = spread(paired, log=True).__dict__
        out.append(row)
    return out


def reference_sizes(rows: list[dict]) -> set[str]:
    return {r["size"] for r in rows if r["reference"]}


def pct(x: dict) -> str:
    """A ratio's spread as a change: '+18.4% [+12.9%, +24.1%]'."""
    return f"{100 * (x['mean'] - 1):+.1f}% [{100 * (x['lo'] - 1):+.1f}%, {100 * (x['hi'] - 1):+.1f}%]"


def direction(sizes: list[dict]) -> str:
    """How the loss moves with parameters: every larger size's interval below the reference, above it, or
    neither."""
    if sizes and all(s["ratio"]["hi"] < 1 for s in sizes):
        return "falls with parameters"
    if sizes and all(s["ratio"]["lo"] > 1 for s in sizes):
        return "rises with parameters"
    return "does not move distinguishably with parameters"


def findings(sizes: list[dict]) -> str:
    """Sentences from the data: per attention how the loss moves with size at the reference's compute, and each
    other attention's move against softmax's."""
    out = []
    for attention in sorted({s["attention"] for s in sizes}, key=lambda a: (a != "softmax", a)):
        mine = [s for s in sizes if s["attention"] == attention]
        moves = "; ".join(
            f"{s['size']} ({s['params']:,} parameters, {s['over_compute']:.2f}x the compute) {pct(s['ratio'])}"
            for s in mine
        )
        out.append(
            f"- {attention}: at equal compute the validation loss {direction(mine)}; against the "
            f"smallest size, paired over {mine[0]['n']} seeds: {moves}."
        )
        for s in (s for s in mine if "vs_softmax" in s):
            x = s["vs_softmax"]
            side = "above" if x["lo"] > 1 else "below" if x["hi"] < 1 else "spanning"
            out.append(f"  At {s['size']} that ratio over softmax's, paired by seed: {pct(x)} ({side} softmax's).")
    if not out:
        out.append("- No attention has two sizes with budget ends within 2x of the same compute.")
    return "\n".join(out) + "\n"


def figure(rows: list[dict], runs: dict[str, dict], path: Path) -> None:
    """Per attention: each size's validation loss at its cooled-down budget ends against compute, a thin line per
    seed; the points compared ringed."""
    attentions = sorted({r["attention"] for r in rows}, key=lambda a: (a != "softmax", a))
    fig, axes = plt.subplots(1, len(attentions), figsize=(5.2 * len(attentions), 4.2), dpi=110, squeeze=False)
    sizes = [s for _, s in sorted({(r["params"], r["size"]) for r in rows})]
    colours = dict(zip(sizes, plt.cm.viridis(np.linspace(0, 0.85, len(sizes))), strict=True))
    for ax, attention in zip(axes[0], attentions, strict=True):
        for size in sizes:
            for i, by_run in enumerate(runs.values()):
                v = by_run.get((attention, size))
                if v and v["ends"]:
                    xs = sorted(v["ends"])
                    ys = [v["ends"][n][1] for n in xs]
                    label = size if i == 0 else None
                    ax.plot([n * v["gmacs"] for n in xs], ys, color=colours[size], lw=0.8, alpha=0.6, label=label)
        for r in (r for r in rows if r["attention"] == attention):
            ax.plot(r["compute"], r["val_loss"], "o", ms=7, mfc="none", color=colours[r["size"]])
        ax.set(xscale="log", yscale="log", xlabel="training compute (forward GMACs, log)")
        ax.set(ylabel="validation loss (log)")
        ax.set_title(f"{attention}: a line per seed; rings, the budget ends compared", fontsize=8)
        if ax is not axes[0][-1]:
            ax.grid(True, which="both", alpha=0.3)
            plain_ticks(ax)
            ax.legend(fontsize=7)
    finish(fig, axes[0][-1], path)


def write(folders: list[Path], out: Path, command: str) -> Path:
    runs = merged(folders)
    left_out = []
    rows = [r for seed, by_run in runs.items() for r in seed_rows(by_run, seed, left_out)]
    (out.parent / out.stem).mkdir(parents=True, exist_ok=True)
    figure(rows, runs, out.parent / out.stem / FIGURE)
    meta = {"command": command, "seeds": list(runs), "per_size": per_size(rows), "left_out": sorted(set(left_out))}
    return pages.write_page(out, rebuild, pages.stamp(), meta, rows)


def rebuild(page: Path) -> str:
    saved = pages.load_data(page)
    meta, rows = saved["meta"], saved["rows"]
    title = "Loss against model size at equal training compute, over seeds"
    lines = [pages.header(title, meta["command"], made=saved["made"])]
    lines.append(__doc__.split("\n\n", 2)[2].replace("\n", " ").strip() + "\n")
    lines.append("## Findings\n")
    lines.append(findings(meta["per_size"]))
    lines.append(f"## Per size, paired over seeds ({', '.join(meta['seeds'])})\n")
    lines.append(
        "| attention | size | non-embedding parameters | samples | compute over the reference | "
        "validation loss over the reference's [95% CI] | over softmax's same ratio [95% CI] |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for s in meta["per_size"]:
        samples = ", ".join(f"{n:,}" for n in s["samples"])
        soft = pct(s["vs_softmax"]) if "vs_softmax" in s else ""
        lines.append(
            f"| {s['attention']} | {s['size']} | {s['params']:,} | {samples} | {s['over_compute']:.2f}x | "
            f"{pct(s['ratio'])} | {soft} |"
        )
    lines.append("\n## Per seed\n")
    lines.append(
        "| seed | attention | size | samples | compute (GMACs) | validation loss | over the reference's | "
        "zero-shot top-1 |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ref = " (reference)" if r["reference"] else ""
        lines.append(
            f"| {r['seed']} | {r['attention']} | {r['size']}{ref} | {r['samples']:,} | {r['compute']:,.0f} | "
            f"{r['val_loss']:.3f} | {r['over_loss']:.3f} | {100 * r['top1']:.1f}% |"
        )
    for attention, size, why in meta["left_out"]:
        lines.append(f"\nLeft out: {attention} {size}, {why} (within {WITHIN:g}x needed) at some seed.")
    lines.append(f"\n![validation loss against compute per size]({Path(page).stem}/{FIGURE})\n")
    return "\n".join(lines)
