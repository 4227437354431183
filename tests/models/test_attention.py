"""Every registered attention, tested the moment it registers: shapes, dtypes, gradients,
causality, padding, fast path == naive reference (forward and backward, awkward lengths)."""

import pytest
import torch

from models.attention import ATTENTIONS, attend, build_attention, get_attention

DIM, HEADS = 32, 4
NAMES = sorted(ATTENTIONS)
# every variant in each direction it supports (deltanet is causal only, efficient and others non-causal only)
MODES = [
    (n, c)
    for n in NAMES
    for c in (False, True)
    if (ATTENTIONS[n].supports_causal if c else ATTENTIONS[n].supports_bidirectional)
]


def ids(mode):
    return f"{mode[0]}-{'causal' if mode[1] else 'full'}"


def layer(name, causal, **options):
    torch.manual_seed(0)
    return build_attention(name, DIM, HEADS, causal=causal, **options)


def rel_err(a, b):
    """Norm-wise relative error; the floor keeps an exactly-zero reference (e.g. grad of q at N = 1) meaningful."""
    floor = 1e-2 * b.numel() ** 0.5
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(floor)).item()


@pytest.mark.parametrize("mode", MODES, ids=ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shape_and_dtype(mode, dtype):
    m = layer(*mode).to(dtype)
    for n in (1, 7):
        x = torch.randn(2, n, DIM, dtype=dtype)
        y = m(x)
        assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()


@pytest.mark.parametrize("mode", MODES, ids=ids)
def test_every_parameter_gets_a_gradient(mode):
    m = layer(*mode)
    m(torch.randn(2, 9, DIM)).square().sum().backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reaches {missing}"


@pytest.mark.parametrize("name", [n for n in NAMES if ATTENTIONS[n].supports_causal])
def test_causality(name):
    m = layer(name, True)
    n = 70  # crosses a 64-token chunk boundary
    x = torch.randn(1, n, DIM)
    y = m(x)
    for t in (0, 30, 63, 64, 68):
        x2 = x.clone()
        x2[:, t + 1 :] += torch.randn_like(x2[:, t + 1 :])
        torch.testing.assert_close(m(x2)[:, : t + 1], y[:, : t + 1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES, ids=ids)
def test_padding_equals_truncation(mode):
    m = layer(*mode)
    n_real, n_pad = 11, 6
    x = torch.randn(2, n_real + n_pad, DIM)
    key_mask = torch.ones(2, n_real + n_pad, dtype=torch.bool)
    key_mask[:, n_real:] = False
    padded = m(x, key_mask)[:, :n_real]
    torch.testing.assert_close(padded, m(x[:, :n_real]), rtol=1e-5, atol=1e-5)
    # different garbage in the padding changes nothing
    x2 = x.clone()
    x2[:, n_real:] = 100 * torch.randn_like(x2[:, n_real:])
    torch.testing.assert_close(m(x2, key_mask)[:, :n_real], padded, rtol=1e-5, atol=1e-5)


def qkv_pair(b, n, h=HEADS, d=DIM // HEADS):
    """The same q, k, v in fp32 (for the fast path) and fp64 (for an exact reference), with grads."""
    base = [torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3)]
    fast = [t.float().requires_grad_() for t in base]
    ref = [t.clone().requires_grad_() for t in base]
    return fast, ref


# references that build [N, N] (x D for gla) decay tensors in float64 take seconds at 1000 tokens: 300 still
# crosses many of their chunks (16 and 64 tokens); tests/models/test_gated.py covers their chunking in detail
HEAVY_REFERENCE = {"gla": 300, "ssd": 300}


@pytest.mark.parametrize("mode", MODES, ids=ids)
@pytest.mark.parametrize("b,n", [(1, 1), (2, 7), (1, 63), (2, 1000)])
def test_fast_path_equals_reference(mode, b, n):
    n = min(n, HEAVY_REFERENCE.get(mode[0], n))
    m = layer(*mode, **({"max_length": 1024} if mode[0] == "linformer" else {}))
    (q, k, v), (q64, k64, v64) = qkv_pair(b, n)
    key_mask = torch.ones(b, n, dtype=torch.bool)
    if n > 2:
        key_mask[-1, -(n // 3) :] = False
    out = m.attention(q, k, v, key_mask)
    m64 = layer(*mode, **({"max_length": 1024} if mode[0] == "linformer" else {})).double()
    m64.load_state_dict(m.state_dict())
    ref = m64.attention_reference(q64, k64, v64, key_mask)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) <= 1e-5
    grad = torch.randn_like(ref)
    out.backward(grad.float())
    ref.backward(grad)
    for name, a, r in (("q", q, q64), ("k", k, k64), ("v", v, v64)):
        assert rel_err(a.grad, r.grad) <= 1e-5, f"grad of {name}"


@pytest.mark.parametrize("mode", MODES, ids=ids)
def test_bf16_agrees_with_fp32_reference(mode):
    m = layer(*mode, **({"max_length": 1024} if mode[0] == "linformer" else {}))
    (q, k, v), _ = qkv_pair(2, 100)
    ref = m.attention_reference(q.detach(), k.detach(), v.detach(), None)
    with torch.no_grad():
        out = m.bfloat16().attention(*(t.detach().bfloat16() for t in (q, k, v)), None)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) <= 2e-2


@pytest.mark.parametrize("mode", MODES, ids=ids)
def test_layer_trains_under_bf16_autocast(mode):
    """The path of train.precision=bf16: fp32 weights, forward under autocast, backward outside it."""
    m = layer(*mode)
    x = torch.randn(2, 70, DIM)
    with torch.no_grad():
        ref = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    y.float().square().sum().backward()
    assert rel_err(y, ref) <= 2e-2
    bad = [n for n, p in m.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not bad, f"no finite gradient for {bad}"


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="known attentions: " + ", ".join(NAMES)):
        build_attention("sofmax", DIM, HEADS)


@pytest.mark.parametrize("name", [n for n in NAMES if not ATTENTIONS[n].supports_causal])
def test_non_causal_variant_refuses_causal(name):
    with pytest.raises(ValueError, match=f"attention '{name}' cannot be causal: .+"):
        build_attention(name, DIM, HEADS, causal=True)


@pytest.mark.parametrize("name", [n for n in NAMES if not ATTENTIONS[n].supports_bidirectional])
def test_causal_only_variant_refuses_both_ways(name):
    with pytest.raises(ValueError, match=f"attention '{name}' is causal only \\(text tower\\): .+"):
        build_attention(name, DIM, HEADS, causal=False)


@pytest.mark.parametrize("name", [n for n in NAMES if ATTENTIONS[n].function is not None])
def test_attend_matches_the_layer_math(name):
    q, k, v = torch.randn(3, 2, HEADS, 9, DIM // HEADS).unbind(0)
    causal = get_attention(name).supports_causal
    m = layer(name, causal)
    torch.testing.assert_close(attend(name, q, k, v, causal=causal), m.attention(q, k, v, None))


def test_registry_refuses_duplicates():
    from models.attention import register_attention

    with pytest.raises(ValueError, match="registered twice"):
        register_attention("softmax")(type("Again", (), {"__module__": "tests"}))
