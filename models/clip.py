"""Two-tower CLIP (Radford et al. 2021) with the attention of each tower chosen from the registry.

With `softmax` in both towers the model is open_clip's `CLIP` for the same size: same state-dict keys,
same outputs, so checkpoints move between the two (see models/pretrained.py).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import run_folder
from models.blocks import BlockOptions
from models.config import ModelConfig, layer_attentions, layer_options, open_clip_with_sizes, resolved_size
from models.pretrained import load_pretrained, read_state_dict
from models.text import TextTower
from models.vit import VisionTransformer

open_clip_with_sizes()  # the tiny sizes of configs/models/ known to open_clip (create_model, get_tokenizer)


class CLIP(TextTower):
    """Image tower `visual`, text tower (inherited, at the top level as in open_clip), learnable logit scale.

    forward(image [B, 3, H, W], text [B, L] ids) -> (image_features [B, E], text_features [B, E],
    logit_scale exp'd [1]); features are L2-normalised, as open_clip's CLIP returns them.

    Scalar parameters (the logit scale, SigLIP's logit bias) are held as shape [1], not 0-dim as in open_clip:
    torch's fully_shard (FSDP2) refuses 0-dim parameters. Loading converts open_clip's 0-dim tensors (same
    keys); `export_open_clip` writes them back 0-dim.
    """

    def __init__(self, *, embed_dim: int, visual: VisionTransformer, text: dict, config: ModelConfig | None = None):
        super().__init__(output_dim=embed_dim, **text)
        self.visual = visual
        self.embed_dim = embed_dim
        self.config = config
        self.logit_scale = nn.Parameter(torch.full((1,), math.log(1 / 0.07)))
        self.register_load_state_dict_pre_hook(scalars_as_vectors)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.visual.transformer.grad_checkpointing = enable
        self.transformer.grad_checkpointing = enable

    def encode_image(self, image: Tensor, normalize: bool = False) -> Tensor:
        """[B, 3, H, W] -> [B, E]."""
        x = self.visual(image)
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, text: Tensor, normalize: bool = False) -> Tensor:
        """[B, L] token ids -> [B, E]."""
        x = self.encode_text_features(text)
        return F.normalize(x, dim=-1) if normalize else x

    def forward(
        self, image: Tensor | None = None, text: Tensor | None = None
    ) -> tuple[Tensor | None, Tensor | None, Tensor]:
        image_features = self.encode_image(image, normalize=True) if image is not None else None
        text_features = self.encode_text(text, normalize=True) if text is not None else None
        return image_features, text_features, self.logit_scale.exp()


def scalars_as_vectors(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Load hook: a 0-dim tensor (open_clip's logit_scale / logit_bias) for a [1] parameter becomes [1]."""
    for name, param in module.named_parameters(recurse=False):
        value = state_dict.get(prefix + name)
        if value is not None and value.ndim == 0 and tuple(param.shape) == (1,):
            state_dict[prefix + name] = value.reshape(1)


def tower_heads(name: str, tower: str, width: int, heads: int | None = None, head_width: int | None = None) -> int:
    """Head count of a tower: given directly (text) or as width / head_width (image, open_clip's rule)."""
    if heads is None:
        if width % head_width:
            raise ValueError(
                f"model size {name!r}: {tower} tower width {width} is not divisible by head width {head_width}; "
                "set vision_cfg.head_width to a divisor of the width"
            )
        heads = width // head_width
    if width % heads:
        raise ValueError(
            f"model size {name!r}: {tower} tower width {width} is not divisible by {heads} heads; "
            "pick a width that is a multiple of the head count"
        )
    return heads


def build_clip(cfg: ModelConfig) -> CLIP:
    """The CLIP that `cfg` names; loads `cfg.pretrained` (matching names and shapes) when set."""
    size = resolved_size(cfg)
    v, t = size["vision_cfg"], size["text_cfg"]
    quick_gelu = size.get("quick_gelu", False)
    image_names = layer_attentions("image", cfg.image_attention, v["layers"], causal=False)
    text_names = layer_attentions("text", cfg.text_attention, t["layers"], causal=True)
    image_heads = tower_heads(cfg.name, "image", v["width"], head_width=v.get("head_width", 64))
    text_heads = tower_heads(cfg.name, "text", t["width"], heads=t["heads"])
    prefix = 1 + cfg.image_registers  # the class token and the registers, before the patch grid
    image_tokens = (v["image_size"] // v["patch_size"]) ** 2 + prefix
    image_options = layer_options(
        "image", image_names, cfg.image_attention_options, image_tokens, cfg.attention_impl, prefix=prefix
    )
    visual = VisionTransformer(
        image_size=v["image_size"],
        patch_size=v["patch_size"],
        width=v["width"],
        heads=image_heads,
        output_dim=size["embed_dim"],
        attentions=image_names,
        options=image_options,
        block=BlockOptions(v.get("mlp_ratio", 4.0), quick_gelu, cfg.layer_scale, cfg.qk_norm),
        patch_dropout=cfg.patch_dropout or v.get("patch_dropout", 0.0),
        pos_embed=cfg.image_pos_embed,
        pool=cfg.image_pool,
        registers=cfg.image_registers,
    )
    text = dict(
        context_length=t["context_length"],
        vocab_size=t["vocab_size"],
        width=t["width"],
        heads=text_heads,
        attentions=text_names,
        options=layer_options("text", text_names, cfg.text_attention_options, t["context_length"], cfg.attention_impl),
        block=BlockOptions(t.get("mlp_ratio", 4.0), quick_gelu, cfg.layer_scale, cfg.qk_norm),
        pos_embed=cfg.text_pos_embed,
    )
    model = CLIP(embed_dim=size["embed_dim"], visual=visual, text=text, config=cfg)
    model.set_grad_checkpointing(cfg.grad_checkpointing)
    if cfg.pretrained:
        load_pretrained(model, cfg.pretrained, text_keep=cfg.text_pos_keep, fresh=cfg.pretrained_fresh)
    return model


def create_model(
    name: str, image_attention: str | list[str] = "softmax", text_attention: str | list[str] = "softmax", **options
) -> CLIP:
    """Like `open_clip.create_model(name)`: a size name and registry names in, the model out.

    `options` are the other `ModelConfig` fields (image_attention_options, grad_checkpointing, ...).
    """
    known = {f.name for f in dataclasses.fields(ModelConfig)} - {"name", "image_attention", "text_attention"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"create_model: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return build_clip(ModelConfig(name=name, image_attention=image_attention, text_attention=text_attention, **options))


def load_checkpoint(path, ema: bool = False) -> CLIP:
    """The CLIP of one of our checkpoint folders or run directories (its newest complete checkpoint), rebuilt from
    the config in its meta.json, with its weights (model.safetensors) or, with `ema`, the EMA of them that a run with
    train.ema keeps (ema.safetensors); each file checked against the manifest. A SigLIP model keeps its logit bias."""
    folder = run_folder.find_checkpoint(Path(path))
    name = run_folder.EMA if ema else run_folder.MODEL
    problem = run_folder.file_problem(folder, name)
    if problem:
        hint = " (the run kept no EMA of the weights: train.ema.decay=0)" if ema and problem == "is missing" else ""
        raise run_folder.CheckpointError(f"checkpoint {folder}: {name} {problem}{hint}; pass another checkpoint")
    cfg = ModelConfig(**{**run_folder.read_meta(folder)["config"]["model"], "pretrained": None})
    model, state = build_clip(cfg), read_state_dict(folder / name)
    if "logit_bias" in state:
        model.logit_bias = nn.Parameter(torch.empty_like(state["logit_bias"]))  # as train/main.py adds it
    model.load_state_dict(state)
    return model


def image_size(model_or_cfg: CLIP | ModelConfig | str) -> int:
    if isinstance(model_or_cfg, CLIP):
        return model_or_cfg.visual.image_size[0]
    cfg = model_or_cfg if isinstance(model_or_cfg, ModelConfig) else ModelConfig(name=model_or_cfg)
    return resolved_size(cfg)["vision_cfg"]["image_size"]


def transforms(model_or_cfg: CLIP | ModelConfig | str):
    """(train_transform, eval_transform): open_clip's image transforms at the model's image size, OpenAI mean/std."""
    # imported here: training on synthetic batches (scripts/gpu_train_check.py) needs no open_clip
    import open_clip

    size = image_size(model_or_cfg)
    return open_clip.image_transform(size, is_train=True), open_clip.image_transform(size, is_train=False)


def tokenizer_key(cfg: ModelConfig) -> tuple[str, int]:
    """What open_clip's tokenizer for the size depends on: its name and context length (models.preprocess's key)."""
    return cfg.name, resolved_size(cfg)["text_cfg"]["context_length"]


def tokenizer(model_or_cfg: CLIP | ModelConfig | str):
    """open_clip's tokenizer for the size (BPE, vocab 49408), padded to the model's context length."""
    if isinstance(model_or_cfg, CLIP):
        model_or_cfg = model_or_cfg.config
    cfg = model_or_cfg if isinstance(model_or_cfg, ModelConfig) else ModelConfig(name=model_or_cfg)
    context_length = resolved_size(cfg)["text_cfg"]["context_length"]
    import open_clip

    return open_clip.get_tokenizer(cfg.name, context_length=context_length)
