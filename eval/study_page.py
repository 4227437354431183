"""A study report as a docs page that can be written again from the data it was written from.

    python -m scripts.publish_study runs/demo-seed0 docs/study.md     (figures -> docs/study/, data -> docs/study/data/)

The study's report.md is made from runs.json, one JSON per fit (eval/study_analysis.py: FITS) and page.json (the
header's stamp - commit, date, machine, load - the study's settings, the command's options, the number of classes,
the attention benchmark's table, the clock and the learning-rate sweep). `publish` copies those files and the
figures beside the page and writes the page: the report with its figure links pointing into docs/<page>/ and the
page's own "## Findings" section (written by a person from the numbers below it) kept after the header.
`rebuild(page)` writes it again from docs/<page>/data/ alone; tests/test_docs_regenerate.py checks that this gives
the committed page, so every number on it comes from the data beside it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

from eval import study_plots, study_report
from eval.scaling import format_table

# runs.json, page.json and each fit's JSON (eval/study_analysis.py FITS; page.json names them)
DATA = ("runs.json", "page.json")
FINDINGS = "## Findings\n"


class PageError(ValueError):
    """A study folder or page that cannot be published or rebuilt; one line naming it and the fix."""


def page_data(
    made: dict, study, args, classes: int, bench: str, clock: dict, sweep, titles: dict, errors: dict
) -> dict:
    """What report.md is written from besides runs.json and the fits' JSON (page.json)."""
    return {
        "made": made,
        "study": {k: getattr(study, k) for k in ("attentions", "sizes", "data", "fits", "budgets", "lr_sweep")}
        | {"jobs": study.jobs, "threads_per_job": study.threads_per_job, "title": study.title},
        "args": {"quick": bool(args.quick), "seed": args.seed, "study": getattr(args, "study", None)},
        "classes": classes,
        "bench": bench,
        "clock": clock,
        "sweep": list(sweep),
        "titles": titles,
        "fit_errors": errors,
    }


def report_from(folder: Path) -> str:
    """report.md written again from a folder's runs.json, fit JSONs and page.json."""
    missing = [n for n in ("runs.json", "page.json") if not (folder / n).is_file()]
    if missing:
        raise PageError(f"{folder} has no {missing[0]}: publish a study made by this version of scripts.demo")
    page = json.loads((folder / "page.json").read_text())
    runs = json.loads((folder / "runs.json").read_text())
    fits = {
        name: json.loads((folder / f"{name}.json").read_text())
        if (folder / f"{name}.json").is_file()
        else {"error": page["fit_errors"].get(name, "no fit")}
        for name in page["titles"]
    }
    study = SimpleNamespace(**page["study"])
    args = SimpleNamespace(**page["args"])
    text = study_report.report_md(
        runs,
        fits,
        page["titles"],
        page["bench"],
        study,
        args,
        page["clock"],
        format_table,
        page["classes"],
        page["sweep"],
        made=page["made"],
    )
    arm = folder / "linearise.md"  # the linearisation arm's page (a study folder's linearise/linearise.md)
    arm = arm if arm.is_file() else folder / "linearise" / "linearise.md"
    return text + study_report.linearise_section(arm.read_text()) if arm.is_file() else text


def page_text(report: str, stem: str, findings: str = "") -> str:
    """The docs page of a report: figure links into docs/<stem>/, the findings section before the first section."""
    text = re.sub(r"\]\(([\w./-]+\.png)\)", rf"]({stem}/\1)", report)
    if not findings:
        return text
    first = text.find("\n## ")  # after the header and the study's opening paragraph, before the first section
    return f"{text[: first + 1]}{findings.rstrip()}\n\n{text[first + 1 :]}" if first >= 0 else f"{text}\n{findings}"


def findings_of(page: Path) -> str:
    """A page's "## Findings" section (up to the next "## " heading), or ''."""
    if not page.is_file():
        return ""
    text = page.read_text()
    start = text.find(FINDINGS)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(FINDINGS))
    return text[start : end if end >= 0 else len(text)].rstrip() + "\n"


def with_findings(page: Path, text: str, beside: bool = False) -> str:
    """A generated page's `text` with the "## Findings" section of the page as committed (page_text); `beside`: its
    figure links stay as written (the figures sit beside the page, not in docs/<stem>/)."""
    page = Path(page)
    kept = page_text(text, page.stem, findings_of(page))
    return kept.replace(f"]({page.stem}/", "](") if beside else kept


def publish(folder: Path, page: Path, findings: str | None = None) -> Path:
    """The study in `folder` as the docs page `page`: data and figures into docs/<stem>/, the page written from
    them. `findings` None keeps the page's own findings section."""
    folder, page = Path(folder), Path(page)
    text = report_from(folder)  # fails before anything is copied
    findings = findings_of(page) if findings is None else findings
    media = page.parent / page.stem
    (media / "data").mkdir(parents=True, exist_ok=True)
    fits = [f"{name}.json" for name in json.loads((folder / "page.json").read_text())["titles"]]
    for name in [*DATA, *fits]:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, media / "data" / name)
    if (folder / "linearise" / "linearise.md").is_file():
        shutil.copyfile(folder / "linearise" / "linearise.md", media / "data" / "linearise.md")
    for name in sorted(set(re.findall(r"\]\(([\w./-]+\.png)\)", text))):  # the figures the report links
        (media / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / name, media / name)
    page.write_text(page_text(text, page.stem, findings))
    return page


def rebuild(page: Path) -> str:
    """The page written again from docs/<stem>/data/ and its committed findings section."""
    page = Path(page)
    return page_text(report_from(page.parent / page.stem / "data"), page.stem, findings_of(page))


def redraw(page: Path, folder: Path | None = None) -> Path:
    """The page's learning-curve figure drawn again from docs/<stem>/data/ (runs.json, and the study's attentions and
    sizes from page.json) into `folder` (default docs/<stem>/, where the page links it); the figure's path."""
    page = Path(page)
    data = page.parent / page.stem / "data"
    if not (data / "page.json").is_file():
        raise PageError(f"{data} has no page.json: {page} is not a study page made by scripts.publish_study")
    study = json.loads((data / "page.json").read_text())["study"]
    path = Path(folder or page.parent / page.stem) / "learning_curves.png"
    runs = json.loads((data / "runs.json").read_text())
    study_plots.learning_curves(runs, study["attentions"], list(study["sizes"]), path)
    return path
