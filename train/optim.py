"""AdamW with CLIP's weight-decay exclusions and a warmup + cosine schedule (Loshchilov & Hutter 2017, 2019)."""

from __future__ import annotations

import functools
import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from train.config import OptimConfig

LOGIT_SCALE_MAX = math.log(100)
# parameters named like this are embeddings (or the temperature/bias), never decayed
NO_DECAY_NAMES = ("embedding", "logit_scale", "logit_bias")


def decays(name: str, param: nn.Parameter, module: nn.Module) -> bool:
    """Weight decay only for matrices of linear/conv layers: not biases, norms, embeddings or the logit scale."""
    if param.ndim < 2 or isinstance(module, (nn.Embedding, nn.LayerNorm, nn.GroupNorm)):
        return False
    return not any(key in name for key in NO_DECAY_NAMES)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """[{params with decay}, {params without}] over the trainable parameters, each listed once."""
    owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if decays(name, p, owner[id(p)]) else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, max_steps: int, cuda: bool = False
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW over `model` and its LambdaLR schedule (stepped once per optimizer step).

    Fused (one kernel for the whole update, its step counts on the device: no host reads) when optim.fused is
    true, or null and the model trains on CUDA; else torch's default (foreach).
    """
    fused = cfg.fused if cfg.fused is not None else cuda
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None
    )
    # a partial, not a closure or object: LambdaLR then saves no state of it, so a resumed run follows the
    # schedule of its current config, and the state dict holds plain numbers (loadable with weights_only)
    schedule = functools.partial(
        lr_multiplier, warmup=cfg.warmup_steps, total=max_steps, kind=cfg.schedule, min_ratio=cfg.min_lr_ratio
    )
    return optimizer, LambdaLR(optimizer, schedule)


def lr_multiplier(step: int, *, warmup: int, total: int, kind: str, min_ratio: float) -> float:
    """Linear warmup from 1/warmup to 1, then cosine down to min_ratio at `total` (or constant)."""
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def clamp_logit_scale(model: nn.Module) -> None:
    """Keep exp(logit_scale) <= 100 (CLIP, Radford et al. 2021, sec. 2.5); `model` is the unwrapped CLIP."""
    model.logit_scale.clamp_(0, LOGIT_SCALE_MAX)
