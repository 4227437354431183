"""Losses against their definitions, gradient accumulation against one big batch, AdamW groups and the schedules."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator

from models import ModelConfig, build_clip
from train.config import ConfigError, OptimConfig
from train.loop import clip_gradients, compute_gradients
from train.loss import ClipLoss, SigLipLoss
from train.optim import (
    build_optimizer,
    check_schedule,
    clamp_logit_scale,
    cooldown_steps,
    follow_schedule,
    lr_multiplier,
    param_groups,
)


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
    decay, no_decay = param_groups(model, OptimConfig(weight_decay=0.2))
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


@pytest.mark.parametrize("shape", ["linear", "cosine"])
def test_const_cooldown_values_at_the_boundaries(shape):
    """Warmup 10, constant to step 90, then 20 cooldown steps down to min_ratio 0.1 at step 110 (and after)."""
    kw = dict(warmup=10, total=110, kind="const-cooldown", min_ratio=0.1, cooldown=20, shape=shape)
    assert lr_multiplier(0, **kw) == pytest.approx(0.1) and lr_multiplier(9, **kw) == pytest.approx(1.0)
    assert [lr_multiplier(s, **kw) for s in (10, 50, 89, 90)] == [1.0, 1.0, 1.0, 1.0]
    quarter = 0.25 if shape == "linear" else 0.5 * (1 - math.cos(math.pi / 4))  # fraction of the fall at step 95
    assert lr_multiplier(95, **kw) == pytest.approx(1 - 0.9 * quarter)
    assert lr_multiplier(100, **kw) == pytest.approx(0.55)
    assert lr_multiplier(110, **kw) == pytest.approx(0.1) and lr_multiplier(500, **kw) == pytest.approx(0.1)
    values = [lr_multiplier(s, **kw) for s in range(90, 111)]
    assert all(a > b for a, b in itertools.pairwise(values))
    other = lr_multiplier(95, **{**kw, "shape": "cosine" if shape == "linear" else "linear"})
    assert other != pytest.approx(lr_multiplier(95, **kw))


def test_const_cooldown_length_from_fraction_or_steps_and_the_optimizer_follows_it():
    model = build_clip(ModelConfig(name="tiny-s"))
    cfg = OptimConfig(lr=1e-3, warmup_steps=2, schedule="const-cooldown", cooldown_fraction=0.25)
    assert cooldown_steps(cfg, 40) == 10 and cooldown_steps(OptimConfig(cooldown_fraction=0.25), 40) == 0
    assert cooldown_steps(OptimConfig(schedule="const-cooldown", cooldown_steps=7), 40) == 7
    optimizer, schedule = build_optimizer(model, cfg, max_steps=40)
    lrs = []
    for _ in range(40):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs[:2] == pytest.approx([5e-4, 1e-3]) and lrs[2:31] == pytest.approx([1e-3] * 29)
    assert lrs[31] == pytest.approx(0.9e-3) and lrs[39] == pytest.approx(0.1e-3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-15)


def test_a_loaded_schedule_follows_the_current_config():
    """A constant run's optimizer/scheduler state loaded under a const-cooldown config: the next step uses the
    cooldown's lr, not the one saved with the optimizer."""
    model = build_clip(ModelConfig(name="tiny-s"))
    optimizer, schedule = build_optimizer(model, OptimConfig(lr=1e-3, warmup_steps=2, schedule="constant"), 100)
    for _ in range(8):
        optimizer.step()
        schedule.step()
    cooled = OptimConfig(lr=1e-3, warmup_steps=2, schedule="const-cooldown", cooldown_steps=4)
    optimizer2, schedule2 = build_optimizer(model, cooled, max_steps=10)
    optimizer2.load_state_dict(optimizer.state_dict())
    schedule2.load_state_dict(schedule.state_dict())
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(1e-3)
    follow_schedule(schedule2)
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(0.5e-3) == schedule2.get_last_lr()[0]
    assert optimizer2.param_groups[1]["lr"] == pytest.approx(0.5e-3)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"cooldown_fraction": 0.001}, "a cooldown of 0 steps"),
        ({"cooldown_steps": 95}, "a cooldown of 95 steps after optim.warmup_steps=10 does not fit"),
    ],
)
def test_a_cooldown_that_does_not_fit_is_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        check_schedule(OptimConfig(warmup_steps=10, schedule="const-cooldown", **changes), 100)
    check_schedule(OptimConfig(warmup_steps=10, schedule="const-cooldown", cooldown_steps=90), 100)


def test_gradient_norm_with_and_without_clipping():
    """Without clip_norm: torch's clip_grad_norm_ value bit for bit, the gradients untouched; with it: scaled."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    model(torch.randn(4, 5)).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    for twin, g in zip(twins, grads, strict=True):
        twin.grad = g.clone()
    norm = clip_gradients(Accelerator(cpu=True), model, None)
    assert norm > 0 and torch.equal(norm, torch.nn.utils.clip_grad_norm_(twins, math.inf))
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    clip_gradients(Accelerator(cpu=True), model, 0.1)
    assert torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]) == pytest.approx(0.1, rel=1e-4)
