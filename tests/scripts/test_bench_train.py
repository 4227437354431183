"""scripts/bench_train.py and train/bench/training.py: a tiny run writes its three files; the CUDA option's defaults
and its error without a GPU; a contender that runs out of memory (a fake OOM) is reported, not raised."""

import csv
import math

import pytest
import torch

from eval import machine
from models.attention.ops import dispatch
from scripts import bench_train
from train.bench import probes, training


def test_tiny_run_writes_csv_table_and_plot(tmp_path):
    sizes = ["--sizes", "tiny-s", "--attention-size", "tiny-s", "--image-sizes", "64", "--attentions", "linear_affine"]
    batches = ["--batch-size", "4", "--attention-batch-size", "2", "--steps", "1"]
    bench_train.main([*sizes, *batches, "--out", str(tmp_path)])
    with open(tmp_path / "bench_train.csv") as f:
        rows = list(csv.DictReader(f))
    precisions = ["fp32"] + ([] if "bfloat16" in machine.emulated("cpu") else ["bf16"])  # bf16: native CPUs only
    first = [r for r in rows if r["part"] == "vs_open_clip"]
    assert [r["precision"] for r in first] == precisions
    assert {(r["pixels"], r["attention"]) for r in rows[len(first) :]} == {("64", "linear_affine"), ("64", "softmax")}
    assert all(float(r["ours_s"]) > 0 and r["status"] == "" for r in rows)
    assert "| 64 | linear_affine |" in (tmp_path / "bench_train.md").read_text()
    assert training.rebuild(tmp_path / "bench_train.md") == (tmp_path / "bench_train.md").read_text()  # its JSON
    assert (tmp_path / "bench_train.png").stat().st_size > 0


def test_the_cpu_default_times_every_attention_the_image_tower_takes():
    names = bench_train.parse_args([]).attention_names
    assert "softmax" in names and "gla" in names and "retention_2d" in names and "deltanet" not in names


def test_cuda_defaults_and_error_without_a_gpu(monkeypatch):
    args = bench_train.parse_args(["--device", "cuda"])
    assert (args.batch_size, args.attention_batch_size, args.image_sizes) == (64, 16, "224,448,896")
    assert args.attention_names == sorted(["softmax", *dispatch.linear_ops()])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="torch sees no CUDA GPU here"):
        bench_train.main(["--device", "cuda"])


def test_a_contender_out_of_memory_is_reported():
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    calls = []
    result = probes.race({"softmax": lambda: calls.append(1), "big": oom}, 2, probes.probe("cpu"))
    assert len(calls) == 3 and result["softmax"][0] > 0  # warm-up + 2 rounds; the other kept running
    assert math.isnan(result["big"][0])
    row = training.row("attention", "ViT-S-16", 896, "bf16", "big", result["big"], result["softmax"])
    assert row["status"] == "out of memory"
    with pytest.raises(ZeroDivisionError):
        probes.race({"broken": lambda: 1 / 0}, 1, probes.probe("cpu"))
