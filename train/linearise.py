"""Linearising the main job's best softmax run (train/distill.py) against training the same attention from scratch.

    python -m scripts.linearise STUDY_DIR [--transfer-steps 100] [--distill-steps 400] [--eval-every 25] [--out DIR]
    train.linearise.linearise(Settings(study=STUDY_DIR))          # the same from Python (the main job's arm)

STUDY_DIR is a finished `python -m scripts.demo` folder. The teacher is its best softmax run; each student (the
study's linear attentions, in both towers, the teacher's size) starts from the teacher's weights, trains its
attention layers to reproduce the teacher's (stage 1, attention transfer: only the attention parameters, per-layer
output MSE), then the whole model on the contrastive loss plus the distillation terms (stage 2: embeddings and
the teacher's similarity distribution, each weight 1), on the study's data with the learning rate the study gave
that attention at that size. The scratch curve is the study's own run of that attention and size. The report
gives, per student, the steps (of the study's batch; stage 1 counted) to reach 95% of the teacher's zero-shot top-1
against the steps from scratch (or its best, if it never did), and plots both curves. Writes OUT/linearise.md,
.json and .png.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import yaml

from eval import pages, study_page
from eval.seeds import students_of
from models import run_folder
from train.study import Job, overrides, spec_of
from train.study_local import run_jobs

SHARE = 0.95  # of the teacher's top-1


@dataclass
class Settings:
    """The arm's options (scripts/linearise.py's flags; a study config's `linearise:` section)."""

    study: Path  # a finished study folder
    transfer_steps: int = 100
    distill_steps: int = 400
    transfer_lr: float = 1e-3
    eval_every: int = 25
    warmup_steps: int = 10  # of each stage
    students: list[str] | None = None  # default: the study's linear attentions
    out: Path | None = None  # default: STUDY/linearise


def linearise(args: Settings, run: dict | None = None, report=print) -> Path:
    """The arm on a finished study folder; `run` as in jobs_of (the main job passes its study's). Returns the
    page (OUT/linearise.md)."""
    study = Path(args.study).resolve()
    out = Path(args.out).resolve() if args.out else study / "linearise"
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    teacher, scratch = study_runs(study, args.students)
    run_jobs(jobs_of(study, out, teacher, scratch, args, run), parallel=2, threads=1, report=report, launch="fork")
    results = compare(out, teacher, scratch, args)
    plot(out, teacher, results)
    return write(out, teacher, results, args, time.perf_counter() - start)


def study_runs(study: Path, students: list[str] | None = None) -> tuple[dict, dict[str, dict | None]]:
    """(the best softmax run, {student: the study's run of it at the teacher's size, None if it has none}); the
    students are the study's linear attentions unless given."""
    runs = json.loads((study / "runs.json").read_text())
    teacher = max((r for r in runs if r["attention"] == "softmax"), key=lambda r: r["top1"])
    scratch = {r["attention"]: r for r in runs if r["size"] == teacher["size"] and r["attention"] != "softmax"}
    return teacher, scratch if students is None else {a: scratch.get(a) for a in students}


def run_lr(run_dir: Path) -> float:
    return float(yaml.safe_load((Path(run_dir) / run_folder.CONFIG).read_text())["optim"]["lr"])


def teacher_model(run_dir) -> dict:
    """The teacher run's model name and image size (a study's size may be SIZE@RESpx: image_sizes)."""
    model = yaml.safe_load((Path(run_dir) / run_folder.CONFIG).read_text())["model"]
    return {"model.name": model["name"], "model.image_size": model.get("image_size")}


def run_batch(run_dir: Path) -> int:
    """The batch size a run trained with (its saved config)."""
    return int(yaml.safe_load((Path(run_dir) / run_folder.CONFIG).read_text()).get("data", {}).get("batch_size", 64))


def jobs_of(
    study: Path, out: Path, teacher: dict, scratch: dict[str, dict], args, run: dict | None = None
) -> list[Job]:
    """Per student: stage 1 (transfer), then stage 2 (distill) from its weights. `run`: the study's overrides of
    every run (its `run:`, e.g. the data settings), under the linearisation's own."""
    common = {
        **(run or {}),
        **teacher_model(teacher["run_dir"]),
        "data.train_shards": spec_of(study / "data" / "train"),
        "data.workers": 0,
        "data.cache_mb": 512,
        "eval.dataset": str(study / "data" / "eval"),
        "eval.val_shards": None,
        "eval.every": args.eval_every,
        "distill.teacher": teacher["run_dir"],
        "train.resume": "none",
        "train.progress": False,
        "optim.warmup_steps": args.warmup_steps,
    }
    jobs = []
    for attention, own in scratch.items():
        towers = {"model.image_attention": attention, "model.text_attention": attention}
        transfer_dir, distill_dir = out / f"{attention}-transfer", out / f"{attention}-distill"
        stage1 = {**common, **towers, "distill.stage": "transfer", "train.max_steps": args.transfer_steps}
        stage1 |= {"optim.lr": args.transfer_lr, "train.run_dir": str(transfer_dir), "train.log_every": 1}
        stage2 = {**common, **towers, "distill.stage": "distill", "train.max_steps": args.distill_steps}
        stage2 |= {"optim.lr": run_lr((own or teacher)["run_dir"]), "train.run_dir": str(distill_dir)}
        stage2["model.pretrained"] = str(transfer_dir)
        first = Job(teacher["size"], f"{attention} transfer", transfer_dir, train_argv(stage1))
        jobs += [first, Job(teacher["size"], f"{attention} distill", distill_dir, train_argv(stage2), after=first)]
    return jobs


