"""The worker side: read tar shards, shuffle, decode, transform, tokenize, batch; count bad input.

A worker reads "raw samples" (files of one key, grouped as webdataset does) from its pieces of
shards, shuffles them in blocks of `shuffle_buffer` (each block permuted by an RNG seeded from its
place in the stream, so the stream can be re-entered at any block), then decodes. Bad input is
marked where it is found and counted, by cause, when its turn comes to be decoded; every batch
carries the worker's counts and its position, so the main process knows both exactly.
"""

import contextlib
import hashlib
import io
import itertools
import logging
import random
import warnings
from dataclasses import dataclass, field
from functools import partial

import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info
from webdataset.tariterators import base_plus_ext, tar_file_iterator

from data.errors import BadSample, DataError, zero_counts
from data.plan import EpochShape, Piece, worker_batches
from data.reading import StreamFault, open_shard

log = logging.getLogger(__name__)
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")


def tar_samples(url: str, timeout_s: float | None = None, retries: int = 0):
    """Raw samples of one tar as dicts {"__key__", "__url__", ext: bytes}. A key seen twice in the tar
    gives a sample marked "duplicate_key"; a tar that cannot be opened or breaks off ends with one
    sample marked "unreadable_tar" (the sample it was inside is lost with it).

    A stream that stalls for `timeout_s` seconds or whose command fails (data/reading.py) is opened again up to
    `retries` times, passing over the samples already given out, so each is given once; then it ends with one
    sample marked with the fault's cause ("stalled_stream" or "broken_stream") and the URL."""
    given = 0
    for attempt in range(retries + 1):
        samples = tar_pass(url, timeout_s)
        try:
            for count, sample in enumerate(samples):
                if count >= given:
                    given += 1
                    yield sample
            return
        except StreamFault as fault:
            if attempt == retries:
                yield {"__key__": None, "__url__": url, "__error__": fault.cause, "__detail__": fault.message}
                return
            log.warning("data: %s; reading it again (retry %d of data.shard_retries=%d)", fault, attempt + 1, retries)
        finally:
            samples.close()


def tar_pass(url: str, timeout_s: float | None):
    """One pass of tar_samples: raw samples, the "duplicate_key" and "unreadable_tar" marks; StreamFault raised."""
    seen, current, stream = set(), None, None
    try:
        stream = open_shard(url, timeout_s)
        for member in tar_file_iterator(stream):
            key, suffix = base_plus_ext(member["fname"])
            if key is None:
                continue
            suffix = suffix.lower()
            if current is not None and key == current["__key__"]:
                if suffix in current:
                    current["__error__"] = "duplicate_key"
                current[suffix] = member["data"]
                continue
            if current is not None:
                yield current
            current = {"__key__": key, "__url__": url, suffix: member["data"]}
            if key in seen:
                current["__error__"] = "duplicate_key"
            seen.add(key)
    except Exception as exn:
        # Every member read so far is whole (tar stores sizes), so a sample with both parts is good.
        if current is not None and "txt" in current and any(ext in current for ext in IMAGE_EXTENSIONS):
            yield current
        if isinstance(exn, StreamFault):
            raise
        yield {"__key__": None, "__url__": url, "__error__": "unreadable_tar", "__detail__": repr(exn)}
        return
    finally:
        # A pipe stopped early (the worker needed no more of this shard) may exit non-zero on close.
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.close()
    if current is not None:
        yield current


def piece_samples(piece: Piece, offset: int = 0, read=tar_samples):
    """Raw samples of a piece, starting `offset` samples into it (`read`: url -> raw samples, tar_samples or a
    data.cache.SampleCache's). A tar that breaks inside the part passed over belongs to the worker that reads that
    part, which reports it; here it just ends."""
    with contextlib.closing(read(piece.url)) as samples:
        for count, sample in enumerate(samples, -(piece.skip + offset)):
            if count < 0:
                if "__error__" in sample and sample["__key__"] is None:
                    return
                continue
            if piece.take is not None and count >= piece.take - offset:
                return
            yield sample


def epoch_raw(pieces: list[Piece], piece: int = 0, offset: int = 0, read=tar_samples):
    """(sample, piece index, samples read in that piece) over the pieces, from a position."""
    for index in range(piece, len(pieces)):
        start = offset if index == piece else 0
        for done, sample in enumerate(piece_samples(pieces[index], start, read), start + 1):
            yield sample, index, done


def resampled_raw(urls: list[str], weights: list[float] | None, rng: random.Random, read=tar_samples):
    """Endless samples from shards drawn with replacement; fails if shard after shard has no sample."""
    empty_in_a_row = 0
    while True:
        url = rng.choices(urls, weights=weights)[0]
        good = 0
        for sample in piece_samples(Piece(url), read=read):
            good += "__error__" not in sample
            yield sample, 0, 0
        empty_in_a_row = 0 if good else empty_in_a_row + 1
        if empty_in_a_row > 2 * len(urls) + 20:
            raise DataError(
                f"{empty_in_a_row} shards in a row had no readable sample (last: {url}): check data.train_shards"
            )


