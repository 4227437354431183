"""Fit scaling laws L(x) = beta * x^alpha (+ c) to many runs, per group, with bootstrap intervals.

Answers "does linear attention follow the same scaling law as softmax?": fits every group (e.g. the
attention variant), gives 95% bootstrap intervals for alpha and beta, and the interval of the
difference of exponents between groups. Forms: ``power`` (least squares in log-log space),
``saturating`` (y = beta x^alpha + c, c >= 0) and, with ``--frontier-bins K``, the compute-frontier
fit of Cherti et al. 2023. What is read from each input kind: see eval/scaling_io.py. A group with only as many
distinct x as the form has parameters gives no interval: every verdict on it is "undetermined" (with the reason),
and so is a prediction's interval there or where every bootstrap fit predicts the same value. Every group carries
its R^2 on log y over the points fitted (its frontier, where it has one) and the x range of those points; a fit
below R2_MIN (0.95) does not describe its points, which the table says (poor_fit).

    python -m eval.scaling runs/ --x compute --y error --group model.image_attention --frontier-bins 8 \
        --out runs/scaling
    python -m eval.scaling results.csv --x params --y loss --form saturating --extrapolate 1e9 --out out/

Writes DIR/report.json and DIR/scaling.png only once everything is computed (temp file + os.replace).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from eval.scaling_fit import (
    FITS,
    R2_MIN,
    bootstrap,
    fit_procedure,
    floor_at_bound,
    interval,
    predict,
    r2_log,
    too_few_x,
    zero_width,
)
from eval.scaling_io import POINTS, ScalingInputError, ScalingWarning, evaluate, load_points
from eval.scaling_plot import build_figure, render_png

__all__ = [
    "ScalingInputError",
    "ScalingWarning",
    "fit",
    "format_table",
    "group_points",
    "load_points",
    "main",
    "plot",
    "poor_fit",
]

BAND_POINTS = 60
POOR_FIT = "the fit does not describe its points"
ZERO_WIDTH = "every bootstrap fit predicts the same value: a zero-width interval"
FLOOR_AT_BOUND = {
    "lower": "the floor is at its bound: the data do not show a floor",
    "upper": "the floor is at its bound (the lowest y): the data do not place it below their lowest point",
}


def group_points(
    df: pd.DataFrame, x: str, y: str, group: str | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{group name: (x [N], y [N])} with rows missing x, y or group dropped (one warning says how many)."""
    xs, ys = evaluate(df, x), evaluate(df, y)
    if group is not None and group not in df.columns:
        raise ScalingInputError(
            f"group column '{group}' not found; available columns: {', '.join(map(str, df.columns))}"
        )
    labels = df[group] if group is not None else pd.Series("all", index=df.index)
    missing = {x: ~np.isfinite(xs), y: ~np.isfinite(ys), group: labels.isna().to_numpy()}
    dropped = np.logical_or.reduce(list(missing.values()))
    if dropped.any():
        detail = ", ".join(f"{int(m.sum())} in '{name}'" for name, m in missing.items() if m.any())
        warnings.warn(
            f"dropped {int(dropped.sum())} of {len(df)} rows with missing or non-finite values ({detail})",
            ScalingWarning,
            stacklevel=2,
        )
    keep = ~dropped
    names = labels[keep].astype(str).to_numpy()
    # Natural order of the values (64 before 128), as text when they do not compare.
    try:
        order = [str(v) for v in sorted(labels[keep].unique())]
    except TypeError:
        order = sorted(set(names))
    return {name: (xs[keep][names == name], ys[keep][names == name]) for name in order}


def _check_group(name: str, x: np.ndarray, y: np.ndarray, x_expr: str, y_expr: str) -> None:
    if len(x) == 0:
        raise ScalingInputError(f"group '{name}' has no points with both '{x_expr}' and '{y_expr}'; check the columns")
    for axis, expr, values in (("x", x_expr, x), ("y", y_expr, y)):
        bad = int((values <= 0).sum())
        if bad:
            raise ScalingInputError(
                f"group '{name}': {bad} of {len(values)} values of {axis} '{expr}' are <= 0; "
                "a log-log fit needs positive values (drop those runs or pick another column)"
            )


