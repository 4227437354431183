"""The model section of a run config, and the sizes it names (open_clip's JSON model configs).

Sizes are data: `ViT-S-16`, `ViT-B-16`, `ViT-L-16` ... are open_clip's own model configs, the tiny ones
configs/models/*.json in the same format. Both are read from their JSON files, so a config check needs no open_clip
import (seconds: it brings torchvision and timm); `open_clip_with_sizes()` registers configs/models/ with open_clip
(models.clip calls it on import), so `open_clip.get_tokenizer("tiny-s")` and `open_clip.create_model("tiny-s")` know
them too, and a size registered with open_clip by the user is found once open_clip is imported. Where open_clip is
not installed (a GPU machine running scripts/gpu_train_check.py on synthetic batches), configs/models/open_clip/*.json
are copies of open_clip's ViT-S/B/L-16 (a test checks that they equal open_clip's).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

TINY_CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "models"
OPEN_CLIP_COPIES = TINY_CONFIG_DIR / "open_clip"  # ViT-S/B/L-16 as open_clip has them, used without open_clip


@functools.cache
def open_clip_with_sizes():
    """open_clip with configs/models/ registered (the tiny sizes), or None where it is not installed."""
    try:
        import open_clip
    except ImportError:
        return None
    open_clip.add_model_config(TINY_CONFIG_DIR)
    return open_clip


def open_clip_config_dir() -> Path | None:
    """open_clip's model_configs folder, found without importing open_clip."""
    spec = importlib.util.find_spec("open_clip")
    return Path(spec.origin).parent / "model_configs" if spec is not None and spec.origin else None


