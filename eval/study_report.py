"""The main job's report: the runs, the checks of what the study must show, the fits, and what the data support.

Every number comes from the runs of this study (runs.json) and the fits (eval.scaling reports). The sentences
that compare with the paper (Gerami, Madani, Duraiswami 2026) follow fixed rules stated in the report itself.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np

from eval import budget_exponents, pages, smoothing, time_to_target
from eval.claims import FLAT, FLAT_LOSS, MARGIN, claims, claims_table, end_points, flattened
from eval.multiplier import multiplier
from eval.scaling import poor_fit
from eval.scaling_fit import R2_MIN

NODENOM = "linear_affine_nodenom"
# the report's title where a study config's `title:` is unset, and for page data saved before studies had titles
DEFAULT_TITLE = "Softmax vs linear attention on the embedded synthetic data"
# what fits.json keeps of each group of a fit (the seed statistics and claim (c) read n_distinct_x, x_range, r2)
DIGEST = ("alpha", "alpha_ci", "beta", "beta_ci", "n_points", "n_distinct_x", "x_range", "r2", "no_interval", "formula")


def fit_digest(report: dict) -> dict:
    """The numbers of a fit a reader needs: per group alpha, its interval, beta, points; the comparisons."""
    if "groups" not in report:
        return report
    groups = {name: {k: g[k] for k in DIGEST if k in g} for name, g in report["groups"].items()}
    comparisons = [
        {k: c.get(k) for k in ("a", "b", "alpha_diff", "alpha_diff_ci", "verdict", "reason")}
        for c in report["comparisons"]
    ]
    return {"x": report["x"], "y": report["y"], "form": report["form"], "groups": groups, "comparisons": comparisons}


def by_attention(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs per attention, smallest model first."""
    out: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: r["params_without_token_embedding"]):
        out.setdefault(run["attention"], []).append(run)
    return out


def exponent_below_zero(fits: dict, name: str, attention: str) -> tuple[bool, str]:
    g = fits.get(name, {}).get("groups", {}).get(attention)
    if g is None:
        return False, "not fitted"
    return g["alpha_ci"][1] < 0, f"alpha {g['alpha']:+.3f} [{g['alpha_ci'][0]:+.3f}, {g['alpha_ci'][1]:+.3f}]"


def criteria(runs: list[dict], fits: dict, num_classes: int, learns=(0.8, 1.0)) -> list[tuple[str, bool, str]]:
    """(what must hold, whether it does, the numbers) for the checks the study must pass (README, "The main job");
    `learns`: the range softmax's best top-1 must lie in (the study's fits.learns); every attention must reach its
    floor or 10x chance, whichever is lower (it learns the task)."""
    groups = by_attention(runs)
    softmax = groups.get("softmax", [])
    best = max(softmax, key=lambda r: r["top1"], default=None)
    low, high = learns
    checks = [
        ("chance level <= 5%", 1 / num_classes <= 0.05, f"{num_classes} classes: {100 / num_classes:.1f}%"),
        (
            f"best softmax run between {100 * low:.0f}% and {100 * high:.0f}% zero-shot top-1 (it learns the task, "
            "which does not saturate)",
            best is not None and low <= best["top1"] <= high,
            f"{best['size']}: {100 * best['top1']:.1f}%" if best else "no softmax run",
        ),
    ]
    learned = min(low, 10 / num_classes)  # far above chance; the window above is softmax's, the task's calibration
    for attention, rows in groups.items():
        top = max(rows, key=lambda r: r["top1"])
        checks.append(
            (
                f"{attention}: its best run >= {100 * learned:.0f}% zero-shot top-1 (it learns the task: "
                f"{'10x chance' if learned < low else 'the floor above'})",
                top["top1"] >= learned,
                f"{top['size']}: {100 * top['top1']:.1f}% after {top['samples_seen']:,} samples",
            )
        )
    for attention in [a for a in ("softmax", NODENOM) if a in groups]:
        rows = groups[attention]
        largest = rows[-1]
        checks.append(
            (
                f"{attention}: the largest model's learning curve still falls at the end",
                largest["tail_slope"] < 0,
                f"log-log slope of error over the second half of training {largest['tail_slope']:+.2f}",
            )
        )
        errors = [1 - r["top1"] for r in rows]
        falls = sum(b < a for a, b in itertools.pairwise(errors))
        if len(rows) > 1:  # one size (configs/study/tokens577.yaml): nothing to check across sizes
            checks.append(
                (
                    f"{attention}: final error falls with model size (largest below smallest, exponent's interval < 0)",
                    errors[-1] < errors[0] and exponent_below_zero(fits, "error_params", attention)[0],
                    "smallest to largest: "
                    + ", ".join(f"{100 * e:.1f}%" for e in errors)
                    + f" (falls at {falls} of {len(errors) - 1} steps up in size); error vs parameters "
                    + exponent_below_zero(fits, "error_params", attention)[1],
                )
            )
        ok, numbers = exponent_below_zero(fits, "error_frontier", attention)
        checks.append((f"{attention}: compute-frontier exponent's 95% interval below 0", ok, numbers))
    return checks


