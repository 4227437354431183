"""Continuum softmax: the closed form against a numerical integral of its definition, log phi2 at extreme
arguments, the start token options, the causal boundary and query chunking."""

import math

import mpmath
import pytest
import torch
from scipy.integrate import simpson

from models.attention import attend, build_attention
from models.attention.continuum import continuum_softmax, log_phi2
from models.attention.reference import continuum_softmax as continuum_reference

H, N, D = 2, 5, 4
MASKS = {
    "none": None,
    "right_pad": [True, True, True, False, False],
    "holes": [True, False, True, True, False],
    "left_pad": [False, True, True, True, True],
}
STEPS = 400  # Simpson intervals per unit segment, even: no Simpson panel straddles a knot


def path_integral(q, k, v, k0, v0, causal, mask):
    """o_t = int_0^T e^{q_t.k_s/sqrt(D)} v_s ds / int_0^T e^{q_t.k_s/sqrt(D)} ds by Simpson's rule, one head.

    q, k, v [N, D]; the path runs through k0, v0 and then the real tokens in order, linear in between.
    """
    real = [i for i in range(len(k)) if mask is None or mask[i]]
    knots_k, knots_v = torch.stack([k0] + [k[i] for i in real]), torch.stack([v0] + [v[i] for i in real])
    out = []
    for t in range(len(q)):
        T = sum(1 for i in real if i <= t) if causal else len(real)
        if T == 0:
            out.append(v0)
            continue
        s = torch.linspace(0, T, STEPS * T + 1, dtype=torch.float64)
        i = s.floor().long().clamp(max=T - 1)
        u = (s - i)[:, None]
        k_s, v_s = (1 - u) * knots_k[i] + u * knots_k[i + 1], (1 - u) * knots_v[i] + u * knots_v[i + 1]
        e = torch.exp(k_s @ q[t] / math.sqrt(len(q[t])))  # [S]
        num = simpson((e[:, None] * v_s).numpy(), x=s.numpy(), axis=0)
        out.append(torch.as_tensor(num / simpson(e.numpy(), x=s.numpy())))
    return torch.stack(out)


