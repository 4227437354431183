"""retention and retention_2d (models/attention/decay.py): the chunked scans against the quadratic references
(causal and not, awkward lengths, padded keys, grids with a class token), LION's reversed pass, the grid
convention written out by hand, gradients (gradcheck, fp32 against fp64), no N x N saved for the backward, a tiny
CLIP with them in both towers, one-line errors."""

import pytest
import torch

from models import create_model
from models.attention import build_attention, reference
from models.attention.decay import log_gammas, retention, retention_2d, scan, two_sided
from tests.models.test_attention import rel_err
from tests.models.test_clip import batch, clip_loss, one_line_error


def qkv(b, h, n, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) for _ in range(3)]


def padded(b, n, seed=0):
    mask = torch.rand(b, n, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[:, 0] = True
    return mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "b,h,n,chunk",
    [(1, 1, 1, 64), (2, 3, 7, 4), (1, 2, 65, 16), (3, 4, 130, 64), (2, 8, 50, 1), (1, 2, 77, None), (1, 2, 129, None)],
)  # chunk None: the default, one whole block up to decay.WHOLE = 128 tokens, blocks of 64 beyond
def test_retention_equals_reference(causal, b, h, n, chunk):
    q, k, v = qkv(b, h, n)
    mask = padded(b, n)
    ours = retention(q, k, v, causal=causal, key_mask=mask, chunk_size=chunk)
    torch.testing.assert_close(ours, reference.retention(q, k, v, causal=causal, key_mask=mask), rtol=1e-10, atol=1e-10)


def test_reversed_pass_is_the_strict_upper_triangle_and_the_sum_the_two_sided_form():
    """LION: the downward scan is the causal (lower, diagonal included) matrix, the scan of the reversed tokens
    with strict=True the strictly upper one, so their sum counts the diagonal once."""
    q, k, v = qkv(2, 3, 37)
    lg, i = log_gammas(3, q), torch.arange(37)
    distance, ones = (i[:, None] - i[None]).abs(), torch.ones(37, 37, dtype=torch.bool)
    scaled = q / 8**0.5
    down = scan(scaled, k, v, lg, 1, 8, strict=False)
    up = scan(scaled.flip(2), k.flip(2), v.flip(2), lg, 1, 8, strict=True).flip(2)
    torch.testing.assert_close(down, reference.decayed(q, k, v, distance, ones.tril()))
    torch.testing.assert_close(up, reference.decayed(q, k, v, distance, ones.triu(1)))
    torch.testing.assert_close(two_sided(scaled, k, v, lg, 1, 8), reference.retention(q, k, v))


