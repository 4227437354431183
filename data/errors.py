"""Errors of the data pipeline and the causes for which a sample is skipped."""

# Every cause a sample (or a whole shard) can be skipped for; counts are reported under these names.
SKIP_CAUSES = (
    "unreadable_tar",  # shard could not be opened, or its tar stream ended early (truncated, corrupt)
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


class DataError(ValueError):
    """A problem with the data configuration or the shards, found at start-up (one-line message)."""


class BadSample(Exception):
    """Raised inside the pipeline for one sample that must be skipped; `cause` is in SKIP_CAUSES."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


def zero_counts() -> dict[str, int]:
    return {cause: 0 for cause in SKIP_CAUSES}
