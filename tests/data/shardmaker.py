"""Tiny webdataset shards for the data tests: sample i has caption "sample i" and a 8x8 image."""

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def jpeg(side: int = 8, value: int = 128) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (value, 50, 200)).save(buffer, format="JPEG")
    return buffer.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sample_members(ids) -> list[tuple[str, bytes]]:
    members = []
    for i in ids:
        members += [(f"{i:06d}.jpg", jpeg(value=i % 256)), (f"{i:06d}.txt", f"sample {i}".encode())]
    return members


def write_shards(folder: Path, sizes: list[int], first_id: int = 0, sizes_json: bool = True) -> str:
    """Shards 0000.tar.. with the given sample counts and unique ids; returns the brace spec."""
    folder.mkdir(parents=True, exist_ok=True)
    next_id = first_id
    for shard, size in enumerate(sizes):
        write_tar(folder / f"{shard:04d}.tar", sample_members(range(next_id, next_id + size)))
        next_id += size
    if sizes_json:
        (folder / "sizes.json").write_text(json.dumps({f"{s:04d}.tar": n for s, n in enumerate(sizes)}))
    return str(folder / f"{{0000..{len(sizes) - 1:04d}}}.tar")


def ids_tokenizer(captions: list[str]) -> torch.Tensor:
    """Stands in for a tokenizer: the sample id of each caption, [n, 1]."""
    return torch.tensor([[int(caption.split()[-1])] for caption in captions])


def to_tensor(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 255


def batch_ids(loader) -> list[list[int]]:
    return [tokens[:, 0].tolist() for _, tokens in loader]