def train_argv(settings: dict) -> list[str]:
    return [sys.executable, "-m", "train", "configs/demo.yaml", *overrides(settings)]


def curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, zero-shot top-1) of every evaluation of a run."""
    records = [json.loads(line) for line in (Path(run_dir) / run_folder.METRICS).read_text().splitlines()]
    return [(r["step"], r["zeroshot/top1"]) for r in records if "zeroshot/top1" in r]


def layer_drops(run_dir: Path) -> dict[str, float]:
    """Each layer's stage-1 output MSE at the first step over its value at the last (transfer/mse/<layer>)."""
    records = [json.loads(line) for line in (Path(run_dir) / run_folder.METRICS).read_text().splitlines()]
    steps = [r for r in records if any(k.startswith("transfer/mse/") for k in r)]
    return {
        k.removeprefix("transfer/mse/"): steps[0][k] / steps[-1][k] for k in steps[0] if k.startswith("transfer/mse/")
    }


def first_step(points: list[tuple[int, float]], target: float) -> int | None:
    return next((step for step, top1 in points if top1 >= target), None)


def costs(teacher: dict, own: dict | None, batch: int, lin_steps: int | None, scratch_steps: int | None) -> dict:
    """Compute to the target in GMACs (a training step 3x its forward pass, Kaplan et al. 2020): from scratch, the
    student's steps; linearised, the teacher's whole training run plus every student step (stage 1 counted) with the
    teacher's forward pass on the same batch. None where the target was not reached or there is no scratch run."""
    teacher_gmacs = 3 * teacher["gmacs_per_sample"] * teacher["samples_seen"]
    student = own["gmacs_per_sample"] if own else teacher["gmacs_per_sample"]
    per_step = batch * (3 * student + teacher["gmacs_per_sample"])
    return {
        "teacher_gmacs": teacher_gmacs,
        "linearised_gmacs": None if lin_steps is None else teacher_gmacs + lin_steps * per_step,
        "linearised_gmacs_without_teacher": None if lin_steps is None else lin_steps * per_step,
        "scratch_gmacs": None if scratch_steps is None else scratch_steps * batch * 3 * student,
    }


