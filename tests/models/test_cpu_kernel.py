"""The fused C kernels of non-causal linear_affine_nodenom and linear_affine (models/attention/ops/*/*_cpu.c) and of
the causal forms of all three linear ops (ops/causal_cpu.c): built where a compiler exists, the path auto takes on
the CPU in fp32, they agree with the O(N^2) reference and with the PyTorch paths (ops/linear_affine_nodenom/torch.py,
ops/normalised.py, ops/causal.py) at every head size they support, and fall back cleanly when they cannot be
built."""

import ctypes

import pytest
import torch

from models.attention import attend
from models.attention.ops import causal, cpu_build, dispatch, normalised
from models.attention.ops.linear_affine import cpu as affine_cpu
from models.attention.ops.linear_affine_nodenom import cpu as nodenom_cpu
from models.attention.ops.linear_affine_nodenom import torch as nodenom_torch
from tests.models.test_attention import rel_err

NAME = "linear_affine_nodenom"
KERNEL_NAMES = [name for name in dispatch.linear_ops() if dispatch.TABLES[name].cpu_noncausal]


def test_kernel_is_built_wherever_a_compiler_exists():
    """No silent fallback: on this machine (and CI's) gcc exists, so the suite really runs the kernel."""
    assert cpu_build.compiler() is not None, "no C compiler: install gcc so the fused kernel is tested"
    assert cpu_build.library() is not None
    q = torch.randn(1, 2, 5, 64)
    assert [dispatch.resolve(name, "auto", q, False) for name in KERNEL_NAMES] == ["cpu"] * len(KERNEL_NAMES)


@pytest.fixture
def kernel_only(monkeypatch):
    """Makes the PyTorch paths raise, so a passing test proves a kernel computed the result."""

    def refuse(*args, **kwargs):
        raise AssertionError("PyTorch path used where the C kernel should run")

    monkeypatch.setattr(nodenom_torch, "forward", refuse)
    monkeypatch.setattr(nodenom_torch, "backward", refuse)
    monkeypatch.setattr(normalised, "features", refuse)  # NormalisedLinear's first step


