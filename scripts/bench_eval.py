"""Zero-shot evaluation throughput, ours against clip_benchmark 1.6.2, on the same model and image folder.

    python scripts/bench_eval.py [--model ViT-S-32] [--per-class 8] [--batch-size 32] [--workers 2] \\
        [--rounds 2] [--threads N]

The data is the synthetic evaluation set (24 classes, 7 templates, `--per-class` images each) written to a
temporary folder. Both tools get the same open_clip model (random init), preprocess, tokenizer, class names,
templates, batch size and worker count, in the same precision (fp32 on CPU; bf16 autocast on CUDA): ours reads
the folder with `eval.zeroshot.evaluate`, clip_benchmark with torchvision's ImageFolder and
`clip_benchmark.metrics.zeroshot_classification.evaluate`, as its CLI does. A timed run is the whole
evaluation (class embeddings + images); the class-embedding phase is also timed alone. Rounds alternate between
the tools; the best round of each is kept. Also records top-1/top-5 of both (they must agree). Writes
docs/bench_eval.csv, .json, .png and .md (train/bench/zeroshot.py).
"""

import argparse
import sys

import torch

from train.bench import zeroshot


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-S-32", help="open_clip architecture (random init)")
    parser.add_argument("--per-class", type=int, default=8, help="images per class (24 classes)")
    parser.add_argument("--image-size", type=int, default=64, help="size of the synthetic images on disk")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(args.threads)
    zeroshot.write_outputs(zeroshot.measure(args), args)


if __name__ == "__main__":
    main()
