"""eval/smoothing.py: the share of token spread each image-tower layer keeps is 0 for a layer that averages every
token alike and 1 for one that passes each token its own value."""

import pytest
import torch

import models
from eval.smoothing import kept_per_layer, spread


def tiny(attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = models.ModelConfig(name="demo-w32-p4", image_size=32, image_attention=attention, text_attention=attention)
    return models.build_clip(cfg).eval()


def test_spread_is_the_share_of_energy_the_tokens_do_not_share():
    same = torch.ones(2, 5, 3)
    assert torch.allclose(spread(same), torch.zeros(2))
    centred = torch.randn(2, 6, 4)
    centred = centred - centred.mean(1, keepdim=True)
    assert torch.allclose(spread(centred), torch.ones(2))
    assert torch.allclose(spread(3 * centred + 1), spread(centred + 1 / 3))  # scale-free


@pytest.mark.parametrize("attention", ["softmax", "linear_affine"])
def test_a_layer_with_equal_weights_keeps_nothing(attention):
    """q = k = 0: softmax and the normalised form weight every token alike, so every output is the mean value."""
    model = tiny(attention)
    for block in model.visual.transformer.resblocks:
        with torch.no_grad():
            block.attn.in_proj_weight[: 2 * block.attn.dim] = 0
            block.attn.in_proj_bias[: 2 * block.attn.dim] = 0
    kept = kept_per_layer(model, torch.randn(3, 3, 32, 32))
    assert len(kept) == len(model.visual.transformer.resblocks) and max(kept) < 1e-6


def test_a_layer_that_passes_each_token_its_value_keeps_everything(monkeypatch):
    model = tiny("softmax")
    for block in model.visual.transformer.resblocks:
        monkeypatch.setattr(block.attn, "attention", lambda q, k, v, key_mask: v)
    kept = kept_per_layer(model, torch.randn(3, 3, 32, 32))
    assert kept == pytest.approx([1.0] * len(kept), abs=1e-5)
    assert all(not block.attn._forward_pre_hooks for block in model.visual.transformer.resblocks)  # hooks removed


def test_the_normalised_study_measures_claim_b_at_257_tokens():
    """configs/study/normalised.yaml: softmax, linear_affine and Eq. 7 at 65 and 257 image tokens, the linear forms
    on budgets that can show 2x softmax's samples (claim (b)'s threshold), smoothing measured after training."""
    from train.study import REPO, load_study

    study = load_study(REPO / "configs" / "study" / "normalised.yaml")
    assert study.attentions == ["softmax", "linear_affine", "linear_affine_nodenom"] and study.smoothing >= 32
    assert list(study.sizes) == ["demo-w32-p4@32px", "demo-w32-p4@64px"]
    steps = {a: study.per_attention[a]["run"]["train.max_steps"] for a in study.attentions}
    assert steps["linear_affine"] >= 2 * steps["softmax"] and steps["linear_affine_nodenom"] >= 2 * steps["softmax"]
    assert len(study.budgets["fractions"]) >= 4  # >= 5 cooled-down budgets per run (issue 45 item 5)
