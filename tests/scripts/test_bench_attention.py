"""scripts/bench_attention.py: the quick run writes its three files, and the aims check reads a frame right."""

import pandas as pd

from scripts.bench_attention import aims, main


def test_quick_run_writes_csv_plot_and_table(tmp_path):
    main(["--quick", "--variants", "softmax", "linear_affine_nodenom", "--out", str(tmp_path / "bench")])
    frame = pd.read_csv(tmp_path / "bench.csv")
    assert set(frame.variant) == {"softmax", "linear_affine_nodenom"} and (frame.time_ms > 0).all()
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert "linear_affine_nodenom full" in (tmp_path / "bench.md").read_text()


def frame_with(nodenom_ratio_197, gemm_fraction):
    rows = []
    for n, softmax_ms in ((197, 1.0), (4096, 300.0), (65536, 7e4), (131072, 2.8e5)):
        ours = softmax_ms * (nodenom_ratio_197 if n == 197 else 1 / 1000)
        rows += [
            dict(
                variant="softmax",
                N=n,
                time_ms=softmax_ms,
                ratio_to_softmax=1.0,
                gemm_fraction=None,
                peak_mb=None,
                extrapolated="O(N^2)" if n > 4096 else "",
            ),
            dict(
                variant="linear_affine_nodenom",
                N=n,
                time_ms=ours,
                ratio_to_softmax=ours / softmax_ms,
                gemm_fraction=gemm_fraction,
                peak_mb=n / 100,
                extrapolated="",
            ),
        ]
    return pd.DataFrame(rows).assign(mode="full", dtype="float32")


def test_aims_say_met_and_missed_from_the_numbers():
    met = aims(frame_with(0.5, 0.6))
    assert len(met) == 2 + 5 and all(line.endswith("| met |") for line in met[2:])
    assert "(softmax extrapolated)" in met[4]
    missed = aims(frame_with(0.7, 0.4))
    assert missed[2].endswith("| MISSED |") and missed[5].endswith("| MISSED |") and missed[3].endswith("| met |")
