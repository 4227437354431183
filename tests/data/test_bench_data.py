"""scripts/bench_data.py runs both loaders on the same shards and writes its report."""

from scripts.bench_data import main
from train.bench import loader


def test_bench_runs_both_loaders_and_writes_the_report(tmp_path):
    ratio = main(
        ["--samples", "32", "--image-size", "32", "--batch-size", "8", "--rounds", "1", "--out", str(tmp_path)]
    )
    assert ratio > 0
    rows = (tmp_path / "bench_data.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",32," in row for row in rows[1:])  # both loaders saw all 32 samples
    assert "Ratio ours / open_clip" in (tmp_path / "bench_data.md").read_text()
    assert loader.rebuild(tmp_path / "bench_data.md") == (tmp_path / "bench_data.md").read_text()  # from its JSON
