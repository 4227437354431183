"""What the registry-wide tests cannot know about the linear family: Eq. 7 by hand, convexity,
chunk sizes, bf16 at long lengths, the hand-written backward."""

import pytest
import torch

from models.attention import attend, build_attention
from models.attention.ops import causal, dispatch
from models.attention.ops.causal import CausalLinear
from models.attention.ops.linear_affine_nodenom import torch as nodenom_torch
from models.attention.ops.normalised import NormalisedLinear

CAUSAL_LINEAR = dispatch.linear_ops()


@pytest.mark.parametrize("causal", [False, True])
def test_nodenom_bf16_long_sequence_is_finite_and_accurate(causal):
    n = 65536
    q, k, v = torch.randn(3, 1, 2, n, 8).unbind(0)
    out = attend("linear_affine_nodenom", q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal)
    exact = attend("linear_affine_nodenom", q.double(), k.double(), v.double(), causal=causal)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    # the sums grow with N (no 1/N); fp32 accumulation keeps them to bf16 precision of the inputs
    rel = (out.double() - exact).norm() / exact.norm()
    assert rel < 2e-2


def test_linear_affine_nodenom_by_hand():
    """Weights (1 + cos)/2: 1 for a key along q, 1/2 orthogonal, 0 opposite, whatever the lengths."""
    e = torch.eye(4, dtype=torch.float64)
    q = (3 * e[0]).expand(3, 4)
    k = torch.stack([2 * e[0], 5 * e[1], -0.5 * e[0]])
    v = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]], dtype=torch.float64)
    q, k, v = (t.reshape(1, 1, 3, 4) for t in (q, k, v))
    full = attend("linear_affine_nodenom", q, k, v)
    torch.testing.assert_close(full[0, 0], torch.tensor([[1.0, 0.5, 0, 0]] * 3, dtype=torch.float64))
    causal = attend("linear_affine_nodenom", q, k, v, causal=True)
    expect = torch.tensor([[1.0, 0, 0, 0], [1.0, 0.5, 0, 0], [1.0, 0.5, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(causal[0, 0], expect)


def test_nodenom_output_grows_with_n():
    q, k, v = torch.randn(3, 2, 3, 50, 16, dtype=torch.float64).unbind(0)
    twice = attend("linear_affine_nodenom", q, *(torch.cat([t, t], 2) for t in (k, v)))
    torch.testing.assert_close(twice, 2 * attend("linear_affine_nodenom", q, k, v))


@pytest.mark.parametrize("name,causal", [("linear_affine", False), ("linear_affine", True), ("efficient", False)])
def test_output_is_a_convex_combination_of_values(name, causal):
    q, k, v = (3 * torch.randn(3, 2, 4, 200, 16, dtype=torch.float64)).unbind(0)
    out = attend(name, q, k, v, causal=causal)
    if causal:
        low, high = v.cummin(2).values, v.cummax(2).values
    else:
        low, high = v.amin(2, keepdim=True), v.amax(2, keepdim=True)
    assert (out >= low - 1e-9).all() and (out <= high + 1e-9).all()
    constant = attend(name, q, k, torch.full_like(v, 0.7), causal=causal)
    torch.testing.assert_close(constant, torch.full_like(v, 0.7))


@pytest.mark.parametrize("name", CAUSAL_LINEAR)
def test_chunk_size_does_not_change_the_result(name):
    q, k, v = torch.randn(3, 1, 2, 1000, 8).unbind(0)
    key_mask = torch.ones(1, 1000, dtype=torch.bool)
    key_mask[:, 990:] = False
    outs = [attend(name, q, k, v, causal=True, key_mask=key_mask, chunk_size=c) for c in (1, 16, 64, 100, 4096)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-5)
    layer = build_attention(name, 16, 2, causal=True, chunk_size=100)
    ref = layer.attention_reference(q.double(), k.double(), v.double(), key_mask)
    torch.testing.assert_close(outs[3].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_chunk_size_names_the_fix(bad):
    q = torch.randn(1, 1, 5, 4)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        attend("linear_elu", q, q, q, causal=True, chunk_size=bad)


def test_bad_key_mask_names_the_fix():
    q = torch.randn(2, 1, 5, 4)
    with pytest.raises(ValueError, match=r"pass a bool mask \[B, N\]"):
        attend("linear_affine", q, q, q, key_mask=torch.ones(2, 6, dtype=torch.bool))


HAND_WRITTEN = {
    "nodenom": lambda q, k, v, keep: nodenom_torch.NoDenom.apply(
        q, k, v, keep, (nodenom_torch.forward, nodenom_torch.backward)
    ),
    "nodenom-plain": lambda q, k, v, keep: nodenom_torch.NoDenom.apply(
        q, k, v, keep, (nodenom_torch.plain_forward, nodenom_torch.plain_backward)
    ),
    "affine": lambda q, k, v, keep: NormalisedLinear.apply(q, k, v, keep, dispatch.TABLES["linear_affine"].op),
    "elu": lambda q, k, v, keep: NormalisedLinear.apply(q, k, v, keep, dispatch.TABLES["linear_elu"].op),
    **{
        f"causal-{name}": lambda q, k, v, keep, op=table.op: CausalLinear.apply(q, k, v, keep, op, 4)
        for name, table in dispatch.TABLES.items()
    },
}


# the causal forms twice: quadratic (N <= QUADRATIC_MAX) and chunked (QUADRATIC_MAX = 0, chunks of 4 tokens)
GRADCHECKS = [(f, 256) for f in HAND_WRITTEN] + [(f, 0) for f in HAND_WRITTEN if f.startswith("causal")]


@pytest.mark.parametrize("function,quadratic_max", GRADCHECKS)
@pytest.mark.parametrize("masked", [False, True])
def test_hand_written_backward_passes_gradcheck(function, masked, quadratic_max, monkeypatch):
    monkeypatch.setattr(causal, "QUADRATIC_MAX", quadratic_max)
    q, k, v = (torch.randn(2, 9, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))
    keep = torch.tensor([1.0] * 6 + [0.0] * 3, dtype=torch.float64).expand(2, 9)[..., None] if masked else None
    assert torch.autograd.gradcheck(lambda q, k, v: HAND_WRITTEN[function](q, k, v, keep), (q, k, v))


def test_padded_query_rows_stay_finite_when_no_key_is_real_yet():
    q, k, v = torch.randn(3, 1, 2, 70, 8).unbind(0)
    key_mask = torch.ones(1, 70, dtype=torch.bool)
    key_mask[:, :5] = False  # causal queries 0..4 see no real key at all
    for name in CAUSAL_LINEAR:
        assert torch.isfinite(attend(name, q, k, v, causal=True, key_mask=key_mask)).all(), name


@pytest.mark.parametrize("masked", [False, True])
def test_nodenom_blocks_of_any_size_give_the_same_result(masked):
    """Blocks of 64 and 300 rows (one head's row range; 300 does not divide 1000) and 4096 (several whole heads)."""
    q, k, v, grad = torch.randn(4, 3, 1000, 8, dtype=torch.float64).unbind(0)
    keep = (torch.arange(1000) < 950).double().expand(3, 1000)[..., None] if masked else None
    results = []
    for rows in (64, 300, 4096):
        out, *saved = nodenom_torch.forward(q, k, v, keep, rows=rows)
        results.append((out, *nodenom_torch.backward(grad, q, k, v, keep, *saved, rows=rows)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if masked:
        assert (results[0][2][:, 950:] == 0).all() and (results[0][3][:, 950:] == 0).all()
