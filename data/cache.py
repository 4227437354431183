"""Training samples kept in memory across epochs (`data.cache_mb`, with `data.workers: 0`).

A run that reads its shards more than once (the embedded study's runs see them 1.6-4.8 times) reads each tar
once and decodes each image once; later epochs take the raw samples and the decoded images from memory. The
batches are the same bit for bit: the order, the shuffling and the random crops depend only on a sample's place
in the stream (data/stream.py), and the crop is taken from the same decoded image. Shards are kept whole, in the
order they are first read, while they fit; a shard that does not fit is read from disk every epoch.

A study that starts its runs as forks of one process (train/forked.py) reads and decodes its shards once, in that
process, before the first fork (`preload`): every run then finds them in memory from its first epoch on (its pages
shared with the parent until written), as a cache filled by an earlier epoch of its own. The same bytes and the same
decoded images, so the same batches bit for bit.
"""

import contextlib
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat

from data.errors import BadSample
from data.stream import decode, tar_samples

log = logging.getLogger(__name__)
DECODED = "__decoded__"  # key of a cached raw sample that holds its decoded (image, caption)
# Whole shards read and decoded by `preload` in this process (or the one it was forked from): url -> raw samples,
# and the decoding limits (max_pixels, max_caption_bytes) they were decoded under.
PRELOADED: dict[str, list[dict]] = {}
PRELOADED_LIMITS: dict[str, tuple[int, int]] = {}


def read_and_decode(url: str, max_pixels: int, max_caption_bytes: int) -> list[dict]:
    """The raw samples of one tar, each that decodes with its (image, caption) under DECODED."""
    samples = list(tar_samples(url))
    for sample in samples:
        with contextlib.suppress(BadSample):
            sample[DECODED] = decode(sample, max_pixels, max_caption_bytes)
    return samples


def preload(urls: list[str], max_mb: float, max_pixels: int, max_caption_bytes: int, workers: int = 1) -> float:
    """Read and decode whole shards given as absolute local paths (a fork may run in another directory) into
    PRELOADED while their files fit in `max_mb` (the runs' data.cache_mb), for the SampleCaches of this process and
    of its forks; with `workers` > 1 that many forked processes decode them (a decoded image comes back pixel for
    pixel: PIL pickles its bytes). A sample that does not decode is kept undecoded: the run that meets it decodes it
    again and counts it as skipped. Returns the MB of tar files kept."""
    used, chosen = 0, []
    for url in urls:
        if url in PRELOADED or not os.path.isabs(url) or not os.path.isfile(url):
            continue
        size = os.path.getsize(url)
        if used + size > max_mb * 2**20:
            break
        chosen.append(url)
        used += size
    limits = (max_pixels, max_caption_bytes)
    if workers > 1 and len(chosen) > 1:
        with ProcessPoolExecutor(min(workers, len(chosen)), mp_context=multiprocessing.get_context("fork")) as pool:
            shards = list(pool.map(read_and_decode, chosen, repeat(max_pixels), repeat(max_caption_bytes)))
    else:
        shards = [read_and_decode(url, *limits) for url in chosen]
    for url, samples in zip(chosen, shards, strict=True):
        PRELOADED[url], PRELOADED_LIMITS[url] = samples, limits
    return used / 2**20


class SampleCache:
    """`read(url)` is `tar_samples(url)` that keeps whole shards; `decoded` / `keep` memoise decoding."""

    def __init__(self, max_mb: float, limits: tuple[int, int] | None = None):
        self.max_bytes = int(max_mb * 2**20)
        self.limits = limits  # (max_pixels, max_caption_bytes): preloaded shards decoded under others are not used
        self.used = 0
        self.shards: dict[str, list[dict]] = {}
        self.refused: set[str] = set()

    def read(self, url: str, read=tar_samples):
        """The raw samples of one tar (`read(url)`), from memory once a whole pass over it has been kept."""
        if url in self.shards:
            yield from self.shards[url]
            return
        if url in PRELOADED and PRELOADED_LIMITS[url] == self.limits:
            yield from PRELOADED[url]
            return
        size = os.path.getsize(url) if os.path.isfile(url) else None
        if url in self.refused or size is None or self.used + size > self.max_bytes:
            self.refuse(url)
            yield from read(url)
            return
        kept = list(read(url))  # read whole: a piece may stop early, the next epoch needs all of it
        self.shards[url] = kept
        self.used += size
        yield from kept

    def decoded(self, sample: dict):
        """The (image, caption) kept for this raw sample, or None."""
        return sample.get(DECODED)

    def keep(self, sample: dict, image, caption: str) -> None:
        """Keep a decoded image with its cached raw sample while it fits (3 bytes a pixel)."""
        if sample.get("__url__") not in self.shards:
            return
        size = image.width * image.height * len(image.getbands())
        if self.used + size > self.max_bytes:
            self.refuse(sample["__url__"])
            return
        sample[DECODED] = (image, caption)
        self.used += size

    def refuse(self, url: str) -> None:
        if not self.refused:
            log.info(
                "data: cache full at %.0f of %.0f MB (data.cache_mb); %s and later shards are read from disk",
                self.used / 2**20,
                self.max_bytes / 2**20,
                url,
            )
        self.refused.add(url)
