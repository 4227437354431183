"""fastmax_released (models/attention/fastmax.py): against the released attention written out by hand from the flat
memory order, fast path == quadratic reference (gradcheck too), its heads of consecutive tokens against the usual
split, how it differs from Eq. 7 (linear_affine_nodenom) and where they agree, the released block (no projections),
a tiny CLIP, one-line errors."""

import pytest
import torch

from models import create_model
from models.attention import attend, build_attention
from models.attention.fastmax import fastmax_released, reference, released_heads, usual_heads
from tests.models.test_attention import rel_err
from tests.models.test_clip import batch, clip_loss, one_line_error


def split(x, heads):
    """[B, N, C] -> [B, H, N, D], the usual split (what every registry attention receives)."""
    B, N, C = x.shape
    return x.view(B, N, heads, C // heads).transpose(1, 2)


def merge(o):
    """[B, H, N, D] (usual split) -> [B, N, C]."""
    B, H, N, D = o.shape
    return o.transpose(1, 2).reshape(B, N, H * D)


def by_hand(xq, xk, xv, heads):
    """The released attention on [B, N, C] from the memory order: row r is slice r % H (features (r % H) D ..) of
    token r // H; head g is rows g N .. g N + N - 1; o_r = sum_s (1 + q_r.k_s / (max |q| max |k|)) v_s over the rows
    s of r's head, the maxima over the rows of that head."""
    B, N, C = xq.shape
    D = C // heads
    out = torch.zeros_like(xv)

    def row(x, b, r):
        return x[b, r // heads, (r % heads) * D : (r % heads + 1) * D]

    for b in range(B):
        for g in range(heads):
            rows = range(g * N, (g + 1) * N)
            q_max = max(row(xq, b, r).norm() for r in rows)
            k_max = max(row(xk, b, r).norm() for r in rows)
            for r in rows:
                o = sum((1 + row(xq, b, r) @ row(xk, b, s) / (q_max * k_max)) * row(xv, b, s) for s in rows)
                out[b, r // heads, (r % heads) * D : (r % heads + 1) * D] = o
    return out


def inputs(b, h, n, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("b,h,n,d", [(1, 1, 1, 4), (2, 3, 1, 2), (2, 4, 8, 2), (1, 3, 7, 5), (2, 2, 13, 3)])
def test_equals_the_released_code_written_by_hand(b, h, n, d):
    q, k, v = inputs(b, h, n, d)
    expected = by_hand(merge(q), merge(k), merge(v), h)
    torch.testing.assert_close(merge(fastmax_released(q, k, v)), expected)
    torch.testing.assert_close(merge(reference(q, k, v)), expected)


def test_layer_without_projections_is_the_released_block_and_with_them_the_registry_layout():
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    released = build_attention("fastmax_released", 12, 3, projections=False).double()
    assert not list(released.parameters())
    torch.testing.assert_close(released(x), by_hand(x, x, x, 3))  # q = k = v = the block's LN output, no out_proj
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    torch.testing.assert_close(released(x, mask)[1, :6], released(x[1:, :6])[0])
    torch.manual_seed(0)
    layer = build_attention("fastmax_released", 12, 3).double()
    assert set(layer.state_dict()) == set(build_attention("softmax", 12, 3).state_dict())
    qkv = torch.nn.functional.linear(x, layer.in_proj_weight, layer.in_proj_bias)
    q, k, v = (split(t, 3) for t in qkv.chunk(3, -1))
    torch.testing.assert_close(layer(x), layer.out_proj(by_hand(merge(q), merge(k), merge(v), 3)))


@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck(masked):
    q, k, v = (t.requires_grad_() for t in inputs(2, 2, 5, 3))
    mask = torch.tensor([[True] * 5, [True, False, True, True, False]]) if masked else None
    for fn in (fastmax_released, reference):
        assert torch.autograd.gradcheck(lambda q, k, v, fn=fn: fn(q, k, v, key_mask=mask), (q, k, v))


@pytest.mark.parametrize("b,h,n,d", [(1, 1, 1, 8), (3, 4, 9, 8), (2, 12, 50, 16), (4, 3, 31, 4)])
def test_fp32_fast_path_equals_fp64_reference_forward_and_backward(b, h, n, d):
    base = inputs(b, h, n, d)
    fast, exact = [t.float().requires_grad_() for t in base], [t.clone().requires_grad_() for t in base]
    mask = torch.rand(b, n, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[0] = True
    if b > 2:
        mask[1] = False  # a row without any real token: zeros
        mask[2, 1:] = False  # one real token
    out, ref = fastmax_released(*fast, key_mask=mask), reference(*exact, key_mask=mask)
    assert out.dtype == torch.float32 and rel_err(out, ref) <= 1e-5
    grad = torch.randn_like(ref)
    out.backward(grad.float())
    ref.backward(grad)
    for name, a, r in zip("qkv", fast, exact):
        assert rel_err(a.grad, r.grad) <= 1e-5, f"grad of {name}"


def test_heads_are_runs_of_consecutive_tokens_not_the_usual_feature_slices():
    x = torch.randn(2, 8, 8, dtype=torch.float64)  # N = 8 tokens, H = 4 heads of D = 2
    regrouped = released_heads(split(x, 4))
    for h in range(4):  # released head h: tokens 2h and 2h + 1, each with all four of its slices
        torch.testing.assert_close(regrouped[:, h], x[:, 2 * h : 2 * h + 2].reshape(2, 8, 2))
    assert not torch.equal(regrouped, split(x, 4))
    torch.testing.assert_close(usual_heads(regrouped), split(x, 4))
    one = torch.randn(2, 1, 8, dtype=torch.float64)  # one token: the reshape without transpose is the usual split
    assert torch.equal(released_heads(split(one, 4)), split(one, 4))
    # so tokens 0 and 1 attend only to each other: changing tokens 2-7 changes nothing there, unlike in Eq. 7
    changed = x.clone()
    changed[:, 2:] += torch.randn_like(changed[:, 2:])
    ours = [merge(fastmax_released(*[split(t, 4)] * 3)) for t in (x, changed)]
    eq7 = [merge(attend("linear_affine_nodenom", *[split(t, 4)] * 3)) for t in (x, changed)]
    torch.testing.assert_close(ours[0][:, :2], ours[1][:, :2])
    assert not torch.allclose(eq7[0][:, :2], eq7[1][:, :2])


def test_differs_from_eq7_and_agrees_once_the_heads_the_norm_and_the_half_are_accounted_for():
    q, k, v = inputs(2, 4, 16, 8)
    eq7 = attend("linear_affine_nodenom", q, k, v)
    ours = fastmax_released(q, k, v)
    assert rel_err(ours, eq7) > 0.1 and rel_err(ours, 2 * eq7) > 0.1
    # one token per head: the max norm is the row's own L2 norm and the heads are the usual ones; only the 1/2 is left
    q1, k1, v1 = inputs(2, 4, 1, 8)
    torch.testing.assert_close(fastmax_released(q1, k1, v1), 2 * attend("linear_affine_nodenom", q1, k1, v1))

    def eq7_on_released_heads(q, k, v):
        return usual_heads(2 * attend("linear_affine_nodenom", *(released_heads(t) for t in (q, k, v))))

    # with the released heads and the factor 2 the norm is the one difference left: random row norms differ ...
    assert rel_err(ours, eq7_on_released_heads(q, k, v)) > 0.01
    # ... and rows of one norm per released head (3 for q, 0.5 for k) make the max-norm scale the L2 normalisation
    same_q, same_k = (
        usual_heads(torch.nn.functional.normalize(released_heads(t), dim=-1) * s) for t, s in ((q, 3), (k, 0.5))
    )
    torch.testing.assert_close(fastmax_released(same_q, same_k, v), eq7_on_released_heads(same_q, same_k, v))


@pytest.mark.parametrize("projections", [True, False])
def test_tiny_clip_forward_backward_with_it_in_the_image_tower(projections):
    model = create_model(
        "tiny-s", image_attention="fastmax_released", image_attention_options={"projections": projections}
    )
    images, text = batch(model, trim=True)
    clip_loss(model, images, text).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    attn = model.visual.transformer.resblocks[0].attn
    assert (len(list(attn.parameters())) > 0) == projections


def test_one_line_errors():
    one_line_error(
        lambda: build_attention("fastmax_released", 32, 4, causal=True),
        "attention 'fastmax_released' cannot be causal: the released code drops the causal mask",
    )
    one_line_error(lambda: create_model("tiny-s", text_attention="fastmax_released"), "text tower", "cannot be causal")
    one_line_error(lambda: build_attention("fastmax_released", 32, 4, p=2), "unknown options p; it takes projections")
    one_line_error(lambda: build_attention("fastmax_released", 32, 4, projections="no"), "must be true or false")