def block_shuffle(raw, size: int, rng_of_block, block: int = 0, index: int = 0, piece: int = 0, offset: int = 0):
    """Yield (sample, position): blocks of `size` raw samples, each permuted by rng_of_block(block).
    position = where this sample's block starts (piece, offset) + block number + samples of the
    block already given out (index), i.e. everything needed to re-enter the stream after it."""
    while True:
        units = list(itertools.islice(raw, size))
        if not units:
            return
        order = list(range(len(units)))
        rng_of_block(block).shuffle(order)
        for k in range(index, len(units)):
            position = {"block": block, "index": k + 1, "piece": piece, "offset": offset}
            yield units[order[k]][0], position
        piece, offset = units[-1][1], units[-1][2]
        block, index = block + 1, 0


def block_rng(stream_key: str, block: int) -> random.Random:
    """The RNG that permutes one block: a function of the stream's identity and the block number."""
    return random.Random(f"{stream_key}:{block}")


def decode(sample: dict, max_pixels: int, max_caption_bytes: int = 65_536) -> tuple[Image.Image, str]:
    """(RGB PIL image, caption) of a raw sample, or BadSample naming why it is skipped."""
    if "__error__" in sample:
        raise BadSample(sample["__error__"])
    data = next((sample[ext] for ext in IMAGE_EXTENSIONS if ext in sample), None)
    if data is None:
        raise BadSample("missing_image")
    if "txt" not in sample:
        raise BadSample("missing_caption")
    if len(sample["txt"]) > max_caption_bytes:  # before decoding or tokenizing it
        raise BadSample("oversized_caption")
    try:
        text = sample["txt"].decode("utf-8").strip()
    except UnicodeDecodeError:
        raise BadSample("non_utf8_caption") from None
    if not text:
        raise BadSample("empty_caption")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            # The header alone gives the size, so a bomb is refused before its pixels are decoded.
            if image.width * image.height > max_pixels:
                raise BadSample("oversized_image")
            return image.convert("RGB"), text
    except Image.DecompressionBombError:
        raise BadSample("oversized_image") from None
    except BadSample:
        raise
    except Exception:
        raise BadSample("corrupt_image") from None


def what_was_skipped(sample: dict) -> str:
    """'sample KEY of URL', or for a tar that broke off 'the rest of URL (the error)'."""
    if sample["__key__"] is None:
        detail = sample.get("__detail__")
        return f"the rest of {sample['__url__']}" + (f" ({detail})" if detail else "")
    return f"sample {sample['__key__']} of {sample['__url__']}"


@dataclass
class StreamJob:
    """Everything one rank's workers need for one pass over an epoch (pickled into each worker)."""

    urls: list[str]
    weights: list[float] | None
    pieces: list[list[Piece]] | None  # per logical worker (epoch mode); None in resampled mode
    shape: EpochShape
    seed: int
    epoch: int
    rank: int
    workers: int
    shuffle_buffer: int
    max_pixels: int
    max_caption_bytes: int
    shard_timeout_s: float | None = None
    shard_retries: int = 0
    start_batch: int = 0
    positions: dict[int, dict] = field(default_factory=dict)  # logical worker -> position to resume at


