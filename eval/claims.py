"""The paper's claims (Gerami, Madani, Duraiswami 2026), one row each, judged from the study's runs by fixed rules.

Each claim is "supported", "not supported" or "undetermined", with the numbers behind it; RULES states the rules
and the report prints them. Sizes compare like with like: a linear attention against softmax at the largest size
both were trained at. Claim (d) is judged from the study's own runs: the samples multiplier and the step times
(median training samples per second) of the same runs, at the image tokens they trained with, and only from
MIN_TOKENS tokens on (the paper's setting is 197; below a few hundred tokens attention is a small part of a step).
Projections to longer sequences (the study's multiplier times the step ratios of the training-step benchmark,
docs/bench_train.csv at 197 and 785 tokens, and docs/bench_long.csv at 4,097) are printed beside it, labelled, and
never decide it.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from eval.multiplier import multiplier
from eval.scaling import POOR_FIT, poor_fit
from eval.scaling_fit import R2_MIN

NODENOM, NORMALISED = "linear_affine_nodenom", "linear_affine"
# claim (c): the fit it reads (eval/study_analysis.FITS), the one shown beside it, and what "similar" means
PARAMS_FIT, FRONTIER_FIT = "val_loss_params", "error_frontier"
MARGIN, MIN_SIZES, MIN_SPAN = 0.05, 4, 10.0
FLAT_LOSS = 0.05  # a run has flattened when its validation loss falls less than 5% per doubling of samples at its end
BENCH_TRAIN = Path(__file__).resolve().parents[1] / "docs" / "bench_train.csv"
BENCH_LONG = Path(__file__).resolve().parents[1] / "docs" / "bench_long.csv"
GAP, LOSS_RATIO, MUCH_SLOWER, MORE_BUDGET = 0.05, 1.05, 2.0, 2.0
FLAT = 0.05  # a zero-shot error curve has flattened when it falls less than 5% per doubling of samples at its end
MIN_TOKENS = 257  # claim (d) is judged at this many image tokens or more (issue 45: >= 257, the resolution study)
RULE_C = (
    f"(c) read from the exponents of the validation loss (contrastive) against non-embedding parameters at the end "
    f"of each full-budget run, per attention (the paper fits training loss against model size: about -0.36 softmax, "
    f"-0.33 LA): supported when the whole 95% interval of the difference of exponents (Eq. 7 - softmax) lies within "
    f"+-{MARGIN} (the margin of 'similar'), not supported when it lies wholly outside +-{MARGIN}, else undetermined; "
    f"undetermined too with fewer than {MIN_SIZES} sizes or sizes spanning less than {MIN_SPAN:g}x in parameters "
    f"(3 sizes: indicative only), or when either fit's R^2 on log loss is below {R2_MIN} (the power law does not "
    f"describe its points), or when some run the fits read has not flattened (its validation loss still falls "
    f">= {100 * FLAT_LOSS:.0f}% per doubling of samples between its cooled-down budget nearest half its samples and "
    f"its end: the exponents then compare the sizes at equal samples, not converged). The compute-frontier exponents "
    f"of zero-shot error are shown beside it, not ruled on."
)
RULE_D = (
    f"(d) judged at the image tokens the study's largest runs trained with, from those runs alone: the samples "
    f"multiplier k of Eq. 7 over softmax to the hardest target softmax reaches, and the step-time ratio r of the same "
    f"runs (softmax's median training samples per second over Eq. 7's); supported when k's interval lies above 1 "
    f"and its upper bound x r is below 1 (more samples, less time), not supported when k's upper bound is <= 1 or "
    f"its lower bound x r is above 1, else undetermined; undetermined below {MIN_TOKENS} image tokens, where the "
    f"paper's time claim is not at stake. Projections to longer sequences (k x the benchmarks' step ratios) are "
    f"shown, labelled, and never decide it."
)
RULES = (
    f"(a) supported when, at the largest size, Eq. 7's final top-1 is within {100 * GAP:.0f} points of softmax's and "
    f"its validation loss within {LOSS_RATIO}x; not supported when it misses that although its budget was at least "
    f"{MORE_BUDGET:g}x softmax's samples (the paper: LA needs more epochs) and its curve has flattened (its zero-shot "
    f"error between its last two budgets, or over the last quarter of its run, changed by less than {100 * FLAT:.0f}% "
    f"per doubling of samples, or by less than 2 binomial standard errors of the larger error on the zero-shot set "
    f"per doubling); "
    f"else undetermined. "
    f"(b) supported when linear_affine needs >= {MUCH_SLOWER:g}x softmax's samples to the hardest target softmax "
    f"reaches at the largest size (lower interval bound, or never reaching it), not supported when the upper bound "
    f"is below {MUCH_SLOWER:g}x. " + RULE_C + " " + RULE_D
)


def step_ratios(
    attention: str, study_ratio: float, path: Path = BENCH_TRAIN, long: Path = BENCH_LONG
) -> dict[int, float]:
    """{tokens: step time of `attention` / softmax's}: 17 from the study's own runs, 197 and 785 from the training
    benchmark, longer ones from the long-sequence benchmark (the image tower's measured steps, no checkpointing)."""
    out = {17: study_ratio}
    if path.is_file():
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["part"] == "attention" and row["attention"] == attention and row["precision"] == "fp32":
                    out[(int(row["pixels"]) // 16) ** 2 + 1] = float(row["ratio"])
    if long.is_file():
        with open(long) as f:
            for row in csv.DictReader(f):
                measured = row["how"] == "measured" and row["checkpointing"] == "False"
                if row["part"] == "image" and row["attention"] == attention and measured:
                    out.setdefault(int(row["tokens"]), float(row["ratio"]))
    return out


def end_points(run: dict) -> tuple[float, float, float, float]:
    """(samples, zero-shot error) before the end and at the end of a run's curve, that flattened compares: the ends
    of its last two budgets (with budgets), else the evaluation nearest 3/4 of its samples (its first, if that is the
    last) and its last."""
    samples = [float(s) for s, _ in run["curve"]]
    errors = [1 - t for _, t in run["curve"]]
    at = min(range(len(samples)), key=lambda i: abs(samples[i] - 0.75 * samples[-1]))
    before, error = (samples[at], errors[at]) if at < len(samples) - 1 else (samples[0], errors[0])
    if len(run.get("budgets", [])) >= 2:
        before, error = float(run["budgets"][-2][0]), 1 - run["budgets"][-2][1]
    return before, error, samples[-1], errors[-1]


def flattened(run: dict, n_images: int | None = None) -> tuple[bool, float]:
    """(whether the zero-shot error curve has flattened at its end, its change per doubling of samples there). The
    change between end_points is put per doubling of samples, so that budgets 1.25x or 2x apart read alike:
    (e_end / e_before) ** (1 / log2(s_end / s_before)) - 1. Flat: a change of less than FLAT per doubling. With
    `n_images` (the zero-shot set's size) a change within the set's noise counts as flat too: less than 2 binomial
    standard errors of the larger of the two errors per doubling, as near 0% error a relative change is a fraction of
    one image. (Both errors are measured on the same images, so the noise of their difference is below that of two
    independent draws: one evaluation's is the yardstick.)"""
    before, error, end, last = end_points(run)
    doublings = math.log2(end / before) if end > before else math.nan
    if not doublings > 0:  # one evaluation: nothing to measure a change over
        return False, math.nan
    change = (max(last, 1e-9) / max(error, 1e-9)) ** (1 / doublings) - 1
    larger = max(error, last)
    noise = 2 * math.sqrt(larger * (1 - larger) / n_images) if n_images else 0
    return abs(change) < FLAT or abs(last - error) / doublings < noise, change


def hardest_target(ref: dict, targets: list[float]) -> float | None:
    """The lowest target error the reference run reaches."""
    reached = [t for t in targets if any(1 - top1 <= t for _, top1 in ref["curve"])]
    return min(reached, default=None)


def samples_multiplier(run: dict, ref: dict, target: float, n_images: int, n_boot: int):
    curves = [([s for s, _ in r["curve"]], [1 - t for _, t in r["curve"]]) for r in (run, ref)]
    return multiplier(*curves, target, n_images=n_images, n_boot=n_boot)


def cpu_per_sample(run: dict) -> float:
    return run["cpu_seconds"] / run["samples_seen"] if run["cpu_seconds"] > 0 else math.nan


def claim_a(run: dict, ref: dict, n_images: int | None = None) -> tuple[str, str]:
    gap, ratio = ref["top1"] - run["top1"], run["val_loss"] / ref["val_loss"]
    flat, change = flattened(run, n_images)
    budget = run["samples_seen"] / ref["samples_seen"]
    numbers = (
        f"{run['size']}: top-1 {100 * run['top1']:.1f}% vs {100 * ref['top1']:.1f}%, validation loss "
        f"{run['val_loss']:.3f} vs {ref['val_loss']:.3f} ({ratio:.2f}x); error {change:+.0%} per doubling of samples "
        f"at its end; its budget {budget:.1f}x softmax's samples"
    )
    if gap <= GAP and ratio <= LOSS_RATIO:
        return "supported", numbers
    # a run on a plateau looks flat too: only a budget well beyond softmax's can show that it has converged
    return ("not supported" if flat and budget >= MORE_BUDGET else "undetermined"), numbers


def claim_b(m, size: str) -> tuple[str, str]:
    numbers = f"{size}, target {100 * m.target:.0f}% error: {m.text()} softmax's samples"
    if m.reference_at_start:
        return "undetermined", numbers
    lo, hi = (m.k, math.inf) if m.censored else (0.0, m.k) if m.at_start else (m.lo, m.hi)
    if lo >= MUCH_SLOWER:
        return "supported", numbers
    return ("not supported" if hi < MUCH_SLOWER else "undetermined"), numbers


def equivalence(lo: float, hi: float, margin: float = MARGIN) -> str:
    """An equivalence test of a difference with 95% interval [lo, hi]: "supported" when the whole interval lies
    within +-margin, "not supported" when it lies wholly outside, else "undetermined"."""
    if -margin <= lo and hi <= margin:
        return "supported"
    return "not supported" if hi < -margin or lo > margin else "undetermined"


def coverage(groups: dict[str, dict]) -> tuple[int, float, list[str]]:
    """(distinct sizes, their span max/min in x, why the exponents cannot be ruled on) of the fits `groups`
    {name: eval.scaling group with n_distinct_x, x_range, r2}: the fewest sizes and narrowest span of any group."""
    sizes = min(g.get("n_distinct_x", 0) for g in groups.values())
    span = min((g["x_range"][1] / g["x_range"][0] if "x_range" in g else 1.0) for g in groups.values())
    reasons = [f"{name}: {poor_fit(g)}: {POOR_FIT}" for name, g in groups.items() if poor_fit(g)]
    if sizes < MIN_SIZES or span < MIN_SPAN:
        what = "indicative only" if sizes == MIN_SIZES - 1 else "too few sizes" if sizes < MIN_SIZES else "too narrow"
        reasons.insert(0, f"{what}: {sizes} sizes spanning {span:.1f}x (the rule needs {MIN_SIZES} over {MIN_SPAN:g}x)")
    return sizes, span, reasons


def fall_per_doubling(n0: float, loss0: float, n1: float, loss1: float) -> float:
    """How much a loss falls per doubling of samples from (n0, loss0) to (n1, loss1)."""
    return 1 - (loss1 / loss0) ** (1 / math.log2(n1 / n0))


def loss_fall(run: dict) -> float | None:
    """The fall of a run's validation loss per doubling of samples at its end: from its cooled-down budget nearest
    half its samples to its end (run["budgets"]: [samples, top-1, val loss], the last its end); None with fewer than
    two budgets."""
    budgets = [b for b in run.get("budgets", []) if len(b) > 2 and b[2] is not None and math.isfinite(b[2])]
    if len(budgets) < 2:
        return None
    end = budgets[-1]
    half = min(budgets[:-1], key=lambda b: abs(math.log(b[0] / (end[0] / 2))))
    return fall_per_doubling(half[0], half[2], end[0], end[2])


def pair_falls(runs: list[dict]) -> list[float]:
    """loss_fall of each run of softmax and Eq. 7 (claim (c)'s pair) that has budgets to measure it."""
    return [f for r in runs if r["attention"] in ("softmax", NODENOM) for f in [loss_fall(r)] if f is not None]


def falls_text(falls: list[float]) -> str:
    """How fast claim (c)'s runs still fall at their end, as the reports say it."""
    if not falls:
        return "flatness not measured (no cooled-down budgets)"
    return (
        f"validation loss at the end falling {100 * min(falls):.0f}% to {100 * max(falls):.0f}% per doubling of "
        f"samples (flat: < {100 * FLAT_LOSS:.0f}%)"
    )


def convergence(runs: list[dict]) -> tuple[str, str | None]:
    """(what claim (c)'s runs of softmax and Eq. 7 show of their budget and flatness, why they cannot be ruled on or
    None): each run's loss_fall; runs without budgets leave it unmeasured, which is said, not ruled on."""
    falls = pair_falls(runs)
    samples = sorted({r["samples_seen"] for r in runs if r["attention"] in ("softmax", NODENOM)})
    each = ", ".join(f"{s:,}" for s in samples)
    budget = f"{each} samples each" if len(samples) == 1 else f"budgets of {each} samples"
    text = f"{budget}; {falls_text(falls)}"
    if not falls or max(falls) < FLAT_LOSS:
        return text, None
    return text, "not flat: the exponents compare the sizes at equal samples, not converged"


def frontier_line(fits: dict) -> str:
    """The compute-frontier exponents of zero-shot error, shown beside claim (c) (not the quantity it rules on)."""
    c = next((c for c in fits.get(FRONTIER_FIT, {}).get("comparisons", []) if c["a"] == NODENOM), None)
    head = "compute-frontier exponents of zero-shot error (not ruled on)"
    if c is None or c.get("verdict") == "undetermined":
        return f"{head}: {'not compared' if c is None else 'no interval'}"
    lo, hi = c["alpha_diff_ci"]
    return f"{head}: difference {c['alpha_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def claim_c(fits: dict, runs: list[dict] = ()) -> tuple[str, str]:
    """The exponents of validation loss against non-embedding parameters (PARAMS_FIT), by the equivalence rule, on
    runs that have flattened (convergence)."""
    fit = fits.get(PARAMS_FIT, {})
    c = next((c for c in fit.get("comparisons", []) if c["a"] == NODENOM and c["b"] == "softmax"), None)
    if c is None:
        why = fit.get("error", "no softmax and Eq. 7 groups")
        return "undetermined", f"validation loss against parameters not fitted ({why}); {frontier_line(fits)}"
    soft, eq7 = fit["groups"]["softmax"], fit["groups"][NODENOM]
    sizes, span, reasons = coverage({"softmax": soft, NODENOM: eq7})
    flat, unflat = convergence(list(runs))
    lo, hi = c["alpha_diff_ci"]
    ci = "no interval" if c.get("verdict") == "undetermined" else f"[{lo:+.3f}, {hi:+.3f}]"
    r2 = ", ".join(
        f"{n} {g['r2']:.3f}" if g.get("r2") is not None else f"{n} n/a" for n, g in (("softmax", soft), ("Eq. 7", eq7))
    )
    numbers = (
        f"validation loss against non-embedding parameters, {sizes} sizes spanning {span:.1f}x: exponents softmax "
        f"{soft['alpha']:+.3f}, Eq. 7 {eq7['alpha']:+.3f}; difference {c['alpha_diff']:+.3f} {ci} "
        f"(margin +-{MARGIN}); R^2 on log loss {r2} (the paper: about -0.36 vs -0.33); {flat}; {frontier_line(fits)}"
    )
    reasons += [unflat] if unflat else []
    if c.get("verdict") == "undetermined":  # too few points for an interval (eval.scaling says why)
        reasons.append(c.get("reason") or "no interval")
    if reasons:
        would = f"; the interval alone would read: {equivalence(lo, hi)}" if "indicative only" in reasons[0] else ""
        return "undetermined", numbers + "; undetermined: " + "; ".join(reasons) + would
    return equivalence(lo, hi), numbers


def claim_d(m, tokens: int | None, ratio: float, projected: dict[int, float]) -> tuple[str, str]:
    """More samples (k's interval above 1) but less time (k x the runs' own step ratio below 1), measured at the
    runs' image tokens, from MIN_TOKENS on; `projected`: {tokens: benchmark step ratio}, shown only."""
    if not math.isfinite(m.reference_samples) or m.reference_at_start:
        return "undetermined", f"target {100 * m.target:.0f}% error: {m.text()}"
    k_lo, k_hi = (m.k, math.inf) if m.censored else (0.0, m.k) if m.at_start else (m.lo, m.hi)
    bound = ">" if m.censored else "<" if m.at_start else ""
    return time_verdict(m.target, m.text(), k_lo, k_hi, m.k, tokens, ratio, projected, bound)


def time_verdict(target, k_text, k_lo, k_hi, k, tokens, ratio, projected, bound: str = "") -> tuple[str, str]:
    """Claim (d)'s rule on a samples multiplier (its interval k_lo..k_hi) and the measured step-time ratio. `bound`:
    '>' when k is a lower bound (a run that never reaches the target), '<' an upper bound (one there at its first
    evaluation); the times to the target are then bounds too."""
    where = f"{tokens} image tokens" if tokens else "the study's image tokens (unknown)"
    numbers = (
        f"target {100 * target:.0f}% error at {where}: {k_text} the samples, steps {ratio:.2f}x softmax's time "
        f"(the same runs), time to it {bound}{k * ratio:.2f}x"
    )
    longer = {n: r for n, r in sorted(projected.items()) if not tokens or n > tokens}
    if longer:
        numbers += "; projected, not measured: " + ", ".join(
            f"{n} tokens {bound}{k * r:.2f}x" for n, r in longer.items()
        )
    if not math.isfinite(ratio):
        return "undetermined", numbers + " (no step times measured)"
    if not tokens or tokens < MIN_TOKENS:
        return "undetermined", numbers + f" (judged at >= {MIN_TOKENS} image tokens: the resolution study)"
    if k_hi <= 1 or k_lo * ratio > 1:
        return "not supported", numbers
    return ("supported" if k_lo > 1 and k_hi * ratio < 1 else "undetermined"), numbers


def step_ratio(run: dict, ref: dict) -> float:
    """Step-time ratio of `run` over softmax's `ref`: their median training samples per second (the training steps
    alone: no start-up or evaluation), else their CPU seconds per sample."""
    if run.get("samples_per_s") and ref.get("samples_per_s"):
        return ref["samples_per_s"] / run["samples_per_s"]
    return cpu_per_sample(run) / cpu_per_sample(ref)


def claims(
    runs: list[dict],
    fits: dict,
    targets: list[float],
    n_images: int,
    n_boot: int,
    bench: Path = BENCH_TRAIN,
    long: Path = BENCH_LONG,
) -> list[tuple]:
    """[(claim, verdict, numbers)] for the paper's four claims; `bench`: the training-step benchmark's CSV."""
    largest = {}
    for r in sorted(runs, key=lambda r: r["params_without_token_embedding"]):
        largest.setdefault(r["attention"], {})[r["size"]] = r
    soft = largest.get("softmax", {})
    out = []
    for claim, attention, judge in (
        ("(a) Eq. 7 converges to a loss and accuracy comparable to softmax", NODENOM, "a"),
        ("(b) the normalised form converges much more slowly or fails", NORMALISED, "b"),
        ("(c) the scaling exponents are similar", NODENOM, "c"),
        ("(d) LA needs more epochs but less total time", NODENOM, "d"),
    ):
        if judge == "c":
            out.append((claim, *claim_c(fits, runs)))
            continue
        shared = [s for s in largest.get(attention, {}) if s in soft]
        if not shared:
            out.append((claim, "undetermined", f"no {attention} and softmax runs of the same size"))
            continue
        run, ref = largest[attention][shared[-1]], soft[shared[-1]]
        target = hardest_target(ref, targets)
        if judge == "a":
            out.append((claim, *claim_a(run, ref, n_images)))
        elif target is None:
            out.append((claim, "undetermined", f"softmax {ref['size']} reaches none of the targets {targets}"))
        else:
            m = samples_multiplier(run, ref, target, n_images, n_boot)
            if judge == "b":
                out.append((claim, *claim_b(m, run["size"])))
            else:
                projected = {n: r for n, r in step_ratios(attention, math.nan, bench, long).items() if n != 17}
                out.append((claim, *claim_d(m, run.get("image_tokens"), step_ratio(run, ref), projected)))
    return out


def claims_table(rows: list[tuple]) -> str:
    lines = ["| claim | verdict | numbers |", "|---|---|---|"]
    lines += [f"| {claim} | **{verdict}** | {numbers} |" for claim, verdict, numbers in rows]
    return "\n".join(lines) + "\n\nRules: " + RULES + "\n"
