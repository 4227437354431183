"""The main job's analysis of a finished study: power-law fits per attention, the learning-curve and summary
figures, the report's rows per run, and report.md with its JSON beside it (runs.json, fits.json, lr_sweep.json,
clock.json). Everything comes from the runs' metrics.jsonl (eval.scaling reads them); the study's jobs
(train/study.py) are read for their run folders, sizes, attentions and budget branches only.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from eval import pages, smoothing, study_page, study_plots, study_report, time_to_target
from eval.scaling import ScalingInputError, ScalingWarning, fit, format_table, load_points, plot
from models import run_folder
from models.config import ModelConfig, resolved_size

ATTENTION = study_plots.ATTENTION
COMPUTE_LABEL = "compute (GMACs x samples seen)"
# name -> (x, y, points, x label, y label, what it is). points: "ends", the last evaluation of every run and budget
# branch (each a model trained for that budget, cooled down: Hagele et al. 2024), or "last", of the full-budget runs
# only. A frontier reads the ends, not the evaluations during the constant-rate phase, which lie above them.
FITS = {
    "error_frontier": (
        "compute",
        "error",
        "ends",
        COMPUTE_LABEL,
        "zero-shot top-1 error",
        "compute frontier of zero-shot error (the cooled-down end of every budget of every run)",
    ),
    "val_loss_frontier": (
        "compute",
        "val_loss",
        "ends",
        COMPUTE_LABEL,
        "validation loss (contrastive)",
        "compute frontier of the validation loss (the cooled-down end of every budget of every run)",
    ),
    "error_params": (
        "params_without_token_embedding",
        "error",
        "last",
        "parameters without the token embedding",
        "zero-shot top-1 error",
        "zero-shot error against parameters at the end of training",
    ),
    # claim (c) as the paper states it (eval/claims.py: PARAMS_FIT): loss against non-embedding parameters
    "val_loss_params": (
        "params_without_token_embedding",
        "val_loss",
        "last",
        "parameters without the token embedding",
        "validation loss (contrastive)",
        "validation loss against parameters at the end of each full-budget run (claim (c))",
    ),
    # as the paper plots it: training loss against model size (its Fig. 3); "tail": the mean of the logged training
    # losses over the last TAIL of each full-budget run's steps (one batch's loss is noisy)
    "train_loss_params": (
        "params_without_token_embedding",
        "loss",
        "tail",
        "parameters without the token embedding",
        "training loss (contrastive, mean over the last 10% of steps)",
        "training loss against parameters at the end of each full-budget run (as the paper plots it)",
    ),
}
TAIL = 0.1


def tail_mean(frame: pd.DataFrame, y: str, tail: float = TAIL) -> pd.DataFrame:
    """One row per run: its last record with `y` the mean of `y` over the last `tail` of the run's steps."""
    if y not in frame.columns or "step" not in frame.columns:
        raise ScalingInputError(f"no run logged {y!r} with its step")
    rows = []
    for _, run in frame.groupby("@source", sort=False):
        last = run["step"].max()
        kept = run[run["step"] >= (1 - tail) * last]
        rows.append(run.sort_values("step").iloc[-1].copy())
        rows[-1][y] = kept[y].mean()
    return pd.DataFrame(rows).reset_index(drop=True)


def points(jobs, y: str, which: str) -> pd.DataFrame:
    """The runs' points, each grouped under its study arm (the attention, or ATTENTION@OPTIMIZER where the study
    has an optimizer axis), not only the attention its config names."""
    frame = load_points([job.run_dir for job in jobs], y=y, points=which)
    frame[ATTENTION] = frame["@source"].map({str(job.run_dir): job.attention for job in jobs})
    return frame


def error_floor(classes: int, study) -> float:
    """The zero-shot error a log-log fit or slope reads for an evaluation without a single mistake: half an image
    of the evaluation set (a continuity correction; 0 has no logarithm, and with n images an error below 1/n
    cannot be told from 0)."""
    return 0.5 / (classes * study.data.get("eval_per_class", 1))


