"""docs/*.md are findings (STYLE.md): a title, one header naming the command, then results; no times of day,
no story of how the runs went, no temporary paths, commit hashes only in the header."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(DOCS.glob("*.md"))

COMMAND = re.compile(r"`(python -m \S|python scripts/\S|bash \S)[^`]*`")
# hours 0-23, minutes 00-59, optional seconds and UTC: "08:21", "21:23-21:35", "17:27 UTC"; not "1:2" or "1:250"
TIME_OF_DAY = re.compile(r"(?<![\d:.])([01]?\d|2[0-3]):[0-5]\d(:[0-5]\d)?(?![\d:])(\s*UTC)?")
TEMPORARY = re.compile(r"/tmp/|/work/")
STORY = re.compile(
    r"earlier the same day|later the same day|\bearlier\b|the (first|second|last) (run|pass)\b|this session|"
    r"last session|moved from the readme",
    re.IGNORECASE,
)
# what a page's prose (code left out) never states: its pattern and why
PROSE = {
    "time_of_day": (TIME_OF_DAY, "times of day: a date is enough"),
    "story": (STORY, "a story of the runs: state the finding; the commit log keeps the history"),
}
# a short or full git hash: 7-40 hex digits with at least one digit and one letter
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def without_code(text: str) -> str:
    """The page with fenced code blocks, indented code blocks and inline code spans removed."""
    text = re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`]*`", "", text)  # a span may run over a line break
    return re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.MULTILINE)


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def test_there_are_pages():
    assert len(PAGES) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_opens_with_a_title_and_a_header_naming_its_command(page):
    text = page.read_text()
    assert text.startswith("# "), f"{page.name}: the first line is not a '# ' title"
    title, *rest = paragraphs(text)
    assert "\n" not in title, f"{page.name}: the title is more than one line"
    assert rest, f"{page.name}: nothing after the title"
    header = rest[0]
    assert not header.startswith("#"), f"{page.name}: a section heading where the header should be"
    assert COMMAND.search(header), f"{page.name}: the header names no `python -m`, `python scripts/` or `bash` command"


@pytest.mark.parametrize("check", PROSE)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_states_no_time_of_day_and_tells_no_story_of_its_runs(page, check):
    pattern, why = PROSE[check]
    found = [m.group(0) for m in pattern.finditer(without_code(page.read_text()))]
    assert not found, f"{page.name}: {found} ({why})"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_names_no_temporary_path(page):
    found = [line for line in page.read_text().splitlines() if TEMPORARY.search(line)]
    assert not found, f"{page.name}: temporary paths in {found}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_commit_hashes_stand_only_in_the_header(page):
    _title, _header, *body = paragraphs(page.read_text())
    found = [m.group(0) for part in body for m in HASH.finditer(part)]
    assert not found, f"{page.name}: commit hashes {found} outside the header"


def test_the_checks_see_what_they_should():
    assert TIME_OF_DAY.search("2026-12-04 08:21-08:41 UTC") and TIME_OF_DAY.search("at 17:27 UTC")
    assert TIME_OF_DAY.search("seed 1 15:21, 10.4") and TIME_OF_DAY.search("(10:31 UTC, same data)")
    assert not any(TIME_OF_DAY.search(s) for s in ("a 1:2 ratio", "1:250", "2026-12-04", "3.2:1", "12:345"))
    assert not TIME_OF_DAY.search(without_code("`--time 2:00:00`\n\n```bash\nsbatch --time 12:00:00\n```\n"))
    assert without_code("a `b\nc` d\n\n    e 10:00\n") == "a  d\n\n\n"
    assert STORY.search("The First Run (budgets)") and STORY.search("in the last run ours") and STORY.search("Earlier:")
    assert not STORY.search(without_code("`earlier`")) and not STORY.search("when a later `sbatch` fails")
    assert HASH.search("at main 4943add with") and not HASH.search("decade 2026-12-04 1.02x deadbee")
    assert [p[:3] for p in paragraphs("# T\n\nhead\nmore\n\n\nbody\n")] == ["# T", "hea", "bod"]
