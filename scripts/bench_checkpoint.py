"""What verifying checkpoints costs: writing a checkpoint's files against hashing them into the manifest
(`models.run_folder.finish`) and checking them before a resume (`models.run_folder.check`).

    python -m scripts.bench_checkpoint [--params 62.3e6] [--rounds 3] [--dir /tmp]

The files have the sizes a CLIP of `--params` parameters writes with AdamW: model.safetensors and
state/model.safetensors (4 bytes a parameter each), state/optimizer.bin (exp_avg and exp_avg_sq, 8 bytes a
parameter), plus the small ones. 62.3e6 is ViT-S-16, 149.6e6 ViT-B-16, 427.7e6 ViT-L-16. Each round writes a
fresh checkpoint in a temporary folder under `--dir` (so the file system is the one checkpoints live on),
finishes it and checks it; the figures are medians over rounds. Writes docs/bench_checkpoint.csv and .md
(train/bench/checkpoint.py).
"""

import argparse
import tempfile
from pathlib import Path

from train.bench import checkpoint

DOCS = Path(__file__).resolve().parents[1] / "docs"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=62.3e6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        rounds = [checkpoint.one_round(Path(root), int(args.params), step) for step in range(1, args.rounds + 1)]
    row = checkpoint.summary(rounds, int(args.params))
    checkpoint.write_page(row, args.out)
    return row


if __name__ == "__main__":
    main()
