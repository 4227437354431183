"""scripts/bench_soak.py streams the same shards through both loaders, reads the RSS at each mark and writes its
page, CSV and figure."""

import csv

from scripts.bench_soak import main
from train.bench.soak import growth, rebuild


def test_soak_reads_the_rss_at_every_mark_of_both_loaders_and_writes_the_page(tmp_path):
    argv = ["--samples", "256", "--every", "128", "--shards", "2", "--per-shard", "100", "--corrupt-every", "10"]
    main([*argv, "--image-size", "32", "--batch-size", "32", "--workers", "1", "--out", str(tmp_path)])
    with open(tmp_path / "bench_soak.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["loader"], int(r["samples"])) for r in rows] == [
        ("ours", 128),
        ("ours", 256),
        ("open_clip", 128),
        ("open_clip", 256),
    ]
    assert all(float(r["main_rss_mb"]) > 50 and float(r["workers_rss_mb"]) > 10 for r in rows)  # one live worker
    page = (tmp_path / "bench_soak.md").read_text()
    assert page.startswith("# Loader memory over a long run") and "--out" not in page
    numeric = [{**r, "main_rss_mb": float(r["main_rss_mb"])} for r in rows]
    assert f"{growth(numeric, 'ours', 'main_rss_mb'):+.1%}" in page
    assert (tmp_path / "bench_soak.png").stat().st_size > 10_000
    assert rebuild(tmp_path / "bench_soak.md") == page  # the page is its JSON written again
