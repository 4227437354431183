"""eval/machine.py: the header's machine line, the emulated-dtype rule, and rate probes bounded on any CPU."""

import time

import torch

from eval import machine


def test_describe_names_the_cpu_model_and_which_reduced_precisions_are_native(monkeypatch):
    monkeypatch.delenv(machine.FORCE_ENV, raising=False)
    text = machine.describe("cpu")
    assert text.startswith(machine.cpu_model()) and f"{torch.get_num_threads()} torch threads" in text
    for short, name in (("bf16", "bfloat16"), ("fp16", "float16")):
        assert f"{short} {'emulated' if name in machine.emulated('cpu') else 'native'}" in text


def test_a_dtype_under_a_quarter_of_fp32s_rate_is_emulated_with_one_line(monkeypatch):
    rates = {torch.float32: 75.0, torch.bfloat16: 0.99, torch.float16: 40.0}
    monkeypatch.setattr(machine, "small_rate", lambda device, dtype: rates[dtype])
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset())  # no flags to read: the probe decides
    machine.measured_emulated.cache_clear()
    try:
        skipped = machine.measured_emulated("cpu")
    finally:
        machine.measured_emulated.cache_clear()
    assert list(skipped) == ["bfloat16"]  # fp16 at 40 of 75 is native
    assert skipped["bfloat16"] == (
        "bf16 skipped: this CPU emulates it (bf16 GEMM 1.0 GFLOP/s against fp32's 75 at 256 x 256, under 1/4)"
    )


def test_the_environment_variable_forces_emulated_bf16(monkeypatch):
    monkeypatch.setenv(machine.FORCE_ENV, "1")
    assert machine.emulated("cpu")["bfloat16"].startswith("bf16 skipped: ")  # measured, or forced by the variable
    assert "bf16 emulated" in machine.describe("cpu") and machine.emulated("cuda") == {}


def test_a_large_product_predicted_to_run_long_is_not_run(monkeypatch):
    monkeypatch.setattr(machine, "small_rate", lambda device, dtype: 1.0)  # 1 GFLOP/s: 4096^3 x 8 would take 550 s
    start = time.perf_counter()
    assert machine.gemm_rate("cpu", torch.float32, 4096, max_seconds=4.0) == (1.0, machine.SMALL)
    assert time.perf_counter() - start < 1.0
    monkeypatch.undo()
    rate, n = machine.gemm_rate("cpu", torch.float32, 512, max_seconds=2.0)  # fast enough: measured at 512
    assert n == 512 and rate > 0


def test_a_cpu_whose_flags_lack_the_instructions_emulates_the_dtype_whatever_the_probe_reads(monkeypatch):
    # an oversubscribed fp32 probe can read 0.5 GFLOP/s, so bf16's emulated 0.2 would pass for native
    rates = {torch.float32: 0.5, torch.bfloat16: 0.2, torch.float16: 0.4}
    monkeypatch.setattr(machine, "small_rate", lambda device, dtype: rates[dtype])
    for flags, emulated in (({"avx2", "fma"}, ["bfloat16", "float16"]), ({"avx2", "avx512_bf16", "avx512_fp16"}, [])):
        monkeypatch.setattr(machine, "cpu_flags", lambda flags=flags: frozenset(flags))
        machine.measured_emulated.cache_clear()
        try:
            skipped = machine.measured_emulated("cpu")
        finally:
            machine.measured_emulated.cache_clear()
        assert list(skipped) == emulated
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset({"avx2"}))
    machine.measured_emulated.cache_clear()
    try:
        assert machine.measured_emulated("cpu")["bfloat16"] == (
            "bf16 skipped: this CPU emulates it (no amx_bf16 or avx512_bf16 in /proc/cpuinfo's flags)"
        )
    finally:
        machine.measured_emulated.cache_clear()