# The open_clip config keys this CLIP reads; any other key must hold open_clip's default value.
READ = {
    "model": {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu"},
    "vision_cfg": {"image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio", "patch_dropout"},
    "text_cfg": {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"},
}
REQUIRED = {
    "model": ["embed_dim", "vision_cfg", "text_cfg"],
    "vision_cfg": ["image_size", "layers", "width", "patch_size"],
    "text_cfg": ["context_length", "vocab_size", "width", "heads", "layers"],
}
DEFAULTS = {
    "model": {"init_logit_bias": None, "custom_text": False},
    "vision_cfg": {
        "ls_init_value": None,
        "attentional_pool": False,
        "no_ln_pre": False,
        "pos_embed_type": "learnable",
        "final_ln_after_pool": False,
        "pool_type": "tok",
        "output_tokens": False,
        "timm_model_name": None,
        "block_type": None,
        "qk_norm": False,
        "act_kwargs": None,
        "norm_kwargs": None,
    },
    "text_cfg": {
        "ls_init_value": None,
        "embed_cls": False,
        "no_causal_mask": False,
        "final_ln_after_pool": False,
        "pool_type": "argmax",
        "proj_bias": False,
        "proj_type": "linear",
        "output_tokens": False,
        "hf_model_name": None,
        "hf_tokenizer_name": None,
        "block_type": None,
        "qk_norm": False,
        "act_kwargs": None,
        "norm_kwargs": None,
    },
}


@dataclass
class ModelConfig:
    """Which CLIP to build: a size, and the attention of each tower by registry name.

    `image_attention` / `text_attention` is one registry name for every layer, or a list with one name
    per layer (a hybrid stack). The options dicts go to every layer of that tower; in a hybrid stack a
    dict keyed by attention name ({"linformer": {"max_length": 64}}) gives each variant its own.
    `attention_impl` (auto | reference | torch | cpu | triton) picks the implementation of every layer whose
    variant has several (the linear ones, models/attention/ops/dispatch.py); an `impl` in the options dicts wins.
    `pretrained` is a softmax (or any) checkpoint, safetensors or torch file: every weight whose name
    and shape match is loaded, the rest keep their fresh initialisation (see `models.load_pretrained`).
    `image_size` and `context_length` (null: the size's) train or evaluate the size at another resolution or
    text length: the image grid, the position tables, the transforms and the tokenizer follow; a `pretrained`
    model of another size has its position tables resampled (models/pretrained.py, `text_pos_keep`); any other
    tensor of another shape refuses the load unless a glob of `pretrained_fresh` names it (it then starts fresh).
    `image_pos_embed` / `text_pos_embed`: `learnable` (a position table, open_clip's) or `rope` (rotary positions
    turning q and k in every layer, models/attention/rope.py; no table, any resolution or context).
    """

    name: str = "tiny-s"
    image_attention: str | list[str] = "softmax"
    text_attention: str | list[str] = "softmax"
    image_attention_options: dict = field(default_factory=dict)
    text_attention_options: dict = field(default_factory=dict)
    attention_impl: str = "auto"
    grad_checkpointing: bool = False
    patch_dropout: float = 0.0
    pretrained: str | None = None
    image_size: int | None = None
    context_length: int | None = None
    text_pos_keep: int = 20  # loading into another context: the first K text positions kept (Long-CLIP); 0: open_clip
    pretrained_fresh: list[str] = field(default_factory=list)  # glob patterns: tensors of another shape start fresh
    image_pos_embed: str = "learnable"  # or rope: 2-D axial rotary positions on the patch grid, no table
    text_pos_embed: str = "learnable"  # or rope: 1-D rotary positions over the tokens (models/attention/rope.py)
    # options that shape attention maps (issue 47): LayerScale in every block of both towers, initialised to this
    # (open_clip's ls_init_value; null: none); a LayerNorm on each head's q and k in both towers (before RoPE and
    # any feature map); the image embedding from the class token (cls) or the mean of the patch tokens (mean)
    layer_scale: float | None = None
    qk_norm: bool = False
    image_pool: str = "cls"  # or mean, or map: timm's attention pooling (models/vit.py)
    image_registers: int = 0  # register tokens after the class token (Darcet et al. 2024; timm's reg_tokens)


def tiny_model_names() -> list[str]:
    return sorted(p.stem for p in TINY_CONFIG_DIR.glob("*.json"))


def size_config(name: str) -> dict:
    """open_clip's model config dict for `name` (embed_dim, vision_cfg, text_cfg), checked for what we build."""
    cfg = json_size_config(name)
    if cfg is None and "open_clip" in sys.modules and open_clip_with_sizes() is not None:
        cfg = open_clip_with_sizes().get_model_config(name)  # a size the user registered with open_clip
    if cfg is None:
        raise ValueError(
            f"unknown model size {name!r}; use one of {', '.join(tiny_model_names())} "
            "or any open_clip model name such as ViT-B-16"
        )
    check_supported(name, "model", cfg)
    check_supported(name, "vision_cfg", cfg["vision_cfg"])
    check_supported(name, "text_cfg", cfg["text_cfg"])
    return cfg


def resolved_size(cfg: ModelConfig) -> dict:
    """size_config(cfg.name) with cfg.image_size and cfg.context_length in place of the size's own values."""
    size = copy.deepcopy(size_config(cfg.name))
    v, t = size["vision_cfg"], size["text_cfg"]
    if cfg.image_size is not None:
        patch = v["patch_size"]
        if cfg.image_size < patch or cfg.image_size % patch:
            below = max(patch, cfg.image_size // patch * patch)
            nearest = sorted({below, below + patch})
            raise ValueError(
                f"model.image_size={cfg.image_size} is not a multiple of {cfg.name}'s patch size {patch}; "
                f"nearest valid sizes: {', '.join(map(str, nearest))}"
            )
        v["image_size"] = cfg.image_size
    if cfg.context_length is not None:
        if cfg.context_length < 2:
            raise ValueError(
                f"model.context_length={cfg.context_length}: a caption needs at least 2 tokens (start and end); "
                f"{cfg.name}'s own is {t['context_length']}"
            )
        t["context_length"] = cfg.context_length
    return size


def json_size_config(name: str) -> dict | None:
    """A size from the JSON files of configs/models/, open_clip's model_configs, or (without open_clip) the copies."""
    for folder in (TINY_CONFIG_DIR, open_clip_config_dir() or OPEN_CLIP_COPIES):
        if (folder / f"{name}.json").is_file():
            return json.loads((folder / f"{name}.json").read_text())
    return None


def check_supported(name: str, section: str, cfg: dict) -> None:
    for key in REQUIRED[section]:
        if key not in cfg:
            raise ValueError(f"model size {name!r}: {section} lacks {key!r}; add it to the JSON config")
    for key, value in cfg.items():
        if key in READ[section]:
            continue
        if key not in DEFAULTS[section] or value != DEFAULTS[section][key]:
            raise ValueError(
                f"model size {name!r}: {section}.{key}={value!r} is not implemented by models/ "
                "(plain ViT + causal text transformer only); use a config such as ViT-B-16"
            )
    if section == "vision_cfg" and not isinstance(cfg["layers"], int):
        raise ValueError(
            f"model size {name!r} is a ResNet image tower; models/ builds ViT towers only, "
            "use a config such as ViT-B-16"
        )


def layer_attentions(tower: str, attention: str | list[str], layers: int, causal: bool) -> list[str]:
    """One registry name per layer, checked against the registry and the tower's causality."""
    from models.attention import get_attention  # torch: the model section loads without it

    if not isinstance(attention, (str, list, tuple)):
        raise ValueError(f"{tower} tower: attention must be a registry name or a list of names, got {attention!r}")
    names = [attention] * layers if isinstance(attention, str) else list(attention)
    if len(names) != layers:
        raise ValueError(
            f"{tower} tower: attention list has {len(names)} names for {layers} layers; "
            "give one name per layer or a single name"
        )
    for name in dict.fromkeys(names):
        try:
            get_attention(name).check_causal(causal)
        except ValueError as e:
            raise ValueError(f"{tower} tower: {e}") from None
    return names


def layer_options(
    tower: str, names: list[str], options: dict, seq_len: int, impl: str = "auto", prefix: int | None = None
) -> list[dict]:
    """The options of each layer: one flat dict for all, or a dict keyed by attention name; names checked.

    A variant with a `max_length` option (a fixed-length projection, e.g. Linformer) gets the tower's
    sequence length unless the options set it; one with an `impl` option gets `impl` unless they set it; one with a
    `prefix_tokens` option (the tokens before the patch grid, e.g. retention_2d) gets `prefix` (the image tower's
    class token and registers) unless they set it.
    """
    from models.attention import get_attention  # torch: the model section loads without it

    per_name = bool(options) and all(k in names and isinstance(v, dict) for k, v in options.items())
    per_layer = [dict(options.get(n, {})) if per_name else dict(options) for n in names]
    for name, opts in zip(names, per_layer):
        if "max_length" in (accepted_options(get_attention(name)) or ()):
            opts.setdefault("max_length", seq_len)
        if impl != "auto" and "impl" in (accepted_options(get_attention(name)) or ()):
            opts.setdefault("impl", impl)
        if prefix is not None and "prefix_tokens" in (accepted_options(get_attention(name)) or ()):
            opts.setdefault("prefix_tokens", prefix)
    for name, opts in dict(zip(names, per_layer)).items():
        known = accepted_options(get_attention(name))
        unknown = sorted(set(opts) - known) if known is not None else []
        if unknown:
            raise ValueError(
                f"{tower} tower: attention {name!r} has no option(s) {', '.join(unknown)}; "
                f"its options: {', '.join(sorted(known)) or 'none'}"
            )
    return per_layer


NOT_OPTIONS = {"self", "q", "k", "v", "dim", "num_heads", "causal", "key_mask", "qkv_bias"}


def accepted_options(cls) -> set[str] | None:
    """Keyword options a variant takes: named parameters of its constructor and of its pure function.

    None when its pure function takes any keyword (**kwargs), so nothing can be checked.
    """
    fns = [cls.__init__] + ([cls.function] if getattr(cls, "function", None) is not None else [])
    params = [p for f in fns for p in inspect.signature(f).parameters.values()]
    if cls.function is not None and any(
        p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.function).parameters.values()
    ):
        return None
    return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - NOT_OPTIONS
