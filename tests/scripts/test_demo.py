"""The main job in its reduced mode: every stage runs and the report holds what the runs produced."""

import json

from scripts import demo


def test_demo_quick_writes_the_report(tmp_path):
    out = demo.main(
        [
            "--quick",
            "--out",
            str(tmp_path / "demo"),
            "--sizes",
            "tiny-s",
            "tiny-m",
            "--attentions",
            "softmax",
            "linear_affine_nodenom",
        ]
    )
    report = (out / "report.md").read_text()
    runs = json.loads((out / "runs.json").read_text())
    assert [(r["size"], r["attention"]) for r in runs] == [
        ("tiny-s", "softmax"),
        ("tiny-s", "linear_affine_nodenom"),
        ("tiny-m", "softmax"),
        ("tiny-m", "linear_affine_nodenom"),
    ]
    for r in runs:
        assert 0 <= r["top1"] <= r["top5"] <= 1 and r["final_loss"] > 0
        assert f"{100 * r['top1']:.1f}%" in report
        assert (tmp_path / "demo" / "runs" / f"{r['size']}-{r['attention']}" / "metrics.jsonl").is_file()
    assert "alpha(linear_affine_nodenom) - alpha(softmax)" in report
    assert (out / "scaling_params.png").stat().st_size > 0 and (out / "bench_attention.png").stat().st_size > 0
    assert "| 197 |" in report
    assert sum(line.startswith("# ") for line in report.splitlines()) == 1  # the embedded benchmark's headings nest
