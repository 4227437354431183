"""AdamW with CLIP's weight-decay exclusions and a warmup + cosine schedule (Loshchilov & Hutter 2017, 2019), or
warmup + constant + cooldown (open_clip's const-cooldown; Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations")."""

from __future__ import annotations

import difflib
import functools
import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from train import towers
from train.config import ConfigError, OptimConfig

LOGIT_SCALE_MAX = math.log(100)
# parameters named like this are embeddings (or the temperature/bias), never decayed
NO_DECAY_NAMES = ("embedding", "reg_token", "logit_scale", "logit_bias")  # reg_token: ViT registers, as timm


def decays(name: str, param: nn.Parameter, module: nn.Module) -> bool:
    """Weight decay only for matrices of linear/conv layers: not biases, norms, embeddings or the logit scale."""
    if param.ndim < 2 or isinstance(module, (nn.Embedding, nn.LayerNorm, nn.GroupNorm)):
        return False
    return not any(key in name for key in NO_DECAY_NAMES)


def hidden_matrix(name: str, param: nn.Parameter) -> bool:
    """A weight matrix inside a transformer block: what Muon updates. Its authors (Jordan et al. 2024) leave the
    embeddings, the patch projection, the output heads and every vector to AdamW."""
    return param.ndim == 2 and ".resblocks." in f".{name}"


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """The trainable parameters in groups of one learning rate and weight decay (train/towers.py: per-tower rates,
    weight decay and layer decay), each listed once: the decayed ones' groups first, then the others', each in
    the order of model.named_parameters(). Without per-tower settings: [{decayed}, {not decayed}]. For the Muon
    family (MUON), what is not a hidden matrix goes in groups marked use_fallback (timm's Muon: AdamW for them)."""
    owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    blocks = towers.block_counts(model)
    muon = cfg.name in MUON
    groups: dict[tuple[bool, float, float, bool], list] = {}
    named = [(name, p, decays(name, p, owner[id(p)])) for name, p in model.named_parameters() if p.requires_grad]
    for decayed in (True, False):
        for name, p, _ in (item for item in named if item[2] == decayed):
            lr, weight_decay = towers.rate_and_decay(name, decayed, blocks, cfg)
            fallback = muon and not hidden_matrix(name, p)
            groups.setdefault((decayed, lr, weight_decay, fallback), []).append(p)
    return [
        {"params": ps, "lr": lr, "weight_decay": wd, **({"use_fallback": True} if fallback else {})}
        for (_, lr, wd, fallback), ps in groups.items()
    ]


# timm optimizers that need packages this project does not install (bitsandbytes, apex)
NEEDS_EXTRA = ("bnb", "fused")
MUON = ("muon", "nmuon", "adamuon", "nadamuon")  # timm's Muon family: hidden matrices only (hidden_matrix)


def known_optimizers() -> list[str]:
    """optim.name's choices: adamw (torch's, fused) and timm's optimizers that run with what is installed."""
    from timm.optim import list_optimizers

    return ["adamw", *(name for name in list_optimizers() if name != "adamw" and not name.startswith(NEEDS_EXTRA))]


def check_optimizer(cfg: OptimConfig) -> None:
    """An optim.name that is not an optimizer is one ConfigError line that lists the known ones."""
    if cfg.name == "adamw":
        return
    known = known_optimizers()
    if cfg.name not in known:
        close = difflib.get_close_matches(cfg.name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"optim.name={cfg.name!r} is not an optimizer{hint}; known: {', '.join(known)}")


def build_optimizer(model: nn.Module, cfg: OptimConfig, max_steps: int) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """The optimizer over `model` (optim.name) and its LambdaLR schedule (stepped once per optimizer step).

    adamw: torch's AdamW, fused (one kernel for the whole update, its step counts on the device: no host reads)
    unless optim.fused is false (then torch's default: foreach on CUDA, a loop over the tensors on the CPU). torch
    has the fused kernel on CUDA and on the CPU; on the CPU it takes a tiny model's AdamW step from about a quarter
    of the training step to 3% (docs/bench_train.md), with the same updates to a few ulp. Any other name: timm's
    create_optimizer_v2 over the same groups, with optim.betas and optim.eps where the optimizer takes them.
    """
    groups = param_groups(model, cfg)
    if cfg.name == "adamw":
        fused = cfg.fused if cfg.fused is not None else True
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)
    else:
        optimizer = timm_optimizer(groups, cfg)
    # a partial, not a closure or object: LambdaLR then saves no state of it, so a resumed run follows the
    # schedule of its current config, and the state dict holds plain numbers (loadable with weights_only)
    schedule = functools.partial(lr_multiplier, **schedule_arguments(cfg, max_steps))
    return optimizer, LambdaLR(optimizer, schedule)


