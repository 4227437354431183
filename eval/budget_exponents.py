"""Claim (c)'s exponents at each cooled-down budget: how the comparison of the sizes moves as they train longer.

Claim (c) reads the exponent of the final validation loss against non-embedding parameters at the end of the
full-budget runs (eval/seeds.py claim_c_seeds); where those runs have not flattened, the sizes are compared at
equal samples, not converged. A study with budgets (configs/study/*.yaml `budgets:`) also holds each run's
validation loss at the cooled-down end of each shorter budget, so the same power law fitted there, per seed, gives
the exponent at every budget the runs share. Shown, not ruled on: it says whether the exponents and their
difference drift as the budget grows over the budgets measured, not where they settle.

    rows(seeds)            # [Row]: per budget and attention, the exponent per seed, over seeds, minus softmax's
    table(seeds)           # the seeds page's Markdown table ([] when the study has no budgets or < 3 sizes)
    falls_table(seeds)     # per size: how fast its validation loss falls per doubling of samples between budgets
    figure(seeds, path)    # exponent and difference against samples seen, with 95% intervals over seeds
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from eval import seeds as seeds_mod
from eval import study_plots
from eval.claims import MARGIN, fall_per_doubling
from eval.scaling_fit import fit_power, r2_log
from eval.scaling_plot import finish, plain_ticks

FIGURE = "budget_exponents.png"
MIN_MODELS = 3  # distinct models (parameter counts) a budget's fit needs: two points fit any power law exactly


@dataclass
class Row:
    """One budget and attention: its exponent per seed and over seeds, its difference from softmax's paired by
    seed (None for softmax), the lowest and highest R^2 on log loss over seeds."""

    samples: int
    attention: str
    exponent: seeds_mod.Spread
    minus_softmax: seeds_mod.Spread | None
    r2: tuple[float, float]


def sizes(seeds: list[seeds_mod.Seed], attention: str) -> list[str]:
    """`attention`'s sizes trained at every seed beside softmax, one per model (a size at several image sizes,
    SIZE@RESpx, has one parameter count and is left out)."""
    found = seeds_mod.sizes_of(seeds, attention)
    return found if len({s.split("@")[0] for s in found}) == len(found) else []


def budget_losses(run: dict) -> dict[int, float]:
    """samples -> validation loss at the cooled-down end of each of the run's budgets (the last: its full budget)."""
    return {int(b[0]): float(b[2]) for b in run.get("budgets", []) if len(b) > 2 and b[2] is not None and b[2] > 0}


def exponents(seed: seeds_mod.Seed, attention: str, names: list[str]) -> dict[int, tuple[float, float]]:
    """samples -> (exponent, R^2 on log loss) of the power law of validation loss against non-embedding parameters
    over the sizes `names`, at each budget all of them share (eval/scaling_fit.py fit_power)."""
    runs = [seeds_mod.run_of(seed, attention, n) for n in names]
    if len(runs) < MIN_MODELS or any(r is None for r in runs):
        return {}
    losses = [budget_losses(r) for r in runs]
    shared = sorted(set.intersection(*(set(loss) for loss in losses)))
    x = np.array([r["params_without_token_embedding"] for r in runs], dtype=float)
    found = {}
    for samples in shared:
        y = np.array([loss[samples] for loss in losses])
        params = fit_power(x, y)
        found[samples] = (params[0], r2_log(params, x, y))
    return found


def rows(seeds: list[seeds_mod.Seed]) -> list[Row]:
    """Per budget shared by every seed (fewest samples first) and attention (softmax first): the exponents over
    seeds; [] when the runs have fewer than two budgets or fewer than MIN_MODELS sizes."""
    attentions = list(dict.fromkeys(r["attention"] for r in seeds[0].runs))
    attentions.sort(key=lambda a: a != "softmax")
    fitted = {a: [exponents(s, a, sizes(seeds, a)) for s in seeds] for a in attentions}
    fitted = {a: per_seed for a, per_seed in fitted.items() if all(per_seed)}
    if "softmax" not in fitted:
        return []
    budgets = sorted(set.intersection(*(set(e) for per_seed in fitted.values() for e in per_seed)))
    if len(budgets) < 2:
        return []
    out = []
    for samples in budgets:
        soft = [e[samples][0] for e in fitted["softmax"]]
        for a, per_seed in fitted.items():
            alphas = [e[samples][0] for e in per_seed]
            diff = None if a == "softmax" else seeds_mod.spread([x - y for x, y in zip(alphas, soft)])
            r2 = [e[samples][1] for e in per_seed]
            out.append(Row(samples, a, seeds_mod.spread(alphas), diff, (min(r2), max(r2))))
    return out


