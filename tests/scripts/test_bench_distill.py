"""scripts.bench_distill on a tiny model: the three kinds of step timed through the trainer's functions and the
table written (figures are not asserted: timing)."""

import csv

from scripts import bench_distill
from train.bench import distill_step


def test_bench_distill_times_every_kind_of_step(tmp_path):
    md = bench_distill.main(["--sizes", "tiny-s", "--batch", "4", "--steps", "1", "--out", str(tmp_path)])
    with open(tmp_path / "bench_distill.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["kind"] for r in rows] == ["training", "transfer", "distill"]
    assert all(float(r["s_per_step"]) > 0 and r["batch"] == "4" for r in rows)
    assert float(rows[0]["vs_training"]) == 1.0
    text = md.read_text()
    assert "| tiny-s | 4 | transfer |" in text and "1.6x aim" in text
    assert distill_step.rebuild(md) == text  # the page is its JSON written again
