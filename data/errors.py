"""Errors of the data pipeline and the causes for which a sample is skipped."""

# Every cause a sample (or a whole shard) can be skipped for; counts are reported under these names.
SKIP_CAUSES = (
    "unreadable_tar",  # shard could not be opened, or its tar stream ended early (truncated, corrupt)
    "stalled_stream",  # rest of a pipe:/http shard that sent no byte for data.shard_timeout_s, data.shard_retries times
    "broken_stream",  # rest of a pipe:/http shard whose command failed mid-shard (died, connection dropped), as often
    "duplicate_key",  # a key appears twice in one tar (repeated file, or the key came back later)
    "missing_image",  # no .jpg/.jpeg/.png/.webp in the sample
    "corrupt_image",  # the image bytes do not decode
    "oversized_image",  # more pixels than max_image_pixels (decompression bomb)
    "missing_caption",  # no .txt in the sample
    "empty_caption",  # caption is empty or only whitespace
    "non_utf8_caption",  # caption bytes are not UTF-8
    "oversized_caption",  # caption longer than max_caption_bytes (broken text, not a caption)
    "transform_error",  # the image transform raised on a decoded image
)


# data.max_skip_fraction is checked only from this many samples read (good + skipped) on: a bad sample among the
# first few would otherwise stop a run that is 99.9% readable
SKIP_LIMIT_MIN_READ = 1000


class DataError(ValueError):
    """A problem with the data configuration or the shards, found at start-up (one-line message)."""


class BadSample(Exception):
    """Raised inside the pipeline for one sample that must be skipped; `cause` is in SKIP_CAUSES."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


def zero_counts() -> dict[str, int]:
    return {cause: 0 for cause in SKIP_CAUSES}


def skip_limit_problem(skipped: dict[str, int], good: int, max_fraction: float | None) -> str | None:
    """The one line saying that more than `max_fraction` of the samples read were skipped, or None.

    skipped: counts by cause (a shard that cannot be read counts once); good: samples delivered. Checked once
    SKIP_LIMIT_MIN_READ samples have been read; max_fraction None: never."""
    bad = sum(skipped.values())
    read = good + bad
    if max_fraction is None or read < SKIP_LIMIT_MIN_READ or bad <= max_fraction * read:
        return None
    causes = ", ".join(f"{cause} {n}" for cause, n in sorted(skipped.items()) if n)
    return (
        f"data: {bad} of {read} samples read were skipped ({100 * bad / read:.1f}%, more than "
        f"data.max_skip_fraction={max_fraction}): {causes}; repair or replace the shards, or raise "
        "data.max_skip_fraction (null: no limit)"
    )
