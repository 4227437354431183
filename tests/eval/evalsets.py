"""Tiny evaluation sets for the eval tests, in each layout: ImageFolder trees (named, numbered, WordNet-id
folders), clip_benchmark classification and retrieval webdatasets (written by clip_benchmark's own converters),
caption CSVs; and a tiny-s checkpoint file for the CLIs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from clip_benchmark.webdataset_builder import convert_dataset, convert_retrieval_dataset, path_to_bytes
from PIL import Image
from safetensors.torch import save_file

import models
from data import make_synthetic
from eval import datasets
from models import run_folder


def synthetic_eval(out: Path, per_class: int = 3) -> Path:
    """The synthetic set's 24-class ImageFolder (colour_shape folders, classnames.txt, templates.txt inside)."""
    make_synthetic(out, train_samples=1, eval_per_class=per_class, shard_size=1)
    return out / "eval"


def to_webdataset(folder: Path, out: Path, per_shard: int) -> Path:
    """clip_benchmark's classification webdataset (test/{0..n-1}.tar, nshards.txt) of an ImageFolder tree, with
    its class names and templates beside the shards as clip_benchmark's wds_* folders hold them."""
    items = datasets.ImageFolderSet(folder, transform=lambda image: image).samples
    convert_dataset(items, "test", str(out), max_count=per_shard, transform=path_to_bytes, verbose=False)
    shutil.copy(folder / "classnames.txt", out / "classnames.txt")
    shutil.copy(folder / "templates.txt", out / "zeroshot_classification_templates.txt")
    return out


def renamed_copy(folder: Path, out: Path, names: list[str]) -> Path:
    """The class folders of `folder` (sorted) copied under new folder names, one per class."""
    for old, new in zip(datasets.class_folders(folder), names):
        shutil.copytree(folder / old, out / new)
    return out


def noise_image(path: Path, rng: np.random.Generator, size: int = 24) -> Path:
    colour = rng.integers(0, 256, 3)
    pixels = np.clip(colour + rng.normal(0, 20, (size, size, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def caption_pairs(root: Path, count: int = 9, per_shard: int = 4, broken: int | None = 3) -> Path:
    """`count` noisy images with two captions each as pairs.tsv (filepath, title) and as clip_benchmark's
    retrieval webdataset wds/ (written by its converter); image `broken` is not an image."""
    root.mkdir(parents=True, exist_ok=True)
    rng, items = np.random.default_rng(0), []
    for i in range(count):
        noise_image(root / f"{i}.png", rng)
        items.append((str(root / f"{i}.png"), [f"a photo number {i}", f"picture {i} of a colour"]))
    if broken is not None:
        (root / f"{broken}.png").write_bytes(b"broken")
    rows = ["filepath\ttitle"] + [f"{i}.png\t{c}" for i, (_, captions) in enumerate(items) for c in captions]
    (root / "pairs.tsv").write_text("\n".join(rows) + "\n")
    convert_retrieval_dataset(
        items, "test", str(root / "wds"), transform=path_to_bytes, max_count=per_shard, verbose=False
    )
    (root / "wds" / "dataset_type.txt").write_text("retrieval\n")
    return root


def tiny_run(run: Path, step: int = 5, seed: int = 0) -> Path:
    """RUN/checkpoints/step_<step>/ with the files a training checkpoint has (the weights of a seeded random tiny-s,
    meta.json, a data state, scheduler and random states) and its manifest, finished as the trainer does."""
    torch.manual_seed(seed)
    cfg = models.ModelConfig(name="tiny-s")
    tmp = run_folder.tmp_folder(run, step)
    (tmp / "state").mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in models.build_clip(cfg).state_dict().items()}, str(tmp / "model.safetensors")
    )
    meta = {"step": step, "samples_seen": step * 32, "config": {"model": vars(cfg), "data": {}}}
    (tmp / "meta.json").write_text(json.dumps(meta))
    (tmp / run_folder.data_state_name(0)).write_text("{}")
    torch.save({"last_epoch": step}, tmp / "state" / "scheduler.bin")
    torch.save({"torch_manual_seed": torch.get_rng_state()}, tmp / run_folder.rng_name(0))
    run_folder.finish(tmp)
    return run


def tiny_checkpoint(path: Path, seed: int = 0) -> Path:
    """The weights of a seeded random tiny-s as a safetensors file (for --open-clip-model tiny-s --checkpoint)."""
    torch.manual_seed(seed)
    model = models.create_model("tiny-s")
    return models.export_open_clip(model, path)  # open_clip's layout: its 0-dim logit scale
