"""scripts/bench_attention.py and train/bench/attention.py: the quick run writes its three files, the CUDA option's
defaults and its error without a GPU, out-of-memory points reported (a fake OOM), extrapolation, and the aims check
reading a frame right."""

import pandas as pd
import pytest
import torch
from torch.nn.attention import SDPBackend

from eval import machine
from models.attention.ops import dispatch
from scripts.bench_attention import main
from train.bench import attention, probes
from train.bench.attention import bench_line, parse_args
from train.bench.attention_page import aims, markdown


def test_quick_run_writes_csv_plot_and_table(tmp_path):
    options = ["--variants", "softmax", "linear_affine_nodenom", "--paired-max-n", "300"]
    main(["--quick", *options, "--out", str(tmp_path / "bench")])
    frame = pd.read_csv(tmp_path / "bench.csv")
    assert set(frame.variant) == {"softmax", "linear_affine_nodenom"} and (frame.time_ms > 0).all()
    assert set(frame[frame.variant == "linear_affine_nodenom"].impl) == {"cpu"}  # the C kernels, causal too
    assert (tmp_path / "bench.png").stat().st_size > 0
    text = (tmp_path / "bench.md").read_text()
    assert "linear_affine_nodenom full" in text and "linear_affine_nodenom causal float32: time / softmax" in text
    # up to --paired-max-n the ratio is to SDPA timed alternately with the variant; beyond, to softmax's own row
    ours = frame[frame.variant == "linear_affine_nodenom"]
    paired, alone = ours[ours.N <= 300], ours[ours.N > 300]
    fp32 = [part[part.dtype == "float32"].N.tolist() for part in (paired, alone)]  # bf16 too where it is native
    assert fp32 == [[77, 300, 77, 300], [1024, 1024]]  # full and causal; bf16 (--quick) at 77 and 300 only
    assert len(paired) == 4 * ours.dtype.nunique() and len(alone) == 2
    assert (
        paired.peer_ms.gt(0).all()
        and alone.peer_ms.isna().all()
        and frame[frame.variant == "softmax"].peer_ms.isna().all()
    )
    assert (paired.ratio_to_softmax / (paired.time_ms / paired.peer_ms) - 1).abs().max() < 1e-4  # the CSV's digits


def test_time_pair_alternates_the_two_steps_and_returns_each_best():
    calls, clock = [], iter(range(1000))

    class Probe:
        def time(self, fn):
            fn()
            return next(clock) * (10 if calls[-1] == "peer" else 1)

        def peak_mb(self, fn):
            fn()
            return 0.0

    steps = [lambda: calls.append("ours"), lambda: None, lambda: calls.append("peer"), lambda: None]
    best, median, reps, _, peer_best = attention.time_pair(*steps, Probe(), budget=0.0)
    timed = calls[3:]  # after the warm-ups (peer, ours) and the memory run (ours)
    assert timed[: 2 * (reps - 1)] == ["peer", "ours"] * (reps - 1) and reps >= 3
    assert peer_best == 0 and best < median  # the clock's values: the peer's first reading is 0 * 10


def test_emulated_bf16_is_skipped_in_one_line_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    """A CPU without native bf16 (forced here): no bf16 rate at 4096, no bf16 point, one line in output and page."""
    monkeypatch.setenv(machine.FORCE_ENV, "1")
    argv = ["--variants", "softmax", "linear_affine", "--sizes", "77", "--long-sizes", "--bf16-variants", "softmax"]
    main([*argv, "--budget", "0.05", "--out", str(tmp_path / "bench")])  # not --quick: the full-size rate probe
    frame = pd.read_csv(tmp_path / "bench.csv")
    assert set(frame.dtype) == {"float32"} and set(frame.variant) == {"softmax", "linear_affine"}
    assert capsys.readouterr().out.count("bf16 skipped: ") == 1
    text = (tmp_path / "bench.md").read_text()
    assert text.count("bf16 skipped: ") == 1 and "bf16 emulated" in text


def test_forward_only_pass_and_explicit_impl(tmp_path):
    options = ["--variants", "linear_elu", "--sizes", "77", "--long-sizes", "--passes", "fwd", "fwd+bwd"]
    main(["--quick", *options, "--impl", "reference", "--out", str(tmp_path / "bench")])
    frame = pd.read_csv(tmp_path / "bench.csv")
    assert set(frame.passes) == {"fwd", "fwd+bwd"} and set(frame[frame.variant == "linear_elu"].impl) == {"reference"}
    assert "## float32, fwd: time in ms" in (tmp_path / "bench.md").read_text()


def test_cuda_option_defaults_and_error_without_a_gpu(monkeypatch):
    args = parse_args(["--device", "cuda"])
    assert (args.batch, args.heads, args.head_dim) == (4, 8, 64) and args.sizes[-1] == 4000000
    assert args.passes == ["fwd+bwd", "fwd"] and args.out == "docs/bench_attention_cuda"
    assert [d for d, _ in attention.dtypes_for("linear_elu", args)] == [torch.bfloat16, torch.float32]
    assert attention.peer_backends(torch.bfloat16) == [SDPBackend.FLASH_ATTENTION]
    assert attention.peer_backends(torch.float32) == [SDPBackend.EFFICIENT_ATTENTION]  # flash has no fp32
    assert parse_args(["--device", "cuda", "--batch", "2", "--heads", "3"]).batch == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="torch sees no CUDA GPU here; run on a GPU machine or --device cpu"):
        main(["--device", "cuda", "--quick"])


