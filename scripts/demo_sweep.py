"""A study's learning-rate sweep: every attention at one size with a few multiples of its learning rate; the
best multiple (lowest final validation loss, or zero-shot error) is then used by that attention at every size.

    lr_sweep:                      # in configs/study/*.yaml; {} = no sweep
      size: demo-w32               # where the sweep runs (a size of the study)
      scales: [0.5, 1.0, 2.0]      # multiples of each attention's learning rate (its size's optim.lr x lr_scale)
      metric: val_loss             # or error (zero-shot top-1 error) at the end of the run
      run: {}                      # overrides of the sweep's runs only, e.g. {train.max_steps: 400}

Each sweep run trains like the grid's run of that size and attention (its per_attention budget, and the
const-cooldown schedule without branches when the study has budgets), so the rate is chosen for the schedule it
is used with; transferring it unchanged to the other sizes is the choice of the small sweeps of scaling studies
(e.g. Cherti et al. 2023 tune at one scale). The runs live in OUT/lr_sweep/x<scale>/runs/.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

from eval.scaling import load_points
from scripts.demo_study import Job, Study, StudyError, jobs_of


def sweep_jobs(study: Study, out: Path, paths: dict[str, str], seed: int) -> list[tuple[float, Job]]:
    """[(scale, job)]: each attention at lr_sweep.size with each scale of its learning rate."""
    sweep, pairs = study.lr_sweep, []
    for scale in sweep["scales"]:
        sub = copy.deepcopy(study)
        sub.sizes = {sweep["size"]: study.sizes[sweep["size"]]}
        sub.run = {**study.run, **(sweep.get("run") or {})}
        sub.budgets = {"fractions": [], "cooldown": study.budgets["cooldown"]} if study.budgets else {}
        for attention in study.attentions:
            own = sub.per_attention.setdefault(attention, {})
            own["lr_scale"] = own.get("lr_scale", 1) * scale
        pairs += [(scale, job) for job in jobs_of(sub, out / "lr_sweep" / f"x{scale:g}", paths, seed)]
    return pairs


def choose(study: Study, pairs: list[tuple[float, Job]]) -> list[dict]:
    """One row per sweep run (attention, scale, learning rate, final val loss and top-1, chosen); the chosen scale
    of each attention is multiplied into its per_attention lr_scale for the grid."""
    metric = study.lr_sweep.get("metric", "val_loss")
    rows = []
    for scale, job in pairs:
        error = load_points([job.run_dir], y="error", points="last").iloc[-1]
        loss = load_points([job.run_dir], y="val_loss", points="last").iloc[-1]
        lr = next(float(a.split("=", 1)[1]) for a in job.argv if a.startswith("optim.lr="))
        row = {"attention": job.attention, "scale": scale, "lr": lr, "val_loss": float(loss["val_loss"])}
        row |= {"top1": float(error["zeroshot/top1"]), "chosen": False}
        rows.append(row)
    for attention in study.attentions:
        mine = [r for r in rows if r["attention"] == attention]
        best = min(mine, key=lambda r: r["val_loss"] if metric == "val_loss" else 1 - r["top1"])
        if not math.isfinite(best["val_loss"]):
            raise StudyError(f"lr_sweep: every {attention} run diverged; lower lr_sweep.scales")
        best["chosen"] = True
        own = study.per_attention.setdefault(attention, {})
        own["lr_scale"] = own.get("lr_scale", 1) * best["scale"]
    return rows


def sweep_table(rows: list[dict], study: Study) -> str:
    """The report's section on the sweep ('' without one)."""
    if not rows:
        return ""
    sweep = study.lr_sweep
    lines = [
        "## Learning rate per attention\n",
        f"Each attention trained at {sweep['size']} with {sweep['scales']} x its learning rate; the lowest final "
        f"{'validation loss' if sweep.get('metric', 'val_loss') == 'val_loss' else 'zero-shot error'} chose the "
        f"multiple every size of that attention then used (scripts/demo_sweep.py).\n",
        "| attention | multiple | learning rate | final val loss | zero-shot top-1 | chosen |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['attention']} | {r['scale']:g}x | {r['lr']:.3g} | {r['val_loss']:.3f} | {100 * r['top1']:.1f}% | "
        f"{'**yes**' if r['chosen'] else ''} |"
        for r in rows
    ]
    edge = [
        f"{r['attention']} ({r['scale']:g}x)"
        for r in rows
        if r["chosen"] and r["scale"] in (min(sweep["scales"]), max(sweep["scales"]))
    ]
    if edge:
        lines.append(
            f"\nChosen at the edge of the sweep: {', '.join(edge)}; a rate beyond it may be better still (widen "
            "lr_sweep.scales to find out)."
        )
    return "\n".join(lines) + "\n"
