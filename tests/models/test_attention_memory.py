"""What the PyTorch path (GPUs without Triton, fp64, torch.compile) keeps for the backward, on any device: measured on
the CPU with impl=torch and bf16 inputs through torch.autograd.graph.saved_tensors_hooks, in units of one bf16
[B, H, N, D] tensor. No fp32 copy of q, k or v is saved: at most 4 units non-causal, 6 causal; and the outputs
and every gradient of the bf16 path stay within bf16 tolerance of the fp64 reference."""

import pytest
import torch

from models.attention import attend
from models.attention.ops import causal, dispatch
from tests.models.test_attention import rel_err

OPS = dispatch.linear_ops()
B, H, D = 2, 3, 64
LIMITS = {False: 4, True: 6}


def saved_units(name: str, n: int, is_causal: bool, key_mask=None) -> float:
    """Bytes of every distinct tensor saved for the backward of one call, over the bytes of one bf16 [B, H, N, D]."""
    q, k, v = (torch.randn(B, H, n, D).bfloat16().requires_grad_() for _ in range(3))
    seen = {}

    def pack(t):
        seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attend(name, q, k, v, causal=is_causal, key_mask=key_mask, impl="torch")
    out.float().sum().backward()  # the saved tensors really serve a backward
    return sum(seen.values()) / (B * H * n * D * 2)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("is_causal,n", [(False, 300), (True, 100), (True, 300)])  # causal: quadratic and chunked
def test_torch_path_saves_no_fp32_copies(name, is_causal, n):
    units = saved_units(name, n, is_causal)
    assert units <= LIMITS[is_causal], f"{units:.2f} bf16 units saved"
    assert units >= 3  # q, k and v themselves: the hooks did see the saves


def test_padding_mask_adds_only_a_column():
    key_mask = torch.ones(B, 300, dtype=torch.bool)
    key_mask[:, 250:] = False
    for name in OPS:
        assert saved_units(name, 300, True, key_mask) <= LIMITS[True] + 0.1


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("n", [100, 300])
def test_bf16_torch_path_matches_fp64_reference(name, is_causal, n, monkeypatch):
    """Output and all three gradients in bf16 within 2e-2 of fp64, with padding; causal both quadratic (100) and
    chunked (300 > QUADRATIC_MAX set to 256)."""
    monkeypatch.setattr(causal, "QUADRATIC_MAX", 256)
    base = [torch.randn(B, H, n, D, dtype=torch.float64) for _ in range(3)]
    key_mask = torch.ones(B, n, dtype=torch.bool)
    key_mask[-1, -(n // 4) :] = False
    low = [t.bfloat16().requires_grad_() for t in base]
    exact = [t.clone().requires_grad_() for t in base]
    out = attend(name, *low, causal=is_causal, key_mask=key_mask, impl="torch")
    ref = dispatch.TABLES[name].reference(*exact, causal=is_causal, key_mask=key_mask)
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) <= 2e-2
    grad = torch.randn_like(ref)
    out.backward(grad.bfloat16())
    ref.backward(grad)
    for which, a, r in zip("qkv", low, exact):
        assert a.grad.dtype == torch.bfloat16 and rel_err(a.grad, r.grad) <= 2e-2, f"grad of {which}"
    assert (low[1].grad[-1, :, -(n // 4) :] == 0).all()  # a padded key gets no gradient
