"""Options that shape attention (issue 47): LayerScale, qk-norm, mean pooling. LayerScale and mean pooling are
open_clip's ls_init_value and pool_type avg (strict loading, the same embeddings); qk-norm normalises each head's
q and k before any attention of the registry."""

import copy

import open_clip
import pytest
import torch

import models
from models import ModelConfig, build_clip
from models.attention import ATTENTIONS
from train.config import ConfigError, build_config


def test_layer_scale_and_mean_pooling_are_open_clips():
    size = copy.deepcopy(open_clip.get_model_config("tiny-s"))
    size["vision_cfg"].update(ls_init_value=0.1, pool_type="avg")
    size["text_cfg"].update(ls_init_value=0.1)
    torch.manual_seed(0)
    theirs = open_clip.model.CLIP(**size).eval()
    with torch.no_grad():  # not the init value everywhere, so that a swapped gamma would show
        for name, p in theirs.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.05, 0.5)
    ours = build_clip(ModelConfig(name="tiny-s", layer_scale=0.1, image_pool="mean")).eval()
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    images, text = torch.randn(2, 3, 32, 32), models.tokenizer("tiny-s")(["a red circle", "two blue squares"])
    with torch.no_grad():
        assert (ours.encode_image(images) - theirs.encode_image(images)).abs().max() <= 1e-5
        assert (ours.encode_text(text) - theirs.encode_text(text)).abs().max() <= 1e-5
        plain = build_clip(ModelConfig(name="tiny-s", layer_scale=0.1))
        plain.load_state_dict(theirs.state_dict())
        assert (plain.eval().encode_image(images) - theirs.encode_image(images)).abs().max() > 1e-3  # cls != mean


# one of each way a layer reaches its token mixing: base.forward with a pure function (softmax, a dispatched linear
# op, a feature map turned by RoPE's form), a layer owning parameters (linformer, gla), fastmax's own forward
QK_NORM = ["softmax", "linear_affine_nodenom", "linear_elu", "linformer", "gla", "retention_2d", "fastmax_released"]


@pytest.mark.parametrize("name", QK_NORM)
def test_qk_norm_normalises_q_and_k_before_the_attention(name):
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="tiny-s", image_attention=name, qk_norm=True))
    attn = model.visual.transformer.resblocks[0].attn
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.setdefault("q", o))
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
    model.encode_image(torch.randn(2, 3, 32, 32)).sum().backward()
    q = seen["q"]  # [B, H, N, D], each head's vectors normalised over D
    assert torch.allclose(q.mean(-1), torch.zeros(()), atol=1e-5) and torch.allclose(
        q.var(-1, unbiased=False), torch.ones(()), atol=1e-3
    )
    assert attn.q_norm.weight.grad is not None and attn.k_norm.weight.grad is not None
    assert "visual.transformer.resblocks.0.attn.q_norm.weight" in model.state_dict()


def test_unknown_pool_and_qk_norm_without_projections_are_one_line():
    with pytest.raises(ConfigError, match=r"^model.image_pool='max' is not known; use one of cls, mean, map$"):
        build_config({"model": {"image_pool": "max"}})
    with pytest.raises(ValueError, match=r"no q and k to normalise: drop model\.qk_norm"):
        build_clip(
            ModelConfig(
                name="tiny-s",
                image_attention="fastmax_released",
                image_attention_options={"projections": False},
                qk_norm=True,
            )
        )


# registers (Darcet et al. 2024) and attention pooling (timm's map), issue 47 item 5
IMAGE = [n for n in ATTENTIONS if ATTENTIONS[n].supports_bidirectional]


@pytest.mark.parametrize("name", IMAGE)
def test_registers_and_map_pooling_train_with_every_image_attention(name):
    """Two registers and the MAP head with each attention the image tower takes: the registers are in the tokens it
    mixes (1 + 2 + 16), the class token's output depends on them, and they and the pool's weights learn."""
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="tiny-s", image_attention=name, image_registers=2, image_pool="map"))
    seen = {}
    model.visual.transformer.resblocks[0].attn.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    model.encode_image(torch.randn(2, 3, 32, 32)).sum().backward()
    assert seen["x"].shape[1] == 1 + 2 + 16
    assert model.visual.reg_token.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.visual.attn_pool.parameters())


def test_registers_follow_the_class_token_without_positions_as_timm():
    """[cls, registers, patches], the registers given no position (the table stays open_clip's 1 + grid rows, so an
    open_clip checkpoint loads with only reg_token fresh), kept by patch dropout, angle 0 under RoPE, out of the
    mean pool; retention_2d's grid starts after them."""
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="tiny-s", image_registers=3, patch_dropout=0.5, image_pool="mean"))
    plain = build_clip(ModelConfig(name="tiny-s"))
    missing = model.load_state_dict(plain.state_dict(), strict=False)
    assert missing.missing_keys == ["visual.reg_token"] and not missing.unexpected_keys
    seen = {}
    model.visual.transformer.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    model.train().encode_image(torch.randn(2, 3, 32, 32))
    x, reg = seen["x"], model.visual.ln_pre(model.visual.reg_token)
    assert x.shape[1] == 1 + 3 + 8 and torch.allclose(x[:, 1:4], reg.expand(2, -1, -1), atol=1e-6)
    rope_model = build_clip(ModelConfig(name="tiny-s", image_registers=3, image_pos_embed="rope"))
    cos, sin = rope_model.visual.rope_table(torch.randn(1, 3, 32, 32), None)
    assert cos.shape[0] == 1 + 3 + 16 and (cos[:4] == 1).all() and (sin[:4] == 0).all() and (sin[4:] != 0).any()
    grid = build_clip(ModelConfig(name="tiny-s", image_registers=3, image_attention="retention_2d"))
    assert grid.visual.transformer.resblocks[0].attn.options["prefix_tokens"] == 4
    tokens = torch.randn(2, 1 + 3 + 16, 64)
    expected = model.visual.ln_post(tokens[:, 4:]).mean(1)
    assert torch.allclose(model.visual.pooled(tokens), expected)


def test_map_pooling_is_timms_attention_pool_latent_both_ways():
    from timm.layers import AttentionPoolLatent

    torch.manual_seed(0)
    ours = build_clip(ModelConfig(name="tiny-s", image_pool="map")).visual.attn_pool.eval()
    theirs = AttentionPoolLatent(64, num_heads=2, mlp_ratio=4.0).eval()
    x = torch.randn(2, 17, 64)
    assert (ours(x) - theirs(x)).abs().max() > 1e-3  # different weights: the comparison below can fail
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)
    torch.manual_seed(1)
    again = AttentionPoolLatent(64, num_heads=2, mlp_ratio=4.0).eval()
    ours.load_state_dict(again.state_dict(), strict=True)
    assert torch.allclose(ours(x), again(x), atol=1e-6)


def test_negative_registers_are_one_line():
    with pytest.raises(ConfigError, match=r"^model.image_registers=-1 is out of range"):
        build_config({"model": {"image_registers": -1}})
