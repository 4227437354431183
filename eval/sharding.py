"""Evaluation split across the processes of a job: each rank reads a slice of the images, counts are summed.

A `Shard` names this process's part (rank r of world w). Map-style sets (ImageFolder trees, caption CSVs) give
rank r the contiguous slice of indices [r*n//w, (r+1)*n//w); webdataset folders give each rank a contiguous
block of tar shards when there are at least w of them, else every rank reads all shards and keeps every w-th
sample. Either way the slices partition the set, so summed counts equal those of one process exactly.

Collectives go through torch.distributed (gloo on the CPU, NCCL on GPUs, whose tensors must live on the GPU).
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `world_size` evaluating processes; the default is one process reading everything."""

    rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def index_range(self, n: int) -> range:
        """This rank's contiguous slice of n items (sizes differ by at most one)."""
        return range(self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size)

    def split_urls(self, urls: list[str]) -> tuple[list[str], bool]:
        """(this rank's tar shards, whether samples must be split too): a contiguous block of shards when every
        rank gets at least one, else all of them."""
        if len(urls) >= self.world_size:
            return [urls[i] for i in self.index_range(len(urls))], False
        return list(urls), self.distributed

    def every_nth(self, samples):
        """The samples of a stream that belong to this rank when all ranks read the same stream."""
        return islice(samples, self.rank, None, self.world_size)


def init_from_environment(device: str) -> tuple[Shard, torch.device]:
    """Join the process group that torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT).

    Returns this process's Shard and its device: cuda:LOCAL_RANK with NCCL when `device` is a CUDA device,
    else `device` with gloo. One process (no WORLD_SIZE) gets Shard() and `device` unchanged.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Shard(), torch.device(device)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Shard(dist.get_rank(), dist.get_world_size()), torch.device(device)


def collective_device(device) -> torch.device:
    """Where tensors of a collective must be: the GPU under NCCL, the CPU under gloo."""
    return torch.device(device) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_over_ranks(counts: torch.Tensor, shard: Shard, device) -> torch.Tensor:
    """Integer counts (any shape) summed over every rank; every rank must call it. Returned on the CPU."""
    if not shard.distributed:
        return counts
    total = counts.to(collective_device(device))
    dist.all_reduce(total)
    return total.cpu()


def gather_rows(rows: torch.Tensor, shard: Shard, device) -> torch.Tensor:
    """The row blocks [n_r, ...] of every rank concatenated in rank order (n_r may differ); on the CPU."""
    if not shard.distributed:
        return rows
    where = collective_device(device)
    counts = gather_objects(len(rows), shard)
    padded = torch.zeros(max(counts), *rows.shape[1:], dtype=rows.dtype, device=where)
    padded[: len(rows)] = rows.to(where)
    blocks = [torch.empty_like(padded) for _ in range(shard.world_size)]
    dist.all_gather(blocks, padded)
    return torch.cat([block[:n].cpu() for block, n in zip(blocks, counts)])


def gather_objects(obj, shard: Shard) -> list:
    """One picklable object from every rank, in rank order (for small things: counts, names of skipped files)."""
    if not shard.distributed:
        return [obj]
    out = [None] * shard.world_size
    dist.all_gather_object(out, obj)
    return out


def count_skipped(names: list[str], shard: Shard, keep: int = 10) -> tuple[int, list[str]]:
    """(number of unreadable files over all ranks, the first `keep` of their names in rank order)."""
    parts = gather_objects((len(names), names[:keep]), shard)
    return sum(n for n, _ in parts), [name for _, first in parts for name in first][:keep]


@contextmanager
def random_state_kept(device=None):
    """Run a block without moving the global random generators: torch (CPU and `device` if CUDA), numpy, random.

    An evaluation during training runs inside this, so a run that evaluates draws the same training randomness
    as one that does not, and a resumed run the same as an uninterrupted one.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    python_state, numpy_state = random.getstate(), np.random.get_state()  # noqa: NPY002 - the global RNG on purpose
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)  # noqa: NPY002
