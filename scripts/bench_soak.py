"""Memory of a long loader run: RSS of the main process and the workers, ours against open_clip's pipeline.

    python -m scripts.bench_soak [--samples 200000] [--every 10000] [--workers 2]

Both loaders stream `--samples` samples from the same resampled shards (1 in `--corrupt-every` images corrupt,
skipped and counted) with open_clip's train transform and ViT-B-16 tokenizer; the RSS of the main process and the
summed RSS of the DataLoader workers are read every `--every` samples. Writes docs/bench_soak.csv, .png and .md
(train/bench/soak.py).
"""

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import open_clip

from train.bench import soak

DEFAULTS = {
    "samples": 200_000,
    "every": 10_000,
    "shards": 20,
    "per_shard": 1000,
    "corrupt_every": 100,
    "image_size": 64,
    "batch_size": 128,
    "workers": 2,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs"))
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # open_clip's pipeline logs a warning for every corrupt sample
    transform = open_clip.image_transform(args.image_size, is_train=True)
    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = soak.write_shards(Path(tmp), args.shards, args.per_shard, args.corrupt_every, args.image_size)
        for name in soak.LOADERS:
            rows += soak.soak(spec, name, transform, tokenizer, args)
    given = sys.argv[1:] if argv is None else argv
    shown = [a for i, a in enumerate(given) if not (a.startswith("--out") or (i and given[i - 1] == "--out"))]
    soak.write_report(rows, Path(args.out), args, shown)


if __name__ == "__main__":
    main()