def comparison(fits: dict, name: str, attention: str) -> dict | None:
    return next((c for c in fits.get(name, {}).get("comparisons", []) if c["a"] == attention), None)


def compute_to_reach(rows: list[dict], level: float) -> float:
    """The least compute (GMACs x samples) at which any run of `rows` has zero-shot error <= level (inf: never)."""
    reached = [r["gmacs_per_sample"] * seen for r in rows for seen, top1 in r["curve"] if 1 - top1 <= level]
    return min(reached, default=float("inf"))


SUPPORT_RULES = (
    f"Rules: an exponent matches softmax's when the 95% interval of the difference lies within +-{MARGIN} (claim (c)'s "
    "margin of 'similar'), is steeper or shallower when the interval excludes 0, and is neither distinguishable nor "
    "shown similar otherwise.\n"
)


def exponent_sentence(fits: dict, name: str, attention: str, what: str) -> str:
    c = comparison(fits, name, attention)
    if c is None:
        return f"the {what} exponents were not compared"
    if c.get("verdict") == "undetermined":  # too few points for an interval (eval.scaling says why)
        return f"its {what} exponent against softmax's is undetermined ({c.get('reason')})"
    lo, hi = c["alpha_diff_ci"]
    numbers = f"{c['alpha_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    r2 = {g: fits.get(name, {}).get("groups", {}).get(g, {}).get("r2") for g in (attention, "softmax")}
    poor = [f"{g} R^2 {v:.3f}" for g, v in r2.items() if v is not None and v < R2_MIN]
    if poor:  # an exponent of a fit that does not describe its points compares nothing
        return f"its {what} exponent is not compared: the fit does not describe the points ({', '.join(poor)})"
    if lo >= -MARGIN and hi <= MARGIN:
        return f"its {what} exponent matches softmax's within +-{MARGIN} (difference {numbers})"
    if lo <= 0 <= hi:
        return f"its {what} exponent is neither distinguishable from softmax's nor shown similar (difference {numbers})"
    steeper = "steeper" if hi < 0 else "shallower"
    return f"its {what} exponent is {steeper} than softmax's by {numbers}"


