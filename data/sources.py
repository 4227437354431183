"""Shard specs: brace expansion, `::`-joined sources with weights, start-up checks, shard sizes."""

import json
import os

from webdataset.shardlists import expand_urls

from data.errors import DataError


def is_local(url: str) -> bool:
    """A plain path (not `pipe:` and not a URL with a scheme such as http:// or s3://)."""
    return not url.startswith("pipe:") and "://" not in url


def expand_spec(spec: str, weights: str | None = None) -> tuple[list[str], list[float] | None]:
    """Expand "a/{0..9}.tar::pipe:cat b/{0..3}.tar" into shard URLs, with one weight per URL.

    As in open_clip, each `::` source may get a weight ("1::3"); every shard of that source gets
    the source's weight, so a source is drawn in proportion to weight x number of its shards.
    """
    sources = [source for source in spec.split("::")]
    if not spec.strip() or any(not source.strip() for source in sources):
        raise DataError(
            f"shard spec {spec!r} is empty or has an empty `::` source: give paths such as /data/{{00000..00009}}.tar"
        )
    per_source = [expand_urls(source.strip()) for source in sources]
    urls = [url for source_urls in per_source for url in source_urls]
    if weights is None:
        return urls, None
    parts = weights.split("::")
    if len(parts) != len(sources):
        raise DataError(
            f"train_weights {weights!r} has {len(parts)} entries but train_shards has "
            f"{len(sources)} `::` sources: give one weight per source"
        )
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise DataError(f"train_weights {weights!r} must be numbers joined by `::`, e.g. 1::3") from None
    if any(value < 0 for value in values) or sum(values) <= 0:
        raise DataError(f"train_weights {weights!r} must be non-negative with a positive sum")
    return urls, [value for value, source_urls in zip(values, per_source) for _ in source_urls]


def check_local(urls: list[str]) -> None:
    """Fail at start-up, in one line, if a local shard file does not exist."""
    missing = [url for url in urls if is_local(url) and not os.path.isfile(url)]
    if missing:
        raise DataError(
            f"{len(missing)} of {len(urls)} shard files do not exist (first: {missing[0]}): check data.train_shards"
        )


def _sizes_in_dir(directory: str) -> dict[str, int]:
    """Samples per shard basename from sizes.json ({"00000.tar": n}) or _info.json (wids shardlist)."""
    sizes_path = os.path.join(directory, "sizes.json")
    if os.path.isfile(sizes_path):
        with open(sizes_path) as f:
            return {name: int(count) for name, count in json.load(f).items()}
    info_path = os.path.join(directory, "_info.json")
    if os.path.isfile(info_path):
        with open(info_path) as f:
            shards = json.load(f).get("shardlist", [])
        return {os.path.basename(shard["url"]): int(shard["nsamples"]) for shard in shards}
    return {}


def _img2dataset_count(url: str) -> int | None:
    """Samples written to 00000.tar, from the 00000_stats.json img2dataset writes beside it."""
    stats_path = os.path.splitext(url)[0] + "_stats.json"
    if not os.path.isfile(stats_path):
        return None
    with open(stats_path) as f:
        return int(json.load(f)["successes"])


def read_sizes(urls: list[str]) -> list[int] | None:
    """Sample count of every local shard from sizes.json, _info.json or img2dataset's NNNNN_stats.json
    beside it; None if any shard's count is unknown (then shards are dealt whole to the workers)."""
    if not all(is_local(url) for url in urls):
        return None
    by_dir: dict[str, dict[str, int]] = {}
    sizes = []
    for url in urls:
        directory = os.path.dirname(url) or "."
        if directory not in by_dir:
            by_dir[directory] = _sizes_in_dir(directory)
        count = by_dir[directory].get(os.path.basename(url))
        if count is None:
            count = _img2dataset_count(url)
        if count is None:
            return None
        sizes.append(count)
    return sizes
