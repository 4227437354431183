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