def random_qkv(spread=1.5):
    return [spread * torch.randn(1, H, N, D, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("start", ["zero", "copy", "learn"])
def test_equals_numerical_integral_of_the_definition(mask_name, causal, start):
    q, k, v = random_qkv()
    mask = MASKS[mask_name]
    key_mask = None if mask is None else torch.tensor([mask])
    start_kv = (
        (torch.randn(H, D, dtype=torch.float64), torch.randn(H, D, dtype=torch.float64)) if start == "learn" else None
    )
    fast = continuum_softmax(q, k, v, causal=causal, key_mask=key_mask, start=start, start_kv=start_kv)
    ref = continuum_reference(q, k, v, causal=causal, key_mask=key_mask, start=start, start_kv=start_kv)
    first = next(i for i in range(N) if mask is None or mask[i])
    for h in range(H):
        k0, v0 = {
            "zero": (torch.zeros(D, dtype=torch.float64),) * 2,
            "copy": (k[0, h, first], v[0, h, first]),
            "learn": (start_kv[0][h], start_kv[1][h]) if start_kv else None,
        }[start]
        expected = path_integral(q[0, h], k[0, h], v[0, h], k0, v0, causal, mask)
        torch.testing.assert_close(fast[0, h], expected, rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(ref[0, h], expected, rtol=1e-8, atol=1e-8)


def mp_log_phi2(x):
    x = mpmath.mpf(x)
    return mpmath.log(mpmath.mpf(1) / 2) if x == 0 else mpmath.log((mpmath.exp(x) - 1 - x) / x**2)


POINTS = [
    0.0,
    1e-8,
    -1e-8,
    1e-3,
    -1e-3,
    0.7,
    -0.7,
    1.999,
    2.0,
    2.001,
    -1.999,
    -2.0,
    -2.001,
    50.0,
    -50.0,
    1000.0,
    -1000.0,
]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-14), (torch.float32, 1e-6)])
def test_log_phi2_values_and_gradients_match_mpmath(dtype, tol):
    mpmath.mp.dps = 40
    x = torch.tensor(POINTS, dtype=dtype, requires_grad=True)
    y = log_phi2(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(y).all() and torch.isfinite(grad).all()
    for xi, yi, gi in zip(POINTS, y.tolist(), grad.tolist()):
        value = float(mp_log_phi2(xi))
        slope = 1 / 3 if xi == 0 else float(mpmath.diff(mp_log_phi2, xi))
        assert abs(yi - value) <= tol * max(1.0, abs(value)), f"log phi2({xi})"
        assert abs(gi - slope) <= tol * max(1e-3, abs(slope)), f"d/dx log phi2({xi})"


def test_log_phi2_backward_passes_gradcheck():
    x = torch.tensor(
        [-40.0, -3.0, -2.0, -1.0, 0.0, 0.3, 1.99, 2.01, 7.0, 60.0], dtype=torch.float64, requires_grad=True
    )
    assert torch.autograd.gradcheck(log_phi2, (x,))


def test_gradients_finite_and_exact_for_extreme_scores():
    """Scores in the hundreds: e^a overflows fp32, the log-space weights must not."""
    q, k, v = (t * s for t, s in zip(random_qkv(), (30.0, 30.0, 1.0)))
    key_mask = torch.tensor([MASKS["holes"]])
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    out = continuum_softmax(q32, k32, v32, causal=True, key_mask=key_mask)
    out.square().sum().backward()
    assert all(torch.isfinite(t).all() for t in (out, q32.grad, k32.grad, v32.grad))
    ref = continuum_reference(q, k, v, causal=True, key_mask=key_mask)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def test_copy_start_gives_the_first_token_to_the_first_causal_query():
    q, k, v = random_qkv()
    out = continuum_softmax(q, k, v, causal=True, start="copy")
    torch.testing.assert_close(out[:, :, 0], v[:, :, 0])  # [0, 1] is a constant segment at token 1


def test_zero_start_shrinks_the_first_causal_query_towards_zero():
    q, k, v = random_qkv()
    out = continuum_softmax(q, k, v, causal=True, start="zero")
    a = (q[:, :, 0] * k[:, :, 0]).sum(-1, keepdim=True) / math.sqrt(D)  # a_0 = 0
    # int_0^1 e^{u a} u du / int_0^1 e^{u a} du, the weight of v_1 on [0, 1]
    share = (a * a.exp() - a.exp() + 1) / (a * (a.exp() - 1))
    torch.testing.assert_close(out[:, :, 0], share * v[:, :, 0])


def test_learned_start_is_a_parameter_that_starts_as_zero():
    zero, learn = (build_attention("continuum_softmax", 16, H, causal=True, start=s) for s in ("zero", "learn"))
    learn.load_state_dict(zero.state_dict(), strict=False)
    assert learn.start_k.shape == learn.start_v.shape == (H, 16 // H)
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(learn(x), zero(x))
    learn(x).square().sum().backward()
    assert learn.start_k.grad.abs().sum() > 0 and learn.start_v.grad.abs().sum() > 0
    with torch.no_grad():
        learn.start_v.fill_(3.0)
    assert not torch.allclose(learn(x), zero(x))


def test_start_options_are_checked():
    q, k, v = random_qkv()
    with pytest.raises(
        ValueError, match="start='learn' uses the layer's learned start token; build it with build_attention"
    ):
        attend("continuum_softmax", q, k, v, start="learn")
    with pytest.raises(ValueError, match="unknown start 'first'; pick one of zero, copy, learn"):
        build_attention("continuum_softmax", 16, H, start="first")
    with pytest.raises(ValueError, match="unknown options length; it takes start and query_chunk"):
        build_attention("continuum_softmax", 16, H, length=8)


@pytest.mark.parametrize("start", ["zero", "copy"])
def test_causal_boundary_is_the_end_of_the_prefix(start):
    """Causal query t integrates over [0, t + 1] only: the last key keeps just its left half-segment."""
    q, k, v = random_qkv()
    causal = continuum_softmax(q, k, v, causal=True, start=start)
    full = continuum_softmax(q, k, v, causal=False, start=start)
    for t in range(N):
        prefix = continuum_softmax(q[:, :, : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], start=start)
        torch.testing.assert_close(causal[:, :, t], prefix[:, :, t])
    assert not torch.allclose(causal[:, :, : N - 1], full[:, :, : N - 1])


def test_query_chunks_change_nothing():
    q, k, v = (t.float().repeat(1, 1, 9, 1).requires_grad_() for t in random_qkv())  # N = 45
    key_mask = torch.ones(1, 45, dtype=torch.bool)
    key_mask[:, 10:13] = False
    outs, grads = [], []
    for chunk in (None, 7):
        out = continuum_softmax(q, k, v, causal=True, key_mask=key_mask, query_chunk=chunk)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    torch.testing.assert_close(outs[0], outs[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
