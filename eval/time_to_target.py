"""Time to a target zero-shot error against the image tower's tokens: where does linear attention's cheaper step pay
for the extra samples it needs? (the paper's claim (d), measured at each token count a study trained at)

For each run: the samples at which its curve first reaches the target (eval/multiplier.py first_reach; with budgets,
the cooled-down ends) over its median training samples per second in the study (runs share the machine alike), so
seconds of training to the target; the interval is the parametric bootstrap over the zero-shot images of the samples
to the target (the throughput's own noise is not in it). The target: the hardest one of the study's targets that
softmax reaches, after its first evaluation, at every token count (so every point answers the same question).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from eval.multiplier import first_reach
from eval.scaling_plot import plain_ticks

N_BOOT = 1000
FIGURE = "time_to_target.png"


def reach(run: dict, target: float) -> float:
    return first_reach([s for s, _ in run["curve"]], [1 - t for _, t in run["curve"]], target)


def seconds(run: dict, target: float, n_images: int, n_boot: int = N_BOOT) -> tuple[float, np.ndarray]:
    """(seconds to the target, its bootstrap replicates); inf when the run never reaches it (and in the replicates
    that miss it). Replicate i of every run uses generator seed i, so ratios of runs pair their replicates."""
    samples, top1 = zip(*run["curve"])
    errors, rate = 1 - np.asarray(top1), run["samples_per_s"]
    draws = [
        first_reach(samples, np.random.default_rng(i).binomial(n_images, errors) / n_images, target)
        for i in range(n_boot)
    ]
    return reach(run, target) / rate, np.asarray(draws) / rate


def shared_target(runs: list[dict], targets: list[float]) -> float | None:
    """The lowest target softmax reaches after its first evaluation at every token count it trained at."""
    softmax = [r for r in runs if r["attention"] == "softmax" and r.get("image_tokens")]
    ok = [
        t for t in targets if softmax and all(math.isfinite(reach(r, t)) and 1 - r["curve"][0][1] > t for r in softmax)
    ]
    return min(ok, default=None)


def rows_of(runs: list[dict], target: float, n_images: int) -> list[dict]:
    """One row per run with image tokens: attention, tokens, samples to the target, samples/s, seconds [lo, hi]."""
    out = []
    for r in sorted((r for r in runs if r.get("image_tokens")), key=lambda r: (r["attention"], r["image_tokens"])):
        s, draws = seconds(r, target, n_images)
        lo, hi = np.quantile(draws, [0.025, 0.975], method="nearest")
        first = 1 - r["curve"][0][1] <= target  # there at its first evaluation: an upper bound (eval/multiplier.py)
        out.append({"attention": r["attention"], "tokens": r["image_tokens"], "samples": reach(r, target)})
        out[-1]["bound"] = "<=" if first else ""
        out[-1] |= {"rate": r["samples_per_s"], "seconds": s, "lo": float(lo), "hi": float(hi), "draws": draws}
    return out


def crossing(tokens: np.ndarray, ratios: np.ndarray) -> float:
    """The token count where a least-squares line of log ratio on log tokens crosses 1; inf when the ratio does not
    fall with tokens (or a ratio is not finite)."""
    if not np.all(np.isfinite(ratios)) or np.any(ratios <= 0):
        return math.inf
    slope, intercept = np.polyfit(np.log(tokens), np.log(ratios), 1)
    return math.exp(-intercept / slope) if slope < 0 else math.inf


def break_even(rows: list[dict], attention: str) -> tuple[float, float, float] | None:
    """The image tokens at which `attention`'s time to the target equals softmax's (crossing of their ratio) and its
    95% bootstrap interval (replicates paired across runs); None without both at two or more token counts."""
    soft = {r["tokens"]: r for r in rows if r["attention"] == "softmax"}
    mine = [r for r in rows if r["attention"] == attention and r["tokens"] in soft]
    if len(mine) < 2:
        return None
    tokens = np.array([r["tokens"] for r in mine], dtype=float)
    point = crossing(tokens, np.array([r["seconds"] / soft[r["tokens"]]["seconds"] for r in mine]))
    # a replicate where softmax misses the target at some token count has no ratio there: left out (as
    # eval/multiplier.py leaves out those where the reference misses), not read as "never breaks even"
    kept = [i for i in range(N_BOOT) if all(math.isfinite(soft[r["tokens"]]["draws"][i]) for r in mine)]
    reps = [crossing(tokens, np.array([r["draws"][i] / soft[r["tokens"]]["draws"][i] for r in mine])) for i in kept]
    if not reps:
        return point, math.nan, math.nan
    lo, hi = np.quantile(reps, [0.025, 0.975], method="nearest")
    return point, float(lo), float(hi)


def break_even_lines(rows: list[dict]) -> list[str]:
    span = (min(r["tokens"] for r in rows), max(r["tokens"] for r in rows))
    lines = []
    for attention in dict.fromkeys(r["attention"] for r in rows if r["attention"] != "softmax"):
        found = break_even(rows, attention)
        if found is None:
            continue
        n, lo, hi = (f"{v:,.0f}" if math.isfinite(v) else "none" for v in found)
        where = "within" if span[0] <= found[0] <= span[1] else "outside (extrapolated beyond)"
        bounds = any(r["bound"] for r in rows if r["attention"] == attention)
        lines.append(
            f"- {attention}: break-even at {n} image tokens [95% CI {lo}, {hi}], {where} the measured "
            f"{span[0]}-{span[1]} tokens"
            + (
                "; from upper bounds (a run there at its first evaluation): the break-even may lie lower"
                if bounds
                else ""
            )
        )
    return lines


def figure(rows: list[dict], target: float, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.6, 4.2), dpi=110)
    attentions = list(dict.fromkeys(r["attention"] for r in rows))
    for i, attention in enumerate(attentions):
        mine = [r for r in rows if r["attention"] == attention and math.isfinite(r["seconds"])]
        if not mine:
            continue
        x, y = [r["tokens"] for r in mine], np.array([r["seconds"] for r in mine])
        err = [y - [r["lo"] for r in mine], np.minimum([r["hi"] for r in mine], 1e12) - y]
        colour = plt.get_cmap("tab10")(i % 10)
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, color=colour, label=attention)
        found = break_even(rows, attention) if attention != "softmax" else None
        if found and math.isfinite(found[0]):
            outside = not min(x) <= found[0] <= max(x)
            label = f"{attention} break-even {found[0]:,.0f}{' (extrapolated)' if outside else ''}"
            ax.axvline(found[0], color=colour, ls=":" if outside else "--", lw=1, label=label)
    ax.set(xscale="log", yscale="log", xlabel="image tokens", ylabel=f"training seconds to {100 * target:.0f}% error")
    ax.grid(True, which="both", alpha=0.3)
    plain_ticks(ax)
    ax.legend(fontsize=7)
    ax.set_title("time to the target (samples / samples per s); 95% bootstrap over images", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def several_lengths(runs: list[dict]) -> bool:
    return len({r.get("image_tokens") for r in runs if r.get("image_tokens")}) >= 2


def draw(runs: list[dict], targets: list[float], n_images: int, out: Path) -> None:
    """FIGURE in `out`, for a study at two or more token counts whose softmax reaches a shared target."""
    target = shared_target(runs, targets) if several_lengths(runs) else None
    if target is not None:
        figure(rows_of(runs, target, n_images), target, out / FIGURE)


def section(runs: list[dict], targets: list[float], n_images: int) -> list[str]:
    """The report's section (its figure: `draw`), for a study at two or more token counts."""
    if not several_lengths(runs):
        return []
    target = shared_target(runs, targets)
    if target is None:
        return [
            "## Time to a target against image tokens\n",
            "Softmax reaches none of the targets at every token count.\n",
        ]
    rows = rows_of(runs, target, n_images)
    soft = {r["tokens"]: r["seconds"] for r in rows if r["attention"] == "softmax"}
    table = ["| attention | image tokens | samples to target | samples/s | seconds to target [95% CI] | / softmax's |"]
    table.append("|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["seconds"] / soft.get(r["tokens"], math.nan)
        if not math.isfinite(r["seconds"]):
            table.append(f"| {r['attention']} | {r['tokens']} | not reached | {r['rate']:.0f} | - | - |")
            continue
        hi = "inf" if not math.isfinite(r["hi"]) else f"{r['hi']:.0f}"
        b = r["bound"]
        table.append(
            f"| {r['attention']} | {r['tokens']} | {b}{r['samples']:,.0f} | {r['rate']:.0f} | {b}{r['seconds']:.0f} "
            f"[{r['lo']:.0f}, {hi}] | {b}{ratio:.2f}x |"
        )
    return [
        "## Time to a target against image tokens\n",
        f"Target {100 * target:.0f}% zero-shot error (the hardest softmax reaches at every token count). "
        + __doc__.split("\n\n")[1].replace("\n", " ")
        + "\n",
        "\n".join(table) + "\n",
        "'<=': the run was at the target at its first evaluation (with budgets, its first cooled-down end), so its "
        "samples and seconds are upper bounds. Break-even: the token count at which the ratio of times to "
        "softmax's, a line in log-log through the "
        "measured token counts, crosses 1 ('none': the ratio does not fall with tokens); the interval from the "
        "same bootstrap, replicates paired across runs.\n",
        "\n".join(break_even_lines(rows)) + "\n",
        f"![time to target against tokens]({FIGURE})\n",
    ]
