"""Claim (d) against image tokens over seeds: Eq. 7's time to a target zero-shot error over softmax's, per token count,
from studies over seeds at different token counts (their seeds pages' data), and the token count where it breaks even.

    python -m scripts.break_even docs/study_normalised_seeds/data docs/study_tokens577_seeds/data \
        --out docs/break_even.md

Per seed and token count (a size whose softmax and Eq. 7 runs trained at those image tokens): the samples multiplier
k to the target (eval/multiplier.py: first reach; a run that never reaches it counts at its samples seen, a lower
bound) times the step-time ratio r of the same runs (softmax's median training samples per second over Eq. 7's), so
the time ratio k x r, measured at that token count. Per token count: the geometric mean over seeds with its 95%
Student-t interval (eval/seeds.py spread). The break-even: a least-squares line of log time ratio on log tokens
through every measured seed's point (lower bounds left out) and where it crosses 1, with a 95% bootstrap interval
that resamples the seeds within each token count. Between measured token counts the line interpolates; beyond them
the page says it extrapolates.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from eval import pages, seeds_page
from eval.claims import NODENOM, step_ratio
from eval.scaling_plot import finish
from eval.seeds import reach, run_of, sizes_of, spread

N_BOOT = 2000
FIGURE = "break_even.png"


def seed_rows(folder: Path, target: float, skipped: list, attention: str = NODENOM) -> list[dict]:
    """One row per seed and size of a seeds page's data folder with image tokens and both attentions; the seeds and
    sizes that give no multiplier go to `skipped`, each with why."""
    loaded, _ = seeds_page.load_data(Path(folder))
    rows = []
    for size in sizes_of(loaded, attention):
        for s in loaded:
            mine, soft = run_of(s, attention, size), run_of(s, "softmax", size)
            if not (mine and soft and mine.get("image_tokens")):
                continue
            theirs, got = reach(soft, target), reach(mine, target)
            if not math.isfinite(theirs) or 1 - soft["curve"][0][1] <= target:  # no multiplier (eval/multiplier.py)
                why = (
                    "softmax never reaches it" if not math.isfinite(theirs) else "softmax there at its first evaluation"
                )
                row = {"folder": str(folder), "size": size, "seed": s.seed, "tokens": mine["image_tokens"]}
                skipped.append(row | {"why": why})
                continue
            k = (got if math.isfinite(got) else mine["samples_seen"]) / theirs
            r = step_ratio(mine, soft)
            row = {"folder": str(folder), "size": size, "seed": s.seed, "tokens": mine["image_tokens"]}
            rows.append(row | {"k": k, "r": r, "ratio": k * r, "bound": "" if math.isfinite(got) else ">"})
    return rows


def crossing(tokens: np.ndarray, ratios: np.ndarray) -> tuple[float, float]:
    """(tokens where the least-squares line of log ratio on log tokens crosses 1, its slope); inf when it does not
    fall with tokens."""
    if len(set(tokens.tolist())) < 2:
        return math.nan, math.nan
    slope, intercept = np.polyfit(np.log(tokens), np.log(ratios), 1)
    return (math.exp(-intercept / slope) if slope < 0 else math.inf), float(slope)


def break_even(rows: list[dict], n_boot: int = N_BOOT, seed: int = 0) -> dict | None:
    """The crossing through the measured points and its bootstrap interval; None with fewer than two token counts."""
    measured = [r for r in rows if not r["bound"]]
    by_tokens = {}
    for r in measured:
        by_tokens.setdefault(r["tokens"], []).append(r["ratio"])
    if len(by_tokens) < 2:
        return None
    tokens = np.array([t for t, v in by_tokens.items() for _ in v], dtype=float)
    point, slope = crossing(tokens, np.array([x for v in by_tokens.values() for x in v]))
    rng, reps = np.random.default_rng(seed), []
    for _ in range(n_boot):
        drawn = [rng.choice(v, size=len(v)) for v in by_tokens.values()]
        reps.append(crossing(tokens, np.concatenate(drawn))[0])
    lo, hi = np.quantile(reps, [0.025, 0.975], method="nearest")
    span = [min(by_tokens), max(by_tokens)]
    return {"tokens": point, "lo": float(lo), "hi": float(hi), "slope": slope, "span": span, "n": len(measured)}


def per_tokens(rows: list[dict]) -> list[dict]:
    """Per token count: the geometric mean over seeds of k, r's mean and the time ratio with its interval."""
    out = []
    for tokens in sorted({r["tokens"] for r in rows}):
        mine = [r for r in rows if r["tokens"] == tokens]
        t = spread([r["ratio"] for r in mine], log=True, marks=[r["bound"] for r in mine])
        k = spread([r["k"] for r in mine], log=True, marks=[r["bound"] for r in mine])
        out.append({"tokens": tokens, "n": len(mine), "sizes": sorted({r["size"] for r in mine})})
        out[-1] |= {"k": k.text(unit="x"), "r": float(np.mean([r["r"] for r in mine])), "time": t.text(unit="x")}
        out[-1] |= {"mean": t.mean, "lo": t.lo, "hi": t.hi, "bound": ">" if ">" in t.marks else ""}
    return out


