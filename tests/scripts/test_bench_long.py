"""scripts.bench_long (train/bench/long.py) on a tiny model: every tower, length and attention timed, long ones
extrapolated from one block, the whole CLIP at one setting, and the CSV, table and plot written (figures are not
asserted: timing)."""

import csv

import pytest

from eval import machine
from scripts import bench_long
from train.bench import long


def test_bench_long_writes_every_row_and_marks_extrapolated_ones(tmp_path):
    argv = ["--size", "tiny-s", "--image-sizes", "32,64", "--text-lengths", "8,48", "--clip", "32,16"]
    argv += ["--block-above", "40", "--steps", "1", "--threads", "1", "--out", str(tmp_path)]
    argv += ["--attentions", "softmax,linear_affine_nodenom,linear_elu"]
    md = bench_long.main(argv)
    assert long.rebuild(md) == md.read_text()  # the page is its CSV and JSON written again
    with open(tmp_path / "bench_long.csv") as f:
        rows = list(csv.DictReader(f))
    image = {(r["length"], r["attention"], r["checkpointing"]) for r in rows if r["part"] == "image"}
    assert len(image) == 2 * 3 * 2 and len([r for r in rows if r["part"] == "text"]) == 2 * 3 * 2
    tokens = {r["part"] + r["length"]: int(r["tokens"]) for r in rows}
    assert tokens["image64"] > 40 and tokens["text48"] > 40 and tokens["image32"] <= 40
    for r in rows:
        assert float(r["seconds"]) > 0, r
        assert (r["how"] == "measured") == (int(r["tokens"]) <= 40 or r["part"] == "clip"), r
    clip = {(r["attention"], r["checkpointing"]): r for r in rows if r["part"] == "clip"}
    assert {a for a, _ in clip} == {"softmax", "linear_affine_nodenom", "linear_elu"} and len(clip) == 3 * 2
    assert float(clip[("linear_elu", "True")]["flop_bound"]) == long.clip_flop_ratio("tiny-s", 32, 16)
    text = md.read_text()
    assert "| image | 64 |" in text and "block x" in text and "Slopes of log step time" in text
    assert (tmp_path / "bench_long.png").stat().st_size > 0


def test_the_whole_clips_bound_lies_between_its_towers():
    """ViT-S-16 at 1024 px (4,097 image tokens) with 248 text tokens: the image tower's bound pulls it down, the
    text tower's (nearer 1 at 248 tokens) up; both towers have width 384 and 12 layers."""
    image, text = long.flop_ratio(384, 64, 4097), long.flop_ratio(384, 64, 248)
    assert image < long.clip_flop_ratio("ViT-S-16", 1024, 248) < text


def test_flop_bound_falls_with_length_and_softmax_is_required():
    assert long.flop_ratio(384, 64, 197) > long.flop_ratio(384, 64, 4097) > 0
    assert long.flop_ratio(384, 64, 64) == pytest.approx(1.0)
    with pytest.raises(SystemExit):
        bench_long.parse_args(["--attentions", "linear_elu"])


def test_bf16_autocast_form_runs_and_says_so(tmp_path):
    """--bf16 (the GPU form in scripts/gpu_check.sh, here on the CPU): the same rows, the header names it."""
    argv = ["--size", "tiny-s", "--image-sizes", "32", "--text-lengths", "", "--clip", "", "--steps", "1"]
    argv += ["--threads", "1", "--attentions", "softmax,linear_affine_nodenom", "--bf16", "--out", str(tmp_path)]
    text = bench_long.main(argv).read_text()
    native = "bfloat16" not in machine.emulated("cpu")  # a CPU that emulates bf16 times fp32 and says so
    assert ("bf16 autocast" if native else "--bf16 ignored") in text and "| image | 32 |" in text
    with open(tmp_path / "bench_long.csv") as f:
        assert all(float(r["seconds"]) > 0 for r in csv.DictReader(f))


def test_bf16_on_a_cpu_that_emulates_it_times_fp32_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(machine.FORCE_ENV, "1")
    argv = ["--size", "tiny-s", "--image-sizes", "32", "--text-lengths", "", "--clip", "", "--steps", "1"]
    text = bench_long.main(
        [*argv, "--threads", "1", "--attentions", "softmax", "--bf16", "--out", str(tmp_path)]
    ).read_text()
    assert "fp32 (bf16 skipped: " in text and "bf16 autocast" not in text
    assert capsys.readouterr().out.count("bf16 skipped") == 1
