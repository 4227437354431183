"""The learning rate chosen over seeds from finished runs at several rates and seeds (eval/rate_seeds.py): each
rate's final validation loss per seed, its mean and 95% interval over seeds, its change from the chosen rate paired
by seed, and a figure.

    python -m scripts.rate_seeds runs/sweep-seed*/lr_sweep/x*/runs/demo-w64-l2-* --out docs/rate_seeds.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import rate_seeds


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders (config.yaml, metrics.jsonl)")
    p.add_argument("--out", type=Path, default=Path("docs/rate_seeds.md"), help="the page to write")
    args = p.parse_args(argv)
    command = "python -m scripts.rate_seeds " + " ".join(str(f) for f in args.runs) + f" --out {args.out}"
    try:
        out = rate_seeds.write(args.runs, args.out, command)
    except rate_seeds.RateError as e:
        raise SystemExit(f"error: {e}") from None
    print(out.read_text())
    return out


if __name__ == "__main__":
    main()
