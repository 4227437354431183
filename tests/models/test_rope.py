"""Rotary positions (models/attention/rope.py): the rotation against explicit 2 x 2 blocks, relative positions,
every registered attention with RoPE against its quadratic reference on rotated q and k (RoFormer's form for
elu + 1), causal and not, with padding and gradients; both towers with RoPE; bad input."""

import pytest
import torch

import models
from models.attention import ATTENTIONS, build_attention, reference, rope
from models.attention.ops import dispatch

DIM, HEADS = 32, 4
HEAD = DIM // HEADS
MODES = [
    (n, c)
    for n in sorted(ATTENTIONS)
    for c in (False, True)
    if (ATTENTIONS[n].supports_causal if c else ATTENTIONS[n].supports_bidirectional)
]


def theta_of(table) -> torch.Tensor:
    cos, sin = table
    return torch.atan2(sin.double(), cos.double())


def test_rotation_is_the_explicit_block_rotation_and_keeps_norms():
    x = torch.randn(2, 3, 10, HEAD, dtype=torch.float64)
    table = rope.text_table(10, HEAD)
    ours = rope.rotate(x, table)
    torch.testing.assert_close(ours, reference.rope(x, theta_of(table)))
    torch.testing.assert_close(ours.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(ours[:, :, 0], x[:, :, 0])  # position 0 is not turned


def test_text_scores_depend_on_the_offset_only():
    """(R_m q).(R_n k) = q.(R_{n-m} k): a token pair scores the same wherever it sits."""
    q, k = torch.randn(1, 1, 1, HEAD, dtype=torch.float64), torch.randn(1, 1, 1, HEAD, dtype=torch.float64)
    table = rope.text_table(40, HEAD)

    def score(m, n):
        at = lambda x, p: rope.rotate(x.expand(1, 1, 40, HEAD), table)[:, :, p]  # noqa: E731
        return (at(q, m) * at(k, n)).sum().item()

    assert score(3, 7) == pytest.approx(score(20, 24), rel=1e-6)  # fp32 tables
    assert score(3, 7) != pytest.approx(score(3, 9), rel=1e-3)


def test_image_table_turns_half_the_pairs_by_column_and_half_by_row():
    rows, cols = rope.grid_positions(3, 4)
    theta = theta_of(rope.image_table(rows, cols, HEAD))
    assert theta.shape == (13, HEAD // 2) and theta[0].abs().max() == 0  # the class token is not turned
    quarter = HEAD // 4
    torch.testing.assert_close(theta[1:, 0], cols.double())  # the first frequency of each axis is 1
    torch.testing.assert_close(theta[1:, quarter], rows.double())


def qkv_of(m, x):
    B, N, _ = x.shape
    qkv = torch.nn.functional.linear(x, m.in_proj_weight, m.in_proj_bias)
    return qkv.view(B, N, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0]}-{'causal' if m[1] else 'full'}")
def test_every_attention_with_rope_equals_its_reference_on_rotated_q_and_k(mode):
    """The layer with a RoPE table against the quadratic fp64 reference: q and k rotated first, or for a positive
    feature map RoFormer's numerator-rotated form; padded keys (key_mask) included, gradients too."""
    name, causal = mode
    options = {"max_length": 128} if name == "linformer" else {}
    torch.manual_seed(0)
    m = build_attention(name, DIM, HEADS, causal=causal, **options).double()
    n = 70  # crosses a 64-token chunk
    x = torch.randn(2, n, DIM, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 60:] = False
    table = tuple(t.double() for t in rope.text_table(n, HEAD))
    ours = m(x, mask, table)
    q, k, v = qkv_of(m, x)
    if m.rope_feature_map is not None:
        mixed = reference.linear_elu_rope(q, k, v, theta_of(table), causal=causal, key_mask=mask)
    else:
        mixed = m.attention_reference(reference.rope(q, theta_of(table)), reference.rope(k, theta_of(table)), v, mask)
    expected = m.out_proj(mixed.transpose(1, 2).reshape(2, n, DIM))
    real = mask[:, :, None] if not causal else torch.ones(2, n, 1, dtype=torch.bool)
    torch.testing.assert_close(ours * real, expected * real, rtol=1e-5, atol=1e-6)  # fp32 tables
    (g_ours,) = torch.autograd.grad((ours * real).square().sum(), x)
    (g_ref,) = torch.autograd.grad((expected * real).square().sum(), x)
    # relative to the gradient's largest element: the reference rotates by angles recovered from the fp32 table
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-6 * g_ref.abs().max().item())
    assert not torch.allclose(ours, m(x, mask)), "the positions changed nothing"


