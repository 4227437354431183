"""Loss against model size at equal training compute, over seeds, from seeds pages' data (eval/equal_compute.py).

    python -m scripts.equal_compute docs/study_depth2_flat_seeds/data docs/study_depth2_seeds/data \\
        --out docs/equal_compute.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import equal_compute, seeds_page


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="seeds pages' data folders (docs/<page>/data: seeds.json)")
    p.add_argument("--out", type=Path, default=Path("docs/equal_compute.md"), help="the page to write")
    args = p.parse_args(argv)
    if problem := seeds_page.not_data_folders(args.folders):
        p.error(problem)
    command = "python -m scripts.equal_compute " + " ".join(str(f) for f in args.folders) + f" --out {args.out}"
    out = equal_compute.write(args.folders, args.out, command)
    print(out.read_text())
    return out


if __name__ == "__main__":
    main()
