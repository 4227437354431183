"""An evaluation set decoded once per run: the batches of its first complete pass kept in memory and replayed.

A run evaluates every `eval.every` steps on the same images and captions through a deterministic transform, so
every pass after the first decodes, crops and tokenizes the same bytes into the same tensors. `Replay` keeps the
batches of the first pass that gets to the end, while they fit in `max_mb` (eval.cache_mb, per process), and
yields them again on later passes; a set larger than that is read every time, as before. Results are the same
bit for bit (tests/eval/test_replay.py); on the main job's tiny models reading the set is most of an evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch


def nbytes(item) -> int:
    """Bytes of the tensors in a batch (nested tuples, lists and dicts); other objects count as nothing."""
    if isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, (tuple, list)):
        return sum(nbytes(x) for x in item)
    if isinstance(item, dict):
        return sum(nbytes(x) for x in item.values())
    return 0


class Replay:
    """replay(make_batches) -> the batches of make_batches(), from memory once a complete pass has fit in max_mb."""

    def __init__(self, max_mb: float):
        self.max_bytes = max_mb * 2**20
        self.kept: list | None = None

    @property
    def ready(self) -> bool:
        return self.kept is not None

    def __call__(self, make_batches: Callable[[], Iterable]) -> Iterator:
        if self.kept is not None:
            yield from self.kept
            return
        kept, size = ([] if self.max_bytes > 0 else None), 0
        for batch in make_batches():
            if kept is not None:
                size += nbytes(batch)
                if size <= self.max_bytes:
                    kept.append(batch)
                else:
                    kept = None
            yield batch
        self.kept = kept  # only a pass that reached its end is kept
