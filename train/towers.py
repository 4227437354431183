"""Locking a tower and per-tower optimizer settings: LiT-style locking (Zhai et al. 2022), per-tower learning rates
and weight decay (open_clip issue #707), layer-wise learning-rate decay (BEiT, EVA-CLIP), with open_clip's key names.

A tower is split into groups in depth order, as open_clip's `lock` splits it:

    image: [class_embedding, positional_embedding, conv1, ln_pre], block 0, ..., block L-1, [ln_post, proj]
    text:  [token_embedding, positional_embedding], block 0, ..., block L-1, [ln_final, text_projection]

`optim.lock_image` freezes the image tower's groups but its last `optim.lock_image_unlocked_groups`; `optim.lock_text`
the text tower's but its last `optim.lock_text_unlocked_layers` (open_clip counts the text tower's last block and
ln_final as one group; here every block is a group and the head another, the same split in both towers). With
`optim.lock_text_freeze_layer_norm` (or `optim.lock_image_freeze_layer_norm`) the LayerNorms of the unlocked groups
stay frozen too; the towers have no BatchNorm, so open_clip's `lock_image_freeze_bn_stats` has nothing to do here.
A frozen parameter gets requires_grad=False: no gradient, no optimizer state, bit-identical weights.

Group g of a tower with G groups trains at lr_tower * layer_decay_tower ** (G - 1 - g): the head at the tower's rate,
each block below it `layer_decay` times slower. The logit scale (and bias) train at optim.lr without weight decay.
"""

from __future__ import annotations

import re

from torch import nn

from train.config import OptimConfig

TOWERS = ("image", "text")
SHARED = ("logit_scale", "logit_bias")
FIRST = ("class_embedding", "positional_embedding", "reg_token", "conv1", "ln_pre", "token_embedding")  # group 0
BLOCK = re.compile(r"transformer\.resblocks\.(\d+)\.")


def tower_of(name: str) -> str | None:
    """ "image" or "text" for a parameter name of models.CLIP (open_clip's names), None for the logit scale/bias."""
    if name in SHARED:
        return None
    return "image" if name.startswith("visual.") else "text"


def group_of(name: str, blocks: int) -> int:
    """The parameter's group in its tower: 0 the embeddings, 1 + i block i, blocks + 1 the head."""
    found = BLOCK.search(name)
    if found:
        return 1 + int(found[1])
    local = name.removeprefix("visual.").split(".")[0]
    return 0 if local in FIRST else blocks + 1


def block_counts(model: nn.Module) -> dict[str, int]:
    """Blocks of each tower, from the parameter names."""
    counts = dict.fromkeys(TOWERS, 0)
    for name, _ in model.named_parameters():
        found = BLOCK.search(name)
        if found and tower_of(name):
            counts[tower_of(name)] = max(counts[tower_of(name)], int(found[1]) + 1)
    return counts


def lock_towers(model: nn.Module, cfg: OptimConfig) -> None:
    """Freeze what optim.lock_image / optim.lock_text ask for (requires_grad=False)."""
    blocks = block_counts(model)
    locks = {
        "image": (cfg.lock_image, cfg.lock_image_unlocked_groups, cfg.lock_image_freeze_layer_norm),
        "text": (cfg.lock_text, cfg.lock_text_unlocked_layers, cfg.lock_text_freeze_layer_norm),
    }
    norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)}
    for name, p in model.named_parameters():
        tower = tower_of(name)
        if tower is None or not locks[tower][0]:
            continue
        _, unlocked, freeze_norm = locks[tower]
        groups = blocks[tower] + 2
        if group_of(name, blocks[tower]) < groups - unlocked or (freeze_norm and id(p) in norms):
            p.requires_grad_(False)


def tower_settings(cfg: OptimConfig) -> dict[str | None, tuple[float, float, float]]:
    """(learning rate, weight decay, layer decay) of each tower; None: the logit scale and bias."""
    return {
        "image": (cfg.image_lr or cfg.lr, pick(cfg.image_weight_decay, cfg.weight_decay), cfg.image_layer_decay),
        "text": (cfg.text_lr or cfg.lr, pick(cfg.text_weight_decay, cfg.weight_decay), cfg.text_layer_decay),
        None: (cfg.lr, 0.0, 1.0),
    }


def pick(value, default):
    return default if value is None else value


def rate_and_decay(name: str, decays: bool, blocks: dict[str, int], cfg: OptimConfig) -> tuple[float, float]:
    """(learning rate, weight decay) of one trainable parameter; `decays`: whether it takes weight decay at all."""
    tower = tower_of(name)
    lr, weight_decay, layer_decay = tower_settings(cfg)[tower]
    if tower is not None and layer_decay != 1.0:
        groups = blocks[tower] + 2
        lr *= layer_decay ** (groups - 1 - group_of(name, blocks[tower]))
    return lr, weight_decay if decays else 0.0


def trainable_line(model: nn.Module) -> str:
    """ "trainable parameters: N of M (image tower: a of b; text tower: c of d)"."""
    counts = {tower: [0, 0] for tower in (*TOWERS, None)}
    for name, p in model.named_parameters():
        counts[tower_of(name)][1] += p.numel()
        counts[tower_of(name)][0] += p.numel() if p.requires_grad else 0
    trained, total = (sum(c[i] for c in counts.values()) for i in (0, 1))
    towers = "; ".join(f"{tower} tower: {counts[tower][0]:,} of {counts[tower][1]:,}" for tower in TOWERS)
    return f"trainable parameters: {trained:,} of {total:,} ({towers})"
