"""The seeds page's figure of samples multipliers: each linear attention's samples to a target zero-shot error over
softmax's of the same size, against the target, with its 95% interval over seeds (eval/seeds.py multiplier_spread,
the numbers of the page's multiplier table).

    multipliers_figure(seeds, targets, path)   # False (nothing drawn) when no target gives a multiplier
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from eval import seeds as seeds_mod
from eval import study_plots
from eval.scaling_plot import finish

FIGURE = "multipliers.png"


def points(seeds: list[seeds_mod.Seed], targets: list[float]) -> dict[tuple[str, str], list[tuple[float, object]]]:
    """(attention, size) -> [(target, Spread)] for every target with a multiplier at every seed."""
    attentions = list(dict.fromkeys(r["attention"] for r in seeds[0].runs))
    found = {}
    for a in (a for a in attentions if a != "softmax"):
        for size in seeds_mod.sizes_of(seeds, a):
            if not all(seeds_mod.run_of(s, "softmax", size) for s in seeds):
                continue
            row = [(t, k) for t in targets if (k := seeds_mod.multiplier_spread(seeds, a, size, t)) is not None]
            if row:
                found[(a, size)] = row
    return found


def multipliers_figure(seeds: list[seeds_mod.Seed], targets: list[float], path: Path) -> bool:
    """One panel per size: the geometric mean over seeds (filled marker) with its 95% t interval (bar), each seed's
    value (small dots), a lower bound where a seed's run never reached the target (open triangle, the bar open
    above); the line at 1 is softmax."""
    found = points(seeds, targets)
    if not found:
        return False
    attentions = list(dict.fromkeys(r["attention"] for r in seeds[0].runs))
    sizes = list(dict.fromkeys(size for _, size in found))
    fig, axes = plt.subplots(1, len(sizes), figsize=(max(4.8 * len(sizes), 7.2), 3.9), dpi=110, squeeze=False)
    order = sorted({t for row in found.values() for t, _ in row}, reverse=True)  # easiest target first
    shift = {a: 0.08 * (i - (len(attentions) - 1) / 2) for i, a in enumerate(attentions)}  # keep the bars apart
    for ax, size in zip(axes[0], sizes):
        for (a, s), row in found.items():
            if s != size:
                continue
            colour = study_plots.colour(attentions, a)
            for target, k in row:
                x = order.index(target) + shift[a]
                bound = ">" in k.marks
                hi = k.hi if math.isfinite(k.hi) else k.mean * 4
                if math.isfinite(k.lo):
                    ax.plot([x, x], [k.lo, hi], color=colour, lw=1.2, ls=":" if bound else "-")
                ax.plot(x, k.mean, marker="^" if bound else "o", mfc="none" if bound else colour, color=colour, ms=6)
                ax.plot([x] * len(k.values), k.values, ".", color=colour, ms=3, alpha=0.5)
            ax.plot([], [], "o", color=colour, label=a)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(yscale="log", xlabel="target zero-shot top-1 error (harder to the right)", xlim=(-0.5, len(order) - 0.5))
        ax.set(ylabel="samples to the target / softmax's (log)", title=f"{size}: {len(seeds)} seeds, 95% t interval")
        ax.set_xticks(range(len(order)), [f"{100 * t:g}%" for t in order])
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.title.set_fontsize(8)
    grey = {"color": "0.45", "ls": ""}
    key = [
        Line2D([], [], marker="o", label="geometric mean over seeds; bar: its 95% t interval", **grey),
        Line2D([], [], marker="^", mfc="none", label="a seed never reached it: lower bound, bar open above", **grey),
        Line2D([], [], marker=".", label="each seed", **grey),
    ]
    handles, _ = axes[0][0].get_legend_handles_labels()
    # below the panels, so that it hides no point
    fig.legend(handles=handles + key, fontsize=7, loc="lower center", ncol=3 if len(sizes) > 1 else 2)
    fig.tight_layout(rect=(0, 0.16 if len(sizes) > 1 else 0.2, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return True


PARAMS_FIGURE = "loss_params.png"


def has_sizes(seeds: list[seeds_mod.Seed]) -> bool:
    """Every seed fitted the validation loss against parameters, and some attention has models of two sizes or more."""
    return all(s.fits.get(seeds_mod.PARAMS_FIT, {}).get("groups") for s in seeds) and any(
        len(params_of(seeds, a)) > 1 for a in dict.fromkeys(r["attention"] for r in seeds[0].runs)
    )


def params_of(seeds: list[seeds_mod.Seed], attention: str) -> set[str]:
    """The distinct models of an attention's sizes (SIZE@RESpx, one model at several image sizes, counts once)."""
    return {size.split("@")[0] for size in seeds_mod.sizes_of(seeds, attention)}


def params_figure(seeds: list[seeds_mod.Seed], path: Path) -> bool:
    """Claim (c)'s quantity: the final validation loss of each full-budget run against its parameters without the
    token embedding, per attention: each seed's runs (dots) and its power-law fit (thin line, eval/scaling.py), the
    mean over seeds at each size with its 95% t interval (bar); the legend gives the exponent over seeds."""
    if not has_sizes(seeds):
        return False
    attentions = list(dict.fromkeys(r["attention"] for r in seeds[0].runs))
    fig, ax = plt.subplots(figsize=(6.2, 4.4), dpi=110)
    for i, a in enumerate(attentions):
        colour, sizes = study_plots.colour(attentions, a), seeds_mod.sizes_of(seeds, a)
        if len(params_of(seeds, a)) < 2:
            continue
        runs = [[seeds_mod.run_of(s, a, size) for size in sizes] for s in seeds]
        for row in runs:
            x, y = [r["params_without_token_embedding"] for r in row], [r["val_loss"] for r in row]
            ax.plot(x, y, ".", color=colour, ms=3, alpha=0.5)
        for size_runs in zip(*runs):
            k = seeds_mod.spread([r["val_loss"] for r in size_runs])
            x = size_runs[0]["params_without_token_embedding"] * 1.03 ** (i - 1)  # keep the bars apart
            bar = [[k.mean - k.lo], [k.hi - k.mean]] if len(size_runs) > 1 else None
            ax.errorbar(x, k.mean, yerr=bar, fmt="o", color=colour, ms=5, capsize=2)
        for s in seeds:
            g = s.fits[seeds_mod.PARAMS_FIT]["groups"].get(a)
            if g and g.get("beta") is not None:
                lo, hi = g["x_range"]
                xs = [lo * (hi / lo) ** (j / 20) for j in range(21)]
                ax.plot(xs, [g["beta"] * x ** g["alpha"] for x in xs], color=colour, lw=0.7, alpha=0.5)
        exponent = seeds_mod.exponent_spread(seeds, a, seeds_mod.PARAMS_FIT).text("{:+.3f}")
        ax.plot([], [], "o-", color=colour, label=f"{a}: exponent {exponent}")
    ax.set(xscale="log", yscale="log", xlabel="parameters without the token embedding (log)")
    ax.set(ylabel="final validation loss (contrastive, log)")
    ax.set_title(f"{len(seeds)} seeds: mean and 95% t interval per size; thin lines: each seed's fit", fontsize=8)
    finish(fig, ax, path)
    return True
