"""The optimizer study over seeds: per attention, which optimizer reaches a zero-shot error with fewer samples.

    .venv/bin/python -m scripts.demo --study configs/study/optimizers.yaml --seed 0 --out runs/optimizers-seed0
    .venv/bin/python -m scripts.study_seeds runs/optimizers-seed0 runs/optimizers-seed1 runs/optimizers-seed2 \\
        --study configs/study/optimizers.yaml --out docs/study_optimizers.md

A study with an optimizer axis (train/study.py `optimizers:`) trains arms ATTENTION@OPTIMIZER. Per attention the
study's first optimizer is the reference; for every other one this module gives, per seed and over seeds: the
samples multiplier to each target error the reference reaches at every seed (eval/seeds.py multiplier_spread with
that reference), the difference in final zero-shot top-1, few-shot accuracy and validation loss, each with a 95%
Student-t interval over seeds, and beside the multipliers and top-1 a two-level bootstrap (seeds, and within each
the zero-shot images). RULE says which is faster.
"""

from __future__ import annotations

import math

from eval import pages
from eval.seeds import (
    Seed,
    boot_multiplier,
    hardest_shared_target,
    multiplier_spread,
    per_seed,
    run_of,
    sources,
    spread,
)

ARM_SEPARATOR = "@"  # softmax@muon: the attention softmax trained with optim.name=muon

RULE = (
    "Per attention, at the hardest target error the reference optimizer (the study's first) reaches at every seed: "
    "the other optimizer converges faster when the 95% t interval over seeds of its samples multiplier over the "
    "reference lies wholly below 1 (fewer samples to the same error), slower when it lies wholly above 1, else "
    "undetermined. A seed whose run never reaches the target counts at its samples seen (a lower bound; the "
    "interval's upper end is then infinite)."
)


def attention_of(arm: str) -> str:
    """The registry name of a study arm: softmax@muon -> softmax (a plain attention name is its own)."""
    return arm.split(ARM_SEPARATOR, 1)[0]


def arms_of(seeds: list[Seed]) -> dict[str, list[str]]:
    """attention -> its arms, in the study's order (the reference optimizer first)."""
    out: dict[str, list[str]] = {}
    for arm in dict.fromkeys(r["attention"] for r in seeds[0].runs):
        out.setdefault(attention_of(arm), []).append(arm)
    return out


def size_of(seeds: list[Seed]) -> str:
    """The largest size every arm was trained at in every seed (the study's measured size)."""
    ordered = sorted(seeds[0].runs, key=lambda r: r["params_without_token_embedding"])
    arms = {r["attention"] for r in ordered}
    shared = [r["size"] for r in ordered if all(run_of(s, a, r["size"]) for s in seeds for a in arms)]
    return shared[-1]


def verdict(lo: float, hi: float) -> str:
    if hi < 1:
        return "faster"
    return "slower" if lo > 1 else "undetermined"


def verdict_rows(seeds: list[Seed], targets: list[float], n_images: int | None) -> list[str]:
    """| attention | optimizer against the reference | verdict | numbers |, one row per non-reference arm."""
    size = size_of(seeds)
    rows = ["| attention | optimizer | verdict | samples multiplier over the reference |", "|---|---|---|---|"]
    for attention, (reference, *others) in arms_of(seeds).items():
        target = hardest_shared_target(seeds, size, targets, reference)
        for arm in others:
            name = arm.partition(ARM_SEPARATOR)[2]
            if target is None:
                rows.append(
                    f"| {attention} | {name} | **undetermined** | {reference} reaches no target at every seed |"
                )
                continue
            k = multiplier_spread(seeds, arm, size, target, reference)
            boot = boot_multiplier(seeds, arm, size, target, n_images, reference) if n_images else None
            both = f"; bootstrap over seeds and images [{boot[0]:.2f}x, {boot[1]:.2f}x]" if boot else ""
            rows.append(
                f"| {attention} | {name} vs {reference.partition(ARM_SEPARATOR)[2]} | **{verdict(k.lo, k.hi)}** | "
                f"{size}, target {100 * target:.0f}% error: {k.text(unit='x')}{both} |".replace("infx", "inf")
            )
    return rows


def multiplier_rows(seeds: list[Seed], targets: list[float], n_images: int | None) -> list[str]:
    names, size = " / ".join(s.seed for s in seeds), size_of(seeds)
    both = " | bootstrap over seeds and images" if n_images else ""
    rows = [f"| arm | over | target error | multiplier, seeds {names} | geometric mean [95% CI]{both} |"]
    rows.append("|---|---|---|---|---|" + ("---|" if both else ""))
    for reference, *others in arms_of(seeds).values():
        for arm in others:
            for t in targets:
                k = multiplier_spread(seeds, arm, size, t, reference)
                if k is None:
                    continue
                boot = boot_multiplier(seeds, arm, size, t, n_images, reference) if n_images else None
                cell = f" | [{boot[0]:.2f}x, {boot[1]:.2f}x]".replace("infx", "inf") if boot else ""
                values = per_seed(k.values, "{:.2f}x", k.marks)
                rows.append(f"| {arm} | {reference} | {100 * t:.0f}% | {values} | {k.text(unit='x')}{cell} |")
    return rows