def figure(rows: list[dict], found: dict | None, target: float, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.8, 4.2), dpi=110)
    for r in rows:
        ax.plot(
            r["tokens"],
            r["ratio"],
            "^" if r["bound"] else ".",
            color="tab:green",
            alpha=0.6,
            ms=5 if r["bound"] else 6,
            mfc="none" if r["bound"] else "tab:green",
        )
    for p in per_tokens(rows):
        if math.isfinite(p["lo"]):
            hi = p["hi"] if math.isfinite(p["hi"]) else p["mean"] * 4
            ax.plot([p["tokens"]] * 2, [p["lo"], hi], color="tab:green", lw=1.5, ls=":" if p["bound"] else "-")
        ax.plot(p["tokens"], p["mean"], "o", ms=7, color="tab:green", mfc="none" if p["bound"] else "tab:green")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="softmax's time")
    if found and math.isfinite(found["tokens"]):
        xs = np.geomspace(min(found["span"][0], found["tokens"]), max(found["span"][1], found["tokens"]), 30)
        ys = (xs / found["tokens"]) ** found["slope"]
        ax.plot(xs, ys, color="tab:green", lw=1, label=f"log-log line, slope {found['slope']:.2f}")
        ax.axvspan(found["lo"], min(found["hi"], xs[-1] * 2), color="tab:green", alpha=0.12)
        ax.axvline(found["tokens"], color="tab:green", lw=1, ls="--", label=f"break-even {found['tokens']:,.0f} tokens")
    ax.set(xscale="log", yscale="log", xlabel="image tokens (log)")
    ax.set(ylabel=f"Eq. 7's time to {100 * target:.0f}% error / softmax's (log)")
    ax.set_title(
        "seeds (dots; triangles: never reached, lower bounds), mean and 95% t interval; band: break-even CI", fontsize=7
    )
    finish(fig, ax, path)


def write(folders: list[Path], out: Path, target: float, command: str) -> Path:
    skipped = []
    rows = [r for f in folders for r in seed_rows(f, target, skipped)]
    found = break_even(rows)
    (out.parent / out.stem).mkdir(parents=True, exist_ok=True)
    figure(rows, found, target, out.parent / out.stem / FIGURE)
    meta = {"command": command, "target": target, "break_even": found, "per_tokens": per_tokens(rows)}
    meta["left_out"] = sorted({(r["folder"], r["size"], r["tokens"], r["why"]) for r in skipped})
    return pages.write_page(out, rebuild, pages.stamp(), meta, rows)


def rebuild(page: Path) -> str:
    saved = pages.load_data(page)
    meta, rows = saved["meta"], saved["rows"]
    target = 100 * meta["target"]
    lines = [
        pages.header(
            "Claim (d) against image tokens: Eq. 7's time to target over softmax's, over seeds",
            meta["command"],
            made=saved["made"],
        )
    ]
    lines.append(__doc__.split("\n\n", 2)[2].replace("\n", " ").strip() + "\n")
    lines.append("## Findings\n")
    lines.append(findings(meta, target))
    lines.append(f"## Per token count (target {target:.0f}% zero-shot error)\n")
    lines.append("| image tokens | size | seeds | samples multiplier k | step ratio r | time ratio k x r [95% CI] |")
    lines.append("|---|---|---|---|---|---|")
    for p in meta["per_tokens"]:
        lines.append(f"| {p['tokens']} | {', '.join(p['sizes'])} | {p['n']} | {p['k']} | {p['r']:.2f}x | {p['time']} |")
    lines.append("\n## Per seed\n")
    lines.append("| data | size | seed | image tokens | k | r | k x r |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r['folder']} | {r['size']} | {r['seed']} | {r['tokens']} | {r['bound']}{r['k']:.2f}x | "
            f"{r['r']:.2f}x | {r['bound']}{r['ratio']:.2f}x |"
        )
    for folder, size, tokens, why in meta["left_out"]:
        lines.append(f"\nLeft out: {folder} {size} ({tokens} image tokens), {why} at some seed (no multiplier).")
    lines.append(f"\n![time ratio against image tokens]({Path(page).stem}/{FIGURE})\n")
    return "\n".join(lines)


def findings(meta: dict, target: float) -> str:
    """Sentences from the data: the time ratio at each token count and the break-even."""
    out = []
    for p in meta["per_tokens"]:
        side = "less time" if p["hi"] < 1 else "more time" if math.isfinite(p["lo"]) and p["lo"] > 1 else None
        out.append(
            f"- {p['tokens']} image tokens ({p['n']} seeds): Eq. 7 takes {p['time']} softmax's time to {target:.0f}% "
            f"error ({side or 'the interval spans 1'})."
        )
    found = meta["break_even"]
    if found is None:
        out.append("- No break-even: fewer than two token counts with measured time ratios.")
    elif not math.isfinite(found["tokens"]):
        out.append("- No break-even: the time ratio does not fall with tokens.")
    else:
        where = "between" if found["span"][0] <= found["tokens"] <= found["span"][1] else "outside (extrapolated)"
        hi = f"{found['hi']:,.0f}" if math.isfinite(found["hi"]) else "none"
        out.append(
            f"- Break-even at {found['tokens']:,.0f} image tokens [95% CI {found['lo']:,.0f}, {hi}], {where} "
            f"the measured {found['span'][0]}-{found['span'][1]} tokens; the time ratio falls as tokens^"
            f"{found['slope']:.2f} over {found['n']} measured seeds."
        )
    return "\n".join(out) + "\n"
