"""The dispatcher of the linear ops (models/attention/ops/dispatch.py): what auto picks where, what an explicit impl
says when it cannot run, that a choice is resolved once and logged once, that the Triton files are picked up
the moment they exist (a stand-in module here), the model config's attention_impl, torch.compile."""

import importlib.machinery
import logging
import sys
import types

import pytest
import torch

from models import create_model
from models.attention import attend, build_attention
from models.attention.ops import cpu_build, dispatch
from tests.models.test_attention import rel_err

OPS = dispatch.linear_ops()
# what auto takes non-causal on the CPU: the C kernel where the op has one of that form, else PyTorch
NONCAUSAL = ["cpu" if dispatch.TABLES[op].cpu_noncausal else "torch" for op in OPS]


@pytest.fixture(autouse=True)
def fresh_choices():
    dispatch.forget()
    yield
    dispatch.forget()


def like(device: str, dtype=torch.float32, d: int = 64):
    """A stand-in for q [1, 2, 5, d] on a device this machine may not have (only .device, .dtype, .shape are read)."""
    return types.SimpleNamespace(device=torch.device(device), dtype=dtype, shape=(1, 2, 5, d))


def test_auto_on_the_cpu():
    q = torch.randn(1, 2, 5, 64)
    assert [dispatch.resolve(op, "auto", q, False) for op in OPS] == NONCAUSAL
    assert "torch" in NONCAUSAL  # linear_elu's C kernel: causal only
    assert {dispatch.resolve(op, "auto", q, True) for op in OPS} == {"cpu"}  # causal_cpu.c
    for other, causal in ((q.double(), False), (q.double(), True), (q[..., :48], False), (q[..., :48], True)):
        assert {dispatch.resolve(op, "auto", other, causal) for op in OPS} == {"torch"}
    assert [dispatch.resolve(op, "auto", q.bfloat16(), False) for op in OPS] == NONCAUSAL  # upcast


@pytest.mark.parametrize("wide", [True, False])
def test_auto_leaves_the_non_causal_kernels_out_on_cpus_without_avx512(wide, monkeypatch):
    """linear_cpu.h's 16-float vectors: split on AVX2, where PyTorch's ops are faster (cpu_build.wide_vectors);
    the causal kernel stays; CLIP_CPU_KERNEL=1 (the suite's setting, tests/conftest.py) takes the kernels anyway."""
    monkeypatch.delenv("CLIP_CPU_KERNEL", raising=False)
    cpu_build.wide_vectors.cache_clear()
    flags = {"fpu", "sse2", "avx", "avx2"} | ({"avx512f"} if wide else set())
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: flags)  # not the build's key: the library is not built again
    try:
        q = torch.randn(1, 2, 5, 64)
        want = NONCAUSAL if wide else ["torch"] * len(OPS)
        assert [dispatch.resolve(op, "auto", q, False) for op in OPS] == want
        assert {dispatch.resolve(op, "auto", q, True) for op in OPS} == {"cpu"}
        assert {dispatch.resolve(op, "cpu", q, False) for op in OPS if dispatch.TABLES[op].cpu_noncausal} == {"cpu"}
        monkeypatch.setenv("CLIP_CPU_KERNEL", "1")
        cpu_build.wide_vectors.cache_clear()
        dispatch.forget()
        assert [dispatch.resolve(op, "auto", q, False) for op in OPS] == NONCAUSAL
    finally:
        cpu_build.wide_vectors.cache_clear()


def test_auto_on_cuda_takes_torch_until_the_triton_files_exist():
    """In a checkout without ops/triton_common.py (or triton) auto falls back to torch on CUDA, saying why."""
    for op in OPS:
        impl, why = dispatch.choose(op, like("cuda", torch.bfloat16), False)
        if dispatch.triton_missing(op):
            assert impl == "torch" and "triton" in why
        else:
            assert impl in ("triton", "torch")


@pytest.fixture
def stand_in_triton(monkeypatch):
    """A stand-in ops/triton_common.py whose attend records its call and returns the reference."""
    calls = []
    name = dispatch.TRITON
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def fake_attend(q, k, v, *, causal, key_mask, op):
        calls.append((causal, key_mask))
        return dispatch.TABLES[op.name].reference(q, k, v, causal=causal, key_mask=key_mask)

    module.attend, module.MAX_HEAD_DIM = fake_attend, 128
    monkeypatch.setitem(sys.modules, name, module)
    dispatch.forget()
    return calls