def support(runs: list[dict], fits: dict) -> list[str]:
    """One paragraph per linear attention: exponents, error level and compute multiplier (the paper's claims are
    judged in eval/claims.py)."""
    groups = by_attention(runs)
    if "softmax" not in groups:
        return ["No softmax runs: nothing to compare with."]
    soft = {r["size"]: 1 - r["top1"] for r in groups["softmax"]}
    level = float(np.median(list(soft.values())))
    soft_compute = compute_to_reach(groups["softmax"], level)
    lines = []
    for attention, rows in groups.items():
        if attention == "softmax":
            continue
        ratios = [(1 - r["top1"]) / soft[r["size"]] for r in rows if r["size"] in soft and soft[r["size"]] > 0]
        multiplier = compute_to_reach(rows, level) / soft_compute
        reach = (
            f"it first reaches {100 * level:.1f}% error (softmax's median final error) with {multiplier:.2f}x the "
            f"compute softmax needs ({soft_compute:.3g} GMACs x samples)"
            if np.isfinite(multiplier)
            else f"no run of it reaches {100 * level:.1f}% error (softmax's median final error)"
        )
        parts = [
            exponent_sentence(fits, "val_loss_params", attention, "validation loss against parameters"),
            exponent_sentence(fits, "error_frontier", attention, "compute-frontier (zero-shot error)"),
            exponent_sentence(fits, "val_loss_frontier", attention, "validation-loss frontier"),
            "its final error is " + ", ".join(f"{x:.2f}x" for x in ratios) + " softmax's, size by size",
            reach,
        ]
        lines.append(f"- **{attention}**: " + "; ".join(parts) + ".")
    return lines


def times(m, ratio: float) -> str:
    """The samples multiplier m.k and its interval times a cost ratio per sample, '>' for a lower bound; '' when
    either is unknown. The ratio is one measured number: the interval is the samples multiplier's, scaled."""
    if np.isnan(m.k) or not np.isfinite(ratio):
        return ""
    if m.censored or m.at_start or not np.isfinite(m.lo):
        return f"{'>' if m.censored else '<' if m.at_start else ''}{m.k * ratio:.2f}x"
    hi = f"{m.hi * ratio:.2f}" if np.isfinite(m.hi) else "inf"
    return f"{m.k * ratio:.2f}x [{m.lo * ratio:.2f}, {hi}]"


def multipliers(runs: list[dict], targets: list[float], n_images: int, n_boot: int) -> list[dict]:
    """Per linear attention, size and target error that softmax of the same size reaches after its first evaluation:
    the samples multiplier over softmax (eval.multiplier, with its 95% bootstrap interval), and the compute and time
    ratios per sample (GMACs; the study's own measured training throughput)."""
    groups = by_attention(runs)
    soft = {r["size"]: r for r in groups.get("softmax", [])}
    found = []
    for attention, group in groups.items():
        for run, target in itertools.product(group if attention != "softmax" else [], targets):
            ref = soft.get(run["size"])
            if ref is None:
                continue
            curves = [([s for s, _ in r["curve"]], [1 - t for _, t in r["curve"]]) for r in (run, ref)]
            m = multiplier(*curves, target, n_images=n_images, n_boot=n_boot)
            if not np.isfinite(m.reference_samples) or m.reference_at_start:
                continue  # softmax of this size never gets there, or is there from its first evaluation: no k
            compute = run["gmacs_per_sample"] / ref["gmacs_per_sample"]
            seconds = ref.get("samples_per_s", np.nan) / run.get("samples_per_s", np.nan)
            found.append({"attention": attention, "run": run, "target": target, "m": m, "compute": compute})
            found[-1]["seconds"] = seconds
    return found