def final_tables(seeds: list[Seed]) -> list[str]:
    """Per quantity at the end of the budget (zero-shot top-1, each few-shot accuracy, validation loss): a table of
    each arm's values per seed, their mean, and the arm minus its reference, each with its interval over seeds."""
    names, size = " / ".join(s.seed for s in seeds), size_of(seeds)
    shots = sorted({k for s in seeds for r in s.runs for k in r.get("fewshot", {})})
    shots.sort(key=lambda k: int(k.removesuffix("shot")))  # eval.fewshot's keys: 1shot, 5shot, ...
    quantities = [("zero-shot top-1", lambda r: r["top1"], "{:.1%}", "{:+.1%}")]
    quantities += [
        (
            f"{k.removesuffix('shot')}-shot probe accuracy",
            lambda r, k=k: r["fewshot"].get(k, math.nan),
            "{:.1%}",
            "{:+.1%}",
        )
        for k in shots
    ]
    quantities.append(("validation loss", lambda r: r["val_loss"], "{:.3f}", "{:+.3f}"))
    tables = []
    for head, value, fmt, diff_fmt in quantities:
        rows = [f"| arm | {head}, seeds {names} | mean [95% CI] | minus the reference [95% CI] |", "|---|---|---|---|"]
        for reference, *others in arms_of(seeds).values():
            rows += [
                f"| {a} | {' | '.join(columns(seeds, a, reference, size, value, fmt, diff_fmt))} |"
                for a in [reference, *others]
            ]
        tables.append("\n".join(rows) + "\n")
    return tables


def columns(seeds: list[Seed], arm: str, reference: str, size: str, value, fmt: str, diff_fmt: str) -> list[str]:
    mine = spread([value(run_of(s, arm, size)) for s in seeds])
    diff = spread([value(run_of(s, arm, size)) - value(run_of(s, reference, size)) for s in seeds])
    return [per_seed(mine.values, fmt), mine.text(fmt), "" if arm == reference else diff.text(diff_fmt)]


def sweep_rows(seeds: list[Seed]) -> list[str]:
    """Per arm: the learning rate its runs trained with at each seed, and the sweep behind it (the multiples and
    their validation losses at the first seed that swept; a seed trained with another's choice swept nothing)."""
    names, size = " / ".join(s.seed for s in seeds), size_of(seeds)
    swept = next((s for s in seeds if s.sweep), None)
    rows = [f"| arm | learning rate, seeds {names} | multiple chosen, seeds {names} | validation loss per multiple"]
    rows[0] += f", seed {swept.seed} |" if swept else " |"
    rows.append("|---|---|---|---|")
    for arm in dict.fromkeys(r["attention"] for r in seeds[0].runs):
        rates = " / ".join(f"{run_of(s, arm, size).get('lr', math.nan):.3g}" for s in seeds)
        chosen = [
            next((f"{r['scale']:g}x" for r in s.sweep if r["attention"] == arm and r["chosen"]), "-") for s in seeds
        ]
        mine = sorted((r for r in (swept.sweep if swept else []) if r["attention"] == arm), key=lambda r: r["scale"])
        losses = ", ".join(f"{r['scale']:g}x {r['val_loss']:.3f}" for r in mine)
        rows.append(f"| {arm} | {rates} | {' / '.join(chosen)} | {losses} |")
    return rows


def report(seeds: list[Seed], targets: list[float], command: str, n_images: int | None, made: dict | None) -> str:
    """The page of an optimizer study over seeds; `made`: the header's pages.stamp()."""
    steps = sorted({r["samples_seen"] for s in seeds for r in s.runs})
    return "\n".join(
        [
            pages.header("The optimizer study over seeds", command, made=made),
            f"{sources(seeds)}, at {size_of(seeds)}, every arm to "
            f"{', '.join(f'{n:,}' for n in steps)} samples. Each number: its value per seed, then the mean over seeds "
            f"with a 95% Student-t interval ({len(seeds) - 1} degrees of freedom; multipliers on a log scale, a "
            "geometric mean). Beside them, where the zero-shot set's size is known, a two-level bootstrap (seeds, "
            "and within each the zero-shot images; 2,000 replicates); the verdicts read the t interval.\n",
            "## Which optimizer converges faster, per attention\n",
            "\n".join(verdict_rows(seeds, targets, n_images)) + "\n\nRule: " + RULE + "\n",
            "## Samples to a target error, over the same attention's reference optimizer\n",
            "\n".join(multiplier_rows(seeds, targets, n_images)) + "\n",
            "## At the end of the budget\n",
            *final_tables(seeds),
            "## Learning rates\n",
            "An arm's sweep tries multiples of the size's rate and keeps the lowest validation loss; a seed marked '-' "
            "trained with the rate another seed's sweep chose (`python -m scripts.demo --rates-from FOLDER`). A "
            "multiple at the edge of its sweep says the arm's best rate may lie beyond it.\n",
            "\n".join(sweep_rows(seeds)) + "\n",
        ]
    )


def is_optimizer_study(seeds: list[Seed]) -> bool:
    return any(ARM_SEPARATOR in r["attention"] for s in seeds for r in s.runs)
