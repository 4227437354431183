"""Linearising the main job's best softmax run (train/distill.py) against training the same attention from scratch.

    python -m scripts.linearise STUDY_DIR [--transfer-steps 100] [--distill-steps 400] [--eval-every 25] [--out DIR]

STUDY_DIR is a finished `python -m scripts.demo` folder; what the arm trains and reports: train/linearise.py.
Writes OUT/linearise.md, .json and .png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from train.linearise import Settings, linearise


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", help="a finished python -m scripts.demo folder")
    p.add_argument("--transfer-steps", type=int, default=100)
    p.add_argument("--distill-steps", type=int, default=400)
    p.add_argument("--transfer-lr", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--warmup-steps", type=int, default=10, help="of each stage")
    p.add_argument(
        "--students",
        nargs="+",
        help="registry names to linearise into (default: the study's linear attentions); one the study did not "
        "train (e.g. hedgehog, whose feature map learns) has no curve from scratch and takes the teacher's rate",
    )
    p.add_argument("--out", help="default: STUDY/linearise")
    return p.parse_args(argv)


def main(argv=None) -> Path:
    args = vars(parse_args(argv))
    return linearise(Settings(**args))


if __name__ == "__main__":
    main()
