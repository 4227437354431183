"""The study over several seeds: intervals over seeds, not only over the zero-shot noise of one run.

    .venv/bin/python -m scripts.demo --seed 1 --out runs/demo-seed1      (one folder per seed; the main job is seed 0)
    .venv/bin/python -m scripts.study_seeds runs/demo runs/demo-seed1 runs/demo-seed2 --out docs/study_seeds.md

One study's bootstrap intervals (eval/multiplier.py, eval/scaling_fit.py) cover the noise of its zero-shot set and
of the fit, not that of training: another seed draws another data set, other initial weights and another batch
order, and a samples multiplier can move between seeds by more than one study's interval. This module
reads the finished study folders (runs.json, fits.json, lr_sweep.json, report.md) and gives each number as its
value per seed, its mean over seeds and a 95% Student-t interval over seeds (multipliers on a log scale, so the
mean is a geometric mean). With n seeds the interval has n - 1 degrees of freedom: three seeds give a wide one,
which is the honest width. The paper's claims are judged again on these intervals (RULES).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from eval import pages
from eval.claims import (
    FLAT_LOSS,
    FRONTIER_FIT,
    GAP,
    MARGIN,
    MIN_SIZES,
    MIN_SPAN,
    MUCH_SLOWER,
    NODENOM,
    NORMALISED,
    PARAMS_FIT,
    RULE_D,
    claim_a,
    convergence,
    coverage,
    equivalence,
    falls_text,
    pair_falls,
    step_ratio,
    step_ratios,
    time_verdict,
)
from eval.multiplier import checked_curve, first_reach, reached_at
from eval.scaling_fit import R2_MIN

TRAIN_FIT = "train_loss_params"  # eval/study_analysis.py FITS: training loss against parameters, as the paper plots

RULES = (
    "(a) the verdict every seed gives by the single-study rule (eval/claims.py), undetermined when the seeds "
    f"disagree; the top-1 gap's interval is shown beside it (comparable: within {100 * GAP:.0f} points). "
    f"(b) supported when the lower bound of the seed interval of linear_affine's samples multiplier (at the largest "
    f"size, the hardest target softmax reaches at every seed) is >= {MUCH_SLOWER:g}x, not supported when its upper "
    f"bound is below {MUCH_SLOWER:g}x. (c) the exponents of the validation loss against non-embedding parameters (each "
    f"seed's fit at the end of its full-budget runs): supported when the whole seed interval of the difference "
    f"(Eq. 7 - softmax) lies within +-{MARGIN}, not supported when it lies wholly outside +-{MARGIN}, else "
    f"undetermined; undetermined too with fewer than {MIN_SIZES} sizes or a span under {MIN_SPAN:g}x in parameters "
    f"at some seed (3 sizes: indicative only), a fit with R^2 on log loss below {R2_MIN} at some seed, or a run at "
    f"some seed whose validation loss still falls >= {100 * FLAT_LOSS:.0f}% per doubling of samples at its end (not "
    "flat: the sizes compared at equal samples, not converged). "
    "(d) by the single-study rule, on the seed interval of the samples multiplier and the mean over seeds of the "
    "measured step-time ratio: " + RULE_D.removeprefix("(d) ") + " A seed whose run never reaches the target counts "
    "at its lower bound (its samples seen over softmax's samples to the target) and makes the upper bound infinite; "
    "one already "
    "at the target at its first evaluation counts at its upper bound and makes the lower bound 0."
)


class SeedError(ValueError):
    """A folder that is not a finished study; one line naming it and the fix."""


@dataclass
class Seed:
    """One finished study folder."""

    seed: str
    folder: Path
    runs: list[dict]
    fits: dict
    sweep: list[dict]
    linearise: dict | None = None  # its linearise/linearise.json (python -m scripts.linearise), where it has one


@dataclass
class Spread:
    """Values over seeds: mean and 95% t interval (log scale when `log`). marks: per value, '>' for a lower bound
    (never reached), '<' for an upper bound (there at the first evaluation), '' for a measured value."""

    values: list[float]
    mean: float
    lo: float
    hi: float
    marks: list[str]

    @property
    def bound(self) -> str:
        """'>' when a value is a lower bound (the mean then is one too), '<' an upper bound, '' when all are measured
        (text() says n/a with bounds on both sides)."""
        return ">" if ">" in self.marks else "<" if "<" in self.marks else ""

    def text(self, fmt: str = "{:.2f}", unit: str = "") -> str:
        if not self.values:
            return "n/a"
        if ">" in self.marks and "<" in self.marks:
            return "n/a (bounds on both sides)"
        bound = self.bound
        hi = "inf" if not math.isfinite(self.hi) else fmt.format(self.hi) + unit
        interval = f" [{fmt.format(self.lo)}{unit}, {hi}]" if math.isfinite(self.lo) else ""
        return f"{bound}{fmt.format(self.mean)}{unit}{interval}"


def spread(
    values: list[float], log: bool = False, marks: list[str] | None = None, within: tuple[float, float] | None = None
) -> Spread:
    """The mean of `values` and its 95% Student-t interval over seeds (no interval from one seed). A lower bound
    among them ('>') makes the upper end infinite, an upper bound ('<') the lower end 0. `within`: the range the
    quantity can take (a top-1 accuracy's [0, 1]), to which the interval is cut (with 2-3 seeds a t interval of an
    accuracy can reach past 100%)."""
    marks = marks or [""] * len(values)
    x = np.log(values) if log else np.asarray(values, dtype=float)
    back = np.exp if log else (lambda v: v)
    if len(x) == 0:
        return Spread([], math.nan, math.nan, math.nan, marks)
    mean = float(np.mean(x))
    if len(x) < 2:
        return Spread(list(values), float(back(mean)), math.nan, math.nan, marks)
    half = float(stats.t.ppf(0.975, len(x) - 1) * np.std(x, ddof=1) / math.sqrt(len(x)))
    lo = 0.0 if "<" in marks else float(back(mean - half))
    hi = math.inf if ">" in marks else float(back(mean + half))
    if within:
        lo, hi = max(lo, within[0]), min(hi, within[1])
    return Spread(list(values), float(back(mean)), lo, hi, marks)


def load_seed(folder: Path) -> Seed:
    folder = Path(folder)
    missing = [n for n in ("runs.json", "fits.json") if not (folder / n).is_file()]
    if missing:
        raise SeedError(f"{folder} has no {missing[0]}: give folders of finished `python -m scripts.demo` runs")
    report = folder / "report.md"
    found = re.search(r"--seed (\d+)", report.read_text()) if report.is_file() else None
    sweep = json.loads((folder / "lr_sweep.json").read_text()) if (folder / "lr_sweep.json").is_file() else []
    arm = folder / "linearise" / "linearise.json"
    return Seed(
        found.group(1) if found else folder.name,
        folder,
        json.loads((folder / "runs.json").read_text()),
        json.loads((folder / "fits.json").read_text()),
        sweep,
        json.loads(arm.read_text()) if arm.is_file() else None,
    )


def students_of(saved: dict) -> dict[str, dict]:
    """The students' results in a linearise.json (train/linearise.py): its values that are results."""
    return {k: v for k, v in saved.items() if isinstance(v, dict) and "linearised_steps" in v}


