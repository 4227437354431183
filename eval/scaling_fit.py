"""Scaling-law fits on one group of points: power law, saturating power law, compute frontier, bootstrap.

Every fit returns ``(alpha, beta, c)`` for y = beta * x^alpha + c (c = 0 for the pure power law), so one
``predict`` serves all forms. Inputs are 1-D float arrays x [N], y [N], all positive (checked by the caller).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from eval.scaling_io import ScalingInputError

MIN_DISTINCT_X = {"power": 2, "saturating": 3}
# A floor c within this fraction of a bound of fit_saturating (0 or min y) sits at that bound. scipy's trf starts a
# parameter on a bound 1e-10 inside it, so a floor that never left 0 reads 1e-10: TRF_START says so.
FLOOR_RTOL = 1e-6
TRF_START = 1.0001e-10
# A prediction interval narrower than this fraction of the prediction has zero width.
ZERO_WIDTH_RTOL = 1e-9
# The bootstrap redraws degenerate resamples (too few distinct x); past this many draws per wanted
# resample the group is too small to bootstrap at all.
MAX_DRAWS_PER_RESAMPLE = 20
# A fit whose R^2 on log y (over the points it was fitted on) is below this does not describe its points: a claim
# read from its exponent is undetermined.
R2_MIN = 0.95


class TooFewPoints(ScalingInputError):
    """A group (or a bootstrap resample of it) has fewer distinct x values than the form has parameters."""


def fit_power(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """y = beta * x^alpha by least squares on (log x, log y): log y = log beta + alpha log x."""
    alpha, log_beta = np.polyfit(np.log(x), np.log(y), 1)
    return float(alpha), float(np.exp(log_beta)), 0.0


def _log_saturating(log_x_centered, log_beta_c, alpha, c):
    # log(beta_c * exp(alpha * lx) + c) computed without overflow; log(0) = -inf is exact for c = 0.
    with np.errstate(divide="ignore"):
        return np.logaddexp(log_beta_c + alpha * log_x_centered, np.log(c))


def fit_saturating(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """y = beta * x^alpha + c with 0 <= c <= min(y), by scipy curve_fit on log y.

    Fitting log y weighs relative errors equally, like the log-log power fit. log x is centred for
    conditioning (x spans 1e6-1e12 for compute). The start is the best of power-law fits to y - c0 over
    a few c0 in [0, 0.9 min y]. Raises RuntimeError when curve_fit does not converge.
    """
    lx, ly = np.log(x), np.log(y)
    center = lx.mean()
    starts = []
    for frac in (0.0, 0.25, 0.5, 0.75, 0.9):
        c0 = frac * y.min()
        alpha0, log_beta0 = np.polyfit(lx - center, np.log(y - c0), 1)
        sse = np.sum((_log_saturating(lx - center, log_beta0, alpha0, c0) - ly) ** 2)
        starts.append((sse, (log_beta0, alpha0, c0)))
    p0 = min(starts, key=lambda s: s[0])[1]
    bounds = ([-np.inf, -np.inf, 0.0], [np.inf, np.inf, float(y.min())])
    with warnings.catch_warnings():
        # An exact fit (3 points) has no covariance estimate; only the parameters are used.
        warnings.simplefilter("ignore", OptimizeWarning)
        (log_beta_c, alpha, c), _ = curve_fit(_log_saturating, lx - center, ly, p0=p0, bounds=bounds, maxfev=5000)
    return float(alpha), float(np.exp(log_beta_c - alpha * center)), float(c)


FITS = {"power": fit_power, "saturating": fit_saturating}


def predict(params: np.ndarray, x: np.ndarray) -> np.ndarray:
    """params [..., 3] = (alpha, beta, c), x [M] -> y [..., M]."""
    params = np.asarray(params, dtype=float)
    alpha, beta, c = (params[..., i, None] for i in range(3))
    return beta * np.asarray(x, dtype=float) ** alpha + c


def log_residuals(params, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ln y - ln fit(x) [N] of params (3,) = (alpha, beta, c) on the points x [N], y [N]."""
    return np.log(y) - np.log(predict(params, x))


def r2_log(params, x: np.ndarray, y: np.ndarray) -> float:
    """R^2 of the fit on log y over the points x [N], y [N] it was fitted on: 1 - SS(ln y - ln fit) / SS(ln y -
    mean ln y); nan when every y is the same (nothing to explain)."""
    total = float(np.sum((np.log(y) - np.log(y).mean()) ** 2))
    residual = float(np.sum(log_residuals(params, x, y) ** 2))
    return 1.0 - residual / total if total > 0 else float("nan")


