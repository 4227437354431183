"""Losses against their definitions, gradient accumulation against one big batch, AdamW groups and the schedule."""

import math

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator

from models import ModelConfig, build_clip
from train.config import OptimConfig
from train.loop import compute_gradients
from train.loss import ClipLoss, SigLipLoss
from train.optim import build_optimizer, clamp_logit_scale, lr_multiplier, param_groups


def features(n=6, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1),
        F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1),
    )


def test_clip_loss_is_symmetric_infonce():
    img, txt = features()
    scale = torch.tensor(10.0, dtype=torch.float64)
    logits = scale * img @ txt.T
    expected = 0.0
    for i in range(len(img)):
        expected -= torch.log_softmax(logits[i], 0)[i] / (2 * len(img))
        expected -= torch.log_softmax(logits[:, i], 0)[i] / (2 * len(img))
    assert torch.allclose(ClipLoss()(img, txt, scale).double(), expected, atol=1e-6)


def test_siglip_loss_is_pairwise_sigmoid():
    img, txt = features()
    scale, bias = torch.tensor(10.0), torch.tensor(-10.0)
    expected = 0.0
    for i in range(len(img)):
        for j in range(len(txt)):
            z = 1.0 if i == j else -1.0
            expected -= math.log(torch.sigmoid(z * (scale * img[i] @ txt[j] + bias)).item())
    assert SigLipLoss()(img, txt, scale, bias).item() == pytest.approx(expected / len(img), rel=1e-5)


@pytest.mark.parametrize("loss_name", ["clip", "siglip"])
def test_accumulation_equals_one_big_batch(loss_name):
    """2 micro-batches of 4 give the gradients of one batch of 8 (open_clip's --accum-freq), not of two halves."""
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="tiny-s"))
    model.logit_bias = torch.nn.Parameter(torch.tensor(-10.0)) if loss_name == "siglip" else None
    loss_fn = ClipLoss() if loss_name == "clip" else SigLipLoss()
    images, tokens = torch.randn(8, 3, 32, 32), torch.randint(1, 1000, (8, 32))
    accelerator = Accelerator(cpu=True)

    def grads(micro_batches):
        model.zero_grad(set_to_none=True)
        compute_gradients(accelerator, model, loss_fn, micro_batches, logit_bias=model.logit_bias)
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    whole = grads([(images, tokens)])
    accumulated = grads([(images[:4], tokens[:4]), (images[4:], tokens[4:])])
    assert whole.keys() == accumulated.keys() and len(whole) == len(list(model.parameters()))
    for name in whole:
        assert torch.allclose(whole[name], accumulated[name], atol=1e-5, rtol=1e-4), name
    first, second = grads([(images[:4], tokens[:4])]), grads([(images[4:], tokens[4:])])
    naive = {n: (first[n] + second[n]) / 2 for n in whole}  # averaging the losses of the halves
    assert not torch.allclose(naive["visual.proj"], whole["visual.proj"], atol=1e-5)


def test_no_weight_decay_on_biases_norms_embeddings_and_logit_scale():
    model = build_clip(ModelConfig(name="tiny-s"))
    decay, no_decay = param_groups(model, 0.2)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    assert len(decayed) + len(kept) == len(names)
    for name in (
        "logit_scale",
        "positional_embedding",
        "token_embedding.weight",
        "visual.class_embedding",
        "visual.positional_embedding",
        "ln_final.weight",
        "ln_final.bias",
        "visual.transformer.resblocks.0.attn.in_proj_bias",
    ):
        assert name in kept, name
    for name in (
        "visual.transformer.resblocks.0.attn.in_proj_weight",
        "transformer.resblocks.0.mlp.c_fc.weight",
        "text_projection",
        "visual.proj",
        "visual.conv1.weight",
    ):
        assert name in decayed, name


def test_warmup_then_cosine_and_logit_scale_clamp():
    kw = dict(warmup=10, total=110, kind="cosine", min_ratio=0.0)
    assert lr_multiplier(0, **kw) == pytest.approx(0.1)
    assert lr_multiplier(9, **kw) == pytest.approx(1.0)
    assert lr_multiplier(60, **kw) == pytest.approx(0.5)
    assert lr_multiplier(110, **kw) == pytest.approx(0.0, abs=1e-12)
    model = build_clip(ModelConfig(name="tiny-s"))
    optimizer, _schedule = build_optimizer(model, OptimConfig(lr=1e-3, warmup_steps=10), max_steps=110)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4) and tuple(optimizer.param_groups[0]["betas"]) == (
        0.9,
        0.98,
    )
    with torch.no_grad():
        model.logit_scale.fill_(7.0)
    clamp_logit_scale(model)
    assert model.logit_scale.item() == pytest.approx(math.log(100))
