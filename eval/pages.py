"""The one header of every report and benchmark page: what it is, the command that made it, the commit, the date,
the machine (CPU model and which reduced precisions are native, or the GPU) and its load.

    text = pages.header("Attention benchmark", "python -m scripts.bench_attention --quick")

gives

    # Attention benchmark

    `python -m scripts.bench_attention --quick`; commit 1a2b3c4; 2026-12-05; AMD EPYC (x86_64), 2 cores, 2 torch
    threads; bf16 native, fp16 emulated; load average 1.9 at the end.

A date, never a time of day; the commit carries the history ("with uncommitted changes" when the tree differs).
"""

from __future__ import annotations

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
