"""CLIP with pluggable attention: `create_model("ViT-B-16", image_attention="softmax", text_attention="linear_elu")`."""

from models.clip import CLIP, build_clip, create_model, tokenizer, transforms
from models.config import ModelConfig, tiny_model_names
from models.pretrained import export_open_clip, load_pretrained, read_state_dict, resample_positions
from models.summary import format_summary, gmacs_per_sample, summary

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
    "transforms",
]
