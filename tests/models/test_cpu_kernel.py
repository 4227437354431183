"""The fused C kernels of non-causal linear_affine_nodenom and linear_affine (models/attention/nodenom_cpu.c,
affine_cpu.c): built where a compiler exists, the path taken on the CPU in fp32, they agree with the O(N^2)
reference and with the PyTorch paths (tiled.py, NormalisedLinear) at every head size they support, and fall
back cleanly when they cannot be built."""

import pytest
import torch

from models.attention import attend, cpu_kernel, linear, reference, tiled
from tests.models.test_attention import rel_err

NAME = "linear_affine_nodenom"
KERNEL_NAMES = [NAME, "linear_affine"]


def test_kernel_is_built_wherever_a_compiler_exists():
    """No silent fallback: on this machine (and CI's) gcc exists, so the suite really runs the kernel."""
    assert cpu_kernel.compiler() is not None, "no C compiler: install gcc so the fused kernel is tested"
    assert cpu_kernel.library() is not None


@pytest.fixture
def kernel_only(monkeypatch):
    """Makes the PyTorch paths raise, so a passing test proves a kernel computed the result."""

    def refuse(*args, **kwargs):
        raise AssertionError("PyTorch path used where the C kernel should run")

    monkeypatch.setattr(tiled, "forward", refuse)
    monkeypatch.setattr(tiled, "backward", refuse)
    monkeypatch.setattr(linear, "scales", refuse)  # NormalisedLinear's first step


@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("b,h,n", [(1, 1, 1), (2, 3, 7), (1, 2, 63), (2, 1, 1000)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_kernel_equals_reference(kernel_only, name, d, b, h, n, threads):
    """fp32 kernel vs fp64 reference, outputs and all three gradients, padded keys in the last batch row.

    With 2 threads and a single head, rows are split over threads and the partial states summed."""
    torch.set_num_threads(threads)
    base = [torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3)]
    key_mask = torch.ones(b, n, dtype=torch.bool)
    if n > 2:
        key_mask[-1, -(n // 3) :] = False
    fast = [t.float().requires_grad_() for t in base]
    exact = [t.clone().requires_grad_() for t in base]
    out = attend(name, *fast, causal=False, key_mask=key_mask)
    ref = getattr(reference, name)(*exact, causal=False, key_mask=key_mask)
    assert rel_err(out, ref) <= 1e-5
    grad = torch.randn_like(ref)
    out.backward(grad.float())
    ref.backward(grad)
    for name, a, r in zip("qkv", fast, exact):
        assert rel_err(a.grad, r.grad) <= 1e-5, f"grad of {name}"
    if n > 2:
        assert (fast[1].grad[-1, :, -(n // 3) :] == 0).all()  # a padded key gets no gradient


def kernel_and_tiled(n, m, d, keep):
    """Forward + backward of both paths on [G, N, D] queries and [G, M, D] keys (cross lengths)."""
    g = 3
    q, grad = torch.randn(2, g, n, d).unbind(0)
    k, v = torch.randn(2, g, m, d).unbind(0)
    out = torch.empty(g, n, d)
    saved = cpu_kernel.forward(q, k, v, keep, out)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    cpu_kernel.backward(grad, q, k, v, keep, *saved, *grads)
    expected, *tiled_saved = tiled.forward(q, k, v, keep)
    return (out, saved[2], *grads), (expected, tiled_saved[2], *tiled.backward(grad, q, k, v, keep, *tiled_saved))


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
    for kernel in (True, False):
        monkeypatch.setattr(cpu_kernel, "usable", lambda *tensors, kernel=kernel: kernel)
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = linear.NormalisedLinear.apply(*inputs, keep, True)
        out.backward(grad)
        results.append([out, *(t.grad for t in inputs)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_non_temporal_stores_give_identical_results(monkeypatch):
    torch.manual_seed(1)
    normal = kernel_and_tiled(260, 260, 32, None)[0]
    monkeypatch.setattr(cpu_kernel, "STREAM_BYTES", 0)
    torch.manual_seed(1)
    streamed = kernel_and_tiled(260, 260, 32, None)[0]
    for a, b in zip(normal, streamed):
        assert torch.equal(a, b)


def test_unsupported_inputs_take_the_pytorch_path():
    q = torch.randn(4, 10, 64)
    assert cpu_kernel.usable(q, q, q, None)
    assert not cpu_kernel.usable(q.double(), q.double(), q.double(), None)
    assert not cpu_kernel.usable(q[..., :48], q[..., :48], q[..., :48], None)  # D = 48
    empty = torch.randn(0, 2, 10, 64, requires_grad=True)  # a batch of none
    attend(NAME, empty, empty, empty, causal=False).sum().backward()
    assert empty.grad.shape == empty.shape


def test_a_second_build_reuses_the_cached_library(tmp_path, monkeypatch):
    monkeypatch.setenv("CLIP_KERNEL_CACHE", str(tmp_path))
    first = cpu_kernel.build(cpu_kernel.compiler())
    stamp = first.stat().st_mtime_ns
    assert cpu_kernel.build(cpu_kernel.compiler()) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left behind


@pytest.mark.parametrize("env", [{"CLIP_CPU_KERNEL": "0"}, {"CC": "false"}])
def test_without_the_kernel_attention_still_works(env, tmp_path, monkeypatch):
    """Disabled, or a compiler that fails (one warning naming the fix): the PyTorch path gives the same result."""
    monkeypatch.setenv("CLIP_KERNEL_CACHE", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cpu_kernel.library.cache_clear()
    try:
        if "CC" in env:
            with pytest.warns(UserWarning, match="slower PyTorch path"):
                assert cpu_kernel.library() is None
        else:
            assert cpu_kernel.library() is None
        q, k, v = torch.randn(3, 1, 2, 50, 16, dtype=torch.float64).unbind(0)
        out = attend(NAME, q.float(), k.float(), v.float(), causal=False)
        assert rel_err(out, reference.linear_affine_nodenom(q, k, v, causal=False)) <= 1e-5
    finally:
        cpu_kernel.library.cache_clear()  # the next caller builds again with the environment restored


def test_torch_compile_traces_the_pytorch_path_and_agrees_with_the_kernel():
    """fullgraph=True fails on any untraceable call: the compiled layer must take tiled.py, eager the kernel."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 32, requires_grad=True) for _ in range(3))
    compiled = torch.compile(lambda *x: attend(NAME, *x, causal=False), backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    eager = attend(NAME, q, k, v, causal=False)
    for a, b in zip((out, *grads), (eager, *torch.autograd.grad(eager.square().sum(), (q, k, v)))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
