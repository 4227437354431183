"""The Triton kernels of the linear attentions against their fp64 references, forward and every gradient.

Without CUDA they run on the CPU under TRITON_INTERPRET=1 (tests/conftest.py sets it before anything
imports them; test_kernels_run_here asserts that they really ran); on a GPU the same tests run natively.
"""

import functools

import pytest
import torch

from models.attention.ops import dispatch, triton_common
from tests.models.test_attention import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# each op: its Triton kernels, called directly, and its reference
OPS = {
    name: (functools.partial(triton_common.attend, op=dispatch.TABLES[name].op), dispatch.TABLES[name].reference)
    for name in dispatch.linear_ops()
}
NORMALISED = [name for name in OPS if dispatch.TABLES[name].op.normalised]
# (N, D): one token, odd lengths that are no multiple of any block, a head size padded to 64, a long N split
# over programs
SIZES = [(1, 32), (7, 128), (20, 48), (63, 64), (1000, 32)]


def inputs(b, n, d, dtype=torch.float64, offset=0.0, scale=1.0, heads=1):
    """q, k, v [b, heads, n, d] in fp64 and a key mask [b, n]: the last row loses its first key and its last third.
    One head by default: the interpreter runs the programs one by one."""
    q, k, v = torch.randn(3, b, heads, n, d, dtype=torch.float64).unbind(0)
    v = offset + scale * v
    key_mask = torch.ones(b, n, dtype=torch.bool)
    if n > 2:
        key_mask[-1, 0] = False
        key_mask[-1, -(n // 3) :] = False
    return [t.to(dtype).double() for t in (q, k, v)], key_mask


def run_both(name, causal, qkv, key_mask, dtype):
    """The kernel on DEVICE in `dtype` and the fp64 reference, both backpropagated with one random dL/do.
    -> out, ref, [(kernel grad, reference grad)] for q, k, v."""
    attend, exact = OPS[name]
    fast = [t.to(DEVICE, dtype).requires_grad_() for t in qkv]
    slow = [t.clone().requires_grad_() for t in qkv]
    out = attend(*fast, causal=causal, key_mask=key_mask.to(DEVICE))
    ref = exact(*slow, causal=causal, key_mask=key_mask)
    grad = torch.randn_like(ref)
    out.backward(grad.to(DEVICE, dtype))
    ref.backward(grad)
    return out.cpu(), ref, [(a.grad.cpu(), r.grad) for a, r in zip(fast, slow)]


def check(name, causal, n, d, dtype, tol, b=2, **scale):
    qkv, key_mask = inputs(b, n, d, dtype, **scale)
    out, ref, grads = run_both(name, causal, qkv, key_mask, dtype)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out, ref) <= tol
    for x, (got, want) in zip("qkv", grads):
        assert got.dtype == dtype and rel_err(got, want) <= tol, f"grad of {x}"
    padded = ~key_mask[:, None, :, None].expand_as(ref)
    assert (grads[1][0][padded] == 0).all() and (grads[2][0][padded] == 0).all(), "padded keys get no gradient"


def test_kernels_run_here():
    """No silent skip: without CUDA the kernels are the interpreter's, and they run on CPU tensors."""
    if DEVICE == "cpu":
        assert triton_common.INTERPRET
        assert type(triton_common.query_kernel).__name__ == "InterpretedFunction"
    q = torch.randn(1, 1, 5, 16, device=DEVICE)
    assert OPS["linear_affine"][0](q, q, q, causal=True, key_mask=None).shape == q.shape


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, d", SIZES, ids=[f"N{n}-D{d}" for n, d in SIZES])
def test_fp32_matches_fp64_reference(name, causal, n, d):
    check(name, causal, n, d, torch.float32, 1e-5)


@pytest.mark.parametrize("name, causal", [(name, i % 2 == 1) for i, name in enumerate(OPS)])
def test_head_size_128_at_1000_tokens(name, causal):
    check(name, causal, 1000, 128, torch.float32, 1e-5, b=1)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_matches_reference(name, causal, dtype):
    """Inputs rounded to `dtype` on both sides: what is left is the kernels' own rounding."""
    check(name, causal, 200, 64, dtype, 1e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.parametrize("name", NORMALISED)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_values_far_from_zero_keep_fp32_accuracy(name, causal):
    """v = 10 + 0.1 noise: centred on the running mean of v, dq and dk stay within 2e-6 (5e-7 measured);
    uncentred, the sums cancel a 100x larger common part (4e-6 for linear_affine, 2e-5 for linear_elu)."""
    check(name, causal, 300, 32, torch.float32, 2e-6, offset=10.0, scale=0.1)


@pytest.mark.parametrize("name", NORMALISED)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_equal_values_give_that_value(name, causal):
    q, k = torch.randn(2, 1, 2, 300, 32, device=DEVICE).unbind(0)
    v = torch.full_like(q, 0.7)
    out = OPS[name][0](q, k, v, causal=causal, key_mask=None)
    torch.testing.assert_close(out, v, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padding_and_future_tokens_change_nothing(name, causal):
    """Large garbage in padded keys leaves the result bit for bit; so do later tokens for causal queries."""
    qkv, key_mask = inputs(2, 90, 32)
    (q, k, v), key_mask = (t.float().to(DEVICE) for t in qkv), key_mask.to(DEVICE)
    attend = OPS[name][0]
    out = attend(q, k, v, causal=causal, key_mask=key_mask)
    garbage = ~key_mask[:, None, :, None]
    k2, v2 = (torch.where(garbage, 1e4 * torch.randn_like(t), t) for t in (k, v))
    assert torch.equal(attend(q, k2, v2, causal=causal, key_mask=key_mask), out)
    if causal:
        t = 40  # inside the second chunk of every block size
        later = [x.clone() for x in (q, k, v)]
        for x in later:
            x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :])
        assert torch.equal(attend(*later, causal=True, key_mask=key_mask)[:, :, : t + 1], out[:, :, : t + 1])


def saved_bytes(name, causal, q, k, v, key_mask):
    """Bytes the op saves for its backward, and the storages they live in."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        OPS[name][0](q, k, v, causal=causal, key_mask=key_mask)
    return sum(t.numel() * t.element_size() for t in saved), {t.untyped_storage().data_ptr() for t in saved}


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_saves_only_the_inputs_and_small_state(name, causal):
    """q, k, v views of one bf16 qkv (as the layers make them): saved are those views (no copies), the mask
    and, non-causal, the [D + 4, D] fp32 state per head: 3 bf16 [B, H, N, D] units plus O(D^2)."""
    B, H, N, D = 2, 2, 256, 64
    qkv = torch.randn(B, N, 3, H, D, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    key_mask = torch.ones(B, N, dtype=torch.bool, device=DEVICE)
    total, storages = saved_bytes(name, causal, q, k, v, key_mask)
    unit = B * H * N * D * 2
    state = 0 if causal else B * H * (D + 4) * D * 4
    assert total <= 3 * unit + state + B * N, f"{total / unit:.2f} units"
    assert qkv.untyped_storage().data_ptr() in storages


def test_strided_views_give_the_contiguous_result():
    qkv = torch.randn(2, 50, 3, 2, 32, device=DEVICE)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    for attend, _ in OPS.values():
        for causal in (False, True):
            strided = attend(q, k, v, causal=causal, key_mask=None)
            same = attend(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, key_mask=None)
            assert torch.equal(strided, same)
            assert strided.transpose(1, 2).is_contiguous()  # [B, N, H, D] memory: the layer's reshape is free


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, m: (q.double(), m), "one of fp32, bf16, fp16"),
        (lambda q, m: (torch.cat([q] * 5, -1), m), "head size 160 is above"),
        (lambda q, m: (q, m[:, :3]), r"key_mask must be bool \[B, N\]"),
        (lambda q, m: (q, m.float()), r"key_mask must be bool \[B, N\]"),
    ],
)
def test_bad_input_names_the_fix(change, message):
    q, key_mask = change(torch.randn(1, 2, 5, 32, device=DEVICE), torch.ones(1, 5, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match=message):
        OPS["linear_affine"][0](q, q, q, causal=False, key_mask=key_mask)