def test_grid_convention_written_out():
    """Class token first, then a 2 x 3 grid row-major; gamma_0 = 1 - 1/32, gamma_1 = 1 - 1/64."""
    q, k, v = qkv(1, 2, 7, d=4)
    place = [None, (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    expected = torch.zeros_like(q)
    for h, gamma in enumerate((1 - 2**-5, 1 - 2**-6)):
        for i in range(7):
            for j in range(7):
                a, z = place[i], place[j]
                dist = 0 if a is None or z is None else abs(a[0] - z[0]) + abs(a[1] - z[1])
                expected[0, h, i] += gamma**dist * (q[0, h, i] @ k[0, h, j]) / 2 * v[0, h, j]
    torch.testing.assert_close(reference.retention_2d(q, k, v, width=3), expected)
    torch.testing.assert_close(retention_2d(q, k, v, width=3, chunk_size=3), expected)


@pytest.mark.parametrize(
    "n,width,prefix,chunk",
    [
        (17, None, 1, 64),
        (17, None, 1, 4),
        (16, 5, 1, 10),
        (16, 5, 1, 1),
        (1, None, 1, 64),
        (2, None, 1, 64),
        (50, None, 1, 16),
        (12, 4, 0, 8),
        (14, 4, 2, 8),
        (101, None, 1, 64),
    ],
)
def test_retention_2d_equals_reference(n, width, prefix, chunk):
    """4 x 4 and 3 x 5 grids with a class token, one token, partial last rows, no or two prefix tokens."""
    q, k, v = qkv(2, 3, n)
    mask = padded(2, n)
    options = dict(width=width, prefix_tokens=prefix)
    ours = retention_2d(q, k, v, key_mask=mask, chunk_size=chunk, **options)
    torch.testing.assert_close(ours, reference.retention_2d(q, k, v, key_mask=mask, **options))


@pytest.mark.parametrize(
    "fn,options",
    [
        (retention, dict(causal=True, chunk_size=3)),
        (retention, dict(chunk_size=3)),
        (retention_2d, dict(width=3, chunk_size=6)),
        (retention, dict(chunk_size=64)),  # one block: the whole decayed matrix at once
        (retention_2d, dict(width=3, chunk_size=64)),
    ],
)
def test_gradcheck(fn, options):
    inputs = [t.requires_grad_() for t in qkv(1, 2, 8, d=3)]
    mask = padded(1, 8)
    assert torch.autograd.gradcheck(lambda q, k, v: fn(q, k, v, key_mask=mask, **options), inputs)


@pytest.mark.parametrize(
    "fn,ref,options",
    [
        (retention, reference.retention, dict(causal=True)),
        (retention, reference.retention, {}),
        (retention_2d, reference.retention_2d, dict(chunk_size=60)),
    ],
)
def test_fp32_gradients_equal_fp64_reference(fn, ref, options):
    base = qkv(2, 4, 145, d=16)  # 1 + 12^2 tokens: three 64-token chunks, or 12 x 12 patches in blocks of 5 rows
    fast, exact = [t.float().requires_grad_() for t in base], [t.clone().requires_grad_() for t in base]
    grad = torch.randn(base[0].shape, dtype=torch.float64)
    fn(*fast, **options).backward(grad.float())
    ref(*exact, causal=options.get("causal", False)).backward(grad)
    for name, a, r in zip("qkv", fast, exact):
        assert rel_err(a.grad, r.grad) <= 1e-4, f"grad of {name}"


def test_causal_retention_in_one_block_takes_the_c_kernel(monkeypatch):
    """77 tokens, causal, fp32: gamma^(i - j) as e^(b_i) e^(-b_j) on causal_cpu.c (called once), output and gradients
    as the fp64 reference's."""
    from models.attention import decay

    if not decay.raw_kernel_takes(torch.zeros(1, 1, 1, 16)):
        pytest.skip("no C compiler: the kernel is not built")
    calls, original = [], decay.raw_causal
    monkeypatch.setattr(decay, "raw_causal", lambda *a: calls.append(1) or original(*a))
    base, mask = qkv(2, 6, 77, d=16), padded(2, 77)
    fast, exact = [t.float().requires_grad_() for t in base], [t.clone().requires_grad_() for t in base]
    grad = torch.randn(base[0].shape, dtype=torch.float64)
    out, expected = (
        retention(*fast, causal=True, key_mask=mask),
        reference.retention(*exact, causal=True, key_mask=mask),
    )
    assert calls == [1] and rel_err(out, expected) <= 1e-5
    out.backward(grad.float())
    expected.backward(grad)
    for name, a, r in zip("qkv", fast, exact):
        assert rel_err(a.grad, r.grad) <= 1e-4, f"grad of {name}"


@pytest.mark.parametrize(
    "fn,options,n", [(retention, dict(causal=True), 2305), (retention, {}, 2305), (retention_2d, {}, 9217)]
)
def test_no_n_by_n_tensor_is_saved(fn, options, n):
    """1 + 48^2 tokens (retention_2d, whose blocks hold 1,024 tokens: 1 + 96^2): what the backward keeps is
    [N, block] matrices and d x d states, never [N, N]."""
    largest = []
    q, k, v = (t.requires_grad_() for t in qkv(1, 1, n, dtype=torch.float32))

    def pack(t):
        largest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(q, k, v, **options)
    out.sum().backward()
    assert max(largest) <= n * n / 8, max(largest)


def test_tiny_clip_trains_with_retention_in_both_towers_and_retention_2d_in_the_image_tower():
    for image in ("retention", "retention_2d"):
        model = create_model("tiny-s", image_attention=image, text_attention="retention")
        images, text = batch(model, trim=True)
        assert model.visual.tokens(images).shape[1] == 17  # the class token and a 4 x 4 grid
        clip_loss(model, images, text).backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_one_line_errors():
    one_line_error(
        lambda: build_attention("retention_2d", 32, 4, causal=True), "attention 'retention_2d' cannot be causal: "
    )
    one_line_error(lambda: create_model("tiny-s", text_attention="retention_2d"), "text tower", "cannot be causal")
    one_line_error(lambda: build_attention("retention", 32, 4, width=4), "unknown options width; it takes chunk_size")
    one_line_error(lambda: build_attention("retention_2d", 32, 4, width=0), "option width=0 must be an integer >= 1")
    one_line_error(lambda: build_attention("retention_2d", 32, 4, prefix_tokens=-1), "prefix_tokens=-1")


def test_the_families_declare_linear_time():
    """The attention benchmark extrapolates a point it does not measure as O(N^time_power): the decay, gated and
    delta-rule families are O(N) like the linear attentions, softmax O(N^2)."""
    from models.attention import ATTENTIONS

    for name in ("retention", "retention_2d", "ssd", "gla", "deltanet", "linear_affine_nodenom"):
        assert ATTENTIONS[name].time_power == 1, name
    assert ATTENTIONS["softmax"].time_power == 2