def linearise_section(seeds: list[Seed]) -> list[str]:
    """Per student of the linearisation arm (train/linearise.py), over the seeds that ran it: the compute to 95% of
    the teacher's top-1 over training from scratch, the teacher's training counted and not; [] without such seeds."""
    arms = [s for s in seeds if s.linearise]
    if not arms:
        return []
    names = " / ".join(s.seed for s in arms)
    rows = [
        f"| student | compute ratio, teacher counted, seeds {names} | geometric mean [95% CI] | without the teacher's "
        "training | steps to target, linearised / from scratch |",
        "|---|---|---|---|---|",
    ]
    students = list(students_of(arms[0].linearise))
    for student in students:
        found = [s.linearise.get(student, {}) for s in arms]
        both = [r for r in found if r.get("linearised_gmacs") and r.get("scratch_gmacs")]
        cells = [outcome(r) for r in found]
        if not both:
            rows.append(f"| {student} | {' / '.join(cells)} | | | |")
            continue
        total = spread([r["linearised_gmacs"] / r["scratch_gmacs"] for r in both], log=True)
        alone = spread([r["linearised_gmacs_without_teacher"] / r["scratch_gmacs"] for r in both], log=True)
        steps = spread([r["linearised_steps"] / r["scratch_steps"] for r in both], log=True)
        where = "the seed" if len(both) == 1 else f"the {len(both)} seeds"
        over = "" if len(both) == len(found) else f" ({where} where both reached it)"
        rows.append(
            f"| {student} | {' / '.join(cells)} | {total.text(unit='x')}{over} | {alone.text(unit='x')} | "
            f"{steps.text(unit='x')} |"
        )
    return [
        "## Linearisation, counted fairly\n",
        f"The linearisation arm (`python -m scripts.linearise RUN`, train/linearise.py) at {len(arms)} seeds: the "
        "compute (GMACs, a training step 3x its forward pass) to 95% of the teacher's zero-shot top-1, over training "
        "that attention from scratch; 'teacher counted' adds the teacher's whole training run and its forward pass on "
        "every student batch.\n",
        "\n".join(rows) + "\n",
    ]


