"""Where the main job's tiny training step spends its time: the measurements and the page of scripts/profile_step.py
(what it times and how: its docstring).

    per_step, groups = profiling.model_step(profiling.config("demo-w64", "softmax", shards, folder))
    profiling.write(rows, out, "demo-w64", minutes)          # <out>/profile_step.md, .csv and .json
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from data.stream import decode, tar_samples
from eval import pages, study_page
from train import main as train_main
from train.config import load_config
from train.dist import make_accelerator
from train.loop import DataStream, clip_gradients, compute_gradients
from train.loss import build_loss
from train.optim import build_optimizer

REPO = Path(__file__).resolve().parents[2]
GROUPS = {  # op group -> aten op name prefixes (self time)
    "matrix products (linear layers)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention kernels": ("aten::_scaled_dot_product", "Causal", "NoDenom", "Normalised", "Linear"),
    "token embedding gradient (49,408 rows)": ("aten::embedding_dense_backward", "aten::fill_"),
    "AdamW (fused) and gradient norm": ("aten::_fused_adamw_", "aten::linalg_vector_norm", "aten::_foreach"),
    "GELU, LayerNorm, adds and copies": ("aten::gelu", "aten::native_layer_norm", "aten::add", "aten::copy_"),
}


def config(size: str, attention: str, shards: str, folder: Path):
    return load_config(
        [
            "configs/demo.yaml",
            f"model.name={size}",
            f"model.image_attention={attention}",
            f"model.text_attention={attention}",
            f"data.train_shards={shards}",
            "data.workers=0",
            "eval.dataset=null",
            "eval.val_shards=null",
            f"train.run_dir={folder}",
        ]
    )


def model_step(cfg, batches: int = 30) -> tuple[float, dict[str, float]]:
    """(ms per optimizer step of the model alone, {group: ms per step}) on pre-loaded batches."""
    acc = make_accelerator(cfg.train)
    data = train_main.build_data(cfg.data, cfg.model, cfg.train.augment, acc)
    model = train_main.build_model(cfg.model, cfg.train.loss, False)
    optimizer, schedule = build_optimizer(model, cfg.optim, cfg.train.max_steps)
    model, optimizer, schedule = acc.prepare(model, optimizer, schedule)
    stream = DataStream(data, acc.device)
    loss_fn = build_loss(cfg.train.loss, siglip_exchange=cfg.train.siglip_exchange)
    loaded = [stream.next() for _ in range(batches)]

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        compute_gradients(acc, model, loss_fn, [batch])
        clip_gradients(acc, model, None)
        optimizer.step()
        schedule.step()

    for batch in loaded[:5]:
        step(batch)
    start = time.perf_counter()
    for batch in loaded[5:]:
        step(batch)
    per_step = (time.perf_counter() - start) / (batches - 5) * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in loaded[5:15]:
            step(batch)
    groups = dict.fromkeys(GROUPS, 0.0)
    total = 0.0
    for event in prof.key_averages():
        total += event.self_cpu_time_total
        for group, prefixes in GROUPS.items():
            if event.key.startswith(prefixes):
                groups[group] += event.self_cpu_time_total
                break
    groups["everything else (autograd, Python, small ops)"] = total - sum(groups.values())
    return per_step, {g: per_step * us / total for g, us in groups.items()}


def data_stages(cfg, shards_folder: Path, samples: int = 640) -> dict[str, float]:
    """{stage: ms per batch of 64}: reading the tar, decoding the JPEG, the train transform, tokenizing."""
    acc = make_accelerator(cfg.train)
    data = train_main.build_data(cfg.data, cfg.model, cfg.train.augment, acc)
    tar = sorted((shards_folder / "train").glob("*.tar"))[0]
    start = time.perf_counter()
    raw = [s for _, s in zip(range(samples), tar_samples(str(tar)), strict=False)]
    read = time.perf_counter() - start
    start = time.perf_counter()
    decoded = [decode(s, 10**8) for s in raw]
    decoding = time.perf_counter() - start
    torch.manual_seed(0)
    start = time.perf_counter()
    for image, _ in decoded:
        data.image_transform(image)
    transform = time.perf_counter() - start
    captions = [c for _, c in decoded]
    start = time.perf_counter()
    for j in range(0, len(captions), 64):
        data.tokenizer(captions[j : j + 64])
    tokenize = time.perf_counter() - start
    per_batch = 64 / len(raw) * 1e3
    return {
        "reading the tar": read * per_batch,
        "decoding the JPEG": decoding * per_batch,
        "random crop and resize (to uint8)": transform * per_batch,
        "tokenizing (cached)": tokenize * per_batch,
    }


def process_costs(shards: str, folder: Path, eval_folder: Path) -> dict[str, float]:
    """{what: seconds of wall time} of the imports and of a 1-step run without and with its final evaluation."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = {}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import train.main"], cwd=REPO, env=env, check=True)
    out["importing train.main (open_clip, torch, transformers)"] = time.perf_counter() - start
    evals = {
        "without": ["eval.dataset=null", "eval.val_shards=null"],
        "with": [f"eval.dataset={eval_folder / 'eval'}", f"eval.val_shards={eval_folder / 'val' / '00000.tar'}"],
    }
    for name, overrides in evals.items():
        argv = [sys.executable, "-m", "train", "configs/demo.yaml", f"data.train_shards={shards}", "train.max_steps=1"]
        argv += [*overrides, f"train.run_dir={folder / name}", "train.progress=false"]
        start = time.perf_counter()
        subprocess.run(argv, cwd=REPO, env=env, check=True, capture_output=True)
        out[f"a 1-step run {name} its evaluation"] = time.perf_counter() - start
    return out


def write(rows: list[dict], out: Path, size: str, minutes: float) -> Path:
    """<out>/profile_step.csv, .json (the header's stamp, the settings the page reads, the rows) and .md (its
    findings kept); returns the .md."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "profile_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["part", "what", "ms"])
        writer.writeheader()
        writer.writerows(rows)
    page = out / "profile_step.md"
    return pages.write_page(page, rebuild, pages.stamp(), {"size": size, "minutes": minutes}, rows)


def rebuild(page: Path) -> str:
    """profile_step.md written from profile_step.json beside it, with its findings section."""
    saved = pages.load_data(page)
    what = "Where the main job's training step spends its time"
    lines = [
        pages.header(what, pages.command("scripts.profile_step", []), made=saved["made"]),
        f"{saved['meta']['size']}, batch 64, 32 px, one torch thread; {saved['meta']['minutes']:.1f} min. Model step: "
        "forward, contrastive loss, backward, "
        "gradient norm, AdamW on loaded batches (op groups by self time under torch.profiler, scaled to the "
        "unprofiled step). Data: the stages of the data worker, in this process. Per process: wall seconds.",
        "",
        "| part | what | ms |",
        "| --- | --- | ---: |",
    ]
    lines += [f"| {r['part']} | {r['what']} | {r['ms']:.1f} |" for r in saved["rows"]]
    return study_page.with_findings(page, "\n".join(lines) + "\n")
