"""The study over several seeds: each number per seed, its mean and a 95% interval over seeds (eval/seeds.py).

.venv/bin/python -m scripts.demo --seed 1 --out runs/demo-seed1      (one folder per seed; the main job is seed 0)
.venv/bin/python -m scripts.study_seeds runs/demo runs/demo-seed1 runs/demo-seed2 --out docs/study_seeds.md

With --out the page's data (each seed's runs.json, fits.json, lr_sweep.json, and seeds.json) go to
docs/<page>/data/ and its figure to docs/<page>/curves.png, so the page can be rebuilt from them (eval/seeds_page.py);
a "## Findings" section already on the page stays.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eval.seeds import SeedError, load_seed
from eval.seeds_page import body_of, write_page
from eval.study_report import DEFAULT_TITLE
from train.study import REPO, StudyError, load_study


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="finished study folders, one per seed")
    p.add_argument("--study", default=str(REPO / "configs/study/demo.yaml"), help="the study config (its targets)")
    p.add_argument("--out", type=Path, help="Markdown file to write (default: print)")
    args = p.parse_args(argv)
    try:
        seeds = [load_seed(f) for f in args.folders]
        study = load_study(args.study)
    except (SeedError, StudyError) as e:
        raise SystemExit(f"error: {e}") from None
    classnames = seeds[0].folder / "data" / "eval" / "classnames.txt"
    n_images = len(classnames.read_text().splitlines()) * study.data["eval_per_class"] if classnames.is_file() else None
    command = "python -m scripts.study_seeds " + " ".join(str(f) for f in args.folders)
    targets = study.fits.get("targets", [0.2])
    if args.out:
        try:
            title = None if study.title == DEFAULT_TITLE else f"{study.title}, over {len(seeds)} seeds"
            return write_page(seeds, args.out, targets, command, n_images, title)
        except SeedError as e:
            raise SystemExit(f"error: {e}") from None
    text = body_of(seeds, targets, command, n_images, None)
    print(text)
    return text


if __name__ == "__main__":
    main()
