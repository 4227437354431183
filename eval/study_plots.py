"""The main job's figures: learning curves of every run, one summary figure comparing the attentions, the
learning-rate sweep, and the samples multipliers against the target error.

The fits themselves are drawn by eval.scaling.plot (points, frontier, fits, 95% bands). Here: one colour per
attention (the same in every figure), one line style per model size.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from eval.scaling_plot import plain_ticks

STYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2))]
ATTENTION = "model.image_attention"


def colour(attentions: list[str], attention: str):
    return plt.get_cmap("tab10")(attentions.index(attention) % 10)


def style(sizes: list[str], size: str):
    return STYLES[sizes.index(size) % len(STYLES)]


def legend(ax, attentions: list[str], sizes: list[str], budgets: bool = False) -> None:
    """Two keys: colour = attention, line style = size (and, with `budgets`, the ring of a cooled-down budget)."""
    handles = [Line2D([], [], color=colour(attentions, a), lw=2, label=a) for a in attentions]
    handles += [Line2D([], [], color="0.3", linestyle=style(sizes, s), label=s) for s in sizes]
    if budgets:
        ring = {"ls": "none", "marker": "o", "ms": 5, "mfc": "white", "mew": 1.2, "color": "0.3"}
        handles.append(Line2D([], [], label="end of a budget, cooled down", **ring))
    ax.legend(handles=handles, fontsize=7, ncol=2)


PANELS = (("error", "zero-shot top-1 error"), ("val_loss", "validation loss (contrastive, batch 64)"))


def curve_points(run: dict) -> dict[str, tuple[list, list]]:
    """A report row's (eval/study_analysis.run_rows) learning curves as {panel: (samples, values)}: "error" and
    "val_loss", every evaluation of its full-budget run (at its constant rate, then its cooldown), and with budgets
    "error budgets" and "val_loss budgets", the cooled-down end of each budget (the points the fits read)."""
    evaluations = run.get("run_curve", run["curve"])  # with budgets, "curve" holds the budgets' ends
    out = {
        "error": ([s for s, _ in evaluations], [1 - t for _, t in evaluations]),
        "val_loss": ([s for s, _ in run["val_curve"]], [v for _, v in run["val_curve"]]),
    }
    if run.get("budgets"):
        out["error budgets"] = ([b[0] for b in run["budgets"]], [1 - b[1] for b in run["budgets"]])
        out["val_loss budgets"] = ([b[0] for b in run["budgets"]], [b[2] for b in run["budgets"]])
    return out


def learning_curves(runs: list[dict], attentions, sizes, path) -> None:
    """Zero-shot error and validation loss against samples seen, log-log, one line per run (curve_points); where the
    run has budgets, their cooled-down ends as rings joined by a line, its own evaluations faint behind them."""
    budgets = any(run.get("budgets") for run in runs)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6.2 * len(PANELS), 4.8), dpi=110, squeeze=False)
    for ax, (panel, label) in zip(axes[0], PANELS):
        for run in runs:
            points = curve_points(run)
            look = {"color": colour(attentions, run["attention"]), "linestyle": style(sizes, run["size"])}
            faint = {"lw": 1.0, "alpha": 0.4} if f"{panel} budgets" in points else {"lw": 1.4}
            ax.plot(*points[panel], marker=".", ms=3, **faint, **look)
            if f"{panel} budgets" in points:
                ax.plot(*points[f"{panel} budgets"], marker="o", ms=5, mfc="white", mew=1.2, lw=1.4, **look)
        ax.set(xscale="log", yscale="log", xlabel="samples seen (image-text pairs)", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
        plain_ticks(ax)
        legend(ax, attentions, sizes, budgets=budgets)
    title = "learning curves: every evaluation of every run"
    if budgets:
        title = (
            "learning curves: rings, the end of each budget cooled down (the points the fits read); faint, every "
            "evaluation of each run (its constant rate, then its cooldown)"
        )
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def exponent_panel(ax, fits: dict[str, dict], attentions: list[str]) -> None:
    """Forest plot: each fit's exponent per attention with its 95% bootstrap interval."""
    names = list(fits)
    width = 0.8 / max(1, len(attentions))
    for i, attention in enumerate(attentions):
        for j, name in enumerate(names):
            g = fits[name]["groups"].get(attention)
            if g is None:
                continue
            y = j + (i - (len(attentions) - 1) / 2) * width
            lo, hi = g["alpha_ci"]
            ax.errorbar(
                g["alpha"],
                y,
                xerr=[[g["alpha"] - lo], [hi - g["alpha"]]],
                fmt="o",
                capsize=3,
                color=colour(attentions, attention),
                label=attention if j == 0 else None,
            )
    ax.axvline(0, color="0.5", lw=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("fitted exponent alpha (y = beta x^alpha), 95% bootstrap interval")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:  # every fit failed (too few points: the report says why per fit)
        ax.text(0.5, 0.5, "no exponent fitted", transform=ax.transAxes, ha="center", va="center", fontsize=8)
    ax.set_title("scaling exponents per attention", fontsize=9)


def final_panel(ax, finals: pd.DataFrame, attentions: list[str]) -> None:
    """End-of-training zero-shot error against non-embedding parameters, one line per attention."""
    for attention, rows in finals.groupby(ATTENTION, sort=False):
        rows = rows.sort_values("params_without_token_embedding")
        ax.plot(
            rows["params_without_token_embedding"],
            1 - rows["top1"],
            "o-",
            color=colour(attentions, attention),
            label=attention,
        )
    ax.set(xscale="log", yscale="log", xlabel="parameters without the token embedding")
    ax.set_ylabel("zero-shot top-1 error at the end of training")
    ax.grid(True, which="both", alpha=0.3)
    plain_ticks(ax)
    ax.legend(fontsize=7)
    ax.set_title("error against model size (same samples for every size)", fontsize=9)


def summary_figure(fits: dict[str, dict], finals: pd.DataFrame, attentions: list[str], path) -> None:
    """Left: exponents with intervals per fit and attention; right: final error against size."""
    fig, axes = plt.subplots(1, 2, figsize=(12.4, 4.6), dpi=110)
    exponent_panel(axes[0], fits, attentions)
    final_panel(axes[1], finals, attentions)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def log_slope(x, y) -> float:
    """Least-squares slope of log y against log x (nan with fewer than 2 points)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    return float(np.polyfit(np.log(x), np.log(y), 1)[0]) if len(x) >= 2 else float("nan")


def sweep_figure(rows: list[dict], attentions: list[str], path) -> None:
    """The learning-rate sweep (train/lr_sweep.py's rows): final validation loss and zero-shot error against the
    learning rate, one line per attention, the chosen rate circled."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for ax, (column, label) in zip(axes, (("val_loss", "final validation loss"), ("error", "final zero-shot error"))):
        sizes = list(dict.fromkeys(r.get("size") for r in rows))  # one line per attention and swept size
        for attention, size in [(a, z) for a in attentions for z in sizes]:
            mine = sorted(
                (r for r in rows if r["attention"] == attention and r.get("size") == size), key=lambda r: r["lr"]
            )
            if not mine:
                continue
            values = [r["val_loss"] if column == "val_loss" else 1 - r["top1"] for r in mine]
            name = f"{attention} at {size}" if len(sizes) > 1 else attention
            line = "-o" if sizes.index(size) == 0 else "--s"
            ax.plot([r["lr"] for r in mine], values, line, ms=4, color=colour(attentions, attention), label=name)
            chosen = [(r["lr"], v) for r, v in zip(mine, values) if r["chosen"]]
            ax.plot(*zip(*chosen), "o", ms=11, mfc="none", color=colour(attentions, attention)) if chosen else None
        ax.set(xscale="log", yscale="log", xlabel="peak learning rate", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
        plain_ticks(ax)
    axes[0].legend(fontsize=7)
    axes[0].set_title("learning-rate sweep (circled: chosen, the lowest validation loss)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def interval(m, end: str) -> bool:
    """Whether a multiplier (not a bound) has a finite `end` ("lo" or "hi") of its interval to draw."""
    return not (m.censored or m.at_start) and bool(np.isfinite(getattr(m, end)))


def multiplier_figure(found: list[dict], attentions: list[str], path) -> None:
    """Samples multiplier over softmax against the target error with its 95% interval, one panel per model size
    (eval/study_report.multipliers); a run that never reaches a target is drawn at its lower bound with an arrow."""
    sizes = list(dict.fromkeys(f["run"]["size"] for f in found))
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.4 * len(sizes), 4), dpi=110, squeeze=False, sharey=True)
    for ax, size in zip(axes[0], sizes):
        for attention in attentions:
            mine = sorted(
                (f for f in found if f["attention"] == attention and f["run"]["size"] == size),
                key=lambda f: f["target"],
            )
            if not mine:
                continue
            x, k = [100 * f["target"] for f in mine], [f["m"].k for f in mine]
            # a bound (never reached, or there at the first evaluation) has no bar; an interval that does not
            # straddle k (a bootstrap of a censored curve) is drawn from k
            lo = [max(k_ - f["m"].lo, 0) if interval(f["m"], "lo") else 0 for k_, f in zip(k, mine)]
            hi = [max(f["m"].hi - k_, 0) if interval(f["m"], "hi") else 0 for k_, f in zip(k, mine)]
            ax.errorbar(
                x, k, yerr=[lo, hi], fmt="-o", ms=4, capsize=3, color=colour(attentions, attention), label=attention
            )
            for xi, ki, f in zip(x, k, mine):
                if f["m"].censored or not np.isfinite(f["m"].hi):  # a lower bound, or no upper one: an arrow up
                    ax.annotate("", (xi, ki * 1.6), (xi, ki), arrowprops={"arrowstyle": "->"})
        ax.axhline(1, color="grey", lw=0.8, ls=":")
        ax.set(yscale="log", xlabel="target zero-shot error (%)", title=size)
        ax.invert_xaxis()  # harder targets to the right
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("samples to the target / softmax's")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
