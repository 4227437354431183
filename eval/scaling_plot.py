"""The log-log figure of a scaling report: points, fitted lines, bootstrap bands, formulas in the legend."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from eval.scaling_fit import predict


def _formula(params) -> str:
    """Mathtext of y = beta x^alpha (+ c); beta far from 1 in scientific notation (x spans 1e6-1e12)."""
    alpha, beta, c = params
    mantissa, exponent = f"{beta:.2e}".split("e")
    coefficient = f"{beta:.3g}" if 1e-2 <= beta < 1e4 else rf"{mantissa}\cdot 10^{{{int(exponent)}}}"
    text = rf"$y = {coefficient}\, x^{{{alpha:.3f}}}"
    return text + (rf" + {c:.3g}$" if c else "$")


def plain_ticks(ax) -> None:
    """Log axes that span at most two decades labelled 0.2, 0.5, 1 (or 20000, 50000) rather than 2x10^-1, with
    minor labels only at 2 and 5 (and 3 within one decade) so that they never run into each other."""
    for axis in (ax.xaxis, ax.yaxis):
        low, high = ax.get_xlim() if axis is ax.xaxis else ax.get_ylim()
        if 0 < low < high <= 100 * low:
            shown = (2, 3, 5) if high <= 10 * low else (2, 5)
            if high <= 3 * low:  # too few decade ticks to read a value: finer ones, all labelled
                shown = (1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)
                axis.set_minor_locator(ticker.LogLocator(10, subs=shown))
            axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            axis.set_minor_formatter(ticker.FuncFormatter(lambda v, _, shown=shown: _minor_label(v, shown)))


def _minor_label(value: float, shown: tuple[int, ...]) -> str:
    mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0
    return f"{value:g}" if any(abs(mantissa - m) < 1e-6 for m in shown) else ""


def render_png(
    report: dict,
    points: dict[str, tuple[np.ndarray, np.ndarray]],
    xlabel: str | None = None,
    ylabel: str | None = None,
    colours: dict | None = None,
) -> bytes:
    """PNG bytes: one colour per group (tab10 in group order, or `colours` {group: colour}); points (frontier
    points filled, others hollow when a frontier was fitted), the fit over the shared x range, its 95% band
    (2.5/97.5 percentiles of the bootstrap fits' predictions per x) and extrapolated predictions with their
    intervals. The y range is that of the points and predictions (a band may leave it). Axis labels: the
    expressions fitted unless given (say the units, e.g. "compute (GMACs x samples)"). `points`: {group: (x, y)},
    eval.scaling.group_points of the data fitted."""
    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    shown = []
    for i, (name, g) in enumerate(report["groups"].items()):
        colour = (colours or {}).get(name, plt.get_cmap("tab10")(i % 10))
        shown += _draw_group(ax, name, g, *points[name], colour)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(min(shown) / 1.25, max(shown) * 1.25)
    ax.set_xlabel(xlabel or report["x"])
    ax.set_ylabel(ylabel or report["y"])
    frontier = f", frontier of {report['frontier_bins']} bins" if report["frontier_bins"] else ""
    ax.set_title(f"{report['form']} fit{frontier}; bands: 95% bootstrap ({report['n_boot']} resamples)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    plain_ticks(ax)
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _draw_group(ax, name: str, g: dict, x: np.ndarray, y: np.ndarray, colour) -> list[float]:
    """One group's points, fit, band and extrapolations; returns the y values that must stay in view."""
    hollow = "frontier" in g
    ax.scatter(x, y, s=22, facecolors="none" if hollow else colour, edgecolors=colour, alpha=0.8)
    if hollow:
        fx, fy = np.array(g["frontier"]).T
        ax.scatter(fx, fy, s=30, color=colour)
    band = g["band"]
    grid = np.array(band["x"])
    params = [g["alpha"], g["beta"], g.get("c", 0.0)]
    ax.plot(grid, predict(params, grid), color=colour, label=f"{name}: {_formula(params)} (n={g['n_points']})")
    ax.fill_between(grid, band["lo"], band["hi"], color=colour, alpha=0.2, linewidth=0)
    for e in g["extrapolation"]:
        err = [[e["y"] - e["y_ci"][0]], [e["y_ci"][1] - e["y"]]]
        ax.errorbar([e["x"]], [e["y"]], yerr=err, fmt="D", color=colour, capsize=3)
    return [*y, *(e["y"] for e in g["extrapolation"])]