def fake_run(monkeypatch, seconds_at, oom_from=None):
    """bench_line over N = 100, 200, 400, 800 with measure() replaced: time seconds_at(n), OOM from oom_from."""

    def measure(row, name, causal, n, dtype, passes, probe, args):
        if oom_from is not None and n >= oom_from:
            row.update(status="out of memory")
            return None
        row.update(time_ms=1e3 * seconds_at(n), status="", impl="")
        return seconds_at(n)

    monkeypatch.setattr(attention, "measure", measure)
    args = parse_args(["--max-seconds", "1"])
    return bench_line("softmax", False, torch.float32, "fwd+bwd", [100, 200, 400, 800], None, args)


def test_slow_points_are_extrapolated_quadratically(monkeypatch):
    """0.125 s at 100 and 0.5 s at 200 run; 400 (predicted 2 s) and 800 (8 s) exceed --max-seconds 1: O(N^2) from
    the largest measured point."""
    rows = fake_run(monkeypatch, lambda n: (n / 200) ** 2 * 0.5)
    assert [r["extrapolated"] for r in rows] == ["", "", "O(N^2)", "O(N^2)"]
    assert [r["time_ms"] for r in rows] == pytest.approx([125, 500, 2000, 8000])


def test_out_of_memory_is_reported_and_larger_sizes_skipped(monkeypatch):
    rows = fake_run(monkeypatch, lambda n: 1e-3, oom_from=400)
    assert [r["status"] for r in rows] == ["", "", "out of memory", "out of memory (at a smaller N)"]


def test_a_real_out_of_memory_error_is_caught(monkeypatch):
    """measure() itself: an allocation failure inside a step becomes a row status; other errors still raise."""

    def make_step(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    monkeypatch.setattr(attention, "make_step", make_step)
    row, args = {}, parse_args([])
    assert attention.measure(row, "softmax", False, 77, torch.float32, "fwd", probes.probe("cpu"), args) is None
    assert row["status"] == "out of memory"
    monkeypatch.setattr(attention, "make_step", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        attention.measure({}, "softmax", False, 77, torch.float32, "fwd", probes.probe("cpu"), args)


def frame_with(nodenom_ratio_197, gemm_fraction, dtype="float32", big=65536, status=""):
    rows = []
    for n, softmax_ms in ((77, 1.0), (197, 1.0), (4096, 300.0), (big, 7e4), (2 * big, 2.8e5)):
        ours = softmax_ms * (nodenom_ratio_197 if n <= 197 else 1 / 1000)
        common = dict(N=n, dtype=dtype, passes="fwd+bwd", impl="")
        for mode in ("full", "causal"):
            peer = dict(variant="softmax", time_ms=softmax_ms, ratio_to_softmax=1.0, gemm_fraction=None, peak_mb=None)
            extrapolated = "O(N^2)" if n > 4096 else ""
            rows.append(dict(mode=mode, status="", extrapolated=extrapolated, **peer, **common))
            for name in dispatch.linear_ops():
                ours_row = dict(variant=name, time_ms=ours, ratio_to_softmax=ours / softmax_ms, peak_mb=n / 100)
                status_n = status if n == big else ""
                rows.append(
                    dict(mode=mode, status=status_n, extrapolated="", gemm_fraction=gemm_fraction, **ours_row, **common)
                )
    return pd.DataFrame(rows)


def test_aims_say_met_and_missed_from_the_numbers():
    met = aims(frame_with(0.5, 0.6))
    assert len(met) == 2 + 3 + 3 + 2 and all(line.endswith("| met |") for line in met[2:])
    assert "(softmax extrapolated)" in met[4]
    missed = aims(frame_with(1.6, 0.4))
    assert missed[2].endswith("| MISSED |") and missed[3].endswith("| met |")
    assert [line.endswith("| MISSED |") for line in missed[5:8]] == [True] * 3  # causal at 77: 1.6 > 1.5
    assert missed[8].endswith("| MISSED |")  # GEMM fraction


def test_gpu_aims_and_out_of_memory_in_the_report():
    ok = aims(frame_with(0.9, None, "bfloat16", big=4000000), "cuda")
    assert len(ok) == 2 + 5 and all(line.endswith("| met |") for line in ok[2:])
    oom = frame_with(0.9, None, "bfloat16", big=4000000, status="out of memory")
    lines = aims(oom, "cuda")
    assert "out of memory | MISSED |" in lines[2]
    args = parse_args(["--device", "cuda"])
    info = dict(machine="H200", bandwidth=4300.0, gemm_bf16=7.9e5, load_start=0.0, load_end=0.0)
    text = markdown(oom.assign(gbs=1.0, gflops=float("nan"), bandwidth_fraction=0.5), info, args)
    assert "| OOM |" in text or "OOM |" in text
    assert "FlashAttention-2" in text