def _formula(alpha: float, beta: float, c: float, form: str) -> str:
    text = f"y = {beta:.3g} x^{alpha:.3f}"
    return text + f" + {c:.3g}" if form == "saturating" else text


def _fit_group(name, x, y, opts, rng, grid) -> tuple[dict, np.ndarray]:
    """The report entry of one group, and its bootstrap exponents [n_boot] for the comparisons."""
    form, bins = opts["form"], opts["frontier_bins"]
    params, x_used, y_used = fit_procedure(x, y, form, bins, name)
    few = too_few_x(x_used, form, name, bins)
    if few:
        warnings.warn(
            f"{few}; its intervals are not informative (verdicts on it: undetermined)", ScalingWarning, stacklevel=3
        )
    draws, redraws = bootstrap(x, y, form, bins, opts["n_boot"], rng, name)
    result = {
        "n_points": len(x),
        "n_distinct_x": len(np.unique(x)),
        "no_interval": f"{few}: no interval" if few else None,
        "alpha": float(params[0]),
        "alpha_ci": interval(draws[:, 0]),
        "beta": float(params[1]),
        "beta_ci": interval(draws[:, 1]),
        "formula": _formula(*params, form),
        "r2": _finite_or_none(r2_log(params, x_used, y_used)),
        "x_range": [float(x_used.min()), float(x_used.max())],
        "bootstrap_redraws": int(redraws),
    }
    if form == "saturating":
        result.update(c=float(params[2]), c_ci=interval(draws[:, 2]))
        result["c_at_bound"] = floor_at_bound(result["c"], float(y_used.min()))
    if bins:
        result["frontier"] = [[float(a), float(b)] for a, b in zip(x_used, y_used)]
    result["extrapolation"] = _extrapolations(params, draws, opts["extrapolate"], result["no_interval"])
    band = np.percentile(predict(draws, grid), [2.5, 97.5], axis=0)
    result["band"] = {"x": grid.tolist(), "lo": band[0].tolist(), "hi": band[1].tolist()}
    return result, draws[:, 0]


def _finite_or_none(value: float) -> float | None:
    return value if np.isfinite(value) else None  # JSON has no NaN (report.json is written with allow_nan=False)


def _extrapolations(params, draws, at_x, no_interval: str | None) -> list[dict]:
    """The prediction at each x of at_x with its interval; "no_interval" says why that interval is undetermined."""
    predictions = []
    for at in at_x:
        y, ci = float(predict(params, [at])[0]), interval(predict(draws, [at])[:, 0])
        why = no_interval or (ZERO_WIDTH if zero_width(y, ci) else None)
        predictions.append({"x": float(at), "y": y, "y_ci": ci, "no_interval": why})
    return predictions


def _verdict(a: str, b: str, diff: float, lo: float, hi: float, reasons: list[str]) -> tuple[str, str]:
    """(verdict, the one-line summary) of alpha_a - alpha_b; undetermined when a group gives no interval."""
    head = f"alpha({a}) - alpha({b}) = {diff:+.3f}"
    if reasons:
        return "undetermined", f"{head}: undetermined ({'; '.join(reasons)})"
    verdict = "differ" if lo > 0 or hi < 0 else "not distinguishable at 95%"
    plain = (
        "the exponents differ (the interval excludes 0)"
        if verdict == "differ"
        else f"{verdict} (the interval contains 0)"
    )
    return verdict, f"{head} [95% CI {lo:+.3f}, {hi:+.3f}]: {plain}"


def _compare(alphas: dict[str, np.ndarray], fits: dict[str, dict], reference: str | None) -> list[dict]:
    """alpha_a - alpha_b with the interval of the differences of independent bootstrap draws."""
    names = list(alphas)
    pairs = (
        [(other, reference) for other in names if other != reference] if reference else itertools.combinations(names, 2)
    )
    comparisons = []
    for a, b in pairs:
        lo, hi = interval(alphas[a] - alphas[b])
        diff = fits[a]["alpha"] - fits[b]["alpha"]
        reasons = [fits[g]["no_interval"] for g in (a, b) if fits[g]["no_interval"]]
        verdict, summary = _verdict(a, b, diff, lo, hi, reasons)
        comparisons.append(
            {
                "a": a,
                "b": b,
                "alpha_diff": diff,
                "alpha_diff_ci": [lo, hi],
                "verdict": verdict,
                "reason": "; ".join(reasons) or None,
                "summary": summary,
            }
        )
    return comparisons


