"""The page of the study over seeds (eval/seeds.py), written so that it can be written again from its data.

    python -m scripts.study_seeds runs/demo-seed0 ... runs/demo-seed4 --out docs/study_seeds.md

`write_page` copies what the page reads of each seed's folder (runs.json, fits.json, lr_sweep.json) into
docs/<page>/data/<seed>/, with seeds.json (the header's stamp, the command, the folders as given, the targets and
the zero-shot set's size), draws the learning curves with seed bands (docs/<page>/curves.png), the samples
multipliers against target and the loss against parameters (multipliers.png, loss_params.png: eval/seeds_figures.py)
and claim (c)'s exponent at each budget (budget_exponents.png: eval/budget_exponents.py), and writes the page;
a "## Findings" section already on the page stays (eval/study_page.py). `rebuild(page)` writes it again from
docs/<page>/data/ alone: tests/test_docs_regenerate.py compares it with the committed page.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from scipy import stats

from eval import budget_exponents, optimizer_study, pages, seeds, seeds_figures, study_plots
from eval.claims import FLAT_LOSS
from eval.scaling_plot import plain_ticks
from eval.study_page import findings_of, page_text

FILES = ("runs.json", "fits.json", "lr_sweep.json")
FIGURE = "curves.png"
# the README's results table sits between these lines; tests/test_docs_regenerate.py writes it again from the data
README_START, README_END = "<!-- results: written by eval/seeds_page.py from docs/{page}/data -->", "<!-- /results -->"


def band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds (axis 0) and its 95% Student-t interval (none from one seed)."""
    mean = values.mean(axis=0)
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(axis=0, ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def ends(run: dict, row: int) -> dict[int, float]:
    """samples -> zero-shot error (row 0) or validation loss (row 1) at the cooled-down end of each budget (a study
    without budgets: its evaluations)."""
    if run.get("budgets"):
        return {b[0]: 1 - b[1] if row == 0 else b[2] for b in run["budgets"]}
    return {s: 1 - v for s, v in run["curve"]} if row == 0 else dict(run.get("val_curve", []))


def curves_figure(runs_per_seed: list[list[dict]], path: Path) -> None:
    """Zero-shot error and validation loss at the end of each budget against samples seen, per size (columns) and
    attention (colours): the mean over seeds with its 95% interval as a band, its lower edge cut at a tenth of the
    mean (with few seeds the interval of an error near 0 reaches below 0, which a log axis cannot show)."""
    first = runs_per_seed[0]
    attentions = list(dict.fromkeys(r["attention"] for r in first))
    sizes = list(dict.fromkeys(r["size"] for r in sorted(first, key=lambda r: r["params_without_token_embedding"])))
    fig, axes = plt.subplots(2, len(sizes), figsize=(4.6 * len(sizes), 7.4), dpi=110, squeeze=False)
    for col, size in enumerate(sizes):
        for attention in attentions:
            found = [
                next((r for r in runs if r["attention"] == attention and r["size"] == size), None)
                for runs in runs_per_seed
            ]
            if any(r is None for r in found):
                continue
            for row in (0, 1):
                per_run = [ends(r, row) for r in found]
                shared = sorted(set.intersection(*(set(e) for e in per_run)))
                if not shared:
                    continue
                y = np.array([[e[s] for s in shared] for e in per_run], dtype=float)
                mean, lo, hi = band(y)
                ax, colour = axes[row][col], study_plots.colour(attentions, attention)
                ax.plot(shared, mean, color=colour, lw=1.5, marker=".", ms=3, label=attention)
                # on the log axis an interval reaching 0 is drawn down to a tenth of the mean (the title says so)
                ax.fill_between(shared, np.maximum(lo, mean / 10), hi, color=colour, alpha=0.2, lw=0)
        for row, label in enumerate(("zero-shot top-1 error", "validation loss (contrastive)")):
            ax = axes[row][col]
            ax.set(xscale="log", yscale="log", xlabel="samples seen (each budget's cooled-down end)", ylabel=label)
            ax.grid(True, which="both", alpha=0.3)
            plain_ticks(ax)
        title = f"{size}: mean of {len(runs_per_seed)} seeds, 95% band (floor: mean/10)"
        axes[0][col].set_title(title, fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def text_of(loaded: list[seeds.Seed], meta: dict) -> str:
    """The page's text (before its findings) from the seeds and seeds.json."""
    shown = [dataclasses.replace(s, folder=Path(f)) for s, f in zip(loaded, meta["folders"])]  # as given
    body = body_of(shown, meta["targets"], meta["command"], meta["n_images"], meta["made"])
    if meta.get("title"):  # the study config's `title:` (seeds.json written before studies had titles: none)
        body = f"# {meta['title']}\n" + body.split("\n", 1)[1]
    body += f"\n## Learning curves over seeds\n\n![learning curves with seed bands]({FIGURE})\n"
    if not optimizer_study.is_optimizer_study(loaded) and seeds_figures.points(loaded, meta["targets"]):
        body += (
            "\n## Samples multipliers over seeds\n\nEach linear attention's samples to the target over softmax's "
            "(the multiplier table's numbers): geometric mean over seeds with its 95% t interval, each seed a dot.\n"
            f"\n![samples multiplier against target]({seeds_figures.FIGURE})\n"
        )
    if seeds_figures.has_sizes(loaded):
        body += (
            "\n## Loss against parameters over seeds\n\nClaim (c)'s quantity: each full-budget run's final "
            "validation loss against its parameters without the token embedding, each seed's power-law fit, and the "
            "exponent over seeds.\n"
            f"\n![validation loss against parameters]({seeds_figures.PARAMS_FIGURE})\n"
        )
    if table := budget_exponents.table(loaded):
        body += (
            "\n## Exponents at each budget\n\nThe same power law of validation loss against non-embedding "
            "parameters, fitted per seed at the cooled-down end of each budget the runs share "
            "(eval/budget_exponents.py); the last row's budget is the one claim (c) reads. Shown, not ruled on: "
            "where the runs have not flattened it says whether the exponents and their difference drift as the "
            "sizes train longer, not where they settle.\n\n" + "\n".join(table) + "\n"
            f"\n![exponents against the budget they are read at]({budget_exponents.FIGURE})\n"
        )
    if falls := budget_exponents.falls_table(loaded):
        body += (
            "\nHow fast each size's validation loss falls per doubling of samples between consecutive budgets, mean "
            "over seeds with its 95% t interval: a run nearing a floor falls less and less (claim (c) counts a run "
            f"flat below {100 * FLAT_LOSS:.0f}% over its last doubling).\n\n" + "\n".join(falls) + "\n"
        )
    return body


def body_of(loaded: list[seeds.Seed], targets: list[float], command: str, n_images, made: dict | None) -> str:
    """The report over seeds: an optimizer study's (arms ATTENTION@OPTIMIZER: eval/optimizer_study.py), else the
    attention study's (eval/seeds.py)."""
    if optimizer_study.is_optimizer_study(loaded):
        return optimizer_study.report(loaded, targets, command, n_images, made)
    return seeds.report(loaded, targets, command, n_images, made=made)


def load_data(data: Path) -> tuple[list[seeds.Seed], dict]:
    meta = json.loads((data / "seeds.json").read_text())
    loaded = []
    for name in meta["seeds"]:
        folder = data / f"seed{name}"
        read = {f: json.loads((folder / f).read_text()) if (folder / f).is_file() else [] for f in FILES}
        arm = json.loads((folder / "linearise.json").read_text()) if (folder / "linearise.json").is_file() else None
        loaded.append(seeds.Seed(name, folder, read["runs.json"], read["fits.json"], read["lr_sweep.json"], arm))
    return loaded, meta


def write_page(
    loaded: list[seeds.Seed], page: Path, targets: list[float], command: str, n_images, title: str | None = None
) -> str:
    """Copy the seeds' data beside `page`, draw its figure, write it (keeping its findings) under `title` (None:
    the report's own); its text."""
    page = Path(page)
    names = [s.seed for s in loaded]
    twice = next((s for s in loaded if names.count(s.seed) > 1), None)
    if twice is not None:
        folders = ", ".join(str(s.folder) for s in loaded if s.seed == twice.seed)
        raise seeds.SeedError(f"{folders} are all seed {twice.seed}: give one study folder per seed")
    data = page.parent / page.stem / "data"
    if data.exists():
        shutil.rmtree(data)
    for s in loaded:
        (data / f"seed{s.seed}").mkdir(parents=True)
        for name in FILES:
            if (s.folder / name).is_file():
                shutil.copyfile(s.folder / name, data / f"seed{s.seed}" / name)
        if s.linearise:
            (data / f"seed{s.seed}" / "linearise.json").write_text(json.dumps(s.linearise, indent=1))
    meta = {
        "made": pages.stamp(),
        "command": command,
        "folders": [str(s.folder) for s in loaded],
        "seeds": [s.seed for s in loaded],
        "targets": list(targets),
        "n_images": n_images,
    } | ({"title": title} if title else {})
    (data / "seeds.json").write_text(json.dumps(meta, indent=2))
    curves_figure([s.runs for s in loaded], page.parent / page.stem / FIGURE)
    if not optimizer_study.is_optimizer_study(loaded):
        seeds_figures.multipliers_figure(loaded, targets, page.parent / page.stem / seeds_figures.FIGURE)
    seeds_figures.params_figure(loaded, page.parent / page.stem / seeds_figures.PARAMS_FIGURE)
    budget_exponents.figure(loaded, page.parent / page.stem / budget_exponents.FIGURE)
    text = page_text(text_of(*load_data(data)), page.stem, findings_of(page))
    page.write_text(text)
    return text


def rebuild(page: Path) -> str:
    page = Path(page)
    return page_text(text_of(*load_data(page.parent / page.stem / "data")), page.stem, findings_of(page))


def results_table(loaded: list[seeds.Seed], meta: dict) -> str:
    """The README's table of the main job's results over seeds: per attention at the largest size, the best zero-shot
    and few-shot top-1, the samples multiplier to the hardest target softmax reaches at every seed, and the exponent
    of validation loss against parameters (claim (c)); each the mean over seeds with its 95% interval; then the
    claims' verdicts."""
    attentions = list(dict.fromkeys(r["attention"] for r in loaded[0].runs))
    size = seeds.sizes_of(loaded, "softmax")[-1]
    target = seeds.hardest_shared_target(loaded, size, meta["targets"])
    probes = sorted({k for r in loaded[0].runs for k in r.get("fewshot", {})}, key=lambda k: int(k.split("shot")[0]))
    head = ["attention", f"zero-shot top-1 ({size})", *(f"{k[:-4]}-shot probe" for k in probes)]
    head += [f"samples to {100 * target:.0f}% error vs softmax" if target else "samples multiplier"]
    head += ["val loss vs params exponent", "minus softmax's"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in attentions:
        runs = [seeds.run_of(s, a, size) for s in loaded]
        top1 = seeds.spread([r["top1"] for r in runs]).text("{:.1%}")
        shots = [seeds.spread([r["fewshot"][k] for r in runs]).text("{:.1%}") for k in probes]
        k = seeds.multiplier_spread(loaded, a, size, target) if target and a != "softmax" else None
        alpha = seeds.exponent_spread(loaded, a, seeds.PARAMS_FIT).text("{:+.3f}")
        diff = seeds.diff_spread(loaded, a, seeds.PARAMS_FIT).text("{:+.3f}") if a != "softmax" else ""
        rows.append("| " + " | ".join([a, top1, *shots, k.text(unit="x") if k else "", alpha, diff]) + " |")
    verdicts = "; ".join(
        f"{c.split(')')[0]}) {v}" for c, v, _ in seeds.claim_rows(loaded, meta["targets"], meta["n_images"])
    )
    return "\n".join(rows) + f"\n\nThe paper's claims over {len(loaded)} seeds: {verdicts}.\n"


def readme_block(page: Path) -> str:
    """The README's results block for the seeds page `page`, markers included."""
    page = Path(page)
    loaded, meta = load_data(page.parent / page.stem / "data")
    start = README_START.format(page=page.stem)
    return f"{start}\n{results_table(loaded, meta)}{README_END}"


def not_data_folders(folders: list[Path]) -> str:
    """The error line for folders that are not a seeds page's data folder; '' when all are."""
    missing = [str(f) for f in folders if not (Path(f) / "seeds.json").is_file()]
    return (
        f"{', '.join(missing)}: not a seeds page's data folder (no seeds.json); give docs/<page>/data"
        if missing
        else ""
    )