IMPLEMENTED = [
    (name, causal, impl)
    for name, table in sorted(dispatch.TABLES.items())
    for causal in (False, True)
    for impl in table.impls
    if impl != "reference" and not (impl == "cpu" and dispatch.cpu_mode_missing(name, causal))
]


@pytest.mark.parametrize("name,causal,impl", IMPLEMENTED, ids=lambda v: str(v))
def test_rope_runs_unchanged_on_every_implementation(name, causal, impl):
    """q and k are rotated before the op (RoFormer's form for elu + 1 rotates its feature maps), so the op's
    PyTorch, fused C and Triton (interpreted here) implementations each give the naive reference's output with a
    RoPE table, padding and gradients included."""
    torch.manual_seed(0)
    heads = DIM // 16  # the C kernels take heads of 16, 32, 64 or 128
    naive = build_attention(name, DIM, heads, causal=causal, impl="reference")
    m = build_attention(name, DIM, heads, causal=causal, impl=impl)
    m.load_state_dict(naive.state_dict())
    n = 70  # crosses a 64-token chunk
    x = torch.randn(2, n, DIM, requires_grad=True)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 60:] = False
    table = rope.text_table(n, 16)
    real = mask[:, :, None] if not causal else torch.ones(2, n, 1, dtype=torch.bool)
    ours, expected = m(x, mask, table) * real, naive(x, mask, table) * real
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    (g_ours,) = torch.autograd.grad(ours.square().sum(), x)
    (g_ref,) = torch.autograd.grad(expected.square().sum(), x)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-3, atol=5e-5)  # fp32 sums in another order
    assert not torch.allclose(ours, m(x, mask) * real), "the positions changed nothing"


def test_linear_affine_nodenom_weights_stay_in_zero_one_with_rope():
    """Rotation keeps |q| and |k|: Eq. 7's (1 + q^.k^)/2 on rotated q, k stays in [0, 1]."""
    q, k = torch.randn(2, 4, 50, HEAD, dtype=torch.float64), torch.randn(2, 4, 50, HEAD, dtype=torch.float64)
    table = rope.text_table(50, HEAD)
    qn, kn = (torch.nn.functional.normalize(rope.rotate(t, table), dim=-1) for t in (q, k))
    w = (1 + qn @ kn.transpose(-1, -2)) / 2
    assert w.min() >= 0 and w.max() <= 1


@pytest.mark.parametrize("attention", ["softmax", "linear_affine_nodenom", "linear_elu"])
def test_both_towers_with_rope_have_no_table_and_run_at_any_size(attention):
    m = models.create_model(
        "tiny-s", image_attention=attention, text_attention=attention, image_pos_embed="rope", text_pos_embed="rope"
    )
    assert not [k for k in m.state_dict() if "positional_embedding" in k]
    tokens = models.tokenizer("tiny-s")(["a red circle"])
    for size in (32, 64):  # trained at 32 px, run at 64: no table to resample
        image, text, _ = m(torch.randn(2, 3, size, size), tokens.expand(2, -1))
        assert image.shape == text.shape and torch.isfinite(image).all()
    m.visual.patch_dropout = 0.5  # kept patches carry their own positions
    m.train()
    m.encode_image(torch.randn(2, 3, 32, 32)).sum().backward()
    assert m.visual.conv1.weight.grad.abs().sum() > 0


def test_image_rope_sees_where_a_patch_is():
    """Moving a patch's content to another place changes the image embedding (RoPE gives positions)."""
    m = models.create_model("tiny-s", image_pos_embed="rope").eval()
    image = torch.zeros(1, 3, 32, 32)
    image[..., :8, :8] = 1.0
    moved = torch.zeros(1, 3, 32, 32)
    moved[..., 24:, 24:] = 1.0
    with torch.no_grad():
        assert not torch.allclose(m.encode_image(image), m.encode_image(moved), atol=1e-4)


def test_bad_position_settings_are_one_line():
    with pytest.raises(ValueError, match=r"model.image_pos_embed='alibi' is not known; use one of learnable, rope"):
        models.create_model("tiny-s", image_pos_embed="alibi")
    with pytest.raises(ValueError, match=r"text_pos_embed=rope needs a head width divisible by 2.* 7 wide"):
        rope.check("text", "rope", 7)
    with pytest.raises(ValueError, match=r"image_pos_embed=rope needs a head width divisible by 4 .* 6 wide"):
        rope.check("image", "rope", 6)