def outcome(arm: dict) -> str:
    """One seed's cell of the linearisation table: its compute ratio, or which side never reached the target."""
    lin, own = arm.get("linearised_gmacs"), arm.get("scratch_gmacs")
    if lin and own:
        return f"{lin / own:.2f}x"
    if lin:
        return f"linearised only ({arm['linearised_steps']:,} steps)"
    return f"from scratch only ({arm['scratch_steps']:,} steps)" if own else "neither reached it"


def run_of(seed: Seed, attention: str, size: str) -> dict | None:
    return next((r for r in seed.runs if r["attention"] == attention and r["size"] == size), None)


def sizes_of(seeds: list[Seed], attention: str) -> list[str]:
    """The sizes `attention` and softmax were trained at in every seed, smallest first."""
    ordered = sorted(seeds[0].runs, key=lambda r: r["params_without_token_embedding"])
    sizes = dict.fromkeys(r["size"] for r in ordered if r["attention"] == attention)
    return [s for s in sizes if all(run_of(x, attention, s) and run_of(x, "softmax", s) for x in seeds)]


def reach(run: dict, target: float) -> float:
    return first_reach([s for s, _ in run["curve"]], [1 - t for _, t in run["curve"]], target)


def multiplier_spread(
    seeds: list[Seed], attention: str, size: str, target: float, reference: str = "softmax"
) -> Spread | None:
    """The samples multiplier over `reference` at `size` to `target` per seed; None when, at some seed, the
    reference never reaches the target or is there at its first evaluation (no multiplier: eval/multiplier.py)."""
    values, marks = [], []
    for seed in seeds:
        run, ref = run_of(seed, attention, size), run_of(seed, reference, size)
        mine, theirs = reach(run, target), reach(ref, target)
        if not math.isfinite(theirs) or 1 - ref["curve"][0][1] <= target:
            return None
        marks.append(">" if not math.isfinite(mine) else "<" if 1 - run["curve"][0][1] <= target else "")
        values.append((mine if math.isfinite(mine) else run["samples_seen"]) / theirs)
    return spread(values, log=True, marks=marks)


def exponent_spread(seeds: list[Seed], attention: str, fit: str = FRONTIER_FIT) -> Spread:
    groups = [s.fits.get(fit, {}).get("groups", {}) for s in seeds]
    return spread([g[attention]["alpha"] for g in groups if attention in g])


def diff_spread(seeds: list[Seed], attention: str, fit: str = FRONTIER_FIT) -> Spread:
    values = []
    for s in seeds:
        c = next((c for c in s.fits.get(fit, {}).get("comparisons", []) if c["a"] == attention), None)
        if c is not None:
            values.append(c["alpha_diff"])
    return spread(values)


def hardest_shared_target(
    seeds: list[Seed], size: str, targets: list[float], reference: str = "softmax"
) -> float | None:
    """The lowest target error `reference` at `size` reaches at every seed (after its first evaluation)."""
    ok = [t for t in targets if multiplier_spread(seeds, reference, size, t, reference) is not None]
    return min(ok, default=None)