def _band_grid(groups, extrapolate) -> np.ndarray:
    values = np.concatenate([x for x, _ in groups.values()] + [np.asarray(extrapolate, dtype=float)])
    return np.geomspace(values.min(), values.max(), BAND_POINTS)


def fit(
    df: pd.DataFrame,
    x: str,
    y: str,
    group: str | None = None,
    form: str = "power",
    frontier_bins: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    extrapolate=(),
    reference: str | None = None,
) -> dict:
    """Fit y = beta * x^alpha (+ c) per group of ``df``; returns the report (JSON-serialisable dict).

    x, y: column expressions (eval/scaling_io.py); group: a column or None (one group 'all').
    Bootstrap: ``n_boot`` resamples per group with a generator spawned from ``seed`` for that group.
    ``reference``: compare every group with this one; default: every pair of groups.
    """
    if form not in FITS:
        raise ScalingInputError(f"unknown form '{form}'; choose one of {', '.join(FITS)}")
    if frontier_bins is not None and frontier_bins < 1:
        raise ScalingInputError(f"--frontier-bins must be at least 1, got {frontier_bins}")
    if n_boot < 10:
        raise ScalingInputError(f"n_boot must be at least 10 for a 95% interval, got {n_boot}")
    if any(at <= 0 for at in extrapolate):
        raise ScalingInputError(f"extrapolation points must be positive, got {list(extrapolate)}")
    groups = group_points(df, x, y, group)
    if reference is not None and reference not in groups:
        raise ScalingInputError(f"reference group '{reference}' not found; groups: {', '.join(groups)}")
    for name, (gx, gy) in groups.items():
        _check_group(name, gx, gy, x, y)
    grid = _band_grid(groups, extrapolate)
    opts = {"form": form, "frontier_bins": frontier_bins, "n_boot": n_boot, "extrapolate": list(extrapolate)}
    # One child seed per group (in sorted order), so groups are bootstrapped independently.
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(groups))]
    fits, alphas = {}, {}
    for rng, (name, (gx, gy)) in zip(rngs, groups.items()):
        fits[name], alphas[name] = _fit_group(name, gx, gy, opts, rng, grid)
    return {
        "x": x,
        "y": y,
        "group": group,
        "form": form,
        "frontier_bins": frontier_bins,
        "n_boot": n_boot,
        "seed": seed,
        "extrapolate": [float(v) for v in extrapolate],
        "groups": fits,
        "comparisons": _compare(alphas, fits, reference),
    }


def _ci(value: float, ci: list[float], no_interval: str | None = None) -> str:
    return f"{value:.4g} [no interval]" if no_interval else f"{value:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]"


def poor_fit(g: dict) -> str | None:
    """Why a group's fit does not describe its points (its R^2 on log y below R2_MIN, or undefined), else None."""
    r2 = g.get("r2", R2_MIN)  # absent: a report written before R^2 was recorded
    if r2 is None:
        return "R^2 undefined: every y the same"
    return None if r2 >= R2_MIN else f"R^2 {r2:.3f} on log y, below {R2_MIN}"


def _r2_text(g: dict) -> str:
    return "n/a" if g.get("r2") is None else f"{g['r2']:.3f}"


def _notes(name: str, g: dict) -> list[str]:
    """A group's lines under the table: why it has no interval, a poor fit, a floor at its bound, its predictions."""
    lines = [g["no_interval"]] if g.get("no_interval") else []
    if poor_fit(g):
        lines.append(f"{name}: {poor_fit(g)}: {POOR_FIT}")
    if g.get("c_at_bound"):
        lines.append(f"{name}: c = {g['c']:.3g}: {FLOOR_AT_BOUND[g['c_at_bound']]}")
    for e in g["extrapolation"]:
        at = f"{name}: predicted y at x = {e['x']:.4g}: "
        why = e.get("no_interval")
        lines.append(at + (f"{e['y']:.4g}, interval undetermined ({why})" if why else _ci(e["y"], e["y_ci"])))
    return lines