def frontier(x: np.ndarray, y: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Compute frontier of Cherti et al. 2023 ("Reproducible scaling laws for contrastive
    language-image learning"): split log10 x into ``bins`` equal-width bins between its min and max,
    keep the point of lowest y in each non-empty bin; of those, only the ones below every kept point of less x (the
    frontier falls with compute: a bin whose best point lies above a cheaper bin's, e.g. a small model's longest
    budget past a bigger model's short one, is not on it). x [N], y [N] -> x_f [K'], y_f [K'] (K' <= bins)."""
    lx = np.log10(x)
    width = (lx.max() - lx.min()) / bins
    if width == 0:
        return x[:1], y[:1]
    # The maximum sits on the last edge; it belongs to the last bin.
    index = np.minimum(((lx - lx.min()) / width).astype(int), bins - 1)
    keep = [np.flatnonzero(index == b)[np.argmin(y[index == b])] for b in np.unique(index)]  # in increasing x
    falling = [i for j, i in enumerate(keep) if all(y[i] < y[k] for k in keep[:j])]
    return x[falling], y[falling]


def fit_procedure(x, y, form: str, frontier_bins: int | None, name: str = "all"):
    """The whole fit of one group: optional frontier, then the form. Returns (params (3,), x_used, y_used)."""
    if frontier_bins:
        x, y = frontier(x, y, frontier_bins)
    need = MIN_DISTINCT_X[form]
    distinct = len(np.unique(x))
    if distinct < need:
        where = (
            f"the frontier ({frontier_bins} bins) of group '{name}' keeps" if frontier_bins else f"group '{name}' has"
        )
        fix = (
            "use more --frontier-bins or add runs"
            if frontier_bins
            else "add runs" + (" or use --form power" if form == "saturating" else "")
        )
        raise TooFewPoints(f"{where} {distinct} distinct x value(s); the {form} form needs at least {need} ({fix})")
    return np.array(FITS[form](x, y)), x, y


def bootstrap(x, y, form: str, frontier_bins: int | None, n_boot: int, rng: np.random.Generator, name: str = "all"):
    """Refit ``n_boot`` resamples (points drawn with replacement) -> params [n_boot, 3], redraws.

    Resamples with too few distinct x (or where curve_fit fails) are redrawn and counted in ``redraws``.
    """
    draws, redraws = [], 0
    while len(draws) < n_boot:
        if redraws > MAX_DRAWS_PER_RESAMPLE * n_boot:
            raise TooFewPoints(
                f"group '{name}': only {len(draws)} of {len(draws) + redraws} bootstrap resamples were fittable; "
                "add runs"
            )
        index = rng.integers(0, len(x), len(x))
        try:
            draws.append(fit_procedure(x[index], y[index], form, frontier_bins, name)[0])
        except (TooFewPoints, RuntimeError, np.linalg.LinAlgError):
            redraws += 1
    return np.array(draws).reshape(n_boot, 3), redraws


def too_few_x(x_used: np.ndarray, form: str, name: str, frontier_bins: int | None = None) -> str | None:
    """Why the points a group was fitted on cannot give an interval, or None when they can.

    With as many distinct x as the form has parameters the fit passes through the (mean) point at every x: no
    residual is left, so the bootstrap spread measures only the scatter of repeated x and says nothing of how
    well the form fits. Returns e.g. "group 'a' has only 2 distinct x for a 2-parameter power form".
    """
    need, distinct = MIN_DISTINCT_X[form], len(np.unique(x_used))
    if distinct > need:
        return None
    where = f"the frontier ({frontier_bins} bins) of group '{name}' keeps" if frontier_bins else f"group '{name}' has"
    return f"{where} only {distinct} distinct x for a {need}-parameter {form} form"


def floor_at_bound(c: float, y_min: float) -> str | None:
    """ "lower" when fit_saturating's floor c sits at 0, "upper" when at min y (its bounds), else None."""
    # The trf start inside 0 counts as 0 unless y itself is that small (then the relative test decides).
    lower = min(max(FLOOR_RTOL * y_min, TRF_START), 0.5 * y_min)
    if c <= lower:
        return "lower"
    return "upper" if c >= (1 - FLOOR_RTOL) * y_min else None


def zero_width(y: float, ci: list[float]) -> bool:
    """Whether the interval ci = [lo, hi] of a prediction y has no width (every bootstrap fit agrees)."""
    return ci[1] - ci[0] <= ZERO_WIDTH_RTOL * abs(y)


def interval(draws: np.ndarray) -> list[float]:
    """95% percentile interval of bootstrap draws [n_boot] -> [lo, hi]."""
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return [float(lo), float(hi)]
