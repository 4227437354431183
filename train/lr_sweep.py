"""A study's learning-rate sweep: every attention at one size (or several) with a few multiples of its learning
rate; the best multiple (lowest final validation loss, or zero-shot error) is then used by that attention at every
size where the sweep shows it transfers (apply).

    lr_sweep:                      # in configs/study/*.yaml; {} = no sweep
      size: demo-w32               # where the sweep runs (a size of the study), or several: [demo-w16, demo-w64]
                                   # (the smallest and the largest: the choice transfers when they agree)
      scales: [0.5, 1.0, 2.0]      # multiples of each attention's learning rate (its size's optim.lr x lr_scale),
                                   # or per attention: {softmax: [0.25, 0.5, 1.0], linear_elu: [0.5, 1.0, 2.0]}
      metric: val_loss             # or error (zero-shot top-1 error) at the end of the run
      run: {}                      # overrides of the sweep's runs only, e.g. {train.max_steps: 400}
    rates_from: [docs/study_sizes/data]  # beside a sweep: its multiples are of the rates that sweep chose (a sweep
                                   # around them, e.g. at 4x the budget); its rows record the folders (`around`)

Each sweep run trains like the grid's run of that size and attention (its per_attention budget, and the
const-cooldown schedule keeping the checkpoints where the shorter budgets branch, without the branches), so the
rate is chosen for the schedule it is used with; transferring it unchanged to the other sizes is the choice of the
small sweeps of scaling studies (e.g. Cherti et al. 2023 tune at one scale). The runs live in
OUT/lr_sweep/x<scale>/runs/. The chosen run is the grid's run of that size and attention when their commands are
the same but for the folder (no `run` overrides of the sweep's own): the grid does not train it again, and its
budget branches start from the sweep run's checkpoints (`reuse_chosen`).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from eval.scaling import load_points
from train.study import Job, Study, StudyError, finished, jobs_of, resolve_folder


def scales_of(study: Study, attention: str) -> list[float]:
    """The multiples lr_sweep.scales gives `attention` (one list for all, or a list per attention)."""
    scales = study.lr_sweep["scales"]
    return list(scales[attention] if isinstance(scales, dict) else scales)


def sweep_sizes(study: Study) -> list[str]:
    """The sizes lr_sweep.size names (one size, or a list: e.g. the smallest and the largest), in the study's order."""
    size = study.lr_sweep["size"]
    named = set(size) if isinstance(size, list) else {size}
    return [s for s in study.sizes if s in named]


def sweep_jobs(study: Study, out: Path, paths: dict[str, str], seed: int) -> list[tuple[float, Job]]:
    """[(scale, job)]: each attention at each of lr_sweep's sizes with each scale of its learning rate."""
    sweep, pairs = study.lr_sweep, []
    for scale in sorted({s for a in study.attentions for s in scales_of(study, a)}):
        sub = copy.deepcopy(study)
        sub.attentions = [a for a in study.attentions if scale in scales_of(study, a)]
        sub.sizes = {size: study.sizes[size] for size in sweep_sizes(study)}
        sub.run = {**study.run, **(sweep.get("run") or {})}
        for attention in sub.attentions:
            own = sub.per_attention.setdefault(attention, {})
            own["lr_scale"] = own.get("lr_scale", 1) * scale
        runs = jobs_of(sub, out / "lr_sweep" / f"x{scale:g}", paths, seed)
        pairs += [(scale, job) for job in runs if job.after is None]  # the runs, not their budget branches
    return pairs


def command_but_folder(job: Job) -> list[str]:
    return [a for a in job.argv if not a.startswith("train.run_dir=")]


def reuse_chosen(rows: list[dict], pairs: list[tuple[float, Job]], jobs: list[Job]) -> list[Job]:
    """The grid's jobs still to run: a grid run whose command is its chosen sweep run's (but for the folder) takes
    that run's folder and times instead of training again, and its budget branches start from there."""
    chosen = {(r.get("size"), r["attention"]): r["scale"] for r in rows if r["chosen"]}  # no size: the one swept
    done = {
        (job.size, job.attention): job
        for scale, job in pairs
        if chosen.get((job.size, job.attention), chosen.get((None, job.attention))) == scale
        and (job.process is not None or finished(job.run_dir))
    }
    to_run, branches = [], {id(b) for job in jobs for b in job.budgets}
    for job in jobs:
        if id(job) in branches:
            continue  # kept below with its run
        source = done.get((job.size, job.attention))
        if source is None or job.size != source.size or command_but_folder(job) != command_but_folder(source):
            to_run += [job, *job.budgets]
            continue
        old = str(job.run_dir)
        job.run_dir, job.wall_seconds, job.cpu_seconds = source.run_dir, source.wall_seconds, source.cpu_seconds
        job.reused = True
        for branch in job.budgets:  # branch.after stays the (reused, finished) run: run_jobs starts it at once
            branch.argv = [
                a.replace(old, str(source.run_dir), 1) if a.startswith("train.branch_from=") else a for a in branch.argv
            ]
        to_run += job.budgets
    return to_run


