"""The one header of every report and benchmark page: what it is, the command that made it, the commit, the date,
the machine (CPU model and which reduced precisions are native, or the GPU) and its load.

    text = pages.header("Attention benchmark", "python -m scripts.bench_attention --quick")

gives

    # Attention benchmark

    `python -m scripts.bench_attention --quick`; commit 1a2b3c4; 2026-12-05; AMD EPYC (x86_64), 2 cores, 2 torch
    threads; bf16 native, fp16 emulated; load average 1.9 at the end.

A date, never a time of day; the commit carries the history ("with uncommitted changes" when the tree differs).

A benchmark page is written from its data: `write_page(page, rebuild, made, meta, rows)` keeps beside it, in
<page stem>.json (save_data), the module that writes it again (the one of `rebuild(page)`), the header's stamp, the
settings and measured extras its text reads and its rows, then writes the page as rebuild renders it from
`load_data(page)` alone; tests/test_docs_regenerate.py writes every such page in docs/ again and compares.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from eval import machine

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's short commit, "+ uncommitted changes" when tracked code differs (not docs/ or .md files); "no git
    checkout" outside one."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        # docs/ and Markdown left out: the pages a clean checkout writes (and the README quoting them) say nothing of
        # the code
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", ".", ":!docs", ":!*.md"], cwd=ROOT, capture_output=True
        ).returncode
    except OSError:
        return "no git checkout"
    if head.returncode:
        return "no git checkout"
    return head.stdout.strip() + (" + uncommitted changes" if dirty else "")


def command(module: str, argv: list[str] | None) -> str:
    """`python -m module ARGS` as the shell would take it."""
    return " ".join(["python -m", module, *([shlex.join(argv)] if argv else [])])


def stamp(device: str = "cpu", load: float | None = None, where: str = "") -> dict:
    """What a page's header says of what made it: commit, date, machine (as `where` or machine.describe(device)) and
    the 1-minute load average at the end. Saved with a page's data, so the page can be written again from its data."""
    load = os.getloadavg()[0] if load is None else load
    return {
        "commit": commit(),
        "date": f"{datetime.now(UTC):%Y-%m-%d}",
        "machine": where or machine.describe(device),
        "load": load,
    }


def header(
    title: str, what_ran: str, device: str = "cpu", load: float | None = None, where: str = "", made: dict | None = None
) -> str:
    """The page's title line and its one header sentence (ends with a newline); `where`: the machine as the caller's
    probe described it (default: machine.describe(device)); `made`: a saved stamp() instead of this machine's now."""
    made = made or stamp(device, load, where)
    return (
        f"# {title}\n\n`{what_ran}`; commit {made['commit']}; {made['date']}; "
        f"{made['machine']}; load average {made['load']:.1f} at the end.\n"
    )


def save_data(page: Path, writer: str, made: dict, meta: dict, rows: list[dict]) -> Path:
    """<page stem>.json beside `page`: {"writer": the module whose rebuild(page) writes it again, "made": stamp(),
    "meta": what the text reads besides the rows, "rows": the rows} (JSON keeps floats exactly, NaN included)."""
    data = Path(page).with_suffix(".json")
    saved = {"writer": writer, "made": made, "meta": meta, "rows": rows}
    data.write_text(json.dumps(saved, indent=1, default=lambda x: x.item()) + "\n")  # .item(): NumPy scalars
    return data


def write_page(page: Path, rebuild, made: dict, meta: dict, rows: list[dict]) -> Path:
    """save_data, naming rebuild's module as the writer, then `page` as rebuild(page) writes it from that data."""
    save_data(page, rebuild.__module__, made, meta, rows)
    Path(page).write_text(rebuild(page))
    return Path(page)


def load_data(page: Path) -> dict:
    """What save_data kept beside `page`."""
    return json.loads(Path(page).with_suffix(".json").read_text())
