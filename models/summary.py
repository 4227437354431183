"""Parameter counts and per-sample multiply-accumulates of a CLIP, for logs and scaling fits.

MACs are counted by running the model once on the meta device (shapes only, no arithmetic) under
torch's FlopCounterMode, which counts every matmul, convolution and attention kernel; a MAC is half
a FLOP. Elementwise work (norms, activations, feature maps, cumulative sums) is not counted, as in
open_clip's published GMACs.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry

aten = torch.ops.aten


def count(params) -> int:
    return sum(p.numel() for p in params)


def summary(model: nn.Module, macs: bool = True) -> dict:
    """{"total", "image", "text", "without_token_embedding", "image_gmacs", "text_gmacs", "gmacs"}.

    Counts are parameters; `text` is everything outside `visual` but the logit scale;
    `without_token_embedding` drops the vocabulary table, which dominates tiny models and is
    left out of scaling fits. GMACs are per sample (one image, one full-context text).
    """
    total = count(model.parameters())
    image = count(model.visual.parameters())
    out = {
        "total": total,
        "image": image,
        "text": total - image - model.logit_scale.numel(),
        "without_token_embedding": total - model.token_embedding.weight.numel(),
    }
    if macs:
        out.update(gmacs_per_sample(model))
    return out


def gmacs_per_sample(model: nn.Module) -> dict:
    """{"image_gmacs", "text_gmacs", "gmacs"} for one image and one text of full context length."""
    from models.clip import build_clip

    if getattr(model, "config", None) is None:
        raise ValueError(
            "gmacs_per_sample: the model has no ModelConfig; build it with models.build_clip or models.create_model"
        )
    with torch.device("meta"):
        shadow = build_clip(dataclasses.replace(model.config, pretrained=None)).eval()
    h, w = shadow.visual.image_size
    image = torch.zeros(1, 3, h, w, device="meta")
    text = torch.zeros(1, shadow.context_length, dtype=torch.long, device="meta")
    with torch.no_grad():
        image_macs = flops(shadow.encode_image, image) / 2e9
        text_macs = flops(shadow.encode_text, text) / 2e9
    return {"image_gmacs": image_macs, "text_gmacs": text_macs, "gmacs": image_macs + text_macs}


def flops(fn, *args) -> int:
    # torch counts baddbmm and addmm but not their in-place forms, which the linear attentions use to
    # accumulate their D x D states: without these the state matmul of every layer goes uncounted
    inplace = {
        aten.baddbmm_: flop_registry[aten.baddbmm].__wrapped__,
        aten.addmm_: flop_registry[aten.addmm].__wrapped__,
    }
    counter = FlopCounterMode(display=False, custom_mapping=inplace)
    with counter:
        fn(*args)
    return counter.get_total_flops()


def format_summary(s: dict) -> str:
    """One log line: parameters in millions, GMACs per sample."""
    parts = [
        f"params {s['total'] / 1e6:.2f}M (image {s['image'] / 1e6:.2f}M, text {s['text'] / 1e6:.2f}M, "
        f"without token embedding {s['without_token_embedding'] / 1e6:.2f}M)"
    ]
    if "gmacs" in s:
        parts.append(f"{s['gmacs']:.3f} GMACs/sample (image {s['image_gmacs']:.3f}, text {s['text_gmacs']:.3f})")
    return ", ".join(parts)