def claim_rows(seeds: list[Seed], targets: list[float], n_images: int | None = None) -> list[tuple[str, str, str]]:
    """[(claim, verdict, numbers)] judged on the intervals over seeds (RULES); n_images: the zero-shot set's size."""
    rows = []
    sizes = sizes_of(seeds, NODENOM)
    if not sizes:
        return [("all", "undetermined", "no Eq. 7 and softmax runs of the same size at every seed")]
    size = sizes[-1]
    verdicts = [claim_a(run_of(s, NODENOM, size), run_of(s, "softmax", size), n_images)[0] for s in seeds]
    points = [100 * (run_of(s, "softmax", size)["top1"] - run_of(s, NODENOM, size)["top1"]) for s in seeds]
    gap = spread(points, within=(-100, 100))  # percentage points
    agreed = verdicts[0] if len(set(verdicts)) == 1 else "undetermined"
    numbers = f"{size}: seeds say {', '.join(verdicts)}; softmax - Eq. 7 top-1 {gap.text('{:+.1f}')} points"
    rows.append(("(a) Eq. 7 converges to a loss and accuracy comparable to softmax", agreed, numbers))
    rows.append(("(b) the normalised form converges much more slowly or fails", *claim_b_seeds(seeds, targets)))
    rows.append(("(c) the scaling exponents are similar", *claim_c_seeds(seeds)))
    rows.append(("(d) LA needs more epochs but less total time", *claim_d_seeds(seeds, size, targets)))
    return rows


def claim_c_seeds(seeds: list[Seed]) -> tuple[str, str]:
    """Claim (c) on the interval over seeds of the difference of the validation-loss exponents against parameters
    (PARAMS_FIT), by the equivalence rule of eval/claims.py; each seed's fit must cover the sizes and fit its
    points."""
    fitted = [s for s in seeds if {"softmax", NODENOM} <= set(s.fits.get(PARAMS_FIT, {}).get("groups", {}))]
    if not fitted:
        return "undetermined", "no seed fitted the validation loss against parameters for softmax and Eq. 7"
    diff = diff_spread(fitted, NODENOM, PARAMS_FIT)
    covers = {s.seed: coverage({a: s.fits[PARAMS_FIT]["groups"][a] for a in ("softmax", NODENOM)}) for s in fitted}
    sizes, span = min(c[0] for c in covers.values()), min(c[1] for c in covers.values())
    reasons = [f"seed {seed}: {why}" for seed, (_, _, whys) in covers.items() for why in whys]
    if len(fitted) < len(seeds):
        reasons.append(f"{len(seeds) - len(fitted)} seed(s) without the fit")
    flat = {s.seed: convergence(s.runs) for s in fitted}
    reasons += [f"seed {seed}: {why}" for seed, (_, why) in flat.items() if why]
    falls = pair_falls([r for s in fitted for r in s.runs])
    if not math.isfinite(diff.lo):
        reasons.append(f"{len(fitted)} seed(s): no interval over seeds")
    numbers = (
        f"validation loss against non-embedding parameters, {sizes} sizes spanning {span:.1f}x: Eq. 7 - softmax "
        f"exponent {diff.text('{:+.3f}')} over {len(fitted)} seeds (margin +-{MARGIN}); softmax "
        f"{exponent_spread(fitted, 'softmax', PARAMS_FIT).text('{:+.3f}')}, Eq. 7 "
        f"{exponent_spread(fitted, NODENOM, PARAMS_FIT).text('{:+.3f}')} (the paper: about -0.36 vs -0.33); "
        f"{falls_text(falls)}; compute-frontier difference of zero-shot error (not ruled on) "
        f"{diff_spread(seeds, NODENOM).text('{:+.3f}')}"
    )
    if reasons:
        return "undetermined", numbers + "; undetermined: " + "; ".join(dict.fromkeys(reasons))
    return equivalence(diff.lo, diff.hi), numbers


def claim_b_seeds(seeds: list[Seed], targets: list[float]) -> tuple[str, str]:
    sizes = sizes_of(seeds, NORMALISED)
    target = hardest_shared_target(seeds, sizes[-1], targets) if sizes else None
    if target is None:
        return "undetermined", "no target that softmax reaches at every seed"
    k = multiplier_spread(seeds, NORMALISED, sizes[-1], target)
    numbers = f"{sizes[-1]}, target {100 * target:.0f}% error: {k.text(unit='x')} softmax's samples"
    if math.isfinite(k.lo) and k.lo >= MUCH_SLOWER:
        return "supported", numbers
    return ("not supported" if k.hi < MUCH_SLOWER else "undetermined"), numbers


def claim_d_seeds(seeds: list[Seed], size: str, targets: list[float]) -> tuple[str, str]:
    """Claim (d) by eval/claims.py's rule on the interval over seeds of the samples multiplier and the mean over
    seeds of the step-time ratio of the same runs, at their image tokens."""
    target = hardest_shared_target(seeds, size, targets)
    if target is None:
        return "undetermined", "no target that softmax reaches at every seed"
    k = multiplier_spread(seeds, NODENOM, size, target)
    ratio = float(np.mean([step_ratio(run_of(s, NODENOM, size), run_of(s, "softmax", size)) for s in seeds]))
    projected = {n: r for n, r in step_ratios(NODENOM, math.nan).items() if n != 17}
    tokens = run_of(seeds[0], NODENOM, size).get("image_tokens")
    verdict, numbers = time_verdict(target, k.text(unit="x"), k.lo, k.hi, k.mean, tokens, ratio, projected, k.bound)
    return verdict, f"{size}, {numbers}"


