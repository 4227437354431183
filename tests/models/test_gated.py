"""ssd and gla (models/attention/gated.py): the chunked scan against the quadratic reference (causal and not, awkward
lengths, padded keys), the recurrence written out by hand, LION's reversed pass, gradients (gradcheck, fp32 against
fp64, the decay projections included), no N x N saved for the backward, a tiny CLIP with each in both towers."""

import pytest
import torch

from models import create_model
from models.attention import build_attention, reference
from models.attention.gated import chunk_scan, factorisable, gated_attention
from models.attention.ops import causal_cpu
from tests.models.test_attention import rel_err
from tests.models.test_clip import batch, clip_loss, one_line_error
from tests.models.test_decay import padded, qkv

KINDS = {"ssd": 1, "gla": None}  # features of the decay: one per head, or one per key feature (None: D)


def log_decay(kind, b, h, n, d=8, seed=1, dtype=torch.float64):
    """Log decays in (-inf, 0): spread from near 0 to about -3 per token, so the decays span 0.05 .. 1."""
    g = torch.Generator().manual_seed(seed)
    return -3 * torch.rand(b, h, n, KINDS[kind] or d, generator=g, dtype=dtype) ** 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "b,h,n,chunk",
    [
        *[(1, 1, 1, 64), (2, 3, 7, 4), (1, 2, 65, 16), (3, 4, 130, 64), (2, 5, 50, 1), (1, 2, 33, 16)],
        *[(1, 2, 77, None), (1, 2, 129, None)],  # None: the default, one whole chunk up to decay.WHOLE = 128 tokens
    ],
)
def test_chunked_equals_reference(kind, causal, b, h, n, chunk):
    q, k, v = qkv(b, h, n)
    g, mask = log_decay(kind, b, h, n), padded(b, n)
    ours = gated_attention(q, k, v, g, causal=causal, key_mask=mask, chunk_size=chunk)
    expected = reference.gated(q, k, v, g, causal=causal, key_mask=mask)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_recurrence_written_out(kind):
    """Causal: S_t = diag(G_t) S_{t-1} + k_t v_t^T, o_t = q_t S_t / sqrt(D); two-sided: plus the same recurrence run
    from the end, S'_t = diag(G_{t+1}) (S'_{t+1} + k_{t+1} v_{t+1}^T), o_t += q_t S'_t / sqrt(D)."""
    q, k, v = qkv(2, 3, 9, d=4)
    g = log_decay(kind, 2, 3, 9, d=4)
    gate = g.exp().expand_as(k)
    down, up, state = torch.zeros_like(q), torch.zeros_like(q), torch.zeros(2, 3, 4, 4, dtype=q.dtype)
    for t in range(9):
        state = gate[:, :, t, :, None] * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        down[:, :, t] = (q[:, :, t, None, :] @ state)[:, :, 0] / 2
    state = torch.zeros_like(state)
    for t in reversed(range(8)):
        state = gate[:, :, t + 1, :, None] * (state + k[:, :, t + 1, :, None] * v[:, :, t + 1, None, :])
        up[:, :, t] = (q[:, :, t, None, :] @ state)[:, :, 0] / 2
    for fn in (gated_attention, reference.gated):
        torch.testing.assert_close(fn(q, k, v, g, causal=True), down)
        torch.testing.assert_close(fn(q, k, v, g), down + up)


@pytest.mark.parametrize("kind", KINDS)
def test_reversed_pass_is_the_strict_upper_triangle(kind):
    """LION: the scan of the reversed tokens (each carrying its right neighbour's decay, strict) is the masked
    quadratic form's strictly upper triangle, the forward scan its lower triangle with the diagonal."""
    q, k, v = qkv(2, 3, 37)
    g = log_decay(kind, 2, 3, 37)
    full, lower = reference.gated(q, k, v, g), reference.gated(q, k, v, g, causal=True)
    scaled = q / 8**0.5
    g_reversed = torch.nn.functional.pad(g.flip(2)[:, :, :-1], (0, 0, 1, 0))
    up = chunk_scan(scaled.flip(2), k.flip(2), v.flip(2), g_reversed, 8, strict=True).flip(2)
    torch.testing.assert_close(chunk_scan(scaled, k, v, g, 8, strict=False), lower)
    torch.testing.assert_close(up, full - lower)


