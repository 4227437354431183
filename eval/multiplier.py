"""Samples-to-target multipliers: how many times the samples (or compute) of a reference attention another
attention needs to first reach a given zero-shot error, with a bootstrap interval.

A learning curve is the zero-shot error at each evaluation, against samples seen. The samples at which a curve
first reaches a target error are interpolated linearly in log(samples) between the last evaluation above the
target and the first at or below it (a curve already at the target at its first evaluation reaches it there); a
curve that never reaches it has reached it at +inf, and a multiplier over it is censored: it is at least
(its samples seen) / (the reference's samples to the target). A reference already at the target at its first
evaluation gives no multiplier: it may have got there at any point before, so its samples to the target are only an
upper bound (with budgets from cooldown branches, both curves then start at their first budget and k would be just
the ratio of the budgets); a curve already at the target at its first evaluation gives an upper bound on k.

The interval is a parametric bootstrap over the evaluation's noise: each evaluation's error is a proportion of
`n_images` images, so each replicate draws every point of both curves again as Binomial(n_images, error) /
n_images, and recomputes the multiplier. It covers the noise of the zero-shot set, not that of training
(seeds); a replicate in which the reference never reaches the target is left out and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def first_reach(samples, errors, target: float) -> float:
    """Samples seen when the curve first has error <= target (log-linear between evaluations); inf if never."""
    samples, errors = checked_curve(samples, errors)
    return reached_at(samples.tolist(), errors.tolist(), target)


def checked_curve(samples, errors) -> tuple[np.ndarray, np.ndarray]:
    """A learning curve's (samples seen, errors) as float arrays; one line if it is not one."""
    samples, errors = np.asarray(samples, dtype=float), np.asarray(errors, dtype=float)
    if samples.ndim != 1 or samples.shape != errors.shape or samples.size == 0:
        raise ValueError("a learning curve needs one error per evaluation, and at least one evaluation")
    if np.any(np.diff(samples) <= 0) or samples[0] <= 0:
        raise ValueError("a learning curve's samples seen must be positive and increasing")
    return samples, errors


def reached_at(samples, errors, target: float) -> float:
    """first_reach on a curve that checked_curve has checked, as lists of floats (a bootstrap's replicates check
    their curve once; a loop over a list is faster than numpy's calls on a few dozen evaluations)."""
    i = next((i for i, e in enumerate(errors) if e <= target), None)
    if i is None:
        return math.inf
    if i == 0:
        return float(samples[0])
    s0, s1, e0, e1 = samples[i - 1], samples[i], errors[i - 1], errors[i]
    t = (e0 - target) / (e0 - e1)  # e0 > target >= e1
    return float(math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0))))


@dataclass
class Multiplier:
    """k = samples of the curve to the target / samples of the reference; lo, hi: the bootstrap interval.

    censored: the curve never reaches the target, so k is a lower bound (k = its samples seen over the
    reference's samples to the target); reference_missed: replicates left out because the reference never
    reached the target in them; reference_at_start: the reference is at the target at its first evaluation (k is
    not measured: `text` says so and tables leave it out); at_start: the curve is at the target at its first
    evaluation, so k is an upper bound."""

    target: float
    k: float
    lo: float
    hi: float
    censored: bool
    samples: float
    reference_samples: float
    reference_missed: int = 0
    reference_at_start: bool = False
    at_start: bool = False

    def text(self) -> str:
        """'2.31x [1.90, 2.80]', '> 3.00x (never reached)' or 'n/a'."""
        if not math.isfinite(self.reference_samples):
            return "n/a (the reference never reaches it)"
        if self.reference_at_start:
            return "n/a (the reference is there at its first evaluation)"
        if self.censored:
            return f"> {self.k:.2f}x (never reached)"
        if self.at_start:
            return f"< {self.k:.2f}x (there at its first evaluation)"
        hi = f"{self.hi:.2f}" if math.isfinite(self.hi) else "inf"
        return f"{self.k:.2f}x [{self.lo:.2f}, {hi}]"


def multiplier(
    curve: tuple, reference: tuple, target: float, n_images: int, n_boot: int = 1000, seed: int = 0
) -> Multiplier:
    """The samples multiplier of `curve` over `reference` (each (samples, errors)) at a target error.

    For a compute multiplier, scale each curve's samples by its GMACs per sample first."""
    if n_images < 1 or n_boot < 1 or not 0 <= target <= 1:
        raise ValueError("need n_images >= 1, n_boot >= 1 and a target error in [0, 1]")
    mine, ref = first_reach(*curve, target), first_reach(*reference, target)
    censored = math.isinf(mine)
    k = math.nan if math.isinf(ref) else (float(curve[0][-1]) if censored else mine) / ref
    rng = np.random.default_rng(seed)
    draws, missed = [], 0
    for _ in range(n_boot):
        a = first_reach(curve[0], rng.binomial(n_images, np.asarray(curve[1])) / n_images, target)
        b = first_reach(reference[0], rng.binomial(n_images, np.asarray(reference[1])) / n_images, target)
        if math.isinf(b):
            missed += 1
            continue
        draws.append(a / b)
    if draws:
        # no interpolation between replicates: a replicate that never reaches the target is +inf
        lo, hi = (float(np.quantile(draws, q, method=m)) for q, m in ((0.025, "lower"), (0.975, "higher")))
    else:
        lo = hi = math.nan
    return Multiplier(target, k, lo, hi, censored, mine, ref, missed, reference[1][0] <= target, curve[1][0] <= target)