def per_seed(values: list[float], fmt: str, marks: list[str] | None = None) -> str:
    return " / ".join(m + fmt.format(v) for v, m in zip(values, marks or [""] * len(values)))


def hierarchical(
    seeds: list[Seed], draw, log: bool = False, n_boot: int = 2000, seed: int = 0, batched: bool = False
) -> tuple[float, float]:
    """95% percentile interval of the mean over seeds when both the seeds and, within each seed drawn, the zero-shot
    images are resampled (a two-level bootstrap: Davison and Hinkley 1997, sec. 3.8). draw(seed, rng) gives one
    replicate of that seed's value with its images resampled (`batched`: draw(the seeds drawn, rng) gives theirs, in
    one pass over rng); `log`: the mean of logarithms (multipliers)."""
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        drawn = [seeds[i] for i in rng.integers(len(seeds), size=len(seeds))]
        values = np.array(draw(drawn, rng) if batched else [draw(s, rng) for s in drawn], dtype=float)
        with np.errstate(divide="ignore"):
            reps.append(float(np.exp(np.mean(np.log(values)))) if log else float(np.mean(values)))
    reps = [r for r in reps if not math.isnan(r)]  # a replicate with no value at some seed drawn (draw gave NaN)
    if not reps:
        return math.nan, math.nan
    lo, hi = (float(np.quantile(reps, q, method=m)) for q, m in ((0.025, "lower"), (0.975, "higher")))
    return lo, hi


def rates(run: dict) -> tuple[list[float], np.ndarray]:
    """A run's curve as (samples seen, zero-shot error), checked: a bootstrap replicate draws each evaluation's error
    again from its n_images images, Binomial(n_images, error) / n_images."""
    samples, top1 = zip(*run["curve"])
    samples, error = checked_curve(samples, 1 - np.asarray(top1))
    return samples.tolist(), error


def boot_multiplier(
    seeds: list[Seed], attention: str, size: str, target: float, n_images: int, reference: str = "softmax"
) -> tuple[float, float]:
    """The samples multiplier's two-level bootstrap interval (never reaching the target: its samples seen, a bound;
    replicates in which the reference misses the target are left out, as eval/multiplier.py does). Each replicate
    draws the errors of every curve of the seeds drawn in one call (the draws of one call per curve, in order)."""
    pairs = {}  # per seed, once: its run's and the reference's (samples, error rate) and the run's samples seen

    def pair(seed: Seed) -> tuple:
        if id(seed) not in pairs:
            run, ref = run_of(seed, attention, size), run_of(seed, reference, size)
            pairs[id(seed)] = (*rates(run), *rates(ref), run["samples_seen"])
        return pairs[id(seed)]

    def draw(drawn: list[Seed], rng) -> list[float]:
        curves = [pair(s) for s in drawn]
        errors = (rng.binomial(n_images, np.concatenate([c[i] for c in curves for i in (1, 3)])) / n_images).tolist()
        values, at = [], 0
        for samples, _, ref_samples, _, seen in curves:
            mine = reached_at(samples, errors[at : at + len(samples)], target)
            at += len(samples)
            theirs = reached_at(ref_samples, errors[at : at + len(ref_samples)], target)
            at += len(ref_samples)
            # the reference misses the target in this replicate: no multiplier (left out)
            values.append((mine if math.isfinite(mine) else seen) / theirs if math.isfinite(theirs) else math.nan)
        return values

    return hierarchical(seeds, draw, log=True, batched=True)


def boot_top1(seeds: list[Seed], attention: str, size: str, n_images: int) -> tuple[float, float]:
    """Top-1 at `size`: the two-level bootstrap interval of its mean over seeds."""
    return hierarchical(seeds, lambda s, rng: rng.binomial(n_images, run_of(s, attention, size)["top1"]) / n_images)