def choose(study: Study, pairs: list[tuple[float, Job]]) -> list[dict]:
    """One row per sweep run (size, attention, scale, learning rate, final val loss and top-1, chosen); the chosen
    scales then set each attention's rate at every size (apply)."""
    metric = study.lr_sweep.get("metric", "val_loss")
    rows = []
    for scale, job in pairs:
        error = load_points([job.run_dir], y="error", points="last").iloc[-1]
        loss = load_points([job.run_dir], y="val_loss", points="last").iloc[-1]
        lr = next(float(a.split("=", 1)[1]) for a in job.argv if a.startswith("optim.lr="))
        row = {"size": job.size, "attention": job.attention, "scale": scale, "lr": lr}
        row |= {"val_loss": float(loss["val_loss"]), "top1": float(error["zeroshot/top1"]), "chosen": False}
        if study.adopted:  # multiples of the rates rates_from chose: adopt applies those first
            row["around"] = list(study.rates_from)
        rows.append(row)
    for size, attention in dict.fromkeys((r["size"], r["attention"]) for r in rows):
        mine = [r for r in rows if r["attention"] == attention and r["size"] == size]
        finite = [r for r in mine if math.isfinite(r["val_loss"])]  # min() over a NaN depends on the order
        if not finite:
            raise StudyError(f"lr_sweep: every {attention} run at {size} diverged; lower lr_sweep.scales")
        min(finite, key=lambda r: r["val_loss"] if metric == "val_loss" else 1 - r["top1"])["chosen"] = True
    apply(study, rows)
    return rows


def apply(study: Study, rows: list[dict]) -> None:
    """The chosen multiples into the grid's rates. An attention whose sweep chose one multiple at every swept size
    (it transfers) takes it at every size (per_attention lr_scale); one whose choices differ takes each swept size's
    own at that size and, at a size not swept, the nearest swept size's in the study's order (study.lr_by_size): the
    rate is carried only as far as the sweep shows. Each chosen row records `transfers`."""
    sizes = list(study.sizes)
    for attention in study.attentions:
        chosen = {r.get("size"): r for r in rows if r["attention"] == attention and r["chosen"]}
        if not chosen:
            continue
        transfers = len({r["scale"] for r in chosen.values()}) == 1
        for row in chosen.values():
            row["transfers"] = transfers
        if transfers:
            own = study.per_attention.setdefault(attention, {})
            own["lr_scale"] = own.get("lr_scale", 1) * next(iter(chosen.values()))["scale"]
            continue
        swept = [s for s in sizes if s in chosen]
        if not swept:
            raise StudyError(
                f"the sweep chose {attention}'s rate per size at {', '.join(map(str, chosen))} (it does not transfer), "
                f"none of them a size of this study ({', '.join(sizes)}); give the study an lr_sweep instead"
            )
        for size in sizes:
            nearest = min(swept, key=lambda s: (abs(sizes.index(s) - sizes.index(size)), sizes.index(s)))
            own = study.lr_by_size.setdefault(size, {})
            own[attention] = own.get(attention, 1) * chosen[nearest]["scale"]  # x the rate adopted there, if any


def swept_rows(folder: Path) -> list[dict]:
    """The sweep's rows of a finished study folder (FOLDER/lr_sweep.json) or of a published study page's data
    (FOLDER/page.json's `sweep`, e.g. docs/study_tokens577/data); [] where neither holds any."""
    folder = Path(folder)
    if (folder / "lr_sweep.json").is_file():
        rows = json.loads((folder / "lr_sweep.json").read_text())
        if rows:
            return rows
    if (folder / "page.json").is_file():
        return json.loads((folder / "page.json").read_text()).get("sweep") or []
    return []


def adopt(study: Study, folders: Path | str | list, keep_sweep: bool = False) -> list[dict]:
    """Train with the rates other study folders' sweeps chose (swept_rows, e.g. seed 0's) instead of sweeping again
    (apply, as the sweep would), the sweep dropped (kept with keep_sweep: a sweep around these rates); returns the
    rows applied, each with the folder it came from (`from`). With several folders each attention takes every row of
    the first folder that chose a rate for it (sweeps of separate attentions run as separate studies); rows swept
    around other folders' rates (`around`) apply those folders' rates first. An attention no folder chose a rate for
    is one StudyError line. load_study calls it for a study's `rates_from` (and scripts.demo's --rates-from)."""
    folders = [folders] if isinstance(folders, (str, Path)) else list(folders)
    rows: list[dict] = []
    for attention in study.attentions:
        for folder in folders:
            mine = [r for r in swept_rows(folder) if r["attention"] == attention]
            if any(r.get("chosen") for r in mine):
                around = next((r["around"] for r in mine if r.get("around")), None)
                if around:  # its multiples are of the rates those folders chose: those first (apply multiplies)
                    inner = copy.copy(study)
                    inner.attentions = [attention]
                    adopt(inner, [resolve_folder(f) for f in around], keep_sweep=True)
                rows += [{**r, "from": str(folder)} for r in mine]
                break
        else:
            where = ", ".join(str(Path(f) / "lr_sweep.json") for f in folders)
            raise StudyError(
                f"{where} has no learning rate chosen for {attention}: give a finished study folder of the same study "
                "whose learning-rate sweep ran"
            )
    apply(study, rows)
    if not keep_sweep:
        study.lr_sweep = {}
    return rows


def grid(study: Study, out: Path, paths: dict[str, str], seed: int) -> tuple[list[Job], list[Job], list[dict]]:
    """A study's grid once its sweep (if it has one) has run: (every job, the jobs the sweep has not trained, the
    sweep's rows). The sweep's runs are read from their folders, so this holds in any process (a re-analysis, the
    Slurm runner's second submission)."""
    if not study.lr_sweep:
        jobs = jobs_of(study, out, paths, seed)
        return jobs, jobs, []
    pairs = sweep_jobs(study, out, paths, seed)
    rows = choose(study, pairs)
    jobs = jobs_of(study, out, paths, seed)
    return jobs, reuse_chosen(rows, pairs, jobs), rows
