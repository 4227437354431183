"""The data section of the training config."""

from dataclasses import dataclass

from data.errors import DataError


@dataclass
class DataConfig:
    """Where the train shards are and how they are read. `batch_size` is the global batch size."""

    train_shards: str = ""  # brace/`::` spec, e.g. "/data/{00000..41407}.tar::pipe:cat b/{0..9}.tar"
    train_weights: str | None = None  # e.g. "1::3": one weight per `::` source, resampled mode only
    train_num_samples: int | None = None  # samples per epoch; None: sum of sizes.json/_info.json
    resampled: bool = False  # shards drawn with replacement, endless (else: epochs)
    batch_size: int = 64  # global; each rank gets batch_size // world_size
    workers: int = 2  # DataLoader worker processes per rank; they live for a whole epoch
    prefetch_factor: int = 2  # batches each worker keeps ready ahead of the loop
    shuffle_buffer: int = 1000  # samples per shuffled block inside a worker
    seed: int = 0
    max_image_pixels: int = 89_478_485  # larger images are skipped (PIL's decompression-bomb limit)
    # longer captions are skipped: broken text, not a caption (248 tokens of English, Long-CLIP's context, are ~1.5 KB)
    max_caption_bytes: int = 65_536
    drop_last: bool = False  # epoch mode: drop the last partial step instead of a smaller one
    cache_mb: float = 0  # workers 0 only: keep whole shards and their decoded images in memory (data/cache.py)
    # a run stops (one error line, counts by cause) once more than this fraction of the samples read were skipped as
    # unreadable, counted over all ranks from 1000 samples read on (data/errors.py); null: no limit
    max_skip_fraction: float | None = 0.1
    # a pipe: or http(s) shard that sends no byte for this many seconds is stopped and read again, up to shard_retries
    # times, then skipped (data/reading.py); null: reads wait forever. DataLoader workers that hand over no batch for
    # loader_timeout_s() are taken for hung
    shard_timeout_s: float | None = 120
    shard_retries: int = 2

    def loader_timeout_s(self) -> float:
        """How long the DataLoader waits for a worker's batch (0: forever): time for a batch whose samples come
        from two shards that each stall on every try, plus a minute."""
        if self.shard_timeout_s is None:
            return 0
        return 2 * (self.shard_retries + 1) * self.shard_timeout_s + 60

    def validate(self, world_size: int) -> None:
        """Raise DataError (one line, naming the fix) for a config that cannot work."""
        if not self.train_shards.strip():
            raise DataError("data.train_shards is empty: set it to a shard spec such as /data/{00000..00009}.tar")
        if world_size < 1 or self.batch_size < world_size or self.batch_size % world_size:
            raise DataError(
                f"data.batch_size={self.batch_size} is not a positive multiple of world_size="
                f"{world_size}: it is the global batch size, make it divisible"
            )
        if self.train_weights is not None and not self.resampled:
            raise DataError(
                "data.train_weights needs data.resampled=true (weights only apply when sampling "
                "shards with replacement)"
            )
        if self.train_num_samples is not None and self.train_num_samples < 1:
            raise DataError(
                f"data.train_num_samples={self.train_num_samples} must be >= 1 (or null to read sizes.json)"
            )
        if self.cache_mb < 0 or (self.cache_mb and self.workers):
            raise DataError(
                f"data.cache_mb={self.cache_mb} needs data.workers=0 (a worker process lives for one epoch, so its "
                "cache would be thrown away): set data.workers=0, or data.cache_mb=0"
            )
        limits = (self.shuffle_buffer, self.max_image_pixels, self.max_caption_bytes, self.prefetch_factor)
        if self.workers < 0 or min(limits) < 1:
            raise DataError(
                "data.workers must be >= 0, data.shuffle_buffer, data.max_image_pixels, data.max_caption_bytes and "
                "data.prefetch_factor >= 1"
            )
