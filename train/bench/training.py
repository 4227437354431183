"""Seconds per training step (forward, loss, backward, AdamW step) of our CLIP against open_clip's, and per image
attention: the measurements and the page of scripts/bench_train.py (what it times and how: its docstring).

    rows = training.ours_vs_open_clip(["ViT-S-16"], batch_size=8, rounds=3, probe=probe)     # part 1
    rows += training.attentions("ViT-S-16", names, [224, 448], 2, 3, probe, folder)          # part 2
    training.write_outputs(rows, args, probe, seconds)       # <out>/bench_train[_cuda].csv, .json, .md, .png
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch

try:
    import open_clip
except ImportError as err:  # models/ builds on open_clip's configs and tokenizer, so nothing runs without it
    raise SystemExit(
        f"error: open_clip is needed ({err}); pip install open_clip_torch, or carry its wheel (scripts/gpu_check.sh)"
    ) from None

from eval import machine, pages, study_page
from models import ModelConfig, build_clip
from train.bench.probes import OOM, race
from train.config import OptimConfig
from train.loss import ClipLoss
from train.optim import build_optimizer


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


def batch(size: str, pixels: int, batch_size: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    captions = [f"a photo of object number {i}" for i in range(batch_size)]
    images = torch.randn(batch_size, 3, pixels, pixels, generator=g)
    return images.to(device), open_clip.get_tokenizer(size)(captions).to(device)


def make_step(model, loss_fn, images, tokens, precision: str):
    """A closure doing one full training step; AdamW with our parameter groups for every contender."""
    model.to(images.device).train()
    optimizer, _ = build_optimizer(model, OptimConfig(), max_steps=1000)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            image_features, text_features, scale = model(images, tokens)[:3]
            loss = loss_fn(image_features.float(), text_features.float(), scale)
        loss.backward()
        optimizer.step()

    return step


def row(part: str, model: str, pixels: int, precision: str, attention: str, result: tuple, peer: tuple) -> dict:
    """One CSV row: seconds and peak MB of ours, of the peer (open_clip, or softmax attention), and their ratio."""
    (seconds, peak), (peer_s, _) = result, peer
    out = dict(part=part, model=model, pixels=pixels, precision=precision, attention=attention, ours_s=seconds)
    out.update(peak_mb=peak, ratio=seconds / peer_s, status="" if seconds == seconds else OOM)
    return out | ({"open_clip_s": peer_s} if part == "vs_open_clip" else {})


def precisions(probe) -> list[str]:
    """fp32 and bf16; bf16 skipped, with one line, on a CPU that emulates it (eval/machine.py)."""
    skipped = machine.emulated(probe.device).get("bfloat16")
    if skipped:
        print(skipped, flush=True)
    return ["fp32"] if skipped else ["fp32", "bf16"]


def ours_vs_open_clip(sizes: list[str], batch_size: int, rounds: int, probe) -> list[dict]:
    rows = []
    for size in sizes:
        pixels = open_clip.get_model_config(size)["vision_cfg"]["image_size"]  # 224 for the ViT-*-16
        images, tokens = batch(size, pixels, batch_size, probe.device)
        for precision in precisions(probe):
            torch.manual_seed(0)
            ours = build_clip(ModelConfig(name=size))
            theirs = open_clip.create_model(size)
            steps = {
                "ours": make_step(ours, ClipLoss(), images, tokens, precision),
                "open_clip": make_step(theirs, open_clip.loss.ClipLoss(), images, tokens, precision),
            }
            result = race(steps, rounds, probe)
            rows.append(row("vs_open_clip", size, pixels, precision, "softmax", result["ours"], result["open_clip"]))
            times = f"ours {result['ours'][0]:.3f} s, open_clip {result['open_clip'][0]:.3f} s"
            print(f"{size} {precision}: {times}, ratio {rows[-1]['ratio']:.2f}", flush=True)
            del ours, theirs, steps
            probe.free()
    return rows


def attentions(size: str, names: list[str], image_sizes: list[int], batch_size: int, rounds: int, probe, folder: Path):
    """Rows of part 2: each image attention at each resolution, in fp32 on the CPU and bf16 on a GPU."""
    rows, precision = [], "fp32" if probe.device == "cpu" else "bf16"
    for pixels in image_sizes:
        name = register_resolution(size, pixels, folder)
        images, tokens = batch(size, pixels, batch_size, probe.device)
        steps = {}
        for attention in names:
            torch.manual_seed(0)
            model = build_clip(ModelConfig(name=name, image_attention=attention, text_attention="softmax"))
            steps[attention] = make_step(model, ClipLoss(), images, tokens, precision)
        result = race(steps, rounds, probe)
        for attention, measured in result.items():
            rows.append(row("attention", size, pixels, precision, attention, measured, result["softmax"]))
            print(f"{size} {pixels}px {attention}: {measured[0]:.3f} s ({rows[-1]['ratio']:.2f}x softmax)", flush=True)
        del steps
        probe.free()
    return rows


def seconds(value: float) -> str:
    return OOM if value != value else f"{value:.3f}"


def write_outputs(rows: list[dict], args, probe, total: float) -> Path:
    """<out>/bench_train[_cuda].csv, .json (the header's stamp, the arguments and versions the page reads, the rows),
    .png and .md (its findings kept); returns the .md."""
    out, stem = Path(args.out), "bench_train" if probe.device == "cpu" else "bench_train_cuda"
    out.mkdir(parents=True, exist_ok=True)
    fields = ["part", "model", "pixels", "precision", "attention", "ours_s", "open_clip_s", "ratio", "peak_mb"]
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [*fields, "status"])
        writer.writeheader()
        writer.writerows(rows)
    meta = {k: getattr(args, k) for k in ("command", "batch_size", "steps", "attention_size", "attention_batch_size")}
    meta |= {"torch": torch.__version__, "open_clip": open_clip.__version__, "total": total}
    meta["bf16_skipped"] = machine.emulated(probe.device).get("bfloat16", "")
    page = out / f"{stem}.md"
    pages.write_page(page, rebuild, pages.stamp(probe.device), meta, rows)
    plot(*parts(rows), out / f"{stem}.png")
    return page


def rebuild(page: Path) -> str:
    """bench_train[_cuda].md written from the JSON beside it, with its findings section (the figure beside it)."""
    return study_page.with_findings(page, markdown(pages.load_data(page), Path(page).stem), beside=True)


def parts(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(ours against open_clip, each attention)."""
    return [r for r in rows if r["part"] == "vs_open_clip"], [r for r in rows if r["part"] == "attention"]


def markdown(saved: dict, stem: str) -> str:
    meta, (first, second) = saved["meta"], parts(saved["rows"])
    skipped = meta["bf16_skipped"] and "bf16" not in {r["precision"] for r in first}
    lines = [
        pages.header("Training step: ours against open_clip, and each attention", meta["command"], made=saved["made"]),
        f"Batch {meta['batch_size']}, torch {meta['torch']}, open_clip {meta['open_clip']}; fastest of "
        f"{meta['steps']} steps after one warm-up; a step = forward, contrastive loss, backward, AdamW step; peak = "
        f"memory above what was held before the step. Total run {meta['total'] / 60:.1f} min.",
        *([f"{meta['bf16_skipped']}."] if skipped else []),
        "",
        "## Softmax CLIP, ours vs open_clip (224 px for the ViT-*-16)",
        "",
        "| model | precision | ours s/step | open_clip s/step | ours / open_clip | ours peak MB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['precision']} | {seconds(r['ours_s'])} | {seconds(r['open_clip_s'])} | {r['ratio']:.2f} "
        f"| {r['peak_mb'] or float('nan'):.0f} |"
        for r in first
    ]
    precision = second[0]["precision"] if second else ""
    lines += [
        "",
        f"## Image attention variants ({meta['attention_size']}, batch {meta['attention_batch_size']}, "
        f"text tower softmax, {precision})",
        "",
        "| pixels | attention | s/step | / softmax | peak MB |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['pixels']} | {r['attention']} | {seconds(r['ours_s'])} | {r['ratio']:.2f} | "
        f"{r['peak_mb'] or float('nan'):.0f} |"
        for r in second
    ]
    lines += ["", f"![seconds per step]({stem}.png)", ""]
    return "\n".join(lines)


def plot(first: list[dict], second: list[dict], path: Path) -> None:
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
    right.set_title(f"image attention variants, {second[0]['precision'] if second else ''}")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
