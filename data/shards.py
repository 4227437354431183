"""The training data pipeline over webdataset tar shards: `build_train_data(cfg, ...) -> TrainData`.

Resume guarantees (`state_dict` after k batches of epoch e, `load_state_dict` in a new process):
- epoch mode, each rank loading its own state (same world size, workers, batch size, shards):
  the next batches are exactly those the interrupted run would have made next (same samples, same
  order; image augmentations are random and not part of the state).
- epoch mode, any other state (another rank's, or the layout changed): the epoch continues at
  batch k, each worker passing over as many raw samples as it had delivered; samples of this epoch
  may then be repeated or missed in proportion to the bad samples skipped before batch k.
- resampled mode: the epoch continues at batch k with fresh random streams seeded by
  (seed, epoch, rank, worker, k): reproducible, statistically the same as an unbroken run (shards
  are drawn with replacement), but not the same samples.
"""

import logging

import torch
from torch.utils.data import DataLoader

from data.cache import SampleCache
from data.config import DataConfig
from data.errors import SKIP_CAUSES, DataError, zero_counts
from data.plan import epoch_pieces, epoch_shape, worker_batches
from data.sources import check_local, expand_spec, read_sizes
from data.stream import ShardStream, StreamJob

log = logging.getLogger(__name__)


class Batches:
    """`for images, tokens in train_data.loader`: the rest of the current epoch for this rank."""

    def __init__(self, data: "TrainData"):
        self.data = data

    def __iter__(self):
        return self.data.iterate()

    def __len__(self) -> int:
        return self.data.num_batches - self.data.batch


