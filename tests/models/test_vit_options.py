"""Options that shape attention (issue 47): LayerScale, qk-norm, mean pooling. LayerScale and mean pooling are
open_clip's ls_init_value and pool_type avg (strict loading, the same embeddings); qk-norm normalises each head's
q and k before any attention of the registry."""

import copy

import open_clip
import pytest
import torch

import models
from models import ModelConfig, build_clip
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
    with pytest.raises(ConfigError, match=r"^model.image_pool='max' is not known; use one of cls, mean$"):
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
