"""Training-step time and peak memory against sequence length, of each tower and of the whole CLIP, with the
FLOP model's bound: the measurements and the page of scripts/bench_long.py (what it times and how: its docstring).

    rows = long.measure(args, "image", 1024, probe)    # every attention x checkpointing at one length
    rows += long.clip_rows(args, probe)                # the whole CLIP at --clip
    long.write(rows, args, probe, seconds)             # <out>/bench_long.csv, .md and .png
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import torch

from eval import pages, study_page
from models import ModelConfig, build_clip
from models.blocks import Block
from models.config import size_config
from train.bench.probes import race
from train.config import OptimConfig
from train.loss import ClipLoss
from train.optim import build_optimizer


def autocast(device: str, bf16: bool):
    """bf16 autocast on the device (fp32 master weights, as training runs it), or nothing."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16)


def tower_step(model, tower: str, inputs, clip_loss=None, bf16: bool = False):
    """One training step of a tower (or the whole CLIP when clip_loss is given) as a closure, on the model's
    device, the forward under bf16 autocast when asked."""
    optimizer, _ = build_optimizer(model, OptimConfig(), max_steps=1000)
    model.train()
    device = next(model.parameters()).device

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, bf16):
            if clip_loss is not None:
                loss = clip_loss(*model(*inputs)[:3])
            elif tower == "image":
                loss = model.encode_image(inputs).float().square().mean()
            else:
                loss = model.encode_text(inputs).float().square().mean()
        loss.backward()
        optimizer.step()

    return step


