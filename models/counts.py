"""The size and compute of a CLIP: the one vocabulary that run summaries, eval results and scaling fits use.

    summary(model) -> {"params", "params_image", "params_text", "params_without_token_embedding",
                       "image_gmacs", "text_gmacs", "gmacs_per_sample", "image_attention", "text_attention"}

MACs are counted under torch's FlopCounterMode, which counts every matmul, convolution and attention kernel;
a MAC is half a FLOP. Elementwise work (norms, activations, feature maps, cumulative sums) is not counted, as
in open_clip's published GMACs. Our models (built from a ModelConfig) are counted on the meta device (shapes
only, no arithmetic), and so is any other CLIP whose forward(image, text) takes None for either (open_clip's
models): its tensors are stood in for by meta tensors, so the model itself is not touched.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from models.clip import build_clip

aten = torch.ops.aten

KEYS = (
    "params",
    "params_image",
    "params_text",
    "params_without_token_embedding",
    "params_trainable",
    "image_gmacs",
    "text_gmacs",
    "gmacs_per_sample",
    "image_attention",
    "text_attention",
)


def count(params) -> int:
    return sum(p.numel() for p in params)


def token_embedding_params(model: nn.Module) -> int:
    """Parameters of the text token embedding table(s): memory, but no compute."""
    return sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding) and name.split(".")[-1] == "token_embedding"
    )


def summary(model: nn.Module, macs: bool = True) -> dict:
    """Parameters, GMACs per sample and the attention of each tower (keys in `KEYS`).

    `params_text` is everything outside `visual` but the logit scale (and bias); `params_without_token_embedding`
    drops the vocabulary table, which dominates tiny models and is left out of scaling fits. GMACs are per
    sample: one image and one text of full context length. `macs=False` leaves the three GMACs keys out.
    Attentions: the registry names of the model's ModelConfig, "softmax" for a model without one.
    """
    total = count(model.parameters())
    image = count(model.visual.parameters())
    scalars = count(p for name, p in model.named_parameters() if name in ("logit_scale", "logit_bias"))
    cfg = getattr(model, "config", None)
    out = {
        "params": total,
        "params_image": image,
        "params_text": total - image - scalars,
        "params_without_token_embedding": total - token_embedding_params(model),
        "params_trainable": count(p for p in model.parameters() if p.requires_grad),  # less with optim.lock_*
    }
    if macs:
        out.update(gmacs_per_sample(model))
    out["image_attention"] = getattr(cfg, "image_attention", "softmax")
    out["text_attention"] = getattr(cfg, "text_attention", "softmax")
    return out


def gmacs_per_sample(model: nn.Module) -> dict:
    """{"image_gmacs", "text_gmacs", "gmacs_per_sample"} for one image and one text of full context length."""
    if getattr(model, "config", None) is not None:
        with torch.device("meta"):
            shadow = build_clip(dataclasses.replace(model.config, pretrained=None)).eval()
        return _measure(shadow.visual, shadow.context_length, shadow.encode_image, shadow.encode_text)
    if not hasattr(model, "visual"):
        raise ValueError(
            "gmacs_per_sample: the model is neither ours (models.build_clip) nor a CLIP with a `visual` tower "
            "whose forward(image, text) takes None for either; build it with models.create_model or open_clip"
        )
    # The same counting as for ours: every tensor on the meta device (no copy, no arithmetic), through the
    # model's forward(image, None) and forward(None, text). On real CPU tensors some fused kernels (the
    # eval-mode fast path of nn.MultiheadAttention, CPU flash attention) would escape the counter.
    meta = {name: torch.empty_like(t, device="meta") for name, t in (*model.named_parameters(), *model.named_buffers())}

    def run(image, text):
        return torch.func.functional_call(model, meta, (image, text))

    return _measure(model.visual, getattr(model, "context_length", 77), lambda x: run(x, None), lambda t: run(None, t))


def _measure(visual: nn.Module, context_length: int, encode_image, encode_text) -> dict:
    size = getattr(visual, "image_size", 224)
    h, w = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    image = torch.zeros(1, 3, h, w, device="meta")
    text = torch.zeros(1, context_length, dtype=torch.long, device="meta")
    with torch.no_grad():
        image_macs = flops(encode_image, image) / 2e9
        text_macs = flops(encode_text, text) / 2e9
    return {"image_gmacs": image_macs, "text_gmacs": text_macs, "gmacs_per_sample": image_macs + text_macs}


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
        f"params {s['params'] / 1e6:.2f}M (image {s['params_image'] / 1e6:.2f}M, text {s['params_text'] / 1e6:.2f}M, "
        f"without token embedding {s['params_without_token_embedding'] / 1e6:.2f}M)"
    ]
    if "gmacs_per_sample" in s:
        parts.append(
            f"{s['gmacs_per_sample']:.3f} GMACs/sample (image {s['image_gmacs']:.3f}, text {s['text_gmacs']:.3f})"
        )
    return ", ".join(parts)
