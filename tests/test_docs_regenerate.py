"""Every generated study page is written again from the data committed beside it and compared with the committed
page (eval/study_page.py): every number on it comes from docs/<page>/data/, none is typed by hand outside its
"## Findings" section."""

from pathlib import Path

import pytest

from eval import seeds_page, study_page
from eval.study_page import findings_of, page_text

DOCS = Path(__file__).resolve().parents[1] / "docs"
# a page and what writes it again: a study's report (page.json beside its data) or the study over seeds (seeds.json)
WRITERS = {"page.json": study_page.rebuild, "seeds.json": seeds_page.rebuild}
GENERATED = sorted(
    (p, writer)
    for p in DOCS.glob("*.md")
    for data, writer in WRITERS.items()
    if (DOCS / p.stem / "data" / data).is_file()
)


def test_the_main_jobs_pages_are_generated():
    assert {DOCS / "study.md", DOCS / "study_seeds.md"} <= {page for page, _ in GENERATED}


@pytest.mark.parametrize("page,writer", GENERATED, ids=lambda p: getattr(p, "name", ""))
def test_a_generated_page_is_its_data_written_again(page, writer):
    assert writer(page) == page.read_text()
    linked = {line.split("](")[1].split(")")[0] for line in page.read_text().splitlines() if "![" in line}
    assert linked and all((DOCS / name).is_file() for name in linked)


def test_findings_stay_after_the_header_and_links_move_into_the_pages_folder(tmp_path):
    report = "# Title\n\n`python -m x`; header.\n\n9 runs.\n\n## Runs\n\n![curves](learning_curves.png)\n"
    findings = "## Findings\n\nLinear attention reaches 40%.\n"
    text = page_text(report, "study", findings)
    assert text.startswith("# Title\n\n`python -m x`; header.\n\n9 runs.\n\n" + findings + "\n## Runs")
    assert "](study/learning_curves.png)" in text
    (tmp_path / "study.md").write_text(text)
    assert findings_of(tmp_path / "study.md") == findings


def test_the_readmes_results_table_is_the_seeds_pages_data_written_again():
    """The README's results block (between its markers) is what eval/seeds_page.py writes from the data of the page
    over seeds: no number in it is typed by hand."""
    readme = (DOCS.parent / "README.md").read_text()
    pages = [
        p
        for p, writer in GENERATED
        if writer is seeds_page.rebuild and seeds_page.README_START.format(page=p.stem) in readme
    ]
    assert pages, "the README has no results block of a page over seeds"
    for page in pages:
        assert seeds_page.readme_block(page) in readme
