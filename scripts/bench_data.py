"""Throughput of our shard loader against open_clip's webdataset pipeline, on the same shards.

    python scripts/bench_data.py [--samples 4000] [--image-size 224] [--batch-size 64] [--workers 2]

Both loaders decode JPEGs, apply open_clip's train transform and tokenizer in `--workers`
DataLoader workers and yield batches; each reads one epoch of synthetic 224 px JPEG shards
written to a temporary folder. Each round runs both loaders back to back (the first one alternates);
the headline ratio is the median over rounds of ours / open_clip within a round.
Writes docs/bench_data.csv and docs/bench_data.md (train/bench/loader.py).
"""

import argparse
import tempfile
from pathlib import Path

import open_clip

from data.synthetic import make_synthetic
from train.bench import loader


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs"))
    args = parser.parse_args(argv)
    transform = open_clip.image_transform(args.image_size, is_train=True)
    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    with tempfile.TemporaryDirectory() as tmp:
        shard_size = max(1, args.samples // 8)
        spec = make_synthetic(
            tmp, train_samples=args.samples, eval_per_class=0, image_size=args.image_size, shard_size=shard_size
        )
        rows = loader.rounds(spec, transform, tokenizer, args)
    ratio = loader.paired_ratio(rows)
    print(f"ours / open_clip = {ratio:.2f} (median of per-round ratios)")
    loader.write_report(rows, Path(args.out), args)
    return ratio


if __name__ == "__main__":
    main()