def check_against_reference(name, causal, d, b, h, n, threads):
    """fp32 impl vs fp64 reference, outputs and all three gradients, padded keys in the last batch row."""
    torch.set_num_threads(threads)
    base = [torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3)]
    key_mask = torch.ones(b, n, dtype=torch.bool)
    if n > 2:
        key_mask[-1, -(n // 3) :] = False
    fast = [t.float().requires_grad_() for t in base]
    exact = [t.clone().requires_grad_() for t in base]
    out = attend(name, *fast, causal=causal, key_mask=key_mask)
    ref = dispatch.TABLES[name].reference(*exact, causal=causal, key_mask=key_mask)
    assert rel_err(out, ref) <= 1e-5
    grad = torch.randn_like(ref)
    out.backward(grad.float())
    ref.backward(grad)
    for which, a, r in zip("qkv", fast, exact):
        assert rel_err(a.grad, r.grad) <= 1e-5, f"grad of {which}"
    if n > 2:
        assert (fast[1].grad[-1, :, -(n // 3) :] == 0).all()  # a padded key gets no gradient


@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("b,h,n", [(1, 1, 1), (2, 3, 7), (1, 2, 63), (2, 1, 1000)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_kernel_equals_reference(kernel_only, name, d, b, h, n, threads):
    """fp32 kernel vs fp64 reference, outputs and all three gradients, padded keys in the last batch row.

    With 2 threads and a single head, rows are split over threads and the partial states summed."""
    check_against_reference(name, False, d, b, h, n, threads)


CAUSAL_NAMES = dispatch.linear_ops()


@pytest.fixture
def causal_kernel_only(monkeypatch):
    """Makes the PyTorch causal form raise, so a passing test proves causal_cpu.c computed the result."""

    def refuse(*args, **kwargs):
        raise AssertionError("PyTorch causal path used where the C kernel should run")

    monkeypatch.setattr(causal.CausalLinear, "apply", refuse)


@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("b,h,n", [(1, 1, 1), (2, 3, 7), (1, 2, 63), (2, 1, 77), (1, 2, causal.QUADRATIC_MAX)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", CAUSAL_NAMES)
def test_causal_kernel_equals_reference(causal_kernel_only, name, d, b, h, n, threads):
    """fp32 causal kernel vs fp64 reference, outputs and all three gradients, padded keys in the last batch row;
    with 2 threads the heads are split over threads."""
    check_against_reference(name, True, d, b, h, n, threads)


@pytest.mark.parametrize("name", CAUSAL_NAMES)
def test_causal_kernel_hands_longer_sequences_and_bf16_on(name, monkeypatch):
    """Beyond QUADRATIC_MAX tokens the chunked PyTorch form runs (O(N)); bf16 inputs are upcast to the kernel and
    their result agrees with the PyTorch path's."""
    calls = []
    real = causal.CausalLinear.apply
    monkeypatch.setattr(causal.CausalLinear, "apply", lambda *a: calls.append(a[1].shape[1]) or real(*a))
    long = torch.randn(3, 1, 2, causal.QUADRATIC_MAX + 1, 32).unbind(0)
    assert rel_err(attend(name, *long, causal=True), attend(name, *long, causal=True, impl="torch")) <= 1e-5
    assert calls == [causal.QUADRATIC_MAX + 1] * 2  # auto's cpu impl handed it on, like impl=torch
    short = [t[..., :77, :].bfloat16() for t in long]
    fast, slow = attend(name, *short, causal=True), attend(name, *short, causal=True, impl="torch")
    assert fast.dtype == torch.bfloat16 and len(calls) == 3  # only the torch call above
    assert rel_err(fast, slow) <= 1e-2


def kernel_and_tiled(n, m, d, keep):
    """Forward + backward of both paths on [G, N, D] queries and [G, M, D] keys (cross lengths)."""
    g = 3
    q, grad = torch.randn(2, g, n, d).unbind(0)
    k, v = torch.randn(2, g, m, d).unbind(0)
    out, *saved = nodenom_cpu.forward(q, k, v, keep)
    grads = nodenom_cpu.backward(grad, q, k, v, keep, *saved)
    expected, *torch_saved = nodenom_torch.forward(q, k, v, keep)
    torch_grads = nodenom_torch.backward(grad, q, k, v, keep, *torch_saved)
    return (out, saved[2], *grads), (expected, torch_saved[2], *torch_grads)


@pytest.mark.parametrize("masked", [False, True])
def test_kernel_equals_pytorch_path_with_different_query_and_key_lengths(masked):
    keep = (torch.rand(3, 517, 1) > 0.3).float() if masked else None
    for a, b in zip(*kernel_and_tiled(300, 517, 64, keep)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("masked", [False, True])
def test_affine_kernel_equals_pytorch_path_with_different_query_and_key_lengths(masked, monkeypatch):
    q, grad = torch.randn(2, 3, 300, 64).unbind(0)
    k, v = torch.randn(2, 3, 517, 64).unbind(0)
    keep = (torch.rand(3, 517, 1) > 0.3).float() if masked else None
    results = []
    affine = dispatch.TABLES["linear_affine"].op
    for function in (affine_cpu.AffineKernel.apply, lambda *x: normalised.NormalisedLinear.apply(*x, affine)):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = function(*inputs, keep)
        out.backward(grad)
        results.append([out, *(t.grad for t in inputs)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_non_temporal_stores_give_identical_results(monkeypatch):
    torch.manual_seed(1)
    normal = kernel_and_tiled(260, 260, 32, None)[0]
    monkeypatch.setattr(cpu_build, "STREAM_BYTES", 0)
    torch.manual_seed(1)
    streamed = kernel_and_tiled(260, 260, 32, None)[0]
    for a, b in zip(normal, streamed):
        assert torch.equal(a, b)


def test_unsupported_inputs_take_the_pytorch_path():
    q = torch.randn(1, 4, 10, 64)
    assert cpu_build.why_not(q) == ""
    assert "float32" in cpu_build.why_not(q.double()) and not cpu_build.why_not(q.bfloat16())
    assert "head sizes" in cpu_build.why_not(q[..., :48])  # D = 48
    for other in (q.double(), q[..., :48]):
        assert dispatch.resolve(NAME, "auto", other, False) == "torch"
    for is_causal in (False, True):
        empty = torch.randn(0, 2, 10, 64, requires_grad=True)  # a batch of none
        attend(NAME, empty, empty, empty, causal=is_causal).sum().backward()
        assert empty.grad.shape == empty.shape


def test_a_second_build_reuses_the_cached_library(tmp_path, monkeypatch):
    """The cache on a one-function source (the kernels' own build takes about 35 s on 2 cores; every other test here
    loads it)."""
    source = tmp_path / "source" / "kernel.c"
    source.parent.mkdir()
    source.write_text("int answer(void) { return 42; }\n")
    monkeypatch.setattr(cpu_build, "SOURCES", [source])
    monkeypatch.setattr(cpu_build, "HEADERS", [])
    tmp_path = tmp_path / "cache"
    monkeypatch.setenv("CLIP_KERNEL_CACHE", str(tmp_path))
    first = cpu_build.build(cpu_build.compiler())
    assert ctypes.CDLL(str(first)).answer() == 42
    stamp = first.stat().st_mtime_ns
    assert cpu_build.build(cpu_build.compiler()) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left behind


@pytest.mark.parametrize("env", [{"CLIP_CPU_KERNEL": "0"}, {"CC": "false"}])
def test_without_the_kernel_attention_still_works(env, tmp_path, monkeypatch):
    """Disabled, or a compiler that fails (one warning naming the fix): auto takes the PyTorch path, with the same
    result, and an explicit impl=cpu says why it cannot run."""
    monkeypatch.setenv("CLIP_KERNEL_CACHE", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    dispatch.forget()
    try:
        if "CC" in env:
            with pytest.warns(UserWarning, match="slower PyTorch path"):
                assert cpu_build.library() is None
        else:
            assert cpu_build.library() is None
        q, k, v = torch.randn(3, 1, 2, 50, 16, dtype=torch.float64).unbind(0)
        out = attend(NAME, q.float(), k.float(), v.float(), causal=False)
        assert dispatch.resolve(NAME, "auto", q.float(), False) == "torch"
        assert rel_err(out, dispatch.TABLES["linear_affine_nodenom"].reference(q, k, v)) <= 1e-5
        fix = "CLIP_CPU_KERNEL=0" if "CLIP_CPU_KERNEL" in env else "building the C kernels failed"
        with pytest.raises(ValueError, match=f"cannot use impl=cpu here: {fix}"):
            attend(NAME, q.float(), k.float(), v.float(), impl="cpu")
    finally:
        dispatch.forget()  # the next caller builds again with the environment restored


def test_torch_compile_traces_the_pytorch_path_and_agrees_with_the_kernel():
    """fullgraph=True fails on any untraceable call: the compiled layer must take torch.py, eager the kernel."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 32, requires_grad=True) for _ in range(3))
    compiled = torch.compile(lambda *x: attend(NAME, *x, causal=False), backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    eager = attend(NAME, q, k, v, causal=False)
    for a, b in zip((out, *grads), (eager, *torch.autograd.grad(eager.square().sum(), (q, k, v)))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
