"""Long-CLIP's recipe (scripts/long_clip.py): per text attention, four runs of one size (base on short captions;
fine-tuned on long captions with the context kept or the positions stretched; long captions from scratch) and their
evaluation (long-caption text-to-image R@1, short-caption zero-shot top-1) by the eval CLIs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from eval import pages, study_page
from models.config import size_config
from train.study import REPO, Job, overrides, spec_of

ARMS = ("base", "kept", "stretched", "scratch")
NAMES = {
    "base": "base (short captions)",
    "kept": "fine-tuned on long captions, context kept",
    "stretched": "fine-tuned on long captions, positions stretched",
    "scratch": "long captions from scratch",
}


# the shapes study's sweep's choices at demo-w32 (configs/study/full.yaml)
RATES = {"softmax": 2e-3, "linear_affine_nodenom": 1e-3}


def jobs_of(out: Path, data: dict[str, Path], args) -> list[Job]:
    """The four runs of each attention; the fine-tunings wait for their base."""
    context = size_config(args.size)["text_cfg"]["context_length"]
    jobs = []
    for attention in args.attentions:
        lr = RATES.get(attention, 2e-3)
        arms = {
            "base": ("short", {"train.max_steps": args.base_steps, "optim.lr": lr}),
            "kept": ("long", {"train.max_steps": args.tune_steps, "optim.lr": lr / 4}),
            "stretched": ("long", {"train.max_steps": args.tune_steps, "optim.lr": lr / 4}),
            "scratch": ("long", {"train.max_steps": args.base_steps + args.tune_steps, "optim.lr": lr}),
        }
        base = None
        for arm, (split, own) in arms.items():
            run_dir = out / "runs" / f"{attention}-{arm}"
            settings = {
                "model.name": args.size,
                "model.text_attention": attention,
                "model.context_length": args.context if arm in ("stretched", "scratch") else context,
                "data.train_shards": spec_of(data[split] / "train"),
                "data.workers": 0,
                "data.cache_mb": 512,
                "eval.dataset": None,
                "eval.val_shards": None,
                "eval.every": 0,
                "train.run_dir": str(run_dir),
                "train.resume": "none",
                "train.progress": False,
                **own,
            }
            if arm in ("kept", "stretched"):
                settings |= {"model.pretrained": str(base.run_dir), "optim.warmup_steps": 25}
            if arm == "stretched":
                settings["model.text_pos_keep"] = args.keep
            argv = [sys.executable, "-m", "train", "configs/demo.yaml", *overrides(settings)]
            job = Job(
                args.size, f"{attention} {arm}", run_dir, argv, after=base if arm in ("kept", "stretched") else None
            )
            base = job if arm == "base" else base
            jobs.append(job)
    return jobs


def evaluate(run_dir: Path, data: dict[str, Path]) -> dict[str, float]:
    """Long-caption text-to-image R@1 and short-caption zero-shot top-1 of a finished run."""
    retrieval, zeroshot = run_dir / "retrieval.json", run_dir / "zeroshot.json"
    command = [sys.executable, "-m", "eval.retrieval", str(run_dir), "--dataset", str(data["long"] / "retrieval")]
    subprocess.run([*command, "--workers", "0", "--out", str(retrieval)], cwd=REPO, check=True, capture_output=True)
    command = [sys.executable, "-m", "eval.zeroshot", str(run_dir), "--dataset", str(data["short"] / "eval")]
    subprocess.run([*command, "--out", str(zeroshot)], cwd=REPO, check=True, capture_output=True)
    return {
        "long_t2i_r1": json.loads(retrieval.read_text())["text_to_image_R@1"],
        "short_top1": json.loads(zeroshot.read_text())["top1"],
    }


PAGE_ARGS = ("size", "base_steps", "tune_steps", "context", "keep", "attentions", "eval_per_class")


def write(out: Path, args, results: dict, seconds: float) -> Path:
    """OUT/long_clip.json (the results per run, the settings, the stamp) and OUT/long_clip.md written from it."""
    meta = {name: getattr(args, name) for name in PAGE_ARGS} | {"seconds": seconds}
    rows = [{"run": name, **r} for name, r in results.items()]
    return pages.write_page(out / "long_clip.md", rebuild, pages.stamp(), meta, rows)


def rebuild(page: Path) -> str:
    """long_clip.md written from long_clip.json beside it, with the page's findings section."""
    saved = pages.load_data(page)
    args = SimpleNamespace(**saved["meta"])
    results = {r["run"]: r for r in saved["rows"]}
    argv = ["--size", args.size, "--base-steps", args.base_steps, "--tune-steps", args.tune_steps]
    argv += ["--context", args.context, "--keep", args.keep]
    context = size_config(args.size)["text_cfg"]["context_length"]
    lines = [
        pages.header(
            "Long-CLIP's recipe on the embedded data: stretched positions against kept ones and training from scratch",
            pages.command("scripts.long_clip", [str(a) for a in argv]),
            made=saved["made"],
        ),
        f"{args.seconds / 60:.1f} min. {args.size}, image tower softmax, batch 64, 32 px; base context {context} "
        f"tokens, long context {args.context}. Long-caption retrieval: text-to-image R@1 over 24 x "
        f"{args.eval_per_class} images in groups of four that differ only in the shape described after 80+ tokens "
        "(a text tower that cannot see that far gets at most 25%; chance "
        f"{100 / (24 * args.eval_per_class):.1f}%); short captions: zero-shot "
        "top-1 over the 24 classes.",
        "",
        "| text attention | run | context | steps | long-caption R@1 | short-caption top-1 |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for attention in args.attentions:
        for arm in ARMS:
            r = results[f"{attention} {arm}"]
            steps = {"base": args.base_steps, "scratch": args.base_steps + args.tune_steps}.get(arm, args.tune_steps)
            ctx = args.context if arm in ("stretched", "scratch") else context
            lines.append(
                f"| {attention} | {NAMES[arm]} | {ctx} | {steps} | {100 * r['long_t2i_r1']:.1f}% | "
                f"{100 * r['short_top1']:.1f}% |"
            )
    return study_page.with_findings(page, "\n".join(lines) + "\n")