def test_constant_ssd_decay_is_retention():
    """a_t = gamma_h for every token: the two-sided matrix is gamma_h^|i - j|, retention's."""
    q, k, v = qkv(2, 3, 20)
    g = torch.log1p(-(2.0 ** (-5.0 - torch.arange(3.0, dtype=torch.float64))))[None, :, None, None].expand(2, 3, 20, 1)
    for causal in (False, True):
        expected = reference.retention(q, k, v, causal=causal)
        torch.testing.assert_close(gated_attention(q, k, v, g, causal=causal, chunk_size=8), expected)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(kind, causal):
    inputs = [t.requires_grad_() for t in [*qkv(1, 2, 8, d=3), log_decay(kind, 1, 2, 8, d=3)]]
    mask = padded(1, 8)
    assert torch.autograd.gradcheck(
        lambda q, k, v, g: gated_attention(q, k, v, g, causal=causal, key_mask=mask, chunk_size=3), inputs
    )


@pytest.mark.parametrize("causal", [False, True])
def test_gla_factorised_and_exact_forms_both_equal_the_definition(causal):
    """gla's chunks take the factorised matmul (q_i e^(b_i)) . (k_j e^(-b_j)) while no chunk decays by more than
    e^-LIMIT, else chunks of 8 with the exact per-feature decays: both give the definition, forward (fp64) and
    gradients (gradcheck), and decays as steep as e^-40 a token leave nothing infinite."""
    mild = -0.05 * torch.rand(2, 3, 70, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    steep = mild.clone()
    steep[..., ::3] = -40.0
    assert factorisable(mild, 64) and not factorisable(steep, 64) and not factorisable(steep, 1)
    assert factorisable(steep.to("meta"), 64)  # no values to read: FLOP counting on the meta device
    q, k, v = qkv(2, 3, 70)
    for g in (mild, steep):
        ours = gated_attention(q, k, v, g, causal=causal, key_mask=padded(2, 70))
        assert torch.isfinite(ours).all()
        expected = reference.gated(q, k, v, g, causal=causal, key_mask=padded(2, 70))
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)
    options = dict(causal=causal, key_mask=padded(1, 8), chunk_size=6, exact_chunk=3)
    for g in (mild[:1, :2, :8, :3], steep[:1, :2, :8, :3]):
        inputs = [t.requires_grad_() for t in [*qkv(1, 2, 8, d=3), g.clone()]]
        assert torch.autograd.gradcheck(lambda q, k, v, g: gated_attention(q, k, v, g, **options), inputs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_layer_gradients_equal_fp64_reference(kind, causal):
    """The layer's chunked path in fp32 against its quadratic reference in fp64: q, k, v and every parameter of the
    decay projection, 145 tokens (several chunks and a partial one)."""
    fast = layer_against_reference(kind, causal, 145)
    assert any("gate" in n or "decay" in n for n, p in fast.named_parameters() if p.grad is not None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_no_n_by_n_tensor_is_saved(kind, causal):
    """What the backward keeps is [N, C] matrices (gla's exact form: [N, C, D]) and D x D states, never [N, N]."""
    n, largest = 2048, []
    m = build_attention(kind, 8, 1, causal=causal)
    q, k, v = (t.requires_grad_() for t in qkv(1, 1, n, dtype=torch.float32))

    def pack(t):
        largest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = m.attention(q, k, v, None)
    out.sum().backward()
    assert max(largest) <= n * n / 8, max(largest)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_clip_trains_with_it_in_both_towers(kind):
    model = create_model("tiny-s", image_attention=kind, text_attention=kind)
    images, text = batch(model, trim=True)
    clip_loss(model, images, text).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if "gate" in name or "decay" in name:
            assert p.grad.abs().sum() > 0, name


def test_one_line_errors():
    one_line_error(lambda: build_attention("ssd", 32, 4, gate_rank=4), "unknown options gate_rank; it takes chunk_size")
    one_line_error(lambda: build_attention("gla", 32, 4, chunk_size=0), "option chunk_size=0 must be an integer >= 1")
    one_line_error(lambda: build_attention("gla", 32, 4, exact_chunk=0), "option exact_chunk=0 must be an integer >= 1")
    one_line_error(lambda: build_attention("sdd", 32, 4), "known attentions: ", "gla", "ssd", "did you mean 'ssd'?")


@pytest.mark.parametrize("kind", KINDS)
def test_text_tower_length_takes_the_c_kernel_and_equals_the_reference(kind, monkeypatch):
    """Causal, fp32, 77 tokens, one chunk: the layer hands its gates as its projection wrote them to causal_cpu.c
    (called once; the kernel takes the log decays, q's scale and the key mask), and its output and every gradient
    (the gate projections' included) match the fp64 reference; gates that decay by more than e^-LIMIT over the
    sequence leave the kernel (it writes nothing) for the chunked form, which matches the reference too."""
    from models.attention import gated

    if not gated.raw_kernel_takes(torch.zeros(1, 1, 1, 16)):
        pytest.skip("no C compiler: the kernel is not built")
    results, original = [], gated.gate_kernel
    monkeypatch.setattr(gated, "gate_kernel", lambda *a: results.append(original(*a)) or results[-1])
    layer_against_reference(kind, True, 77)
    assert len(results) == 1 and results[0] is not None
    results.clear()
    layer_against_reference(kind, True, 77, steep=True)
    assert len(results) == 1 and results[0] is None
    q = qkv(1, 2, 77, d=16)[0].float()
    steep = torch.full((1, 2, 77, KINDS[kind] or 16), -1.0)
    assert not gated.kernel_takes(q, steep, 77, causal=True) and gated.kernel_takes(q, steep / 10, 77, causal=True)
    assert not gated.kernel_takes(q, steep / 10, 64, causal=True) and not gated.kernel_takes(q, steep / 10, 77, False)


def layer_against_reference(kind, causal, n, steep=False):
    """The layer in fp32 against its quadratic reference in fp64 on n tokens with padded keys: the output to 1e-5,
    the gradients of q, k, v and of every parameter to 1e-4; returns the fp32 layer. `steep`: gate biases that
    decay each token by about e^-0.6 (e^-46 over 77 tokens)."""
    torch.manual_seed(0)
    fast = build_attention(kind, 64, 4, causal=causal)
    if steep:
        with torch.no_grad():
            bias = fast.decay_proj.bias if kind == "ssd" else fast.gate_up.bias
            bias.fill_(0.4 if kind == "ssd" else -10.0)
    exact = build_attention(kind, 64, 4, causal=causal).double()
    exact.load_state_dict(fast.state_dict())
    base, mask = qkv(2, 4, n, d=16), padded(2, n)
    ins32, ins64 = [t.float().requires_grad_() for t in base], [t.clone().requires_grad_() for t in base]
    grad = torch.randn(base[0].shape, dtype=torch.float64)
    out, ref = fast.attention(*ins32, mask), exact.attention_reference(*ins64, mask)
    assert rel_err(out, ref) <= 1e-5
    out.backward(grad.float())
    ref.backward(grad)
    for name, a, r in zip("qkv", ins32, ins64):
        assert rel_err(a.grad, r.grad) <= 1e-4, f"grad of {name}"
    for (name, a), r in zip(fast.named_parameters(), exact.parameters()):
        if a.grad is not None:
            assert rel_err(a.grad, r.grad) <= 1e-4, f"grad of {name}"
    return fast


def decayed_definition(q, k, v, g):
    """sum_{j <= i} e^(b_i - b_j) (q_i . k_j) v_j, b = cumsum(g), per feature where g has D of them: the masked
    matrix, fp64."""
    b = g.cumsum(2)
    decay = b[:, :, :, None] - b[:, :, None]  # [B, H, i, j, E]
    mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
    scores = torch.einsum("bhid,bhjd,bhijd->bhij", q, k, decay.masked_fill(~mask[..., None], -torch.inf).exp())
    return scores @ v


@pytest.mark.parametrize("B,H,N,D,E", [(1, 1, 1, 16, 1), (2, 3, 7, 32, 32), (1, 6, 77, 64, 1), (2, 1, 63, 128, 128)])
def test_the_c_kernel_takes_the_log_decays_and_returns_their_gradient(B, H, N, D, E):
    """causal_cpu.decayed (the cumsum and e^b inside the kernel, ssd's E = 1 and gla's E = D) against the fp64
    masked matrix, gradients of q, k, v and the log decays included."""
    generator = torch.Generator().manual_seed(N)
    q, k, v = (torch.randn(B, H, N, D, generator=generator, dtype=torch.float64) for _ in range(3))
    g = -0.3 * torch.rand(B, H, N, E, generator=generator, dtype=torch.float64)
    args = [t.clone().requires_grad_() for t in (q, k, v, g)]
    want = decayed_definition(*args)
    grad = torch.randn_like(want)
    wanted = torch.autograd.grad(want, args, grad)
    args32 = [t.detach().float().requires_grad_() for t in args]
    got = causal_cpu.decayed(*args32)
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    scale = max(w.abs().max() for w in wanted)  # one token: dL/dg is exactly 0, q's and k's terms cancel
    for have, expected in zip(torch.autograd.grad(got, args32, grad.float()), wanted):
        assert (have.double() - expected).abs().max() <= 1e-4 * max(expected.abs().max(), 1e-2 * scale)


@pytest.mark.parametrize(
    "B,H,N,D,E,sign", [(1, 1, 1, 16, 1, -1), (2, 3, 7, 32, 32, 1), (2, 6, 77, 64, 1, -1), (1, 2, 77, 64, 64, 1)]
)
def test_the_c_kernel_reads_the_gates_where_the_projection_wrote_them(B, H, N, D, E, sign):
    """causal_cpu.gated: the log decays factor * logsigmoid(sign x) from the gates x [B, N, H E] (token-major), q
    scaled, padded tokens (key mask) neither keys nor decays, against the fp64 definition on the same inputs;
    gradients of q, k, v and of x included."""
    generator = torch.Generator().manual_seed(N + E)
    q, k, v = (torch.randn(B, H, N, D, generator=generator, dtype=torch.float64) for _ in range(3))
    x = 2 * torch.randn(B, N, H * E, generator=generator, dtype=torch.float64)
    mask = torch.rand(B, N, generator=generator) > 0.3
    mask[:, 0] = True
    factor, q_scale = 1 / 16 if E > 1 else 0.5, D**-0.5
    args = [t.clone().requires_grad_() for t in (q, k, v, x)]
    a_q, a_k, a_v, a_x = args
    g = (factor * torch.nn.functional.logsigmoid(sign * a_x)).unflatten(2, (H, E)).transpose(1, 2)
    keep = mask[:, None, :, None].double()
    want = decayed_definition(a_q * q_scale, a_k * keep, a_v, g * keep)
    grad = torch.randn_like(want)
    wanted = torch.autograd.grad(want, args, grad)
    args32 = [t.detach().float().requires_grad_() for t in args]
    gates = causal_cpu.Gates(heads=H, sign=sign, factor=factor, scale=q_scale)
    got = causal_cpu.gated(*args32[:3], args32[3], mask, gates, limit=1e9)
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    scale = max(w.abs().max() for w in wanted)
    for have, expected in zip(torch.autograd.grad(got, args32, grad.float()), wanted):
        assert (have.double() - expected).abs().max() <= 1e-4 * max(expected.abs().max(), 1e-2 * scale)
    steepest = float((g * keep).sum(2).min())  # the sequence's total log decay on the steepest feature
    for limit in (-0.5 * steepest, -2 * steepest):  # the kernel refuses only where b falls below -limit
        assert (causal_cpu.gated(*args32[:3], args32[3], mask, gates, limit=limit) is None) == (limit < -steepest)
