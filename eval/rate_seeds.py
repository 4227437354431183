"""The learning rate chosen over seeds: finished runs of a size and attention at several rates and seeds, each rate's
final validation loss per seed, its mean with a 95% Student-t interval over seeds, and its change from the chosen
rate paired by seed.

    python -m scripts.rate_seeds runs/sweep-seed*/lr_sweep/x*/runs/demo-w64-l2-* --out docs/rate_seeds.md

A study's sweep (train/lr_sweep.py) chooses from one run per rate, at one seed; where the rates' losses lie closer
than the seeds spread them, another seed chooses another rate. Any finished run folders serve here (a sweep's, a
study grid's, single `python -m train` runs): each is read for its model, image attention, steps, learning rate and
data seed (config.yaml) and its last validation loss and zero-shot top-1 (metrics.jsonl). Runs group by size,
attention and steps; within a group the seeds that ran every rate decide (a seed missing one is listed, not used),
and the chosen rate is the one with the lowest mean loss over them. A rate at the edge of those tried is marked so:
the best may lie beyond it.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import yaml

from eval import pages
from eval.scaling_io import load_points
from eval.scaling_plot import finish, plain_ticks
from eval.seeds import Spread, spread

FIGURE = "rates.png"
COLUMNS = 4  # panels a row in the figure


class RateError(ValueError):
    """Run folders that cannot be compared: one line naming the problem and the fix."""


def read_run(folder: Path) -> dict:
    """One finished run: its group (size, attention, steps), learning rate, seed and final validation loss and top-1."""
    folder = Path(folder)
    if not (folder / "config.yaml").is_file() or not (folder / "metrics.jsonl").is_file():
        raise RateError(f"{folder}: not a run folder (no config.yaml or metrics.jsonl); give finished runs' folders")
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    last = load_points([folder], y="val_loss", points="last")
    if last.empty:
        raise RateError(f"{folder}: no validation loss in metrics.jsonl; give runs that evaluated (eval.every)")
    error = load_points([folder], y="error", points="last")
    return {
        "folder": str(folder),
        "size": cfg["model"]["name"],
        "attention": cfg["model"]["image_attention"],
        "steps": int(cfg["train"]["max_steps"]),
        "lr": float(cfg["optim"]["lr"]),
        "seed": int(cfg["data"]["seed"]),
        "val_loss": float(last.iloc[-1]["val_loss"]),
        "top1": float(error.iloc[-1]["zeroshot/top1"]) if not error.empty else math.nan,
    }


def read_runs(folders: list[Path]) -> list[dict]:
    rows, seen = [], {}
    for folder in folders:
        row = read_run(folder)
        key = (row["size"], row["attention"], row["steps"], row["lr"], row["seed"])
        if key in seen:
            raise RateError(f"{seen[key]} and {folder} are the same size, attention, steps, rate and seed; give one")
        seen[key] = folder
        rows.append(row)
    return sorted(rows, key=lambda r: (r["size"], r["attention"], r["steps"], r["lr"], r["seed"]))


def groups(rows: list[dict]) -> list[dict]:
    """Per size, attention and steps: each rate's losses over the seeds that ran every rate, their mean and interval,
    the change from the chosen rate paired by seed (percent), the chosen rate and whether it sits at an edge."""
    out = []
    for key in dict.fromkeys((r["size"], r["attention"], r["steps"]) for r in rows):
        mine = [r for r in rows if (r["size"], r["attention"], r["steps"]) == key]
        rates = sorted({r["lr"] for r in mine})
        by = {(r["lr"], r["seed"]): r for r in mine}
        seeds = sorted(s for s in {r["seed"] for r in mine} if all((lr, s) in by for lr in rates))
        left_out = sorted({r["seed"] for r in mine} - set(seeds))
        loss = {lr: [by[lr, s]["val_loss"] for s in seeds] for lr in rates}
        top1 = {lr: [by[lr, s]["top1"] for s in seeds] for lr in rates}
        chosen = min(rates, key=lambda lr: np.mean(loss[lr]) if seeds else math.inf)
        per_rate = []
        for lr in rates:
            change = [100 * (a / b - 1) for a, b in zip(loss[lr], loss[chosen], strict=True)]
            s = spread(loss[lr])
            c = spread(change if lr != chosen else [])
            per_rate.append(
                {"lr": lr, "loss": loss[lr], "top1": top1[lr], "mean": s.mean, "lo": s.lo, "hi": s.hi}
                | {"change": c.mean, "change_lo": c.lo, "change_hi": c.hi}
            )
        edge = len(rates) > 1 and chosen in (rates[0], rates[-1])
        out.append(
            {"size": key[0], "attention": key[1], "steps": key[2], "seeds": seeds, "left_out": left_out}
            | {"rates": per_rate, "chosen": chosen, "edge": edge}
        )
    return out


def figure(found: list[dict], path: Path) -> None:
    """Final validation loss against learning rate, one panel per group: each seed (thin), the mean over seeds with
    its 95% interval, the chosen rate ringed, and the mean zero-shot top-1 on the right axis (dashed); at most
    COLUMNS panels a row."""
    cols = min(COLUMNS, len(found))
    rows = -(-len(found) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), dpi=110, squeeze=False)
    for ax in axes.flat[len(found) :]:
        ax.set_visible(False)
    for ax, g in zip(axes.flat, found):
        lrs = [r["lr"] for r in g["rates"]]
        for i, seed in enumerate(g["seeds"]):
            ax.plot(lrs, [r["loss"][i] for r in g["rates"]], color="grey", lw=0.7, alpha=0.6, marker=".", ms=3)
            ax.annotate(f"seed {seed}", (lrs[-1], g["rates"][-1]["loss"][i]), fontsize=6, color="grey")
        mean = [r["mean"] for r in g["rates"]]
        err = [[r["mean"] - r["lo"] for r in g["rates"]], [r["hi"] - r["mean"] for r in g["rates"]]]
        ax.errorbar(lrs, mean, yerr=err, color="tab:blue", lw=1.6, marker="o", ms=4, capsize=3, label="mean, 95% CI")
        best = next(r for r in g["rates"] if r["lr"] == g["chosen"])
        ax.plot([g["chosen"]], [best["mean"]], "o", ms=12, mfc="none", color="tab:red", label="chosen")
        ax.set(xscale="log", xlabel="learning rate (log)", ylabel="final validation loss")
        top1 = [100 * np.mean(r["top1"]) if r["top1"] else math.nan for r in g["rates"]]
        right = ax.twinx()
        right.plot(lrs, top1, color="tab:orange", lw=1.2, ls="--", marker="s", ms=3)
        right.set_ylabel("zero-shot top-1, mean (%, dashed)", fontsize=7, color="tab:orange")
        right.tick_params(axis="y", labelsize=7, colors="tab:orange")
        ax.set_title(f"{g['size']}, {g['attention']}, {g['steps']:,} steps, {len(g['seeds'])} seeds", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        plain_ticks(ax)
    finish(fig, axes.flat[len(found) - 1], path)


def write(folders: list[Path], out: Path, command: str) -> Path:
    rows = read_runs(folders)
    found = groups(rows)
    (out.parent / out.stem).mkdir(parents=True, exist_ok=True)
    figure(found, out.parent / out.stem / FIGURE)
    return pages.write_page(out, rebuild, pages.stamp(), {"command": command, "groups": found}, rows)


def interval(mean: float, lo: float, hi: float, fmt: str, unit: str = "") -> str:
    """As the seeds pages print a mean and its interval (eval/seeds.py Spread.text); '-' where there is none."""
    return Spread([mean], mean, lo, hi, [""]).text(fmt, unit) if math.isfinite(mean) else "-"


def rebuild(page: Path) -> str:
    saved = pages.load_data(page)
    meta, rows = saved["meta"], saved["rows"]
    lines = [pages.header("The learning rate over seeds", meta["command"], made=saved["made"])]
    lines.append(__doc__.split("\n\n", 2)[2].replace("\n", " ").strip() + "\n")
    lines.append("## Findings\n")
    lines.append(findings(meta["groups"]))
    lines.append("## Per rate\n")
    lines.append(
        "| size | attention | steps | learning rate | final validation loss per seed | mean [95% CI] | "
        "change from the chosen rate, paired by seed [95% CI] | zero-shot top-1, mean | top-1 change from the chosen "
        "rate in points, paired by seed [95% CI] |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for g in meta["groups"]:
        for r in g["rates"]:
            mark = " (chosen)" if r["lr"] == g["chosen"] else ""
            change = interval(r["change"], r["change_lo"], r["change_hi"], "{:+.1f}", "%")
            top1 = f"{100 * np.mean(r['top1']):.1f}%" if r["top1"] else "-"
            lines.append(
                f"| {g['size']} | {g['attention']} | {g['steps']:,} | {r['lr']:.4g}{mark} | "
                f"{', '.join(f'{v:.3f}' for v in r['loss'])} | {interval(r['mean'], r['lo'], r['hi'], '{:.3f}')} | "
                f"{change} | {top1} | {top1_change(g, r).text('{:+.1f}') if not mark else ''} |"
            )
    lines.append("\n## Runs\n")
    lines.append("| run folder | size | attention | steps | learning rate | seed | final validation loss |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r['folder']} | {r['size']} | {r['attention']} | {r['steps']:,} | {r['lr']:.4g} | {r['seed']} | "
            f"{r['val_loss']:.3f} |"
        )
    lines.append(f"\n![final validation loss against learning rate]({Path(page).stem}/{FIGURE})\n")
    return "\n".join(lines)


def top1_change(group: dict, rate: dict) -> Spread:
    """A rate's zero-shot top-1 minus the chosen rate's, in points, paired by seed (NaN where a top-1 is missing)."""
    best = next(r for r in group["rates"] if r["lr"] == group["chosen"])
    return spread([100 * (a - b) for a, b in zip(rate["top1"], best["top1"], strict=True)])


def top1_disagrees(group: dict) -> str:
    """' By zero-shot top-1 ... is higher: ...' for each rate whose top-1 is higher than the chosen rate's at the
    95% level, paired by seed: the validation loss chose otherwise; '' where none is."""
    higher = []
    for r in group["rates"]:
        s = top1_change(group, r)
        if r["lr"] != group["chosen"] and math.isfinite(s.lo) and s.lo > 0:
            higher.append(f"{r['lr']:.4g} {s.text('{:+.1f}')} points")
    return f" By zero-shot top-1 a rate the loss did not choose is higher: {'; '.join(higher)}." if higher else ""


def findings(found: list[dict]) -> str:
    """Per group: the chosen rate, each other rate's paired change from it and whether its interval excludes 0."""
    out = []
    for g in found:
        best = next(r for r in g["rates"] if r["lr"] == g["chosen"])
        others = []
        for r in g["rates"]:
            if r["lr"] == g["chosen"] or not math.isfinite(r["change"]):
                continue
            side = "one seed" if not math.isfinite(r["change_lo"]) else "higher" if r["change_lo"] > 0 else "lower"
            side = "not distinguishable" if r["change_lo"] <= 0 <= r["change_hi"] else side
            change = interval(r["change"], r["change_lo"], r["change_hi"], "{:+.1f}", "%")
            others.append(f"{r['lr']:.4g} {change} ({side})")
        where = "at the edge of the rates tried" if g["edge"] else "inside the rates tried"
        n = f"{len(g['seeds'])} seed{'s' if len(g['seeds']) != 1 else ''}"
        dropped = f"; seeds {', '.join(map(str, g['left_out']))} left out (a rate missing)" if g["left_out"] else ""
        out.append(
            f"- {g['size']}, {g['attention']}, {g['steps']:,} steps, {n}{dropped}: chosen "
            f"{g['chosen']:.4g} ({where}), final validation loss "
            f"{interval(best['mean'], best['lo'], best['hi'], '{:.3f}')}; the other rates, paired by seed: "
            f"{'; '.join(others) or 'none'}." + top1_disagrees(g)
        )
    return "\n".join(out) + "\n"
