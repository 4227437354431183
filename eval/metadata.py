"""Model size, compute and attention kind for evaluation results.

Uses `models.summary` when the model is one of ours; for open_clip models it counts parameters itself and
measures GMACs with torch's FLOP counter on one image and one full-length caption (1 MAC = 2 FLOPs), the
same counting as models.summary.
"""

import torch
from torch.utils.flop_counter import FlopCounterMode


def count(params) -> int:
    return sum(p.numel() for p in params)


def token_embedding_params(model: torch.nn.Module) -> int:
    """Parameters of the text token embedding table(s), which cost memory but no compute."""
    return sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Embedding) and name.split(".")[-1] == "token_embedding"
    )


def image_size(model: torch.nn.Module) -> tuple[int, int]:
    size = getattr(getattr(model, "visual", None), "image_size", 224)
    return tuple(size) if isinstance(size, (tuple, list)) else (size, size)


@torch.no_grad()
def gmacs_per_sample(model: torch.nn.Module) -> dict[str, float]:
    """GMACs of encoding one image and one full-length caption, measured by torch.utils.flop_counter."""
    device = next(model.parameters()).device
    image = torch.zeros(1, 3, *image_size(model), device=device)
    tokens = torch.zeros(1, getattr(model, "context_length", 77), dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    result = {}
    for tower, run in (("image", lambda: model.encode_image(image)), ("text", lambda: model.encode_text(tokens))):
        counter = FlopCounterMode(display=False)
        with counter:
            run()
        result[tower] = counter.get_total_flops() / 2e9
    model.train(was_training)
    return {
        "gmacs_per_sample": result["image"] + result["text"],
        "image_gmacs": result["image"],
        "text_gmacs": result["text"],
    }


def describe(model: torch.nn.Module, model_cfg=None) -> dict:
    """Parameters (total, per tower, without the token embedding), GMACs per sample, the attention of each tower."""
    if hasattr(model, "config") and hasattr(model, "token_embedding"):
        import models

        s = models.summary(model)
        out = {
            "params": s["total"],
            "params_image": s["image"],
            "params_text": s["text"],
            "params_without_token_embedding": s["without_token_embedding"],
            "gmacs_per_sample": s["gmacs"],
            "image_gmacs": s["image_gmacs"],
            "text_gmacs": s["text_gmacs"],
        }
    else:
        total, image = count(model.parameters()), count(model.visual.parameters())
        out = {
            "params": total,
            "params_image": image,
            "params_text": total - image - model.logit_scale.numel(),
            "params_without_token_embedding": total - token_embedding_params(model),
            **gmacs_per_sample(model),
        }
    cfg = model_cfg or getattr(model, "config", None)
    out["image_attention"] = getattr(cfg, "image_attention", "softmax")
    out["text_attention"] = getattr(cfg, "text_attention", "softmax")
    return out
