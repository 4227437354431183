"""Cheaper input pipelines with the same numbers: open_clip's image transform split into a per-sample half (in the
data workers, ending in uint8) and a per-batch half (float conversion and normalisation, where the batch lands),
and open_clip's tokenizer with a cache of recent captions.

Both halves together give the float tensor open_clip's transform gives, bit for bit: ToTensor is uint8 -> float32
then / 255, Normalize is - mean then / std, the same element-wise operations on a batch as on one image
(tests/models/test_preprocess.py). The worker then sends a quarter of the bytes, and on a GPU the normalisation
runs there (timm's PrefetchLoader does the same).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor
from torchvision import transforms as T


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


def split_normalise(transform) -> tuple[object, Normalise | None]:
    """(per-sample transform ending in uint8, Normalise) of a Compose that ends in ToTensor + Normalize;
    (transform, None) for any other transform."""
    steps = list(getattr(transform, "transforms", []))
    if len(steps) < 2 or type(steps[-1]) is not T.Normalize or not isinstance(steps[-2], T.ToTensor):
        return transform, None
    normalize = steps[-1]
    return T.Compose([*steps[:-2], T.PILToTensor()]), Normalise(normalize.mean, normalize.std)


class CachedTokenizer:
    """tokenizer(list of captions) -> [n, L], remembering the rows of the last `size` distinct captions, and whether
    each was cut to fit the context (`truncated(captions)` counts them).

    Exact for tokenizers that encode each caption on its own (open_clip's: BPE, padded or cut to L, the last token
    then end-of-text). Captions that repeat (templates, small vocabularies, several epochs of one set) are tokenized
    once."""

    def __init__(self, tokenizer, size: int = 65536):
        self.tokenizer, self.size = tokenizer, size
        self.rows: OrderedDict[str, tuple[Tensor, bool]] = OrderedDict()

    def __call__(self, captions: list[str] | str) -> Tensor:
        if isinstance(captions, str):
            captions = [captions]
        missing = list(dict.fromkeys(c for c in captions if c not in self.rows))
        if missing:
            for caption, row in zip(missing, self.tokenizer(missing), strict=True):
                # a clone, not a view that would keep the whole batch alive
                self.rows[caption] = (row.clone(), self.was_cut(caption, row))
        out = []
        for caption in captions:
            self.rows.move_to_end(caption)
            out.append(self.rows[caption][0])
        while len(self.rows) > self.size:
            self.rows.popitem(last=False)
        return torch.stack(out)

    def truncated(self, captions: list[str]) -> int:
        """How many of `captions` (tokenized by the last call) lost tokens to the context length."""
        return sum(self.rows[c][1] for c in captions if c in self.rows)

    def was_cut(self, caption: str, row: Tensor) -> bool:
        """A row with no padding left may have been cut: then the caption's own length decides (BPE tokenizers
        with `encode`: start + tokens + end > L); tokenizers without `encode` count every full row."""
        if int(row[-1]) == 0:
            return False
        encode = getattr(self.tokenizer, "encode", None)
        return encode is None or len(encode(caption)) + 2 > row.numel()

    def __getattr__(self, name: str):  # context_length, vocab_size, ... of the wrapped tokenizer
        if "tokenizer" not in self.__dict__:  # while unpickling
            raise AttributeError(name)
        return getattr(self.__dict__["tokenizer"], name)