def block_step(width: int, heads: int, attention: str, causal: bool, tokens: int, batch: int, ckpt: bool, args):
    """One block's training step on [batch, tokens, width] (the extrapolation unit)."""
    torch.manual_seed(0)
    block = Block(width, heads, attention, causal=causal, options={}).to(args.device)
    x = torch.randn(batch, tokens, width, device=args.device, requires_grad=True)
    optimizer = torch.optim.AdamW(block.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(args.device, args.bf16):
            if ckpt:
                y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                y = block(x)
        y.float().square().mean().backward()
        optimizer.step()

    return step


def flop_ratio(width: int, head: int, tokens: int, mlp_ratio: float = 4.0) -> float:
    """The FLOP-model bound of linear / softmax step time (module docstring)."""
    dense = (4 + 2 * mlp_ratio) * width * width
    return (dense + 2 * width * head) / (dense + 2 * tokens * width)


def tower_shape(size: str, tower: str) -> tuple[int, int, int]:
    """(width, heads, layers) of a size's tower."""
    cfg = size_config(size)
    if tower == "image":
        v = cfg["vision_cfg"]
        return v["width"], v["width"] // v.get("head_width", 64), v["layers"]
    t = cfg["text_cfg"]
    return t["width"], t["heads"], t["layers"]


def measure(args, tower: str, length: int, probe) -> list[dict]:
    """Every attention (x checkpointing) at one length of one tower: rows of the CSV."""
    width, heads, layers = tower_shape(args.size, tower)
    patch = size_config(args.size)["vision_cfg"]["patch_size"]
    tokens = (length // patch) ** 2 + 1 if tower == "image" else length
    extrapolate = tokens > args.block_above
    batch = 1 if tower == "image" else 2
    steps = {}
    for attention in args.attentions:
        for ckpt in (False, True):
            name = (attention, ckpt)
            if extrapolate:
                steps[name] = block_step(width, heads, attention, tower == "text", tokens, batch, ckpt, args)
                continue
            where = {"image_size" if tower == "image" else "context_length": length}
            model = build_clip(
                ModelConfig(name=args.size, grad_checkpointing=ckpt, **{f"{tower}_attention": attention}, **where)
            ).to(args.device)
            g = torch.Generator().manual_seed(0)
            if tower == "image":
                inputs = torch.randn(batch, 3, length, length, generator=g)
            else:
                inputs = torch.randint(1, model.vocab_size - 1, (batch, length), generator=g)
                inputs[:, -1] = model.vocab_size - 1  # the end-of-text token, where the text is pooled
            steps[name] = tower_step(model, tower, inputs.to(args.device), bf16=args.bf16)
    results = race(steps, args.steps, probe)
    rows = []
    for (attention, ckpt), (seconds, peak) in results.items():
        base = results[("softmax", ckpt)][0] if ("softmax", ckpt) in results else math.nan
        scale = layers if extrapolate else 1
        rows.append(
            {
                "part": tower,
                "length": length,
                "tokens": tokens,
                "attention": attention,
                "checkpointing": ckpt,
                "seconds": seconds * scale,
                "peak_mb": peak,
                "ratio": seconds / base if attention != "softmax" else 1.0,
                "flop_bound": flop_ratio(width, width // heads, tokens) if attention != "softmax" else 1.0,
                "how": f"block x {layers}" if extrapolate else "measured",
            }
        )
    return rows


def clip_flop_ratio(size: str, pixels: int, context: int) -> float:
    """The FLOP-model bound of the whole CLIP: both towers' multiply-adds per sample, linear over softmax (each
    tower: layers x tokens x (12 C^2 + its token mixing), as flop_ratio)."""
    totals = {"linear": 0.0, "softmax": 0.0}
    patch = size_config(size)["vision_cfg"]["patch_size"]
    for tower, tokens in (("image", (pixels // patch) ** 2 + 1), ("text", context)):
        width, heads, layers = tower_shape(size, tower)
        dense = 12 * width * width
        totals["linear"] += layers * tokens * (dense + 2 * width * (width // heads))
        totals["softmax"] += layers * tokens * (dense + 2 * tokens * width)
    return totals["linear"] / totals["softmax"]


def clip_rows(args, probe) -> list[dict]:
    """The whole CLIP at --clip PIXELS,TOKENS, batch 2, ClipLoss; every attention in both towers, with and without
    activation checkpointing."""
    pixels, context = (int(x) for x in args.clip.split(","))
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, pixels, pixels, generator=g)
    steps = {}
    for attention, ckpt in itertools.product(args.attentions, (False, True)):
        model = build_clip(
            ModelConfig(
                name=args.size,
                image_attention=attention,
                text_attention=attention,
                image_size=pixels,
                context_length=context,
                grad_checkpointing=ckpt,
            )
        ).to(args.device)
        tokens = torch.randint(1, model.vocab_size - 1, (2, context), generator=g)
        tokens[:, -1] = model.vocab_size - 1
        inputs = (images.to(args.device), tokens.to(args.device))
        steps[(attention, ckpt)] = tower_step(model, "clip", inputs, ClipLoss(), bf16=args.bf16)
    results = race(steps, args.steps, probe)
    patch = size_config(args.size)["vision_cfg"]["patch_size"]
    bound = clip_flop_ratio(args.size, pixels, context)
    return [
        {
            "part": "clip",
            "length": f"{pixels} px + {context}",
            "tokens": (pixels // patch) ** 2 + 1 + context,
            "attention": attention,
            "checkpointing": ckpt,
            "seconds": s,
            "peak_mb": peak,
            "ratio": s / results[("softmax", ckpt)][0],
            "flop_bound": bound if attention != "softmax" else 1.0,
            "how": "measured",
        }
        for (attention, ckpt), (s, peak) in results.items()
    ]


def slopes(rows: list[dict]) -> dict[tuple[str, str], float]:
    """Least-squares slope of log step time against log tokens per (part, attention), without checkpointing,
    over the longest three lengths (where the attention's own cost shows)."""
    out = {}
    for part in ("image", "text"):
        for attention in {r["attention"] for r in rows}:
            pts = sorted((r["tokens"], r["seconds"]) for r in rows if (r["part"], r["attention"]) == (part, attention))
            pts = [p for p in pts if not math.isnan(p[1])][-3:]
            if len(pts) >= 2:
                x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
                out[(part, attention)] = float(np.polyfit(x, y, 1)[0])
    return out


def plot(rows: list[dict], fitted: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, part in zip(axes, ("image", "text")):
        for attention in dict.fromkeys(r["attention"] for r in rows):
            pts = sorted((r["tokens"], r["seconds"]) for r in rows if (r["part"], r["attention"]) == (part, attention))
            pts = [p for p in pts if not math.isnan(p[1])]
            if pts:
                label = f"{attention} (slope {fitted.get((part, attention), math.nan):.2f})"
                ax.loglog([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_title(f"{part} tower: training step (no checkpointing)")
        ax.set_xlabel("tokens")
        ax.set_ylabel("seconds per step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


WRITER = "train.bench.long"  # in bench_long.json: what writes the page again (tests/test_docs_regenerate.py)
FLOATS = ("seconds", "peak_mb", "ratio", "flop_bound")


def read_rows(path: Path) -> list[dict]:
    """bench_long.csv's rows with their types back (an empty number is NaN): the page is written from these."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["tokens"], r["checkpointing"] = int(r["tokens"]), r["checkpointing"] == "True"
        r.update({k: float(r[k]) if r[k] not in ("", "None") else math.nan for k in FLOATS})
    return rows


def write(rows: list[dict], args, probe, total: float) -> Path:
    """<out>/bench_long.csv, .json (the header's stamp and the arguments the page reads), .png and .md (its findings
    kept); returns the .md."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_long.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    rows = read_rows(out / "bench_long.csv")
    plain = [r for r in rows if not r["checkpointing"] and r["part"] != "clip"]
    plot(plain, slopes(plain), out / "bench_long.png")
    made = pages.stamp(probe.device)
    settings = {"size": args.size, "bf16": args.bf16, "skipped": getattr(args, "skipped", ""), "steps": args.steps}
    saved = {"writer": WRITER, "made": made, "args": {**settings, "argv": args.argv, "total": total}}
    (out / "bench_long.json").write_text(json.dumps(saved, indent=1))
    page = out / "bench_long.md"
    page.write_text(rebuild(page))
    return page


def rebuild(page: Path) -> str:
    """bench_long.md written from bench_long.csv and bench_long.json beside it, with its findings section."""
    page = Path(page)
    saved = json.loads(page.with_suffix(".json").read_text())
    text = markdown(read_rows(page.with_suffix(".csv")), saved["args"], saved["made"])
    return study_page.page_text(text, page.stem, study_page.findings_of(page)).replace(f"]({page.stem}/", "](")


def markdown(rows: list[dict], args: dict, made: dict) -> str:
    plain = [r for r in rows if not r["checkpointing"] and r["part"] != "clip"]
    fitted = slopes(plain)
    skipped = args.get("skipped", "")
    precision = "bf16 autocast" if args["bf16"] else "fp32" + (f" ({skipped}; --bf16 ignored)" if skipped else "")
    title = "Long sequences: training-step time of the whole model against length"
    lines = [
        pages.header(title, pages.command("scripts.bench_long", args["argv"]), made=made),
        f"{args['size']}, {precision}; fastest of {args['steps']} rounds; "
        f"total {args['total'] / 60:.1f} min. Ratio: the attention's step time over softmax's (SDPA) at the same "
        "length and checkpointing; bound: the FLOP model's ratio (scripts/bench_long.py). Peak MB on a CPU: the "
        "process's resident-set high-water mark above what it held before the step; the allocator keeps freed memory, "
        "so a step after a bigger one reads about 0 (no new peak); on a GPU: the CUDA allocator's peak above what was "
        "allocated before the step.",
        "",
        "| tower | length | tokens | attention | checkpointing | s / step | peak MB | ratio | FLOP bound | how |",
        "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        peak = "" if math.isnan(r["peak_mb"]) else f"{r['peak_mb']:.0f}"
        bound = "" if math.isnan(r["flop_bound"]) or r["attention"] == "softmax" else f"{r['flop_bound']:.2f}"
        ratio = "" if r["attention"] == "softmax" else f"{r['ratio']:.2f}"
        lines.append(
            f"| {r['part']} | {r['length']} | {r['tokens']} | {r['attention']} | {'yes' if r['checkpointing'] else ''}"
            f" | {r['seconds']:.3g} | {peak} | {ratio} | {bound} | {r['how']} |"
        )
    lines += ["", "Slopes of log step time against log tokens (the longest three lengths, no checkpointing):", ""]
    lines += [f"- {part} tower, {attention}: {s:.2f}" for (part, attention), s in sorted(fitted.items())]
    lines += ["", "![step time against tokens](bench_long.png)", ""]
    return "\n".join(lines)