def compare(out: Path, teacher: dict, scratch: dict[str, dict], args) -> dict[str, dict]:
    target = SHARE * teacher["top1"]
    results = {}
    for attention, own in scratch.items():
        lin = [(args.transfer_steps + s, t) for s, t in curve(out / f"{attention}-distill")]
        batch = run_batch(own["run_dir"]) if own else run_batch(teacher["run_dir"])
        base = [(samples // batch, top1) for samples, top1 in own.get("run_curve") or own["curve"]] if own else []
        lin_steps, scratch_steps = first_step(lin, target), first_step(base, target)
        results[attention] = {
            **costs(teacher, own, batch, lin_steps, scratch_steps),
            "linearised_curve": lin,
            "scratch_curve": base,
            "linearised_steps": lin_steps,
            "scratch_steps": scratch_steps,
            "linearised_best": max(t for _, t in lin),
            "scratch_best": max((t for _, t in base), default=None),
            "scratch_steps_run": base[-1][0] if base else None,
            "mse_drop": layer_drops(out / f"{attention}-transfer"),
        }
    return results


def plot(out: Path, teacher: dict, results: dict) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (attention, r), colour in zip(
        results.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"), strict=False
    ):
        ax.plot(*zip(*r["linearised_curve"], strict=True), "-o", ms=3, color=colour, label=f"{attention}, linearised")
        if r["scratch_curve"]:
            ax.plot(*zip(*r["scratch_curve"], strict=True), "--", color=colour, label=f"{attention}, from scratch")
    ax.axhline(SHARE * teacher["top1"], color="grey", lw=0.8, ls=":", label=f"{SHARE:.0%} of the teacher's top-1")
    ax.set_xscale("log")
    ax.set_xlabel("steps (linearised: stage 1 included)")
    ax.set_ylabel("zero-shot top-1")
    ax.set_title(f"Linearising {teacher['size']} softmax against training from scratch")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "linearise.png", dpi=120)
    plt.close(fig)


def command_args(args) -> list[str]:
    argv = [str(args.study), "--transfer-steps", str(args.transfer_steps), "--distill-steps", str(args.distill_steps)]
    return argv + (["--students", *args.students] if args.students else [])


PAGE_ARGS = ("study", "transfer_steps", "distill_steps", "transfer_lr", "eval_every", "students")


def write(out: Path, teacher: dict, results: dict, args, seconds: float) -> Path:
    """OUT/linearise.json (each student's results under its name, as eval/seeds.py reads them, with the page's writer,
    stamp and settings) and OUT/linearise.md written from it alone (rebuild)."""
    settings = {name: getattr(args, name) for name in PAGE_ARGS} | {"study": str(args.study), "seconds": seconds}
    saved = {"teacher": teacher["run_dir"], **results, "writer": __name__, "made": pages.stamp()}
    saved["meta"] = {"teacher": {k: teacher[k] for k in ("size", "top1", "run_dir")}, "settings": settings}
    (out / "linearise.json").write_text(json.dumps(saved, indent=1) + "\n")
    page = out / "linearise.md"
    page.write_text(rebuild(page))
    return page


def rebuild(page: Path) -> str:
    """linearise.md written from linearise.json beside it, with the page's findings section."""
    saved = json.loads(Path(page).with_suffix(".json").read_text())
    meta = saved["meta"]
    args = SimpleNamespace(**meta["settings"])
    text = markdown(meta["teacher"], students_of(saved), args, saved["made"])
    return study_page.with_findings(page, text, beside=True)


def markdown(teacher: dict, results: dict, args, made: dict) -> str:
    target = SHARE * teacher["top1"]

    def steps(n, best):
        return f"{n:,}" if n is not None else f"never (best {100 * best:.1f}%)"

    lines = [
        pages.header(
            f"Linearising {teacher['size']} softmax: attention transfer and distillation against training from scratch",
            pages.command("scripts.linearise", command_args(args)),
            made=made,
        ),
        f"{args.seconds / 60:.1f} min. Teacher: the study's best "
        f"softmax run ({teacher['size']}, {100 * teacher['top1']:.1f}% zero-shot top-1); target {SHARE:.0%} of it = "
        f"{100 * target:.1f}%. Students in both towers, from the teacher's weights: stage 1 (attention transfer, "
        f"{args.transfer_steps} steps, lr {args.transfer_lr:g}), then stage 2 (contrastive + embedding + similarity "
        "distillation, weights 1, the study's learning rate for that attention and size, or the teacher's for an "
        "attention the study did not train), evaluated every "
        f"{args.eval_every} steps; from scratch: the study's own run (evaluated every 100 steps, so its step count "
        "is rounded up to the next evaluation).",
        "",
        "| student | linearised: steps to target | from scratch: steps to target | ratio | linearised best | "
        "from scratch best (steps run) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for attention, r in results.items():
        lin, base = r["linearised_steps"], r["scratch_steps"]
        ratio = f"{lin / base:.2f}" if lin is not None and base is not None else ""
        if r["scratch_best"] is None:
            scratch_steps = scratch_best = "no run from scratch in the study"
        else:
            scratch_steps = steps(base, r["scratch_best"])
            scratch_best = f"{100 * r['scratch_best']:.1f}% ({r['scratch_steps_run']:,})"
        lines.append(
            f"| {attention} | {steps(lin, r['linearised_best'])} | {scratch_steps} | {ratio} | "
            f"{100 * r['linearised_best']:.1f}% | {scratch_best} |"
        )
    lines += [
        *cost_lines(results),
        "",
        "Stage 1, each layer's output MSE at its first step over its last (smallest, median, largest drop):",
        "",
    ]
    for attention, r in results.items():
        drops = sorted(r["mse_drop"].values())
        lines.append(
            f"- {attention}: {drops[0]:.1f}x, {drops[len(drops) // 2]:.1f}x, {drops[-1]:.1f}x over {len(drops)} layers"
        )
    lines += ["", "![zero-shot top-1 against steps](linearise.png)"]
    return "\n".join(lines) + "\n"


def cost_lines(results: dict) -> list[str]:
    """The table of compute to the target, the teacher's training counted (costs)."""
    lines = [
        "",
        "Compute to the target (GMACs; a training step 3x its forward pass): linearised counts the teacher's whole "
        "training run and the teacher's forward pass on every student batch; the ratio is over training from scratch "
        "(> 1: linearising costs more than training the attention from scratch, the teacher included).",
        "",
        "| student | teacher's training | linearised, teacher counted | from scratch | ratio | ratio without the "
        "teacher's training |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for attention, r in results.items():
        lin, base, alone = r["linearised_gmacs"], r["scratch_gmacs"], r["linearised_gmacs_without_teacher"]
        cells = [f"{v:,.0f}" if v is not None else "not reached" for v in (r["teacher_gmacs"], lin, base)]
        ratios = [f"{a / base:.2f}" if a is not None and base else "" for a in (lin, alone)]
        lines.append(f"| {attention} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    return lines
