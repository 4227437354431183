"""Claim (d) against image tokens over seeds: Eq. 7's time to a target over softmax's at each token count the given
seeds pages trained at, and the break-even token count with its interval (eval/break_even.py).

    python -m scripts.break_even docs/study_normalised_seeds/data docs/study_tokens577_seeds/data \\
        --out docs/break_even.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import break_even, seeds_page


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="seeds pages' data folders (docs/<page>/data: seeds.json)")
    p.add_argument("--target", type=float, default=0.1, help="target zero-shot top-1 error (default 0.1)")
    p.add_argument("--out", type=Path, default=Path("docs/break_even.md"), help="the page to write")
    args = p.parse_args(argv)
    if problem := seeds_page.not_data_folders(args.folders):
        p.error(problem)
    command = "python -m scripts.break_even " + " ".join(str(f) for f in args.folders) + f" --out {args.out}"
    out = break_even.write(args.folders, args.out, args.target, command)
    print(out.read_text())
    return out


if __name__ == "__main__":
    main()
