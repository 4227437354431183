"""One typed, validated config: a YAML file plus dotted `key=value` overrides.

    cfg = load_config(["configs/tiny.yaml", "train.max_steps=20", "model.image_attention=linear_elu"])

The file has the sections model (models.ModelConfig), data (data.DataConfig), optim, train and eval;
anything left out keeps the dataclass default. Override values are parsed with `yaml.safe_load`, so
`3`, `1e-4`, `true`, `null` and `[a, b]` mean what they say. Unknown keys and values of the wrong type
are a one-line `ConfigError` that names the key and the fix.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from data import DataConfig
from models import ModelConfig


class ConfigError(ValueError):
    """A config problem the user can fix; `python -m train` prints it as one line and exits with 1."""


@dataclass
class OptimConfig:
    """AdamW with a linear warmup and a cosine (or constant) schedule, all counted in optimizer steps."""

    lr: float = 5e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    weight_decay: float = 0.2
    warmup_steps: int = 1000
    schedule: str = "cosine"  # cosine | constant
    min_lr_ratio: float = 0.0  # cosine ends at lr * min_lr_ratio
    grad_clip_norm: float | None = None  # max global gradient norm; null = no clipping


@dataclass
class TrainConfig:
    """The loop, the hardware setup, logging, checkpoints and the test hooks."""

    run_dir: str = "runs/default"
    max_steps: int = 1000
    accum_freq: int = 1  # micro-batches of data.batch_size per optimizer step (one contrastive loss over all)
    loss: str = "clip"  # clip (symmetric InfoNCE) | siglip (sigmoid)
    precision: str = "fp32"  # fp32 | bf16 | fp16 (fp16 uses a gradient scaler; GPU only)
    distributed: str = "ddp"  # ddp | fsdp (full sharding of the transformer blocks)
    fsdp_wrap: list[str] = field(default_factory=lambda: ["Block"])  # block classes to shard
    augment: bool = True  # open_clip's random-crop train transform; false: the eval transform (deterministic)
    cpu: bool = False  # train on the CPU even when a GPU is visible
    compile: bool = False  # torch.compile the model
    seed: int = 0
    deterministic: bool = False  # torch.use_deterministic_algorithms; bit-exact resume on one machine
    log_every: int = 10
    save_every: int = 1000  # steps between checkpoints; one is always written at the end
    keep_last: int = 3  # complete checkpoints kept
    resume: str = "auto"  # auto (newest complete checkpoint in run_dir) | none | PATH to a checkpoint folder
    max_bad_steps: int = 10  # consecutive non-finite steps before the run stops
    debug_nan_steps: list[int] = field(default_factory=list)  # test hook: poison the loss at these steps
    wandb: str = "disabled"  # online | offline | disabled
    wandb_project: str = "clip-attention"
    wandb_name: str | None = None
    progress: bool = True  # tqdm bar on rank 0


@dataclass
class EvalConfig:
    """Zero-shot classification through eval.zeroshot.evaluate, every `every` steps and at the end."""

    dataset: str | None = None  # ImageFolder tree (with classnames.txt/templates.txt) or clip_benchmark wds folder
    classnames: str | None = None  # null: from the dataset folder; else a file or a built-in name such as imagenet1k
    templates: str | None = None  # null: from the dataset folder; else a file or openai | simple
    every: int = 0  # steps between evaluations; 0 = only at the end
    batch_size: int = 64
    val_shards: str | None = None  # held-out webdataset shards (training format): val_loss at every evaluation
    workers: int = 0


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


SECTIONS = typing.get_type_hints(Config)  # section name -> dataclass
CHOICES = {
    ("optim", "schedule"): ("cosine", "constant"),
    ("train", "loss"): ("clip", "siglip"),
    ("train", "precision"): ("fp32", "bf16", "fp16"),
    ("train", "distributed"): ("ddp", "fsdp"),
    ("train", "wandb"): ("online", "offline", "disabled"),
}


def load_config(argv: list[str]) -> Config:
    """`[CONFIG.yaml, key=value, ...]` -> a validated Config."""
    if not argv or "=" in argv[0]:
        raise ConfigError(
            "usage: python -m train CONFIG.yaml [section.key=value ...]; "
            "give a config file first, e.g. configs/tiny.yaml"
        )
    path = Path(argv[0])
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pick one of configs/*.yaml")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections ({', '.join(SECTIONS)}), not a {type(raw).__name__}")
    for item in argv[1:]:
        apply_override(raw, item)
    return build_config(raw)


def apply_override(raw: dict, item: str) -> None:
    """Set `section.key[.subkey]=value` in the raw nested dict; the value is parsed as YAML."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {item!r} must look like section.key=value, e.g. train.max_steps=20")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a section or mapping")
    node[parts[-1]] = value


def build_config(raw: dict) -> Config:
    """Nested dict -> Config; every key and value type is checked against the dataclasses."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown config section {unknown[0]!r}; valid sections: {', '.join(SECTIONS)}")
    sections = {name: build_section(name, SECTIONS[name], raw.get(name) or {}) for name in SECTIONS}
    return Config(**sections)


def build_section(name: str, cls: type, values: dict):
    if not isinstance(values, dict):
        raise ConfigError(f"config section {name!r} must be a mapping of keys to values, not {values!r}")
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    values = dict(values)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"unknown config key {name}.{key}; valid keys of {name!r}: {', '.join(fields)}")
        value = values[key] = coerce_float(value, hints[key])
        if not matches(value, hints[key]):
            raise ConfigError(f"{name}.{key} must be {type_name(hints[key])}, got {type(value).__name__} {value!r}")
        allowed = CHOICES.get((name, key))
        if allowed and value not in allowed:
            raise ConfigError(f"{name}.{key} must be one of {', '.join(allowed)}, got {value!r}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section {name!r}: {e}") from None


def coerce_float(value, hint):
    """YAML 1.1 reads `1e-4` (no dot) as a string; for a float field it means the number.
    Ints become floats too, so the dataclass holds the declared type."""
    if not matches(1.0, hint) or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def matches(value, hint) -> bool:
    """Whether a YAML value fits a type hint (int fits float; bool never fits int or float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin in (list, tuple):
        return (
            isinstance(value, (list, tuple)) and all(matches(v, args[0]) for v in value)
            if args
            else isinstance(value, (list, tuple))
        )
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def type_name(hint) -> str:
    return getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint).replace("typing.", "")


def to_dict(cfg: Config) -> dict:
    """The resolved config as plain YAML/JSON-able data (what config.yaml and meta.json hold)."""
    return dataclasses.asdict(cfg)


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