def test_triton_files_are_used_once_they_exist(stand_in_triton, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the Triton tests' conftest may have set it
    assert dispatch.choose("linear_elu", like("cuda", torch.bfloat16), True) == ("triton", "CUDA inputs")
    q, k, v = torch.randn(3, 1, 2, 7, 16).unbind(0)
    mask = torch.ones(1, 7, dtype=torch.bool)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        attend("linear_elu", q, k, v, causal=True, key_mask=mask, impl="triton")  # CPU tensors, no interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dispatch.forget()
    out = attend("linear_elu", q, k, v, causal=True, key_mask=mask, impl="triton")
    assert stand_in_triton == [(True, mask)]
    torch.testing.assert_close(out, dispatch.TABLES["linear_elu"].reference(q, k, v, causal=True, key_mask=mask))
    assert dispatch.resolve("linear_elu", "auto", q, True) == "cpu"  # auto takes Triton on CUDA only


def test_explicit_impls_that_cannot_run_say_what_is_missing(monkeypatch):
    q = torch.randn(1, 2, 5, 64)
    with pytest.raises(ValueError, match="unknown impl 'trition'; pick one of auto, reference, torch, cpu, triton"):
        build_attention("linear_affine", 128, 2, impl="trition")
    with pytest.raises(ValueError, match="'linear_elu' cannot use impl=cpu: linear_elu's C kernel is the causal form"):
        build_attention("linear_elu", 128, 2, impl="cpu")
    assert build_attention("linear_elu", 128, 2, causal=True, impl="cpu") is not None
    for op in OPS:
        if dispatch.triton_missing(op):
            with pytest.raises(ValueError, match=r"impl=triton: models/attention/ops/triton_common\.py is not in"):
                build_attention(op, 128, 2, impl="triton")
    with pytest.raises(ValueError, match=r"impl=cpu here: the C kernels take float32 \(bf16 and fp16 upcast to it\), "):
        attend("linear_affine", q.double(), q.double(), q.double(), impl="cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # tests/conftest.py sets it where there is no GPU
    assert dispatch.triton_why_not("linear_affine", like("cpu")).startswith("the Triton kernels run on CUDA")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "head sizes up to 128" in dispatch.triton_why_not("linear_affine", like("cpu", d=256))
    assert "float64" in dispatch.triton_why_not("linear_affine", like("cuda", torch.float64))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_impl_that_runs_here_agrees_with_the_reference(op, causal):
    base = [torch.randn(2, 2, 70, 32, dtype=torch.float64) for _ in range(3)]
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[1, 60:] = False
    exact = dispatch.TABLES[op].reference(*base, causal=causal, key_mask=mask)
    for impl in [i for i in dispatch.TABLES[op].impls if not dispatch.why_not(op, i, base[0].float(), causal)]:
        out = attend(op, *(t.float() for t in base), causal=causal, key_mask=mask, impl=impl)
        assert rel_err(out, exact) <= 1e-5, impl


def test_a_choice_is_resolved_once_and_logged_once(caplog, monkeypatch):
    layer = build_attention("linear_affine_nodenom", 128, 2)
    x = torch.randn(2, 9, 128)
    calls = []
    original = dispatch.choose
    monkeypatch.setattr(dispatch, "choose", lambda *a: calls.append(a) or original(*a))
    with caplog.at_level(logging.INFO, logger="models.attention"):
        for _ in range(3):
            layer(x)
        attend("linear_affine_nodenom", *torch.randn(3, 1, 2, 9, 64).unbind(0))
        layer.double()(x.double())
    assert len(calls) == 2  # fp32 once (the layer and the function share it), fp64 once
    lines = [r.getMessage() for r in caplog.records if r.name == "models.attention"]
    assert lines == [
        "attention linear_affine_nodenom: impl cpu (auto: on the CPU: the fused C kernel)",
        "attention linear_affine_nodenom: impl torch (auto: the C kernels take float32 (bf16 and fp16 upcast to it), "
        "the inputs are float64)",
    ]


def test_model_config_attention_impl_reaches_every_linear_layer():
    model = create_model("tiny-s", image_attention="linear_affine", text_attention="linear_elu", attention_impl="torch")
    impls = {m.options.get("impl") for m in model.modules() if hasattr(m, "options") and m.name.startswith("linear")}
    assert impls == {"torch"}
    mixed = create_model(
        "tiny-s",
        image_attention="linear_affine",
        text_attention="softmax",
        attention_impl="reference",
        image_attention_options={"impl": "torch"},  # the tower's own option wins
    )
    assert {m.options.get("impl") for m in mixed.visual.modules() if hasattr(m, "options")} == {"torch"}
    with pytest.raises(ValueError, match="impl=cpu: linear_elu's C kernel is the causal form only"):
        create_model("tiny-s", image_attention="linear_elu", text_attention="linear_elu", attention_impl="cpu")
    create_model("tiny-s", image_attention="linear_affine", text_attention="linear_elu", attention_impl="cpu")


def test_torch_compile_traces_every_op_through_auto():
    """fullgraph=True fails on any untraceable call: under the compiler auto resolves to the PyTorch path. The two
    Functions not traced elsewhere (non-causal nodenom: test_cpu_kernel.py): causal (all three ops share it; the
    normalised quadratic form is its longest) and non-causal normalised."""
    qkv = [torch.randn(1, 2, 40, 32, requires_grad=True) for _ in range(3)]

    def all_ops(q, k, v):
        return attend("linear_affine", q, k, v, causal=True).sum() + attend("linear_elu", q, k, v).sum()

    compiled = torch.compile(all_ops, backend="aot_eager", fullgraph=True)
    out = compiled(*qkv)
    grads = torch.autograd.grad(out, qkv)
    eager = all_ops(*qkv)
    for a, b in zip((out, *grads), (eager, *torch.autograd.grad(eager, qkv))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
