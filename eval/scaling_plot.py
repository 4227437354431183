"""The log-log figure of a scaling report: points, fitted lines, bootstrap bands, formulas and R^2 in the legend,
and under each panel the log residuals of the points fitted."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker
from matplotlib.lines import Line2D

from eval.scaling_fit import log_residuals, predict


def _formula(params) -> str:
    """Mathtext of y = beta x^alpha (+ c); beta far from 1 in scientific notation (x spans 1e6-1e12)."""
    alpha, beta, c = params
    if not np.isfinite([alpha, beta, c or 0]).all():  # a fit that failed (e.g. one point's loss at every size)
        return "no finite fit"
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


def finish(fig, ax, path) -> None:
    """One-panel figures: grid, plain log ticks, a small legend, then saved to `path` and closed."""
    ax.grid(True, which="both", alpha=0.3)
    plain_ticks(ax)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _minor_label(value: float, shown: tuple[int, ...]) -> str:
    mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0
    return f"{value:g}" if any(abs(mantissa - m) < 1e-6 for m in shown) else ""


# Units of the expressions of eval/scaling_io.py. compute = gmacs_per_sample (models.summary: the forward MACs of one
# image and one text, in units of 1e9) x samples_seen, so it counts forward GMACs; a step's backward is not in it.
UNITS = {
    "compute": "compute (forward GMACs: GMACs per image-text pair x samples seen)",
    "gmacs_total": "compute (GMACs)",
    "gmacs_per_sample": "GMACs per image-text pair (forward)",
    "samples_seen": "samples seen (image-text pairs)",
    "step": "optimizer steps",
    "params": "parameters (count)",
    "params_without_token_embedding": "parameters without the token embedding (count)",
    "loss": "training loss (contrastive cross-entropy, nats)",
    "val_loss": "validation loss (contrastive cross-entropy, nats)",
    "error": "zero-shot top-1 error (fraction)",
}


def axis_label(expr: str) -> str:
    """The label of an axis fitted on column expression `expr`, with its unit where the expression is known."""
    name, _, dataset = expr.strip().partition("@")
    if name in UNITS:
        return UNITS[name].replace(" (", f" on {dataset} (", 1) if dataset else UNITS[name]
    return expr


def build_figure(
    report: dict,
    points: dict[str, tuple[np.ndarray, np.ndarray]],
    xlabel: str | None = None,
    ylabel: str | None = None,
    colours: dict | None = None,
):
    """The matplotlib Figure of a report: one log-log panel, or with extrapolations two: the data range alone
    (left, so that the points stay readable) and the view out to the extrapolated x (right); under each, its
    residual panel (ln y - ln fit of the points fitted, against x).

    One colour per group (tab10 in group order, or `colours` {group: colour}); points (frontier points filled,
    others hollow when a frontier was fitted), the fit over the shared x range, its 95% band (2.5/97.5 percentiles
    of the bootstrap fits' predictions per x; none for a group without an interval) and extrapolated predictions
    with their intervals; the legend gives each fit's R^2 on log y. The y range is that of the points and
    predictions in view (a band may leave it). Axis labels: the expressions fitted with their units (axis_label)
    unless given. `points`: {group: (x, y)}, eval.scaling.group_points of the data fitted.
    """
    extrapolating = bool(report["extrapolate"])
    fig, grid = plt.subplots(
        2,
        1 + extrapolating,
        figsize=(13 if extrapolating else 7, 6.5),
        dpi=120,
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [3, 1], "hspace": 0.08},
    )
    axes = list(grid[0])
    frontier = f", frontier of {report['frontier_bins']} bins" if report["frontier_bins"] else ""
    title = f"{report['form']} fit{frontier}; bands: 95% bootstrap ({report['n_boot']} resamples)"
    x_data = np.concatenate([x for x, _ in points.values()])
    for ax, below in zip(axes, grid[1]):
        shown = []
        for i, (name, g) in enumerate(report["groups"].items()):
            shown += _draw_group(ax, name, g, *points[name], _colour(colours, name, i))
            _draw_residuals(below, g, *points[name], _colour(colours, name, i))
        ax.set_xscale("log")
        ax.set_yscale("log")
        if ax is axes[0] and extrapolating:
            # the data panel: the x range of the points; of the predictions only those inside it set the y range
            low, high = x_data.min(), x_data.max()
            ax.set_xlim(low / 1.3, high * 1.3)
            shown = [v for v, at in shown if at is None or low <= at <= high]
        else:
            shown = [v for v, _ in shown]
        ax.set_ylim(min(shown) / 1.25, max(shown) * 1.25)
        ax.set_ylabel(ylabel or axis_label(report["y"]))
        ax.grid(True, which="both", alpha=0.3)
        plain_ticks(ax)
        below.set_xlabel(xlabel or axis_label(report["x"]))
    _titles(fig, axes, report, title)
    handles, _ = axes[-1].get_legend_handles_labels()
    axes[-1].legend(handles=handles + marker_key(report), fontsize=8)
    return fig


def marker_key(report: dict) -> list[Line2D]:
    """Legend entries (grey) for what the markers mean: frontier points (fitted) against the others, and the
    extrapolated predictions, so that no reader takes a point that was not fitted, or not measured, for data."""
    key = []
    if any("frontier" in g for g in report["groups"].values()):
        key.append(Line2D([], [], ls="", marker="o", color="0.45", label="frontier point (fitted)"))
        key.append(Line2D([], [], ls="", marker="o", mfc="none", color="0.45", label="off the frontier (not fitted)"))
    if report["extrapolate"]:
        label = "extrapolated, not measured (95% interval)"
        key.append(Line2D([], [], ls="", marker="D", color="0.45", label=label))
    return key


def _colour(colours: dict | None, name: str, i: int):
    return (colours or {}).get(name, plt.get_cmap("tab10")(i % 10))


def _titles(fig, axes, report: dict, title: str) -> None:
    if report["extrapolate"]:
        fig.suptitle(title, fontsize=9)
        axes[0].set_title("the data range", fontsize=9)
        axes[1].set_title(f"extrapolated to x = {max(report['extrapolate']):.3g}", fontsize=9)
    else:
        axes[0].set_title(title, fontsize=9)


def _draw_residuals(ax, g: dict, x: np.ndarray, y: np.ndarray, colour) -> None:
    """The log residuals ln y - ln fit of the points the group was fitted on (its frontier, where it has one)."""
    if "frontier" in g:
        x, y = np.array(g["frontier"]).T
    params = [g["alpha"], g["beta"], g.get("c", 0.0)]
    ax.scatter(x, log_residuals(params, x, y), s=18, color=colour, alpha=0.8)
    ax.axhline(0, color="0.4", lw=0.8)
    ax.set_ylabel("ln y - ln fit", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def render_png(fig) -> bytes:
    """PNG bytes of a figure (of build_figure), which is closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _draw_group(ax, name: str, g: dict, x: np.ndarray, y: np.ndarray, colour) -> list[tuple[float, float | None]]:
    """One group's points, fit, band and extrapolations; returns the y values that must stay in view, each with the
    x of its prediction (None for a data point)."""
    hollow = "frontier" in g
    ax.scatter(x, y, s=22, facecolors="none" if hollow else colour, edgecolors=colour, alpha=0.8)
    if hollow:
        fx, fy = np.array(g["frontier"]).T
        ax.scatter(fx, fy, s=30, color=colour)
    band = g["band"]
    grid = np.array(band["x"])
    params = [g["alpha"], g["beta"], g.get("c", 0.0)]
    none = " (no interval)" if g.get("no_interval") else ""
    r2 = "" if g.get("r2") is None else f", $R^2$={g['r2']:.3f}"
    label = f"{name}: {_formula(params)} (n={g['n_points']}{r2}){none}"
    ax.plot(grid, predict(params, grid), color=colour, label=label)
    if not none:
        ax.fill_between(grid, band["lo"], band["hi"], color=colour, alpha=0.2, linewidth=0)
    for e in g["extrapolation"]:
        # an undetermined interval is not drawn as a zero-width (or uninformative) error bar
        err = None if e.get("no_interval") else [[e["y"] - e["y_ci"][0]], [e["y_ci"][1] - e["y"]]]
        ax.errorbar([e["x"]], [e["y"]], yerr=err, fmt="D", color=colour, capsize=3)
    return [(v, None) for v in y] + [(e["y"], e["x"]) for e in g["extrapolation"]]