def multiplier_table(found: list[dict]) -> str:
    """The multipliers (multipliers()) as a table: samples, compute and time to each target over softmax's."""
    rows = [
        "| attention | size | target error | samples to it | softmax's | samples multiplier [95% CI] | "
        "compute multiplier | time multiplier |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in found:
        m = f["m"]
        k, t = (times(m, ratio) for ratio in (f["compute"], f["seconds"]))
        rows.append(
            f"| {f['attention']} | {f['run']['size']} | {100 * f['target']:.0f}% | {m.samples:,.0f} | "
            f"{m.reference_samples:,.0f} | {m.text()} | {k} | {t} |"
        )
    return "\n".join(rows) + "\n"


def budget_lines(runs: list[dict], n_images: int | None = None) -> list[str]:
    """Per attention, whether its largest run's learning curve flattened within its budget, and by how much not."""
    lines = []
    for attention, group in by_attention(runs).items():
        largest = group[-1]
        flat, change = flattened(largest, n_images)
        verdict = (
            "looks flat: converged, or on a plateau it has not left yet (only a longer budget tells which)"
            if flat
            else "has not flattened: a longer budget would lower its error further"
            if change < 0
            else "has not flattened: its error rose at its end"
        )
        before, error, end, last = end_points(largest)
        span = (
            f"between its last two budgets ({before:,.0f} and {end:,.0f} samples, each cooled down)"
            if len(largest.get("budgets", [])) >= 2
            else f"between {before:,.0f} and {end:,.0f} samples"
        )
        lines.append(
            f"- {attention}: the largest run ({largest['size']}, {largest['samples_seen']:,} samples) {verdict}; "
            f"its zero-shot error went from {error:.1%} to {last:.1%} {span}, {change:+.0%} per doubling of samples "
            f"(flat: less than {100 * FLAT:.0f}% per doubling, or less than 2 binomial standard errors of the larger "
            "error on the zero-shot set per doubling)."
        )
    return lines


def budgets_table(runs: list[dict]) -> str:
    """Per run with budgets: zero-shot top-1 and validation loss at the end of each budget (cooled down), and the
    validation loss's change per doubling of samples from the budget before (how far the run is from flat)."""
    rows = [
        "| size | attention | samples (budget) | zero-shot top-1 | val loss | val loss per doubling of samples |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["attention"], r["params_without_token_embedding"])):
        change = {n1: f"{0.0 - fall:+.0%}" for _, n1, fall in budget_exponents.falls(r)}
        rows += [
            f"| {r['size']} | {r['attention']} | {s:,} | {100 * t:.1f}% | {v:.3f} | {change.get(s, '')} |"
            for s, t, v in r.get("budgets", [])
        ]
    return "\n".join(rows) + "\n"


def runs_table(runs: list[dict]) -> str:
    probes = sorted({k for r in runs for k in r.get("fewshot", {})}, key=lambda k: int(k.removesuffix("shot")))
    shots = "".join(f" {k.removesuffix('shot')}-shot probe |" for k in probes)
    rows = [
        "| size | attention | params (no embedding) | GMACs/sample | samples seen | zero-shot top-1 | top-5 |"
        f"{shots} val loss | tail slope | wall (s) | CPU (s) |",
        "|---|---|---|---|---|---|---|" + "---|" * len(probes) + "---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["attention"], r["params_without_token_embedding"])):
        probe = "".join(f" {100 * r['fewshot'][k]:.1f}% |" if k in r.get("fewshot", {}) else " - |" for k in probes)
        rows.append(
            f"| {r['size']} | {r['attention']} | {r['params_without_token_embedding'] / 1e6:.3f}M | "
            f"{r['gmacs_per_sample']:.4f} | {r['samples_seen']} | {100 * r['top1']:.1f}% | {100 * r['top5']:.1f}% |"
            f"{probe} {r['val_loss']:.3f} | {r['tail_slope']:+.2f} | {r['wall_seconds']:.0f} | {r['cpu_seconds']:.0f} |"
        )
    return "\n".join(rows) + "\n"


def best_table(runs: list[dict]) -> str:
    rows = ["| attention | best zero-shot top-1 | run |", "|---|---|---|"]
    for attention, group in by_attention(runs).items():
        best = max(group, key=lambda r: r["top1"])
        rows.append(f"| {attention} | {100 * best['top1']:.1f}% | {best['size']} |")
    return "\n".join(rows) + "\n"


def study_flag(args) -> str:
    """' --study configs/study/NAME' for a study other than the main job's, else ''."""
    name = Path(getattr(args, "study", None) or "demo.yaml").name
    return "" if name == "demo.yaml" else f" --study configs/study/{name}"


def clock_sentence(clock: dict, study, where: str) -> str:
    """How long the study took, on what, under which load; a study trained by Slurm job arrays was not timed here."""
    if clock.get("elsewhere"):
        return (
            "Its runs were trained as Slurm job arrays (python -m train.submit study): no times were measured, so "
            "the claims that read time stay undetermined.\n"
        )
    if clock.get("other_study"):
        return (
            f"A re-analysis of a folder where another study ({clock['other_study']}) ran last: its clock is that "
            "study's, so this study's time is not given here (each run's own times stay in the tables).\n"
        )
    loads = clock["load"]
    return (
        f"{study.jobs} runs at a time. The study took {clock['wall'] / 60:.1f} minutes wall and "
        f"{clock['cpu'] / 60:.1f} CPU-minutes on {where}; the 1-minute load average was "
        f"{np.mean(loads):.1f} on average (max {max(loads):.1f}) while it ran (the study's own {study.jobs} runs and "
        f"their data-loader workers count; a load well above {study.jobs * study.threads_per_job + study.jobs} means "
        "other jobs shared the cores)."
        + (
            f" Resumed (--resume): {clock['resumed']} finished runs of the same config were kept from the run "
            "folder; their training is not in this clock.\n"
            if clock.get("resumed")
            else "\n"
        )
    )


def report_md(
    runs, fits, titles, bench, study, args, clock, format_table, num_classes: int, sweep=(), made=None
) -> str:
    """The whole report.md; `titles`: each fit's section title in order; `made`: the header's pages.stamp()
    (default: this machine now)."""
    made = made or pages.stamp()
    targets = study.fits.get("targets", [0.5, 0.3])
    n_images = num_classes * study.data.get("eval_per_class", 1)
    found = multipliers(runs, targets, n_images, study.fits.get("n_boot", 1000))
    what_ran = f"python -m scripts.demo{' --quick' if args.quick else ''}{study_flag(args)} --seed {args.seed}"
    head = pages.header(getattr(study, "title", DEFAULT_TITLE), what_ran, made=made) + (
        f"\n{len(runs)} runs ({len(study.sizes)} sizes x {len(study.attentions)} attentions, the same attention in "
        "both towers). " + clock_sentence(clock, study, made["machine"])
    )
    parts = [
        head,
        "## What the study must show\n",
        check_table(criteria(runs, fits, num_classes, study.fits.get("learns", (0.8, 1.0)))),
        sweep_table(list(sweep), study.lr_sweep, runs),
        "## Runs\n",
        best_table(runs),
        runs_table(runs),
        "Tail slope: the log-log slope of zero-shot error against samples seen over the second half of the "
        "run (negative: still improving).\n",
        "![learning curves](learning_curves.png)\n",
        *budget_section(runs, study),
        "Budgets:\n\n" + "\n".join(budget_lines(runs, n_images)) + "\n",
        "## What the data support\n",
        "\n".join(support(runs, fits)) + "\n",
        SUPPORT_RULES,
        "![summary](summary.png)\n",
        "## The paper's claims\n",
        claims_table(claims(runs, fits, targets, n_images, study.fits.get("n_boot", 1000))),
        *smoothing.section(runs),
        *time_to_target.section(runs, targets, n_images),
        "## Samples to a target error, against softmax of the same size\n",
        multiplier_table(found),
        "![samples multiplier against target](multipliers.png)\n" if found else "",
        f"The samples at which a run's zero-shot error first reaches the target (log-linear between "
        f"{'the ends of its budgets' if study.budgets else 'evaluations'}); the "
        f"multiplier is that over softmax's, the interval a bootstrap over the noise of the {n_images} zero-shot "
        f"images (eval/multiplier.py); '>' marks a run that never reaches the target within its budget (a lower "
        f"bound); targets softmax of that size never reaches, or reaches by its first evaluation, are left out. The "
        f"compute multiplier also counts the GMACs per sample of each attention, the time multiplier each run's "
        f"median training samples per second "
        f"in this study (runs {study.jobs} at a time on {study.threads_per_job} thread(s) each); their intervals "
        f"are the samples multiplier's scaled by that one ratio (the ratio's own noise is not in them).\n",
        f"In the fits and tail slopes below a zero-shot error of 0 (no mistake on the {n_images} images) counts as "
        f"half an image, {0.5 / n_images:.5f}: a logarithm needs a positive error, and below 1/{n_images} the set "
        "cannot tell errors apart.\n",
    ]
    parts.append(
        f"Each fit below prints its R^2 on log y over the points it was fitted on; one below {R2_MIN} does not "
        "describe its points (marked), and a claim read from it is undetermined. Under each figure: the log "
        "residuals (ln y - ln fit) of the points fitted, against x.\n"
    )
    for name, title in titles.items():
        parts += fit_section(name, title, fits[name], format_table)
    parts += ["## Attention layers (forward + backward, B=1, H=6, D=64, fp32, this machine)\n", bench]
    return "\n".join(parts)


def fit_section(name: str, title: str, report: dict, format_table) -> list[str]:
    """One fit's section: its table (with R^2 on log y per group), a mark on a fit that does not describe its
    points, and its figure (with residuals)."""
    if "groups" not in report:
        return [f"## Fit: {title}\n", f"```\nnot fitted: {report['error']}\n```\n"]
    poor = [f"{group} ({poor_fit(g)})" for group, g in report["groups"].items() if poor_fit(g)]
    mark = [f"**Does not describe its points**: {'; '.join(poor)}.\n"] if poor else []
    return [f"## Fit: {title}\n", *mark, f"```\n{format_table(report)}\n```\n", f"![{name}]({name}.png)\n"]


def budget_section(runs: list[dict], study) -> list[str]:
    """The table of budgets and how they were made, when the study has budgets."""
    if not study.budgets:
        return []
    cooldown = study.budgets.get("cooldown", 0.2)
    return [
        f"Every run trained at a constant learning rate after warmup and cooled down linearly to 0 over the last "
        f"{100 * cooldown:.0f}% of its steps; each shorter budget (fractions {study.budgets.get('fractions')} of the "
        f"run's steps) is a branch from the run's checkpoint where that budget's own cooldown of {100 * cooldown:.0f}% "
        f"starts (Hägele et al. 2024; train/branch.py). Each row is a model trained for that many samples; the last "
        f"column is its validation loss's change per doubling of samples from the budget before, (v1 / v0) ** (1 / "
        f"log2(s1 / s0)) - 1 (a run has flattened when it falls less than {100 * FLAT_LOSS:.0f}% per doubling):\n",
        budgets_table(runs),
    ]


def check_table(checks: list[tuple[str, bool, str]]) -> str:
    rows = ["| check | holds | numbers |", "|---|---|---|"]
    rows += [f"| {what} | {'yes' if ok else '**no**'} | {numbers} |" for what, ok, numbers in checks]
    return "\n".join(rows) + "\n"


def linearise_section(text: str) -> str:
    """scripts/linearise.py's page as the report's last section: its title one level down, its command without the
    rest of its header (the report's header names the commit and machine), its figure's path from the report's
    folder."""
    title, header, *body = text.split("\n\n")
    command = header.split("`")[1] if header.count("`") >= 2 else ""  # its header: the report's own covers the rest
    body = "\n\n".join([f"`{command}`" if command else "", *body]).replace(
        "](linearise.png)", "](linearise/linearise.png)"
    )
    return f"\n#{title}\n\n{body}"


def scales_of(rows: list[dict], attention: str) -> list[float]:
    """The multiples of the learning rate the sweep tried for one attention (its rows)."""
    return sorted({r["scale"] for r in rows if r["attention"] == attention})


def scales_text(rows: list[dict]) -> str:
    attentions = list(dict.fromkeys(r["attention"] for r in rows))
    every = {tuple(scales_of(rows, a)) for a in attentions}
    if len(every) == 1:
        return str(list(every.pop()))
    return "; ".join(f"{a}: {scales_of(rows, a)}" for a in attentions)


def at_size(row: dict, several: bool) -> str:
    return f" at {row.get('size')}" if several else ""


def size_cell(row: dict, several: bool) -> str:
    return f" {row.get('size')} |" if several else ""


def around_text(rows: list[dict]) -> str:
    """' (the rate the sweep of F chose ...)' for a sweep around another study's rates (rows with `around`)."""
    around = list(dict.fromkeys(f for r in rows for f in r.get("around") or []))
    if not around:
        return ""
    return f" (the rate the sweep of {', '.join(f'`{f}`' for f in around)} chose at that size: `rates_from`)"


def sweep_table(rows: list[dict], sweep: dict, runs: list[dict] = ()) -> str:
    """The report's section on the learning-rate sweep (train/lr_sweep.py; `sweep` its settings, '' without one);
    `runs` (the study's full-budget runs) name any chosen size whose run trained at another rate (trained_apart)."""
    if not rows:
        return ""
    sizes = list(dict.fromkeys(r.get("size") for r in rows))  # rows of older studies name none: lr_sweep.size
    sizes = [sweep["size"]] if sizes == [None] else sizes
    several = len(sizes) > 1
    source = list(dict.fromkeys(r["from"] for r in rows if r.get("from")))
    lines = [
        "## Learning rate per attention\n",
        (
            f"The rates come from the sweep of {', '.join(f'`{f}`' for f in source)} (`rates_from`: its runs are not "
            "trained again here, nor on this study's clock). There, e"
            if source
            else "E"
        )
        + f"ach attention trained at {', '.join(map(str, sizes))} with {scales_text(rows)} x its learning rate"
        + around_text(rows)
        + "; the "
        f"lowest final {'validation loss' if sweep.get('metric', 'val_loss') == 'val_loss' else 'zero-shot error'} "
        + (
            "chose the multiple at each swept size; where an attention's sizes chose the same multiple it transfers "
            "and every size uses it, else each swept size uses its own and the other sizes the nearest swept "
            "size's (train/lr_sweep.py).\n"
            if several
            else "chose the multiple every size of that attention then used (train/lr_sweep.py).\n"
        ),
        "![learning-rate sweep](lr_sweep.png)\n",
        f"| attention |{' size |' if several else ''} multiple | learning rate | final val loss | zero-shot top-1 "
        "| chosen |",
        "|---|---|---|---|---|---|" + ("---|" if several else ""),
    ]
    lines += [
        f"| {r['attention']} |{size_cell(r, several)} "
        f"{r['scale']:g}x | {r['lr']:.3g} | {r['val_loss']:.3f} | {100 * r['top1']:.1f}% | "
        f"{'**yes**' if r['chosen'] else ''} |"
        for r in rows
    ]
    if several:
        moved = sorted({r["attention"] for r in rows if r["chosen"] and not r.get("transfers", True)})
        lines.append(
            f"\nDoes not transfer across sizes: {', '.join(moved)}."
            if moved
            else "\nEvery attention's choice transfers."
        )
    edge = [
        f"{r['attention']} ({r['scale']:g}x{at_size(r, several)})"
        for r in rows
        if r["chosen"] and r["scale"] in (min(scales_of(rows, r["attention"])), max(scales_of(rows, r["attention"])))
    ]
    if edge:
        lines.append(
            f"\nChosen at the edge of the sweep: {', '.join(edge)}; a rate beyond it may be better still (widen "
            "lr_sweep.scales to find out)."
        )
    lines += trained_apart(rows, runs)
    return "\n".join(lines) + "\n"


def trained_apart(rows: list[dict], runs) -> list[str]:
    """A line naming each attention and swept size whose run trained at another rate than the sweep chose there (the
    study config's lr_by_size on top of the adopted rates, e.g. a rate chosen over seeds), [] where none did."""
    apart = [
        f"{run['attention']} at {run['size']} {run['lr']:.3g} (the sweep chose {row['lr']:.3g})"
        for row in rows
        if row["chosen"]
        for run in runs
        if (run["size"], run["attention"]) == (row.get("size"), row["attention"])
        and not math.isclose(run.get("lr", row["lr"]), row["lr"], rel_tol=1e-6)
    ]
    if not apart:
        return []
    return [f"\nTrained at another rate than the sweep chose (the study config's lr_by_size): {'; '.join(apart)}."]