def table(seeds: list[seeds_mod.Seed]) -> list[str]:
    """The Markdown table of rows(seeds); [] when there is nothing to show."""
    found = rows(seeds)
    if not found:
        return []
    names = " / ".join(s.seed for s in seeds)
    lines = [
        f"| samples seen | attention | exponent, seeds {names} | mean [95% CI] | minus softmax's, paired by seed | "
        "R^2 on log loss, lowest to highest |",
        "|---|---|---|---|---|---|",
    ]
    for r in found:
        diff = r.minus_softmax.text("{:+.3f}") if r.minus_softmax else ""
        lines.append(
            f"| {r.samples:,} | {r.attention} | {seeds_mod.per_seed(r.exponent.values, '{:+.3f}')} | "
            f"{r.exponent.text('{:+.3f}')} | {diff} | {r.r2[0]:.3f} to {r.r2[1]:.3f} |"
        )
    return lines


def falls(run: dict) -> list[tuple[int, int, float]]:
    """[(samples, next samples, fall)]: between consecutive cooled-down budget ends, how much the validation loss
    falls per doubling of samples (eval/claims.py fall_per_doubling); a run with a floor in reach falls less
    and less."""
    ends = sorted(budget_losses(run).items())
    return [(n0, n1, fall_per_doubling(n0, l0, n1, l1)) for (n0, l0), (n1, l1) in itertools.pairwise(ends)]


def falls_table(seeds: list[seeds_mod.Seed]) -> list[str]:
    """Per attention and size of rows(seeds): the validation loss's fall per doubling of samples between each pair
    of consecutive budgets, mean over seeds with its 95% t interval (claim (c)'s flatness, FLAT_LOSS, reads the
    last); one table per set of budgets (attentions trained to budgets of their own have a table each); [] when no
    size has the same budgets at every seed."""
    attentions = list(dict.fromkeys(r["attention"] for r in seeds[0].runs))
    found: dict[tuple, dict] = {}  # budget pairs -> {(attention, size): a spread per pair}
    for a in attentions:
        for size in sizes(seeds, a):
            per_seed = [falls(seeds_mod.run_of(s, a, size)) for s in seeds]
            pairs = tuple((n0, n1) for n0, n1, _ in per_seed[0])
            if pairs and all(tuple((n0, n1) for n0, n1, _ in f) == pairs for f in per_seed):
                spreads = [seeds_mod.spread([f[i][2] for f in per_seed]) for i in range(len(pairs))]
                found.setdefault(pairs, {})[(a, size)] = spreads
    lines = []
    for pairs, group in found.items():
        head = [f"{n0:,} to {n1:,} samples" for n0, n1 in pairs]
        lines += [*([""] if lines else []), "| attention | size | " + " | ".join(head) + " |"]
        lines.append("|---|---|" + "---|" * len(head))
        for (a, size), spreads in group.items():
            lines.append(f"| {a} | {size} | " + " | ".join(x.text("{:.0%}") for x in spreads) + " |")
    return lines


def figure(seeds: list[seeds_mod.Seed], path: Path) -> bool:
    """Left: each attention's exponent against the samples of the budget it was read at, mean over seeds with its
    95% t interval; right: each linear attention's difference from softmax's, with the +-MARGIN band of claim (c).
    False (nothing drawn) when there is nothing to show."""
    found = rows(seeds)
    if not found:
        return False
    attentions = list(dict.fromkeys(r.attention for r in found))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.2), dpi=110)
    right.axhspan(-MARGIN, MARGIN, color="0.85", lw=0, label=f"+-{MARGIN} (claim (c)'s margin)")
    right.axhline(0, color="0.4", lw=0.8)
    for i, a in enumerate(attentions):
        mine, colour = [r for r in found if r.attention == a], study_plots.colour(attentions, a)
        x = np.array([r.samples for r in mine], dtype=float) * 1.03 ** (i - (len(attentions) - 1) / 2)
        for ax, spreads in ((left, [r.exponent for r in mine]), (right, [r.minus_softmax for r in mine])):
            if spreads[0] is None:
                continue
            mean = np.array([s.mean for s in spreads])
            bars = np.array([[s.mean - s.lo, s.hi - s.mean] for s in spreads]).T
            bars = None if not np.isfinite(bars).all() else bars
            ax.errorbar(x, mean, yerr=bars, fmt="o-", color=colour, ms=4, capsize=2, label=a)
    left.set(ylabel="exponent of validation loss against parameters")
    right.set(ylabel="exponent minus softmax's, paired by seed")
    for ax in (left, right):
        ax.set(xscale="log", xlabel="samples seen (each budget's cooled-down end, log)")
    count = len(seeds)
    left.set_title(f"{count} seed{'s' if count > 1 else ''}: mean and 95% t interval per budget", fontsize=8)
    right.set_title("each linear attention against softmax (not ruled on)", fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    plain_ticks(left)
    left.legend(fontsize=7)
    finish(fig, right, path)
    return True
