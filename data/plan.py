"""How an epoch is cut into steps, and which raw samples each (rank, worker) reads.

Batch j of a rank comes from that rank's DataLoader worker j % workers (the DataLoader polls its
workers round-robin and keeps their order), so the number of batches, and of samples, of every
worker is known in advance. When every shard's size is known (sizes.json / _info.json), the
epoch's shards are put in one seeded order (the same on every rank), their samples are numbered
0..N-1 along that order, and each (rank, worker) reads one contiguous range of those numbers:
a shard may be split between two workers, each reading only its part, so every sample is read
exactly once. Without sizes, whole shards are dealt to the (rank, worker) slots instead.
"""

import math
import random
from dataclasses import dataclass

from data.errors import DataError


@dataclass(frozen=True)
class Piece:
    """Part of one shard: pass over the first `skip` raw samples, then read `take` (None: all the rest)."""

    url: str
    skip: int = 0
    take: int | None = None


@dataclass(frozen=True)
class EpochShape:
    num_samples: int  # samples per epoch, whole job
    num_batches: int  # steps per epoch, the same on every rank
    local_batch: int  # samples per batch on one rank
    last_batch: int  # samples in the last batch of the epoch on one rank (<= local_batch)

    def batch_size(self, j: int) -> int:
        return self.last_batch if j == self.num_batches - 1 else self.local_batch


def epoch_shape(num_samples: int, batch_size: int, world_size: int, resampled: bool, drop_last: bool) -> EpochShape:
    """Steps per epoch. Epoch mode keeps every sample: the last step may be smaller (the same size on
    every rank, so gathers across ranks line up), and num_samples % world_size samples (fewer than
    world_size) are left out. With drop_last or in resampled mode every batch is full."""
    local = batch_size // world_size
    if resampled or drop_last:
        steps = math.ceil(num_samples / batch_size) if resampled else num_samples // batch_size
        if steps == 0:
            raise DataError(
                f"an epoch of {num_samples} samples has no full batch of {batch_size}: lower "
                "data.batch_size or set data.drop_last=false"
            )
        return EpochShape(steps * batch_size, steps, local, local)
    per_rank = num_samples // world_size
    if per_rank == 0:
        raise DataError(f"an epoch of {num_samples} samples is smaller than world_size={world_size}")
    steps = math.ceil(per_rank / local)
    return EpochShape(per_rank * world_size, steps, local, per_rank - (steps - 1) * local)


def worker_batches(shape: EpochShape, workers: int, worker: int, start: int = 0) -> list[int]:
    """The rank's batch indices >= start that logical worker `worker` makes (j % workers == worker)."""
    workers = max(1, workers)
    first = start + (worker - start) % workers
    return list(range(first, shape.num_batches, workers))


def worker_quota(shape: EpochShape, workers: int, worker: int) -> int:
    """Samples one worker contributes to one rank's epoch."""
    return sum(shape.batch_size(j) for j in worker_batches(shape, workers, worker))


def shard_order(num_shards: int, seed: int, epoch: int) -> list[int]:
    """The epoch's shard order: seeded by (seed, epoch) only, so every rank computes the same one."""
    order = list(range(num_shards))
    random.Random(f"{seed}:{epoch}:shards").shuffle(order)
    return order


def pieces_of_range(urls: list[str], sizes: list[int], order: list[int], lo: int, hi: int) -> list[Piece]:
    """The parts of shards (in `order`) that hold samples lo..hi-1 of the concatenated epoch."""
    pieces, start = [], 0
    for index in order:
        end = start + sizes[index]
        if end > lo and start < hi and sizes[index] > 0:
            first = max(lo, start)
            pieces.append(Piece(urls[index], first - start, min(hi, end) - first))
        start = end
        if start >= hi:
            break
    return pieces


def epoch_pieces(
    urls: list[str],
    sizes: list[int] | None,
    shape: EpochShape,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    workers: int,
) -> list[list[Piece]]:
    """What each logical worker of `rank` reads in epoch mode: one list of pieces per worker."""
    workers = max(1, workers)
    order = shard_order(len(urls), seed, epoch)
    if sizes is None:
        slots = world_size * workers
        if len(urls) < slots:
            raise DataError(
                f"{len(urls)} shards cannot be dealt to {world_size} ranks x {workers} workers "
                "without sizes.json: add sizes.json beside the shards or use fewer workers"
            )
        return [[Piece(urls[i]) for i in order[rank * workers + w :: slots]] for w in range(workers)]
    total = sum(sizes)
    if total == 0:
        raise DataError("sizes.json says every shard is empty: check the shards or remove sizes.json")
    quotas = [worker_quota(shape, workers, w) for w in range(workers)]
    start = rank * (shape.num_samples // world_size)
    result = []
    for quota in quotas:
        lo, hi = start, start + quota
        start = hi
        # An epoch longer than the data set (train_num_samples > sizes) spreads the data over all
        # workers; each worker then repeats its own part to fill its quota.
        if shape.num_samples > total:
            lo, hi = lo * total // shape.num_samples, hi * total // shape.num_samples
        result.append(pieces_of_range(urls, sizes, order, lo, hi))
    return result