def image_tokens(record: pd.Series) -> int | None:
    """The image tower's tokens (class token and patches) of a run, from its config columns; None for a size this
    checkout does not know (a study made elsewhere)."""
    size = record.get("model.image_size")
    try:
        cfg = ModelConfig(name=record["model.name"], image_size=None if pd.isna(size) else int(size))
        vision = resolved_size(cfg)["vision_cfg"]
    except (KeyError, ValueError):
        return None
    return (vision["image_size"] // vision["patch_size"]) ** 2 + 1


def run_rows(jobs, floor: float = 0.0) -> list[dict]:
    """One row per (size, attention) for the report: size, cost, the final evaluation and the learning curve.

    With budgets (cooldown branches, configs/study/*.yaml `budgets:`), `budgets` lists [samples, top1, val_loss] at
    the end of each budget, and `curve` is those cooled-down ends: the error a model trained for that many samples
    reaches, which the multipliers and the flattening check read (the run's own evaluations at constant learning
    rate stay in `run_curve`)."""
    curves = points(jobs, "error", "all").set_index("@source")
    val = points(jobs, "val_loss", "all").set_index("@source")
    rows = []
    for job in [j for j in jobs if j.after is None]:
        curve = curves.loc[[str(job.run_dir)]].sort_values("samples_seen")
        losses = val.loc[[str(job.run_dir)]].sort_values("samples_seen")
        final = curve.iloc[-1]
        tail = curve.iloc[len(curve) // 2 :]
        rows.append(
            {
                "size": job.size,
                "attention": job.attention,
                "run_dir": str(job.run_dir),
                "wall_seconds": job.wall_seconds,
                "cpu_seconds": job.cpu_seconds,
                "samples_per_s": throughput(job.run_dir),
                "image_tokens": image_tokens(final),
                "optimizer": str(final.get("optim.name", "adamw")),  # runs from elsewhere may not say
                "lr": float(final.get("optim.lr", math.nan)),
                "params_without_token_embedding": int(final["params_without_token_embedding"]),
                "gmacs_per_sample": float(final["gmacs_per_sample"]),
                "samples_seen": int(final["samples_seen"]),
                "top1": float(final["zeroshot/top1"]),
                "top5": float(final["zeroshot/top5"]),
                # eval.fewshot's linear probes at the same evaluation, k -> accuracy (eval/fewshot.py)
                "fewshot": {
                    c.removeprefix("fewshot/"): float(final[c])
                    for c in final.index
                    if str(c).startswith("fewshot/") and pd.notna(final[c])
                },
                "val_loss": float(losses["val_loss"].iloc[-1]),
                "tail_slope": study_plots.log_slope(tail["samples_seen"], np.maximum(1 - tail["zeroshot/top1"], floor)),
                "curve": [[int(s), float(t)] for s, t in zip(curve["samples_seen"], curve["zeroshot/top1"])],
                "val_curve": [[int(s), float(v)] for s, v in zip(losses["samples_seen"], losses["val_loss"])],
            }
        )
        if job.budgets:
            ends = [
                (curves.loc[[str(b.run_dir)]].sort_values("samples_seen").iloc[-1], val.loc[[str(b.run_dir)]])
                for b in [*job.budgets, job]
            ]
            rows[-1]["budgets"] = [
                [
                    int(c["samples_seen"]),
                    float(c["zeroshot/top1"]),
                    float(v.sort_values("samples_seen")["val_loss"].iloc[-1]),
                ]
                for c, v in ends
            ]
            rows[-1]["run_curve"], rows[-1]["curve"] = rows[-1]["curve"], [[s, t] for s, t, _ in rows[-1]["budgets"]]
            tail = rows[-1]["curve"][len(rows[-1]["curve"]) // 2 :]
            rows[-1]["tail_slope"] = study_plots.log_slope([s for s, _ in tail], [max(1 - t, floor) for _, t in tail])
    return rows


def throughput(run_dir: Path) -> float:
    """The run's median training samples per second over its logged steps (runs share the cores alike)."""
    lines = (run_dir / run_folder.METRICS).read_text().splitlines()
    rates = [r["samples_per_s"] for r in map(json.loads, lines) if "samples_per_s" in r]
    return float(np.median(rates)) if rates else float("nan")


def scaling_fits(jobs, out: Path, study, floor: float = 0.0) -> dict[str, dict]:
    """Every fit of FITS, per attention with softmax as the reference; its JSON and PNG beside the report. Zero-shot
    errors of 0 are read as `floor` (error_floor)."""
    options = study.fits
    results = {}
    for name, (x, y, which, xlabel, ylabel, _) in FITS.items():
        mains = [j for j in jobs if j.after is None]
        try:
            frame = (
                tail_mean(points(mains, y, "all"), y)
                if which == "tail"
                else points(jobs if which == "ends" else mains, y, "last")
            )
        except ScalingInputError as e:  # e.g. runs that logged no training loss
            results[name] = {"error": str(e)}
            continue
        if y == "error":  # the fit reads error = 1 - top1
            frame["zeroshot/top1"] = frame["zeroshot/top1"].clip(upper=1 - floor)
        bins = options.get("frontier_bins") if which == "ends" else None
        form = options.get("forms", {}).get(name, "power")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ScalingWarning)
                report = fit(
                    frame,
                    x,
                    y,
                    group=ATTENTION,
                    form=form,
                    frontier_bins=bins,
                    n_boot=options.get("n_boot", 1000),
                    reference=reference(frame),
                )
        except ScalingInputError as e:
            results[name] = {"error": str(e)}
            continue
        colours = {a: study_plots.colour(study.attentions, a) for a in study.attentions}
        plot(report, frame, out / f"{name}.png", xlabel, ylabel, colours)
        (out / f"{name}.json").write_text(json.dumps(report, indent=2))
        results[name] = report
    return results


def reference(frame: pd.DataFrame) -> str | None:
    return "softmax" if "softmax" in set(frame[ATTENTION]) else None


def figures(out: Path, study, jobs) -> tuple[list[dict], dict, int]:
    """Fits and figures from the finished runs: (the report's rows per run, the fits, the number of classes)."""
    classes = len((out / "data" / "eval" / "classnames.txt").read_text().splitlines())
    floor = error_floor(classes, study)
    runs, fits = run_rows(jobs, floor), scaling_fits(jobs, out, study, floor)
    if study.smoothing:  # each layer's kept share of token spread (eval/smoothing.py) on the zero-shot images
        for row in runs:
            row["kept"] = smoothing.kept_of_run(Path(row["run_dir"]), out / "data" / "eval", study.smoothing)
            row["kept_curve"] = smoothing.curve_of(Path(row["run_dir"]))  # logged with eval.smoothing, if it was
        if any(row["kept_curve"] for row in runs):
            smoothing.figure(runs, out / smoothing.FIGURE)
    mains = [j for j in jobs if j.after is None]  # the full-budget runs, not their cooldown branches
    study_plots.learning_curves(runs, study.attentions, list(study.sizes), out / "learning_curves.png")
    finals = points(mains, "error", "last").assign(top1=lambda d: d["zeroshot/top1"])
    fitted = {name: f for name, f in fits.items() if "groups" in f}
    study_plots.summary_figure(fitted, finals, study.attentions, out / "summary.png")
    return runs, fits, classes


def write_report(out: Path, study, runs, fits, classes: int, bench: str, clock: dict, args, sweep=()) -> None:
    """report.md and the JSON it is written from."""
    if not clock.get("other_study"):  # the clock of the study that ran in the folder last stays
        (out / "clock.json").write_text(json.dumps(clock))
    (out / "runs.json").write_text(json.dumps(runs, indent=2))
    (out / "fits.json").write_text(json.dumps({n: study_report.fit_digest(f) for n, f in fits.items()}, indent=2))
    own = [r for r in sweep if "from" not in r]  # rows another study's sweep chose (rates_from) are not this one's
    (out / "lr_sweep.json").write_text(json.dumps(own, indent=2))
    if sweep:
        study_plots.sweep_figure(list(sweep), study.attentions, out / "lr_sweep.png")
    n_images = classes * study.data.get("eval_per_class", 1)
    found = study_report.multipliers(
        runs, study.fits.get("targets", [0.5, 0.3]), n_images, study.fits.get("n_boot", 1000)
    )
    if found:
        study_plots.multiplier_figure(found, study.attentions, out / "multipliers.png")
    time_to_target.draw(runs, study.fits.get("targets", [0.5, 0.3]), n_images, out)
    made, titles = pages.stamp(where=clock.get("machine", "")), {name: spec[-1] for name, spec in FITS.items()}
    errors = {name: f["error"] for name, f in fits.items() if "error" in f}
    data = study_page.page_data(made, study, args, classes, bench, clock, sweep, titles, errors)
    (out / "page.json").write_text(json.dumps(data, indent=2))  # what a docs page of this report is rebuilt from
    text = study_report.report_md(
        runs, fits, titles, bench, study, args, clock, format_table, classes, list(sweep), made=made
    )
    (out / "report.md").write_text(text)


def run_times(out: Path, jobs) -> None:
    """Each job's wall and CPU seconds as its run folder's study_times.json holds them (train/study_local.py writes
    it as the run ends), else as the study's runs.json in `out` does (folders older than the file; a study run in
    parts with --sizes keeps only the last part's runs there); jobs that neither has keep theirs."""
    path = out / "runs.json"
    times = {r["run_dir"]: r for r in json.loads(path.read_text())} if path.is_file() else {}
    for job in jobs:
        own = Path(job.run_dir) / run_folder.STUDY_TIMES
        saved = json.loads(own.read_text()) if own.is_file() else times.get(str(job.run_dir))
        if saved:
            job.wall_seconds, job.cpu_seconds = saved["wall_seconds"], saved["cpu_seconds"]


def saved_times(out: Path, jobs, study: str = "") -> dict:
    """A finished study's wall and CPU seconds per run (runs.json) back on its jobs, and its clock (clock.json; from
    the report's first lines for folders older than it). A study trained elsewhere (Slurm job arrays: train.submit
    study) has neither: its times are unknown (0 per run, NaN on the clock, which the report says). A clock another
    study wrote (its config's file name, `study`, not this one's: studies resumed into one folder, e.g. sizes_long
    and depth) is not this study's: NaN, naming that study (`other_study`), its file left as it is."""
    if not (out / "runs.json").is_file():
        return {"wall": math.nan, "cpu": math.nan, "load": [], "final": True, "elsewhere": True}
    run_times(out, jobs)
    if (out / "clock.json").is_file():
        clock = json.loads((out / "clock.json").read_text())
        clock.setdefault("machine", report_machine(out / "report.md"))
        if study and clock.get("study", study) != study:
            unknown = {"wall": math.nan, "cpu": math.nan, "load": [], "final": True}
            return unknown | {"other_study": clock["study"], "machine": clock["machine"]}  # the folder's machine
        return clock
    found = re.search(
        r"took ([\d.]+) minutes wall and ([\d.]+) CPU-minutes .* was ([\d.]+) on average \(max ([\d.]+)\)",
        (out / "report.md").read_text(),
    )
    wall, cpu, mean, top = (float(x) for x in found.groups())
    machine = report_machine(out / "report.md")
    return {"wall": 60 * wall, "cpu": 60 * cpu, "load": [top, 2 * mean - top], "final": True, "machine": machine}


def report_machine(report: Path) -> str:
    """The machine a report's study ran on, as its header's probe described it ('' when unknown): a re-analysis keeps
    it (a probe now, on a machine busy with other work, could describe it otherwise)."""
    found = re.search(r"\d{4}-\d\d-\d\d; (.+?); load average", report.read_text()) if report.is_file() else None
    return found.group(1) if found else ""


def append_linearise(out: Path) -> None:
    """The linearisation arm's page (train/linearise.py, OUT/linearise/linearise.md) as the report's last section,
    where the study has one."""
    page = out / "linearise" / "linearise.md"
    if page.is_file():
        with open(out / "report.md", "a") as f:
            f.write(study_report.linearise_section(page.read_text()))