class TrainData:
    """One rank's view of the training data; `loader` yields (images [b,3,H,W] float, tokens [b,L])."""

    def __init__(
        self,
        cfg: DataConfig,
        image_transform,
        tokenizer,
        rank: int,
        world_size: int,
        urls: list[str],
        weights: list[float] | None,
        sizes: list[int] | None,
        num_samples: int,
        batch_transform=None,
    ):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.image_transform, self.tokenizer = image_transform, tokenizer
        self.batch_transform = batch_transform  # applied by the consumer where the batch lands (train.loop)
        self.urls, self.weights, self.sizes = urls, weights, sizes
        self.shape = epoch_shape(num_samples, cfg.batch_size, world_size, cfg.resampled, cfg.drop_last)
        self.num_batches = self.shape.num_batches
        self.num_samples = self.shape.num_samples
        self.epoch, self.batch, self.positions = 0, 0, {}
        self._done_counts, self._live_counts = zero_counts(), {}
        self.captions = {"seen": 0, "truncated": 0}  # captions on this rank so far, and those cut to the context
        self.loader = Batches(self)
        limits = (cfg.max_image_pixels, cfg.max_caption_bytes)
        self.cache = SampleCache(cfg.cache_mb, limits) if cfg.cache_mb else None  # kept across epochs (workers 0)
        self._job()  # plan epoch 0 now, so that an impossible split fails at start-up

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless it is the epoch the state is already in."""
        if epoch != self.epoch:
            self.epoch, self.batch, self.positions = epoch, 0, {}

    def skipped(self) -> dict[str, int]:
        """Bad-input counts by cause on this rank so far (all epochs; sum over ranks for the job)."""
        total = dict(self._done_counts)
        for counts in self._live_counts.values():
            for cause, count in counts.items():
                total[cause] += count
        return total

    def layout(self) -> dict:
        """What must be unchanged for worker positions to stay valid."""
        return {
            "world_size": self.world_size,
            "workers": self.cfg.workers,
            "batch_size": self.cfg.batch_size,
            "num_samples": self.num_samples,
            "shards": len(self.urls),
            "seed": self.cfg.seed,
            "shuffle_buffer": self.cfg.shuffle_buffer,
            "resampled": self.cfg.resampled,
        }

    def state_dict(self) -> dict:
        """Position in the stream after the batches handed out so far (JSON-serialisable)."""
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "rank": self.rank,
            "layout": self.layout(),
            "positions": {str(w): p for w, p in self.positions.items()},
            "skipped": self.skipped(),
            "captions": dict(self.captions),
        }

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue from `state`: this rank's own dict, or a list of every rank's dicts."""
        if isinstance(state, list):
            state = next((s for s in state if s.get("rank") == self.rank), state[0])
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        if not 0 <= self.batch <= self.num_batches:
            raise DataError(
                f"data state is at batch {self.batch} of an epoch of {self.num_batches}: it "
                "comes from another data configuration"
            )
        own = state.get("rank") == self.rank and state.get("layout") == self.layout()
        saved = state.get("skipped", {}) if state.get("rank") == self.rank else {}
        self._done_counts = {cause: int(saved.get(cause, 0)) for cause in SKIP_CAUSES}
        mine = state.get("captions", {}) if state.get("rank") == self.rank else {}
        self.captions = {key: int(mine.get(key, 0)) for key in ("seen", "truncated")}
        self._live_counts = {}
        if own:
            self.positions = {int(w): p for w, p in state.get("positions", {}).items()}
        else:
            if not self.cfg.resampled:
                log.warning(
                    "data: state of rank %s or another layout; rank %d resumes epoch %d at batch %d "
                    "by sample count (approximate)",
                    state.get("rank"),
                    self.rank,
                    self.epoch,
                    self.batch,
                )
            self.positions = {w: {"pass": 0, "raw": self.delivered(w)} for w in range(max(1, self.cfg.workers))}

    def delivered(self, worker: int) -> int:
        """Samples logical `worker` has put into this rank's batches before batch `self.batch`."""
        done = [j for j in worker_batches(self.shape, self.cfg.workers, worker) if j < self.batch]
        return sum(self.shape.batch_size(j) for j in done)

    def _job(self) -> StreamJob:
        cfg = self.cfg
        pieces = (
            None
            if cfg.resampled
            else epoch_pieces(
                self.urls, self.sizes, self.shape, cfg.seed, self.epoch, self.rank, self.world_size, cfg.workers
            )
        )
        positions = {} if cfg.resampled else dict(self.positions)
        return StreamJob(
            self.urls,
            self.weights,
            pieces,
            self.shape,
            cfg.seed,
            self.epoch,
            self.rank,
            cfg.workers,
            cfg.shuffle_buffer,
            cfg.max_image_pixels,
            cfg.max_caption_bytes,
            cfg.shard_timeout_s,
            cfg.shard_retries,
            self.batch,
            positions,
        )

    def iterate(self):
        """Yield the rest of the epoch's batches, keeping position and skip counts up to date."""
        dataset = ShardStream(self._job(), self.image_transform, self.tokenizer, self.cache)
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.cfg.workers,
            pin_memory=torch.cuda.is_available(),  # pinned batches: the copy to the GPU does not block the loop
            prefetch_factor=self.cfg.prefetch_factor if self.cfg.workers else None,
            timeout=self.cfg.loader_timeout_s() if self.cfg.workers else 0,
        )
        self._live_counts = {}
        try:
            for images, tokens, info in loader:
                if info["batch"] != self.batch:
                    raise RuntimeError(f"data: batch {info['batch']} arrived where {self.batch} was due")
                self.batch += 1
                self.captions["seen"] += len(tokens)
                self.captions["truncated"] += info.get("truncated", 0)
                self._live_counts[info["worker"]] = info["skipped"]
                if info["position"] is not None:
                    self.positions[info["worker"]] = info["position"]
                yield images, tokens
            skipped = {cause: n for cause, n in self.skipped().items() if n}
            log.info(
                "data: rank %d finished epoch %d (%d batches); skipped so far: %s",
                self.rank,
                self.epoch,
                self.num_batches,
                skipped or "none",
            )
            self.epoch, self.batch, self.positions = self.epoch + 1, 0, {}
        except RuntimeError as e:
            if "DataLoader timed out" not in str(e):
                raise
            raise DataError(
                f"data: rank {self.rank}: the DataLoader workers handed over no batch for "
                f"{self.cfg.loader_timeout_s():g} s (2 x (data.shard_retries + 1) x data.shard_timeout_s + 60 s), "
                "although every shard read is bounded: a worker is hung elsewhere (py-spy dump --pid shows where); "
                "raise data.shard_timeout_s if batches legitimately take that long"
            ) from None
        finally:
            self._done_counts = self.skipped()
            self._live_counts = {}


def build_train_data(
    cfg: DataConfig, image_transform, tokenizer, *, rank: int = 0, world_size: int = 1, batch_transform=None
) -> TrainData:
    """Check the config and the shards (errors at start-up, one line each) and build this rank's data.

    image_transform: PIL image -> tensor [3,H,W] (e.g. open_clip.image_transform(224, is_train=True));
    tokenizer: list[str] -> long tensor [n, L] (e.g. open_clip.get_tokenizer(model_name));
    batch_transform: images [b,3,H,W] as the loader yields them -> model input, or None; kept as
    `.batch_transform` for the consumer to apply where the batch lands (models/preprocess.py: uint8 from the
    workers, normalised on the device).
    """
    cfg.validate(world_size)
    if not 0 <= rank < world_size:
        raise DataError(f"rank={rank} is outside 0..{world_size - 1}: pass the process's rank and world size")
    urls, weights = expand_spec(cfg.train_shards, cfg.train_weights)
    check_local(urls)
    sizes = read_sizes(urls)
    num_samples = cfg.train_num_samples or (sum(sizes) if sizes is not None else None)
    if num_samples is None:
        raise DataError(
            f"the number of samples of {cfg.train_shards!r} is unknown: set data.train_num_samples "
            "or put sizes.json beside the shards"
        )
    return TrainData(
        cfg, image_transform, tokenizer, rank, world_size, urls, weights, sizes, num_samples, batch_transform
    )
