"""CLIP with pluggable attention: `create_model("ViT-B-16", image_attention="softmax", text_attention="linear_elu")`.

The names below are imported on first use, so `models.config` and `models.attention` (what a config check needs)
load without open_clip, torchvision or timm: `python -m train` answers a config error before those imports.
"""

import importlib

__all__ = [
    "CLIP",
    "ModelConfig",
    "build_clip",
    "create_model",
    "export_open_clip",
    "format_summary",
    "gmacs_per_sample",
    "load_pretrained",
    "read_state_dict",
    "resample_positions",
    "summary",
    "tiny_model_names",
    "tokenizer",
    "tokenizer_key",
    "transforms",
]
LAZY = {
    **dict.fromkeys(["CLIP", "build_clip", "create_model", "tokenizer", "tokenizer_key", "transforms"], "models.clip"),
    **dict.fromkeys(["ModelConfig", "tiny_model_names"], "models.config"),
    **dict.fromkeys(
        ["export_open_clip", "load_pretrained", "read_state_dict", "resample_positions"], "models.pretrained"
    ),
    **dict.fromkeys(["format_summary", "gmacs_per_sample", "summary"], "models.counts"),
}


def __getattr__(name: str):
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    try:  # a submodule (models.run_folder, models.attention) used as an attribute after `import models`
        return importlib.import_module(f"models.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"models.{name}":
            raise
    raise AttributeError(f"module 'models' has no attribute {name!r}")
