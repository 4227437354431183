"""Cheaper input pipelines with the same numbers: open_clip's image transform split into a per-sample half (in the
data workers, ending in uint8) and a per-batch half (float conversion and normalisation, where the batch lands),
its random crop with torchvision's random draws made without a tensor allocation per draw, and open_clip's
tokenizer with a cache of recent captions.

Both halves together give the float tensor open_clip's transform gives, bit for bit: ToTensor is uint8 -> float32
then / 255, Normalize is - mean then / std, the same element-wise operations on a batch as on one image
(tests/models/test_preprocess.py). The worker then sends a quarter of the bytes, and on a GPU the normalisation
runs there (timm's PrefetchLoader does the same).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from PIL import Image
from torch import Tensor
from torchvision import transforms as T
from torchvision.transforms import functional as F
from torchvision.transforms.functional import pil_modes_mapping


class Normalise:
    """uint8 images [B, 3, H, W] -> float32, / 255, - mean, / std (per channel): ToTensor + Normalize of a batch."""

    def __init__(self, mean, std):
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.on: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def __call__(self, images: Tensor) -> Tensor:
        if images.dtype != torch.uint8:
            raise TypeError(f"Normalise takes uint8 images, got {images.dtype}")
        if images.device not in self.on:
            self.on[images.device] = tuple(
                torch.tensor(v, dtype=torch.float32, device=images.device)[:, None, None] for v in (self.mean, self.std)
            )
        mean, std = self.on[images.device]
        return images.to(torch.float32).div(255).sub_(mean).div_(std)

    def __repr__(self) -> str:
        return f"Normalise(mean={self.mean}, std={self.std})"


class ResizedCrop:
    """torchvision's RandomResizedCrop of a PIL image, the same crop for the same state of torch's generator: the
    same draws in the same order (uniform_ on a float32 tensor, exp in float32, randint), from one kept tensor
    instead of new ones per draw, and PIL's crop and resize called directly (what torchvision's functional API calls
    for PIL images). About 3x cheaper on the study's 32 px images, where torchvision's per-call overhead is most of
    the transform (tests/models/test_preprocess.py checks equality over many seeds, sizes and shapes). Tensors go to
    torchvision's transform."""

    def __init__(self, crop: T.RandomResizedCrop):
        self.crop = crop
        self.height, self.width = crop.size
        self.scale = (float(crop.scale[0]), float(crop.scale[1]))
        self.log_ratio = tuple(v.item() for v in torch.log(torch.tensor(crop.ratio)))
        self.resample = pil_modes_mapping[crop.interpolation]
        self.draw = torch.empty(1)

    def params(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop: RandomResizedCrop.get_params."""
        area = height * width
        for _ in range(10):
            target_area = area * self.draw.uniform_(*self.scale).item()
            aspect_ratio = self.draw.uniform_(*self.log_ratio).exp_().item()
            w = round(math.sqrt(target_area * aspect_ratio))
            h = round(math.sqrt(target_area / aspect_ratio))
            if 0 < w <= width and 0 < h <= height:
                i = torch.randint(0, height - h + 1, size=(1,)).item()
                j = torch.randint(0, width - w + 1, size=(1,)).item()
                return i, j, h, w
        ratio, in_ratio = self.crop.ratio, width / height  # ten misses: the central crop, as torchvision
        if in_ratio < min(ratio):
            w, h = width, round(width / min(ratio))
        elif in_ratio > max(ratio):
            w, h = round(height * max(ratio)), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image):
        if not isinstance(image, Image.Image):
            return self.crop(image)
        i, j, h, w = self.params(image.height, image.width)
        image = image.crop((j, i, j + w, i + h))
        if (h, w) == (self.height, self.width):
            return image
        return image.resize((self.width, self.height), self.resample)

    def __repr__(self) -> str:
        return f"ResizedCrop({self.crop!r})"


class ToUint8:
    """PILToTensor: an image -> uint8 [C, H, W] (a permuted view of its pixels in H, W, C order, as torchvision's),
    an RGB image through one bytes copy instead of a NumPy array (half the time on 32 px images); other modes
    through torchvision's pil_to_tensor."""

    def __call__(self, image: Image.Image) -> Tensor:
        if image.mode != "RGB":
            return F.pil_to_tensor(image)
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        return pixels.view(image.height, image.width, 3).permute(2, 0, 1)

    def __repr__(self) -> str:
        return "ToUint8()"


def split_normalise(transform) -> tuple[object, Normalise | None]:
    """(per-sample transform ending in uint8, Normalise) of a Compose that ends in ToTensor + Normalize;
    (transform, None) for any other transform. A RandomResizedCrop in it becomes a ResizedCrop (the same crops)."""
    steps = list(getattr(transform, "transforms", []))
    if len(steps) < 2 or type(steps[-1]) is not T.Normalize or not isinstance(steps[-2], T.ToTensor):
        return transform, None
    normalize = steps[-1]
    steps = [ResizedCrop(s) if type(s) is T.RandomResizedCrop else s for s in steps[:-2]]
    return T.Compose([*steps, ToUint8()]), Normalise(normalize.mean, normalize.std)


# Rows of captions tokenized once by a study before it forks its runs (share_rows), per tokenizer key
# (models.clip.tokenizer_key: the size and its context length); a CachedTokenizer with that key reads them.
SHARED_ROWS: dict[tuple, dict[str, tuple[Tensor, bool]]] = {}


class CachedTokenizer:
    """tokenizer(list of captions) -> [n, L], remembering the rows of the last `size` distinct captions, and whether
    each was cut to fit the context (`truncated(captions)` counts them).

    Exact for tokenizers that encode each caption on its own (open_clip's: BPE, padded or cut to L, the last token
    then end-of-text). Captions that repeat (templates, small vocabularies, several epochs of one set) are tokenized
    once; with a `key`, the rows SHARED_ROWS holds for it (tokenized before this process was forked) are used as
    they are, outside the `size` bound."""

    def __init__(self, tokenizer, size: int = 65536, key: tuple | None = None):
        self.tokenizer, self.size = tokenizer, size
        self.rows: OrderedDict[str, tuple[Tensor, bool]] = OrderedDict()
        self.shared = SHARED_ROWS.get(key, {}) if key is not None else {}

    def __call__(self, captions: list[str] | str) -> Tensor:
        if isinstance(captions, str):
            captions = [captions]
        missing = list(dict.fromkeys(c for c in captions if c not in self.rows and c not in self.shared))
        if missing:
            for caption, row in zip(missing, self.tokenizer(missing), strict=True):
                # a clone, not a view that would keep the whole batch alive
                self.rows[caption] = (row.clone(), self.was_cut(caption, row))
        out = []
        for caption in captions:
            kept = self.shared.get(caption)
            if kept is None:
                self.rows.move_to_end(caption)
                kept = self.rows[caption]
            out.append(kept[0])
        while len(self.rows) > self.size:
            self.rows.popitem(last=False)
        return torch.stack(out)

    def truncated(self, captions: list[str]) -> int:
        """How many of `captions` (tokenized by the last call) lost tokens to the context length."""
        return sum((self.shared.get(c) or self.rows[c])[1] for c in captions if c in self.shared or c in self.rows)

    def was_cut(self, caption: str, row: Tensor) -> bool:
        """A row with no padding left may have been cut: then the caption's own length decides (BPE tokenizers
        with `encode`: start + tokens + end > L); tokenizers without `encode` count every full row."""
        if int(row[-1]) == 0:
            return False
        encode = getattr(self.tokenizer, "encode", None)
        return encode is None or len(encode(caption)) + 2 > row.numel()

    def __getstate__(self) -> dict:  # a worker process started by spawn gets no shared rows (it tokenizes them again)
        return {**self.__dict__, "shared": {}}

    def __getattr__(self, name: str):  # context_length, vocab_size, ... of the wrapped tokenizer
        if "tokenizer" not in self.__dict__:  # while unpickling
            raise AttributeError(name)
        return getattr(self.__dict__["tokenizer"], name)


def share_rows(key: tuple, tokenizer, captions: list[str]) -> int:
    """Tokenize the distinct `captions` once into SHARED_ROWS[key] (before a study forks its runs; those it holds
    already, from an earlier call, are not tokenized again); returns how many distinct captions it then holds of
    them. In groups of 64, as training batches: tensors below ATen's grain size, so no thread pool starts before the
    fork (train/forked.py)."""
    shared, unique = SHARED_ROWS.setdefault(key, {}), list(dict.fromkeys(captions))
    missing = [c for c in unique if c not in shared]
    cached = CachedTokenizer(tokenizer, size=len(missing) + 1)
    for start in range(0, len(missing), 64):
        cached(missing[start : start + 64])
    shared.update(cached.rows)
    return len(unique)