def tables(seeds: list[Seed], targets: list[float], n_images: int | None = None) -> list[str]:
    """The Markdown tables: best top-1, exponents (against parameters, then compute), multipliers, learning
    rates chosen."""
    names = " / ".join(s.seed for s in seeds)
    attentions = list(dict.fromkeys(r["attention"] for r in seeds[0].runs))
    largest = sizes_of(seeds, "softmax")[-1] if sizes_of(seeds, "softmax") else None
    both = f" | at {largest}: bootstrap over seeds and images" if n_images and largest else ""
    best = [f"| attention | best zero-shot top-1, seeds {names} | mean [95% CI over seeds]{both} |"]
    best.append("|---|---|---|" + ("---|" if both else ""))
    for a in attentions:
        top = spread([max(r["top1"] for r in s.runs if r["attention"] == a) for s in seeds], within=(0, 1))
        cell = ""
        if both and all(run_of(s, a, largest) for s in seeds):
            mean = np.mean([run_of(s, a, largest)["top1"] for s in seeds])
            lo, hi = boot_top1(seeds, a, largest, n_images)
            cell = f" | {mean:.1%} [{lo:.1%}, {hi:.1%}]"
        best.append(f"| {a} | {per_seed(top.values, '{:.1%}')} | {top.text('{:.1%}')}{cell} |")
    alpha = exponent_table(seeds, attentions, PARAMS_FIT, "validation-loss exponent against parameters")
    frontier = exponent_table(seeds, attentions, FRONTIER_FIT, "compute-frontier exponent")
    train = exponent_table(seeds, attentions, TRAIN_FIT, "training-loss exponent against parameters")
    both = " | bootstrap over seeds and images" if n_images else ""
    mult = [f"| attention | size | target error | samples multiplier, seeds {names} | geometric mean [95% CI]{both} |"]
    mult.append("|---|---|---|---|---|" + ("---|" if both else ""))
    for a in attentions[1:] if attentions[0] == "softmax" else attentions:
        for size in sizes_of(seeds, a):
            for t in targets:
                k = multiplier_spread(seeds, a, size, t)
                if k is not None:
                    boot = boot_multiplier(seeds, a, size, t, n_images) if n_images else None
                    cell = f" | [{boot[0]:.2f}x, {boot[1]:.2f}x]".replace("infx", "inf") if boot else ""
                    mult.append(
                        f"| {a} | {size} | {100 * t:.0f}% | {per_seed(k.values, '{:.2f}x', k.marks)} | "
                        f"{k.text(unit='x')}{cell} |"
                    )
    lrs = [f"| attention | learning-rate multiple chosen by the sweep, seeds {names} |", "|---|---|"]
    for a in attentions:
        chosen = [
            next((f"{r['scale']:g}x" for r in s.sweep if r["attention"] == a and r["chosen"]), "-") for s in seeds
        ]
        lrs.append(f"| {a} | {' / '.join(chosen)} |")
    if not any(s.sweep for s in seeds):
        lrs = [
            "No seed ran a learning-rate sweep; the rates their runs trained with (the study config's, or those "
            "another study's sweep chose: `--rates-from`):\n",
            f"| attention | size | learning rate, seeds {names} |",
        ]
        lrs.append("|---|---|---|")
        for a in attentions:
            for size in sizes_of(seeds, a):
                rates = [f"{run['lr']:.3g}" if (run := run_of(s, a, size)) and "lr" in run else "-" for s in seeds]
                lrs.append(f"| {a} | {size} | {' / '.join(rates)} |")
    return ["\n".join(t) + "\n" for t in (best, alpha, train, frontier, mult, lrs)]


def exponent_table(seeds: list[Seed], attentions: list[str], fit: str, what: str) -> list[str]:
    """Per attention: the exponent of `fit` per seed, its mean with the interval over seeds, minus softmax's."""
    names = " / ".join(s.seed for s in seeds)
    rows = [f"| attention | {what}, seeds {names} | mean [95% CI] | minus softmax's |", "|---|---|---|---|"]
    for a in attentions:
        e = exponent_spread(seeds, a, fit)
        diff = diff_spread(seeds, a, fit).text("{:+.3f}") if a != "softmax" else ""
        rows.append(f"| {a} | {per_seed(e.values, '{:+.3f}')} | {e.text('{:+.3f}')} | {diff} |")
    return rows