class ShardStream(IterableDataset):
    """Yields (images [b,3,H,W], tokens [b,L], info) for this worker's batches of one epoch;
    info = {"batch", "worker", "position", "skipped"} (skipped: this worker's counts by cause).
    cache: a data.cache.SampleCache that outlives the epoch (data.workers 0), or None."""

    def __init__(self, job: StreamJob, image_transform, tokenizer, cache=None):
        self.job, self.image_transform, self.tokenizer, self.cache = job, image_transform, tokenizer, cache
        read = partial(tar_samples, timeout_s=job.shard_timeout_s, retries=job.shard_retries)
        self.read = partial(cache.read, read=read) if cache is not None else read

    def __iter__(self):
        job = self.job
        loader_worker = get_worker_info()
        worker = ((loader_worker.id if loader_worker else 0) + job.start_batch) % max(1, job.workers)
        counts = zero_counts()
        samples = self.samples(worker, counts)
        for j in worker_batches(job.shape, job.workers, worker, job.start_batch):
            images, captions, position = [], [], None
            for _ in range(job.shape.batch_size(j)):
                image, caption, position = next(samples)
                images.append(image)
                captions.append(caption)
            tokens = self.tokenizer(captions)
            cut = getattr(self.tokenizer, "truncated", None)  # captions cut to the context (models/preprocess.py)
            info = {"batch": j, "worker": worker, "position": position, "skipped": dict(counts)}
            info["truncated"] = cut(captions) if cut is not None else 0
            yield torch.stack(images), tokens, info
        samples.close()

    def samples(self, worker: int, counts: dict[str, int]):
        """(image tensor, caption, position) of good samples; bad ones are counted and passed over.
        In epoch mode a whole pass that gives no good sample at all is an error, not an endless loop (a pass
        resumed partway through may end without one: its good samples came before the checkpoint)."""
        good_in_pass, partway = 0, worker in self.job.positions
        for sample, position in self.raw_positions(worker):
            if sample is None:
                if not good_in_pass and not partway:
                    raise DataError(
                        f"rank {self.job.rank} worker {worker} found no readable sample in its "
                        f"{len(self.job.pieces[worker])} shard pieces: check the shards"
                    )
                good_in_pass, partway = 0, False
                continue
            try:
                image, caption = self.decode(sample)
                try:
                    image = self.transform(image, worker, position)
                except Exception:
                    raise BadSample("transform_error") from None
            except BadSample as bad:
                counts[bad.cause] += 1
                level = logging.WARNING if counts[bad.cause] == 1 else logging.DEBUG
                log.log(level, "data: skipped %s (%s)", what_was_skipped(sample), bad.cause)
                continue
            good_in_pass += 1
            yield image, caption, position

    def decode(self, sample: dict) -> tuple[Image.Image, str]:
        """decode(), or the cache's copy of its result."""
        kept = self.cache.decoded(sample) if self.cache is not None else None
        if kept is not None:
            return kept
        image, caption = decode(sample, self.job.max_pixels, self.job.max_caption_bytes)
        if self.cache is not None:
            self.cache.keep(sample, image, caption)
        return image, caption

    def transform(self, image: Image.Image, worker: int, position: dict | None) -> torch.Tensor:
        """The image transform with torch's RNG seeded by the sample's place in the stream, so its random crops
        are a function of that place: a resumed run (any number of workers) repeats them, and the global RNG
        of the process is left as it was."""
        job, generator = self.job, torch.default_generator
        where = ":".join(str(v) for _, v in sorted((position or {}).items()))
        key = f"{job.seed}:{job.epoch}:{job.rank}:{worker}:{job.start_batch if job.pieces is None else 0}:{where}"
        saved = generator.get_state()
        generator.manual_seed(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) >> 1)
        try:
            return self.image_transform(image)
        finally:
            generator.set_state(saved)

    def raw_positions(self, worker: int):
        """(raw sample, position) for this worker; in epoch mode None marks the end of each pass over
        its pieces (passes repeat only when bad input left the worker short of its quota)."""
        job = self.job
        key = f"{job.seed}:{job.epoch}:{job.rank}:{worker}"
        if job.pieces is None:
            stream_key = f"{key}:{job.start_batch}"
            raw = resampled_raw(job.urls, job.weights, random.Random(f"{stream_key}:shards"), self.read)
            yield from block_shuffle(raw, job.shuffle_buffer, partial(block_rng, stream_key))
            return
        position = job.positions.get(worker, {"pass": 0, "raw": 0})
        pieces, pass_ = job.pieces[worker], position["pass"]
        while True:
            rng_of_block = partial(block_rng, f"{key}:{pass_}")
            if "piece" in position:
                where = {k: position[k] for k in ("block", "index", "piece", "offset")}
                raw = epoch_raw(pieces, position["piece"], position["offset"], self.read)
            else:
                where, raw, short = self.seek(pieces, position["raw"])
                if short:  # a position by sample count past this pass: carry the rest into the next one
                    pass_, position = pass_ + 1, {"pass": pass_ + 1, "raw": short}
                    continue
            for sample, where_now in block_shuffle(raw, job.shuffle_buffer, rng_of_block, **where):
                yield sample, {"pass": pass_, **where_now}
            yield None, None
            pass_, position = pass_ + 1, {"pass": pass_ + 1, "raw": 0}

    def seek(self, pieces: list[Piece], raw_count: int):
        """Re-enter a pass `raw_count` raw samples in, by reading (not decoding) the samples before: (where, raw,
        0), or, when the pass holds fewer whole blocks than that, (None, None, the raw samples left past it)."""
        block, index = divmod(raw_count, self.job.shuffle_buffer)
        raw = epoch_raw(pieces, read=self.read)
        piece = offset = read = 0
        # the loop only advances raw; piece and offset keep the last skipped sample's values, returned below
        for read, (_, piece, offset) in enumerate(itertools.islice(raw, block * self.job.shuffle_buffer), 1):  # noqa: B007
            pass
        if 0 < read < block * self.job.shuffle_buffer:  # (an empty pass carries nothing: its end is the error)
            return None, None, raw_count - read
        return {"block": block, "index": index, "piece": piece, "offset": offset}, raw, 0
