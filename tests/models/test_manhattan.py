"""retention_2d's grid on the C kernel (models/attention/ops/manhattan_cpu.c, ops/manhattan.py): the kernel's sweeps
against the fp64 decayed matrix (grids square and not, one row, one column, every head size), its backward (the same
forward three times) against the matrix's gradients, and the layer taking it in fp32 with the PyTorch form as the
fallback."""

import pytest
import torch

from models.attention import decay, reference
from models.attention.decay import decay_matrix, log_gammas, retention_2d
from models.attention.ops import manhattan
from tests.models.test_attention import rel_err
from tests.models.test_decay import padded, qkv

pytestmark = pytest.mark.skipif(
    not manhattan.takes(torch.zeros(1, 1, 1, 16), 10, 100), reason="no C compiler: the kernel is not built"
)


@pytest.mark.parametrize(
    "B,H,R,W,D",
    [(1, 1, 1, 1, 16), (1, 2, 3, 5, 16), (2, 3, 7, 4, 32), (1, 6, 8, 8, 64), (1, 2, 1, 9, 128), (1, 2, 6, 1, 16)],
)
def test_the_grid_equals_the_decayed_matrix_and_so_do_its_gradients(B, H, R, W, D):
    generator = torch.Generator().manual_seed(R * W + D)
    q, k, v = (torch.randn(B, H, R * W, D, generator=generator, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    log_gamma = log_gammas(H, q)
    want = ((q @ k.transpose(-1, -2)) * decay_matrix(R * W, W, log_gamma)) @ v
    grad = torch.randn(want.shape, generator=generator, dtype=torch.float64)
    wanted = torch.autograd.grad(want, (q, k, v), grad)
    fast = [t.detach().float().requires_grad_() for t in (q, k, v)]
    got = manhattan.two_sided(*fast, log_gamma, W)
    assert rel_err(got, want) <= 1e-5
    for name, have, expected in zip("qkv", torch.autograd.grad(got, fast, grad.float()), wanted):
        assert rel_err(have, expected) <= 1e-5, f"grad of {name}"


@pytest.mark.parametrize("n,width,prefix", [(145, None, 1), (50, 7, 1), (14, 4, 2), (1, None, 1), (64, 8, 0)])
def test_the_layer_takes_the_kernel_in_fp32_and_both_forms_equal_the_reference(n, width, prefix, monkeypatch):
    """fp32 retention_2d through the kernel (called once), and with the kernel refused through the PyTorch blocks:
    output and gradients against the fp64 reference, padded keys and prefix tokens included."""
    base, mask = qkv(2, 3, n, d=16), padded(2, n)
    exact = [t.clone().requires_grad_() for t in base]
    options = dict(width=width, prefix_tokens=prefix)
    want = reference.retention_2d(*exact, key_mask=mask, **options)
    grad = torch.randn(want.shape, dtype=torch.float64)
    wanted = torch.autograd.grad(want, exact, grad)
    calls, original = [], manhattan.two_sided
    monkeypatch.setattr(manhattan, "two_sided", lambda *a: calls.append(1) or original(*a))
    for kernel in (True, False):
        monkeypatch.setattr(manhattan, "takes", lambda q, rows, width, kernel=kernel: kernel)
        fast = [t.float().requires_grad_() for t in base]
        got = decay.retention_2d(*fast, key_mask=mask, chunk_size=16, **options)
        assert rel_err(got, want) <= 1e-5
        for name, have, expected in zip("qkv", torch.autograd.grad(got, fast, grad.float()), wanted):
            assert rel_err(have, expected) <= 1e-4, f"grad of {name}"
    assert calls == ([1] if n > prefix else [])


def test_fp64_odd_head_sizes_and_short_grids_keep_the_pytorch_form():
    """The kernel takes fp32 grids of more than SHORTEST * D tokens, where its sweeps beat the decayed matrix, and at
    most MAX_WIDTH columns."""
    q = torch.zeros(1, 1, 4, 16)
    longest_short = manhattan.SHORTEST * 16
    assert manhattan.takes(q, 1, longest_short + 1) and not manhattan.takes(q, 2, longest_short // 2)
    assert not manhattan.takes(q, 1, manhattan.MAX_WIDTH + 1)  # gamma^-c would leave fp32's safe range
    assert not manhattan.takes(q.double(), 10, 100) and not manhattan.takes(torch.zeros(1, 1, 4, 24), 10, 100)
    out = retention_2d(*qkv(1, 2, 10, d=24), width=3)  # D = 24: the PyTorch blocks
    assert out.shape == (1, 2, 10, 24)