def size_table(seeds: list[Seed]) -> list[str]:
    """Per attention and size (smallest first): the final validation loss and zero-shot top-1 of its full-budget
    run per seed, with the mean over seeds and its 95% t interval (the points of claim (c)'s fits), and its change
    from the next smaller size, paired by seed (where a size gains or loses)."""
    names = " / ".join(s.seed for s in seeds)
    rows = [f"| attention | size | non-embedding parameters | validation loss, seeds {names} | mean [95% CI] "]
    rows[0] += "| change from the smaller size above, paired over seeds | zero-shot top-1 mean [95% CI] |"
    rows.append("|---|---|---|---|---|---|---|")
    for a in dict.fromkeys(r["attention"] for r in seeds[0].runs):
        below = None
        for size in sizes_of(seeds, a):
            runs = [run_of(s, a, size) for s in seeds]
            loss, top1 = spread([r["val_loss"] for r in runs]), spread([r["top1"] for r in runs], within=(0, 1))
            params = f"{runs[0]['params_without_token_embedding']:,}"
            rows.append(
                f"| {a} | {size} | {params} | {per_seed(loss.values, '{:.3f}')} | {loss.text('{:.3f}')} | "
                f"{paired_change(below, loss.values)} | {top1.text('{:.1%}')} |"
            )
            below = loss.values
    return rows


def paired_change(before: list[float] | None, after: list[float]) -> str:
    """The change from `before` to `after` (the same seeds in order) as a percentage: the geometric mean over seeds
    of after/before with its 95% t interval, so the seed-to-seed level (each seed its own data) cancels."""
    if before is None:
        return ""
    ratio = spread([b / a for a, b in zip(before, after)], log=True)
    if not math.isfinite(ratio.lo):
        return f"{ratio.mean - 1:+.1%}"
    return f"{ratio.mean - 1:+.1%} [{ratio.lo - 1:+.1%}, {ratio.hi - 1:+.1%}]"


def sources(seeds: list[Seed]) -> str:
    """'From N study folders (seed 0: `FOLDER`, ...)': where a page over seeds read its numbers."""
    return f"From {len(seeds)} study folders ({', '.join(f'seed {s.seed}: `{s.folder}`' for s in seeds)})"


def report(
    seeds: list[Seed], targets: list[float], command: str, n_images: int | None = None, made: dict | None = None
) -> str:
    """The page; `made`: the header's pages.stamp() (default: this machine now)."""
    best, alpha, train, frontier, mult, lrs = tables(seeds, targets, n_images)
    claims = ["| claim | verdict | numbers |", "|---|---|---|"]
    claims += [f"| {c} | **{v}** | {n} |" for c, v, n in claim_rows(seeds, targets, n_images)]
    return "\n".join(
        [
            pages.header("The study over seeds", command, made=made),
            f"{sources(seeds)}. Each number: its value per seed, then the mean over seeds with a 95% Student-t "
            f"interval over seeds ({len(seeds) - 1} degrees of freedom; multipliers on a log scale; top-1 intervals "
            "cut to 0-100%). '>' marks a mean with a seed whose run never reached the target (counted at its lower "
            "bound), '<' one with a seed whose run was there at its first evaluation (counted at its upper bound). "
            "Targets softmax of that size misses at a seed, or reaches by its first evaluation, give no multiplier "
            "(eval/multiplier.py). Beside it, where the zero-shot set's size is known: a two-level bootstrap, the "
            "seeds resampled and within each the zero-shot images (2,000 replicates, percentile interval); with few "
            "seeds its seed level is coarse and narrower than the t interval, so the verdicts read the t interval.\n",
            "## The paper's claims, on intervals over seeds\n",
            "\n".join(claims) + "\n\nRules: " + RULES + "\n",
            "## Best zero-shot top-1\n",
            best,
            "## Final validation loss per size\n",
            "\n".join(size_table(seeds)) + "\n",
            "## Exponents of the validation loss against non-embedding parameters (claim (c))\n",
            alpha,
            "## Exponents of the training loss against non-embedding parameters (as the paper plots it)\n",
            "The mean of the logged training losses over the last 10% of each full-budget run's steps, against "
            "parameters without the token embedding (eval/study_analysis.py: train_loss_params); shown, not ruled "
            "on (claim (c) reads the validation loss, which every attention is scored on with the same images).\n",
            train,
            "## Compute-frontier exponents (zero-shot error against training compute; not ruled on)\n",
            frontier,
            "## Samples to a target error, over softmax of the same size\n",
            mult,
            "## Learning rates\n",
            lrs,
            *linearise_section(seeds),
        ]
    )
