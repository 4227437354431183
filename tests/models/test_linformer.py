"""Linformer: the length limit, gradients of the token projections, padding anywhere, image-tower size."""

import math

import pytest
import torch

from models.attention import build_attention

DIM, HEADS = 32, 4


def test_longer_input_than_max_length_is_refused():
    m = build_attention("linformer", DIM, HEADS, length=8, max_length=16)
    with pytest.raises(ValueError, match=r"17 tokens exceed max_length=16; build it with option max_length >= 17"):
        m(torch.randn(1, 17, DIM))
    q = torch.randn(1, HEADS, 17, DIM // HEADS)
    with pytest.raises(ValueError, match="max_length=16"):
        m.attention_reference(q, q, q, None)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="option length=0 must be a positive integer"):
        build_attention("linformer", DIM, HEADS, length=0)
    with pytest.raises(ValueError, match="unknown options start; it takes length and max_length"):
        build_attention("linformer", DIM, HEADS, start="zero")


def test_projections_get_gradients_on_the_columns_in_use():
    m = build_attention("linformer", DIM, HEADS, length=8, max_length=32)
    assert m.proj_k.shape == m.proj_v.shape == (8, 32)
    m(torch.randn(2, 20, DIM)).square().sum().backward()
    for p in (m.proj_k, m.proj_v):
        assert (p.grad[:, :20].abs().sum(0) > 0).all()  # every token column in use learns
        assert (p.grad[:, 20:] == 0).all()  # columns past N take no part


def test_init_is_xavier_uniform_with_gain_one_over_sqrt2():
    m = build_attention("linformer", DIM, HEADS, length=64, max_length=256)
    bound = math.sqrt(6 / (64 + 256)) / math.sqrt(2)
    assert m.proj_k.abs().max() <= bound
    assert abs(m.proj_k.std().item() - bound / math.sqrt(3)) < 0.05 * bound
    assert not torch.equal(m.proj_k, m.proj_v)


def test_padding_in_the_middle_is_ignored():
    m = build_attention("linformer", DIM, HEADS, length=8, max_length=32)
    x = torch.randn(2, 12, DIM)
    key_mask = torch.ones(2, 12, dtype=torch.bool)
    key_mask[:, 3:6] = False
    x2 = x.clone()
    x2[:, 3:6] = 100 * torch.randn(2, 3, DIM)
    real = key_mask[0]
    torch.testing.assert_close(m(x2, key_mask)[:, real], m(x, key_mask)[:, real])
    assert not torch.allclose(m(x, key_mask)[:, real], m(x)[:, real])


def image_tower(max_length: int):
    """A /16 image tower at 224 px (197 tokens: class + 14 x 14 patches) with linformer projected to 64."""
    from models.vit import VisionTransformer

    return VisionTransformer(
        image_size=224,
        patch_size=16,
        width=64,
        heads=4,
        output_dim=16,
        attentions=["linformer"],
        options=[{"length": 64, "max_length": max_length}],
    )


def test_works_as_image_tower_attention():
    """A /16 image tower at 224 px has 197 tokens (class + 14 x 14 patches); projected to 64."""
    torch.manual_seed(0)
    tower = image_tower(max_length=197)
    m = tower.transformer.resblocks[0].attn
    assert m.proj_k.shape == (64, 197)
    y = tower(torch.randn(2, 3, 224, 224))
    assert y.shape == (2, 16) and torch.isfinite(y).all()
    y.square().sum().backward()
    assert (m.proj_k.grad.abs().sum(0) > 0).all() and (m.proj_v.grad.abs().sum(0) > 0).all()
    q, k, v = (torch.randn(2, 4, 197, 16, dtype=torch.float64) for _ in range(3))
    m64 = build_attention("linformer", 64, 4, length=64, max_length=197).double()
    m64.load_state_dict(m.state_dict())
    out = m.attention(q.float(), k.float(), v.float(), None)
    torch.testing.assert_close(out.double(), m64.attention_reference(q, k, v, None), rtol=1e-5, atol=1e-5)
    small = image_tower(max_length=196)
    with pytest.raises(ValueError, match="197 tokens exceed max_length=196"):
        small(torch.randn(1, 3, 224, 224))
