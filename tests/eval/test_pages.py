"""eval/pages.py: the one header every report and benchmark page opens with."""

import re

from eval import machine, pages


def test_the_header_names_what_command_commit_date_machine_and_load():
    text = pages.header("Attention benchmark", pages.command("scripts.bench_attention", ["--quick", "--out", "a b"]))
    title, blank, line, end = text.split("\n")
    assert (title, blank, end) == ("# Attention benchmark", "", "")
    assert line.startswith("`python -m scripts.bench_attention --quick --out 'a b'`; commit ")
    assert re.search(r"; commit ([0-9a-f]{7,}( \+ uncommitted changes)?|no git checkout); \d{4}-\d\d-\d\d; ", line)
    assert machine.describe("cpu") in line and re.search(r"load average \d+\.\d at the end\.$", line)
    assert not re.search(r"\d\d:\d\d", line)  # a date, never a time of day


def test_the_commit_outside_a_checkout_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(pages, "ROOT", tmp_path)
    assert pages.commit() == "no git checkout"
