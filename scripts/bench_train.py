"""Seconds per training step (forward, loss, backward, AdamW step) of our CLIP against open_clip's, and per attention.

    python scripts/bench_train.py [--batch-size 8] [--steps 3] [--sizes ViT-S-16,ViT-B-16] [--resolutions 224,448]
                                  [--attention-batch-size 2] [--threads 1] [--out docs]

Part 1: ViT-S-16 and ViT-B-16 with softmax attention, ours (models.build_clip + train.loss.ClipLoss) against
open_clip's own (open_clip.create_model + open_clip.loss.ClipLoss), on the same batch at 224 px, fp32 and bf16
autocast. Part 2: ViT-S-16 with each registered image attention (text tower softmax, so only the image
attention changes) at each resolution, fp32, batch 2 to keep the run under 10 minutes. One intra-op thread by
default: on a shared CPU, idle threads' spin-waits make multi-threaded timings erratic. One warm-up step, then
`--steps` timed rounds in which the contenders take turns (order reversed every other round); the fastest
step is kept, since load from other jobs only adds time.
Writes docs/bench_train.csv, docs/bench_train.md and docs/bench_train.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import open_clip
import torch

from models import ModelConfig, build_clip
from models.attention import ATTENTIONS
from train.config import OptimConfig
from train.loss import ClipLoss
from train.optim import build_optimizer

DOCS = Path(__file__).resolve().parents[1] / "docs"


def register_resolution(size: str, pixels: int, folder: Path) -> str:
    """An open_clip model config `size` at `pixels` px (same weights shapes except the position embedding)."""
    if pixels == open_clip.get_model_config(size)["vision_cfg"]["image_size"]:
        return size
    cfg = open_clip.get_model_config(size)
    cfg["vision_cfg"]["image_size"] = pixels
    name = f"{size}-{pixels}px"
    (folder / f"{name}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder / f"{name}.json")
    return name


def batch(size: str, pixels: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    captions = [f"a photo of object number {i}" for i in range(batch_size)]
    return torch.randn(batch_size, 3, pixels, pixels, generator=g), open_clip.get_tokenizer(size)(captions)


def make_step(model, loss_fn, images, tokens, precision: str):
    """A closure doing one full training step; AdamW with our parameter groups for every contender."""
    optimizer, _ = build_optimizer(model, OptimConfig(), max_steps=1000)
    model.train()

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            image_features, text_features, scale = model(images, tokens)[:3]
            loss = loss_fn(image_features.float(), text_features.float(), scale)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    return step


def race(steps: dict, rounds: int) -> dict[str, float]:
    """Fastest seconds per step of each contender over `rounds`, after one warm-up step each.

    The contenders take turns within a round, in reversed order every other round; the minimum is kept
    because on a shared machine other jobs only ever add time (as `timeit` advises)."""
    for step in steps.values():
        step()
    times = {name: [] for name in steps}
    order = list(steps)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(steps[name]())
    return {name: min(t) for name, t in times.items()}


def ours_vs_open_clip(sizes: list[str], batch_size: int, rounds: int) -> list[dict]:
    rows = []
    for size in sizes:
        images, tokens = batch(size, 224, batch_size)
        for precision in ("fp32", "bf16"):
            torch.manual_seed(0)
            ours = build_clip(ModelConfig(name=size))
            theirs = open_clip.create_model(size)
            result = race(
                {
                    "ours": make_step(ours, ClipLoss(), images, tokens, precision),
                    "open_clip": make_step(theirs, open_clip.loss.ClipLoss(), images, tokens, precision),
                },
                rounds,
            )
            rows.append(
                {
                    "part": "vs_open_clip",
                    "model": size,
                    "pixels": 224,
                    "precision": precision,
                    "attention": "softmax",
                    "ours_s": result["ours"],
                    "open_clip_s": result["open_clip"],
                    "ratio": result["ours"] / result["open_clip"],
                }
            )
            print(
                f"{size} {precision}: ours {result['ours']:.3f} s, open_clip {result['open_clip']:.3f} s, "
                f"ratio {rows[-1]['ratio']:.2f}",
                flush=True,
            )
            del ours, theirs
    return rows


def attentions(size: str, resolutions: list[int], batch_size: int, rounds: int, folder: Path) -> list[dict]:
    rows = []
    for pixels in resolutions:
        name = register_resolution(size, pixels, folder)
        images, tokens = batch(size, pixels, batch_size)
        steps = {}
        for attention in sorted(ATTENTIONS):
            torch.manual_seed(0)
            model = build_clip(ModelConfig(name=name, image_attention=attention, text_attention="softmax"))
            steps[attention] = make_step(model, ClipLoss(), images, tokens, "fp32")
        result = race(steps, rounds)
        for attention, seconds in result.items():
            rows.append(
                {
                    "part": "attention",
                    "model": size,
                    "pixels": pixels,
                    "precision": "fp32",
                    "attention": attention,
                    "ours_s": seconds,
                    "ratio": seconds / result["softmax"],
                }
            )
            print(f"{size} {pixels}px {attention}: {seconds:.3f} s ({rows[-1]['ratio']:.2f}x softmax)", flush=True)
    return rows


def write_outputs(rows: list[dict], args, seconds: float) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fields = ["part", "model", "pixels", "precision", "attention", "ours_s", "open_clip_s", "ratio"]
    with open(out / "bench_train.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    first = [r for r in rows if r["part"] == "vs_open_clip"]
    second = [r for r in rows if r["part"] == "attention"]
    lines = [
        "# Training step: ours against open_clip, and each attention",
        "",
        f"`{' '.join(['python scripts/bench_train.py', *sys.argv[1:]])}`: batch {args.batch_size}, "
        f"CPU ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} thread(s), shared: load average {os.getloadavg()[0]:.1f} at the end), "
        f"torch {torch.__version__}, open_clip {open_clip.__version__}; fastest of {args.steps} "
        "steps after one warm-up; a step = forward, contrastive loss, backward, AdamW step. "
        f"Total run {seconds / 60:.1f} min.",
        "",
        "## Softmax CLIP, ours vs open_clip (224 px)",
        "",
        "| model | precision | ours s/step | open_clip s/step | ours / open_clip |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['precision']} | {r['ours_s']:.3f} | {r['open_clip_s']:.3f} | {r['ratio']:.2f} |"
        for r in first
    ]
    lines += [
        "",
        f"## Image attention variants ({args.attention_size}, batch {args.attention_batch_size}, "
        "text tower softmax, fp32)",
        "",
        "| pixels | attention | s/step | / softmax |",
        "| ---: | --- | ---: | ---: |",
    ]
    lines += [f"| {r['pixels']} | {r['attention']} | {r['ours_s']:.3f} | {r['ratio']:.2f} |" for r in second]
    lines += ["", "![seconds per step](bench_train.png)", ""]
    (out / "bench_train.md").write_text("\n".join(lines))
    plot(first, second, out)


def plot(first: list[dict], second: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{r['model']}\n{r['precision']}" for r in first]
    x = range(len(first))
    left.bar([i - 0.2 for i in x], [r["ours_s"] for r in first], 0.4, label="ours")
    left.bar([i + 0.2 for i in x], [r["open_clip_s"] for r in first], 0.4, label="open_clip")
    left.set_xticks(list(x), labels)
    left.set_ylabel("seconds per training step")
    left.set_title("softmax CLIP, 224 px")
    left.legend()
    names = sorted({r["attention"] for r in second})
    pixels = sorted({r["pixels"] for r in second})
    width = 0.8 / max(1, len(pixels))
    for j, px in enumerate(pixels):
        values = {r["attention"]: r["ours_s"] for r in second if r["pixels"] == px}
        right.bar([i + j * width for i in range(len(names))], [values[n] for n in names], width, label=f"{px} px")
    right.set_xticks([i + width * (len(pixels) - 1) / 2 for i in range(len(names))], names, rotation=30, ha="right")
    right.set_ylabel("seconds per training step")
    right.set_title("image attention variants, fp32")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "bench_train.png", dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sizes", default="ViT-S-16,ViT-B-16")
    parser.add_argument("--attention-size", default="ViT-S-16")
    parser.add_argument("--resolutions", default="224,448")
    parser.add_argument("--attention-batch-size", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(DOCS), help="folder for bench_train.csv/.md/.png")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = ours_vs_open_clip(args.sizes.split(","), args.batch_size, args.steps)
    with tempfile.TemporaryDirectory() as folder:
        rows += attentions(
            args.attention_size,
            [int(p) for p in args.resolutions.split(",")],
            args.attention_batch_size,
            args.steps,
            Path(folder),
        )
    write_outputs(rows, args, time.perf_counter() - start)
    print(f"wrote {Path(args.out) / 'bench_train.md'}, .csv and .png in {(time.perf_counter() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
