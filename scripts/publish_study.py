"""A finished study's report as a docs page that can be rebuilt from the data beside it (eval/study_page.py).

.venv/bin/python -m scripts.publish_study runs/demo-seed0 docs/study.md        (data and figures into docs/study/)
.venv/bin/python -m scripts.publish_study --check docs/study.md                 (rebuild the page; differs: exit 1)
.venv/bin/python -m scripts.publish_study --redraw docs/study.md                (its learning curves from its data)

The page keeps its own "## Findings" section (or takes --findings FILE); everything else is the report, written again
from docs/<page>/data/ by tests/test_docs_regenerate.py.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from eval.study_page import PageError, publish, rebuild, redraw


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path, help="STUDY_FOLDER PAGE.md, or PAGE.md with --check")
    p.add_argument("--check", action="store_true", help="rebuild PAGE.md from its data and compare")
    p.add_argument("--redraw", action="store_true", help="draw PAGE.md's learning curves again from its data")
    p.add_argument("--findings", type=Path, help="a Markdown file starting '## Findings' (default: the page's own)")
    args = p.parse_args(argv)
    if len(args.paths) != (1 if args.check or args.redraw else 2):
        p.error("give STUDY_FOLDER PAGE.md, or --check PAGE.md, or --redraw PAGE.md")
    try:
        if args.redraw:
            print(f"figure: {redraw(args.paths[0])}")
            return 0
        if args.check:
            page = args.paths[0]
            diff = list(difflib.unified_diff(page.read_text().splitlines(), rebuild(page).splitlines(), lineterm=""))
            print("\n".join(diff[:40]) or f"{page}: rebuilt from its data, identical")
            return 1 if diff else 0
        findings = args.findings.read_text() if args.findings else None
        print(f"page: {publish(args.paths[0], args.paths[1], findings)}")
    except (PageError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