def format_table(report: dict) -> str:
    """The report as terminal text: one row per group, then per group its notes and predictions, then comparisons."""
    saturating = report["form"] == "saturating"
    header = ["group", "n", "alpha [95% CI]", "beta [95% CI]"] + (["c [95% CI]"] if saturating else []) + ["R^2"]
    rows = []
    for name, g in report["groups"].items():
        none = g.get("no_interval")
        row = [name, str(g["n_points"]), _ci(g["alpha"], g["alpha_ci"], none), _ci(g["beta"], g["beta_ci"], none)]
        rows.append(row + ([_ci(g["c"], g["c_ci"], none)] if saturating else []) + [_r2_text(g)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    frontier = f", frontier of {report['frontier_bins']} bins" if report["frontier_bins"] else ""
    lines = [
        f"{report['y']} vs {report['x']}: {report['form']} fit{frontier}, "
        f"{report['n_boot']} bootstrap resamples (seed {report['seed']}); R^2 on log y over the points fitted"
    ]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    for name, g in report["groups"].items():
        lines += _notes(name, g)
    lines += [c["summary"] for c in report["comparisons"]]
    return "\n".join(lines)


def plot(report: dict, df: pd.DataFrame, path, xlabel=None, ylabel=None, colours: dict | None = None) -> None:
    """Write the log-log PNG of ``report`` (points from ``df``) to ``path`` atomically (eval.scaling_plot)."""
    _write_atomic({Path(path): render_png(build_figure(report, points_of(report, df), xlabel, ylabel, colours))})


def points_of(report: dict, df: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The points a report was fitted on, per group (its warnings about dropped rows already given by fit)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return group_points(df, report["x"], report["y"], report["group"])


def _write_atomic(files: dict[Path, bytes]) -> None:
    """Write every file to a temp file next to it first, then move all into place (os.replace)."""
    temps = {}
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temps[path] = temp
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.chmod(temp, 0o644)  # mkstemp makes the file private; results are for everyone who reads the folder
        for path, temp in temps.items():
            os.replace(temp, path)
    finally:
        for temp in temps.values():
            if os.path.exists(temp):
                os.remove(temp)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m eval.scaling", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="CSV files, JSON result files, run directories (with metrics.jsonl)")
    parser.add_argument("--x", required=True, help="column or expression: params, samples_seen, compute, 'a*b'")
    parser.add_argument("--y", required=True, help="column or expression: loss, error (= 1 - top1), '1-top1'")
    parser.add_argument("--group", help="column whose values split the points into groups, e.g. image_attention")
    parser.add_argument("--form", choices=sorted(FITS), default="power")
    parser.add_argument(
        "--frontier-bins", type=int, help="fit the lowest y in each of K log10-x bins (Cherti et al. 2023)"
    )
    parser.add_argument(
        "--points",
        choices=POINTS,
        help="which evaluations of each run directory are points: all (the learning curve), last, or cooldown "
        "(final evaluations of annealed runs); default: all with --frontier-bins, else last",
    )
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extrapolate", type=float, nargs="+", default=[], metavar="X", help="predict y at these x")
    parser.add_argument("--reference", help="compare every group with this one (default: every pair)")
    parser.add_argument("--out", required=True, type=Path, help="directory for report.json and scaling.png")
    return parser.parse_args(argv)


def fit_and_write(args) -> str:
    """Read, fit, render, then write DIR/report.json and DIR/scaling.png together; returns the table text."""
    points = args.points or ("all" if args.frontier_bins else "last")
    df = load_points(args.inputs, args.y, points)
    report = fit(
        df,
        args.x,
        args.y,
        args.group,
        args.form,
        args.frontier_bins,
        args.n_boot,
        args.seed,
        args.extrapolate,
        args.reference,
    )
    png = render_png(build_figure(report, points_of(report, df)))
    text = json.dumps(report, indent=2, allow_nan=False).encode()
    _write_atomic({args.out / "report.json": text + b"\n", args.out / "scaling.png": png})
    return format_table(report) + f"\nwrote {args.out / 'report.json'} and {args.out / 'scaling.png'}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ScalingWarning)
        try:
            table = fit_and_write(args)
        except ScalingInputError as err:
            table, error = None, err
    for w in caught:
        if issubclass(w.category, ScalingWarning):
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if table is None:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