def timm_optimizer(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    from timm.optim import create_optimizer_v2, get_optimizer_info

    info = get_optimizer_info(cfg.name)
    extra = {"betas": tuple(cfg.betas)} if info.has_betas and info.num_betas == len(cfg.betas) else {}
    if info.has_eps:
        extra["eps"] = cfg.eps
    return create_optimizer_v2(groups, opt=cfg.name, lr=cfg.lr, weight_decay=cfg.weight_decay, **extra)


def schedule_arguments(cfg: OptimConfig, max_steps: int) -> dict:
    """The keyword arguments of lr_multiplier for this optim section and run length."""
    return {
        "warmup": cfg.warmup_steps,
        "total": max_steps,
        "kind": cfg.schedule,
        "min_ratio": cfg.min_lr_ratio,
        "cooldown": cooldown_steps(cfg, max_steps),
        "shape": cfg.cooldown_shape,
    }


def cooldown_steps(cfg: OptimConfig, max_steps: int) -> int:
    """Length of the const-cooldown schedule's cooldown: optim.cooldown_steps, else cooldown_fraction x max_steps."""
    if cfg.schedule != "const-cooldown":
        return 0
    return cfg.cooldown_steps if cfg.cooldown_steps is not None else round(cfg.cooldown_fraction * max_steps)


def check_schedule(cfg: OptimConfig, max_steps: int) -> None:
    """A const-cooldown schedule whose cooldown is empty or overlaps the warmup is a ConfigError."""
    length = cooldown_steps(cfg, max_steps)
    if cfg.schedule != "const-cooldown" or (length >= 1 and cfg.warmup_steps <= max_steps - length):
        return
    raise ConfigError(
        f"optim.schedule=const-cooldown: a cooldown of {length} steps after optim.warmup_steps={cfg.warmup_steps} "
        f"does not fit in train.max_steps={max_steps}; the cooldown needs 1 to max_steps - warmup_steps steps "
        "(set optim.cooldown_steps or optim.cooldown_fraction)"
    )


def lr_multiplier(
    step: int, *, warmup: int, total: int, kind: str, min_ratio: float, cooldown: int = 0, shape: str = "linear"
) -> float:
    """The learning rate of optimizer step `step` (0-based) over optim.lr.

    Linear warmup from 1/warmup to 1; then `cosine` decays to min_ratio at `total`, `constant` stays at 1, and
    `const-cooldown` stays at 1 until `total - cooldown`, then falls to min_ratio at `total` along a line or a
    half cosine (`shape`). min_ratio is reached at step `total`, i.e. after the last step, as in open_clip.
    """
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    if kind == "const-cooldown":
        start = total - cooldown
        if step < start:
            return 1.0
        return decay(min(1.0, (step - start) / max(1, cooldown)), shape, min_ratio)
    return decay(min(1.0, (step - warmup) / max(1, total - warmup)), "cosine", min_ratio)


def schedule_change(saved: dict, cfg: OptimConfig, max_steps: int, step: int) -> str | None:
    """The warning for a run resumed at `step` under another schedule (`saved`: its checkpoint's config), where the
    learning rate would move by more than 10% at once: a finished cosine run extended by raising train.max_steps
    starts again near optim.lr."""
    old = OptimConfig(**{k: v for k, v in saved.get("optim", {}).items() if k in OptimConfig.__dataclass_fields__})
    old_steps = saved.get("train", {}).get("max_steps", max_steps)
    before = old.lr * lr_multiplier(step - 1, **schedule_arguments(old, old_steps))
    after = cfg.lr * lr_multiplier(step, **schedule_arguments(cfg, max_steps))
    if step < 1 or abs(after - before) <= 0.1 * max(before, after):
        return None
    kinds = f", optim.schedule {old.schedule} -> {cfg.schedule}" if old.schedule != cfg.schedule else ""
    return (
        f"warning: resumed at step {step} under another schedule (train.max_steps {old_steps} -> {max_steps}{kinds}): "
        f"the learning rate moves from {before:.2e} to {after:.2e} at once; to extend a finished run, branch a "
        "cooldown from a constant-rate run instead (train.branch_from with optim.schedule=const-cooldown)"
    )


def decay(progress: float, shape: str, min_ratio: float) -> float:
    """From 1 at progress 0 to min_ratio at progress 1: linearly, or along half a cosine."""
    fall = progress if shape == "linear" else 0.5 * (1 - math.cos(math.pi * progress))
    return 1 - (1 - min_ratio) * fall


def keep_configured_rates(optimizer, scheduler: LambdaLR, configured: list[dict]) -> None:
    """After a checkpoint is loaded: each group's base learning rate and weight decay as the current config built
    them (the loaded optimizer and scheduler states carry the checkpoint's), so a rerun with another optim.lr,
    image_lr, text_lr, layer decay or weight_decay trains with it; on an unchanged config this changes nothing."""
    for group, values in zip(optimizer.param_groups, configured, strict=True):
        group.update(values)
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]


def follow_schedule(scheduler: LambdaLR) -> None:
    """Set each group's lr to the schedule's value at the scheduler's step. After a checkpoint is loaded, the next
    step then uses the schedule of the current config (a branch's cooldown) instead of the lr saved with the
    optimizer; on an unchanged schedule this changes nothing."""
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports (and the metrics log)


@torch.no_grad()
def clamp_logit_scale(model: nn.Module) -> None:
    """Keep exp(logit_scale) <= 100 (CLIP, Radford et al. 2021, sec. 2.5); `model` is the unwrapped CLIP."""
    model.logit_scale.clamp_(0, LOGIT_SCALE_MAX)
