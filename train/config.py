"""One typed, validated config: a YAML file plus dotted `key=value` overrides.

    cfg = load_config(["configs/tiny.yaml", "train.max_steps=20", "model.image_attention=linear_elu"])

The file has the sections model (models.ModelConfig), data (data.DataConfig), optim, train and eval;
anything left out keeps the dataclass default. Override values are parsed with `yaml.safe_load`, so
`3`, `1e-4`, `true`, `null` and `[a, b]` mean what they say. Unknown keys, values of the wrong type and
values outside a field's `Literal` choices are a one-line `ConfigError` that names the key and the fix; so are
numbers out of range or not finite, unknown model sizes, attention names and impls (with the closest known name),
an image size the patch does not divide, an impl that RoPE would ignore and a cache larger than this machine's memory.

A file may start from another: `base: base/laion400m.yaml` (a path relative to the file) loads that file
first and merges this one over it, section by section and key by key (a value given here replaces the
base's, lists included); a base may have its own base.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import yaml

from data import DataConfig
from models import ModelConfig
from models.config import resolved_size

TRANSFER_SHARE = 0.25  # of train.max_steps: attention transfer's when a teacher comes without distill.stage
log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config problem the user can fix; `python -m train` prints it as one line and exits with 1."""


@dataclass
class OptimConfig:
    """AdamW (or optim.name) with a linear warmup and a cosine, constant or constant-then-cooldown schedule, in
    optimizer steps."""

    # adamw (torch's, fused), or any of timm's optimizers (muon, lion, lamb, adopt, laprop, kron, ...: train/optim.py);
    # the Muon family updates the blocks' weight matrices and leaves the rest to AdamW, as its authors prescribe
    name: str = "adamw"
    lr: float = 5e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    weight_decay: float = 0.2
    warmup_steps: int = 1000
    schedule: Literal["cosine", "constant", "const-cooldown"] = "cosine"  # const-cooldown: constant, then a cooldown
    min_lr_ratio: float = 0.0  # cosine and the cooldown end at lr * min_lr_ratio
    cooldown_shape: Literal["linear", "cosine"] = "linear"  # const-cooldown's shape
    cooldown_fraction: float = 0.2  # const-cooldown: the cooldown is this fraction of train.max_steps...
    cooldown_steps: int | None = None  # ...or, when set, this many steps
    grad_clip_norm: float | None = None  # max global gradient norm; null = no clipping
    fused: bool | None = None  # AdamW as one fused kernel (null: yes, on CUDA and the CPU); false: torch's default
    # per tower (train/towers.py): learning rate and weight decay (null: optim.lr, optim.weight_decay), layer-wise
    # learning-rate decay (each block below the head `layer_decay` times slower; 1: none)
    image_lr: float | None = None
    text_lr: float | None = None
    image_weight_decay: float | None = None
    text_weight_decay: float | None = None
    image_layer_decay: float = 1.0
    text_layer_decay: float = 1.0
    # locking (LiT; open_clip's keys): a locked tower trains only its last N groups (a block is a group; the
    # embeddings and the head are one each); freeze_layer_norm keeps the LayerNorms of those frozen too
    lock_image: bool = False
    lock_image_unlocked_groups: int = 0
    lock_image_freeze_layer_norm: bool = False
    lock_text: bool = False
    lock_text_unlocked_layers: int = 0
    lock_text_freeze_layer_norm: bool = False


@dataclass
class EmaConfig:
    """An exponential moving average of the weights, timm's ModelEmaV3 (train/ema.py). The u-th update, after
    optimizer step u * every, sets ema = d * ema + (1 - d) * weights with d = 0 for u = 1 (a copy), else decay, or
    with warmup (timm's use_warmup) min(decay, 1 - u ** -warmup_power): power 2/3 reaches 0.999 at 31.6k updates,
    3/4 at 10k. Evaluated beside the weights (ema/val_loss, ema/zeroshot/*), checkpointed as ema.safetensors, sharded
    like the model under FSDP."""

    decay: float = 0.0  # 0 = no EMA; e.g. 0.9998
    warmup: bool = False
    warmup_power: float = 2 / 3
    every: int = 1  # optimizer steps between updates
    device: Literal["model", "cpu"] = "model"  # cpu: off the accelerator (copied to it for each evaluation)


@dataclass
class TrainConfig:
    """The loop, the hardware setup, logging and checkpoints. run_dir: a path or an fsspec URL (train/storage.py)."""

    # null: a folder of its own, runs/<config stem>-<image attention>-<text attention>-<YYYYmmdd-HHMMSS> (named at
    # the start, name_run_dir); resuming (train.resume=auto, a requeued job) needs run_dir set: a new name starts fresh
    run_dir: str | None = None
    max_steps: int = 1000
    accum_freq: int = 1  # micro-batches of data.batch_size per optimizer step (one contrastive loss over all)
    loss: Literal["clip", "siglip"] = "clip"  # symmetric InfoNCE | sigmoid
    # how siglip brings the other ranks' texts (train/siglip.py): gather (all_gather) | shift (a ring to the right,
    # W-1 hops) | bidir (both ways, about W/2 hops); shift and bidir keep saved memory per rank flat in the ranks
    siglip_exchange: Literal["gather", "shift", "bidir"] = "gather"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # fp16 uses a gradient scaler; GPU only
    distributed: Literal["ddp", "fsdp"] = "ddp"  # fsdp: full sharding, one unit per transformer block
    fsdp_wrap: list[str] = field(default_factory=lambda: ["Block"])  # block classes to shard
    fsdp_reduce_fp32: bool = True  # fsdp: reduce-scatter gradients in fp32 (else in the precision's dtype)
    tf32: bool = True  # on GPUs: fp32 matmuls/convolutions in TF32 (the fp32 parts under bf16 too); false: full fp32
    augment: bool = True  # open_clip's random-crop train transform; false: the eval transform (deterministic)
    cpu: bool = False  # train on the CPU even when a GPU is visible
    compile: bool = False  # torch.compile the model
    seed: int = 0
    deterministic: bool = False  # torch.use_deterministic_algorithms; bit-exact resume on one machine
    log_every: int = 10
    save_every: int = 1000  # steps between checkpoints; one is always written at the end
    keep_last: int = 3  # complete checkpoints kept
    # storage that refuses a periodic checkpoint (full disk, quota, I/O error): 1 stops the run at once (one line, the
    # partial folder removed); N > 1 trains on, says so once per failure, tries again at the next save, and stops when
    # N saves in a row failed. The pre-emption and final checkpoints always stop the run when they fail
    max_failed_saves: int = 1
    resume: str = "auto"  # auto (newest complete checkpoint in run_dir) | none | PATH or URL of a checkpoint folder
    branch_from: str | None = None  # a checkpoint folder of another run: a new run starts from it (train/branch.py)
    keep_steps: list[int] = field(default_factory=list)  # checkpoints written at these steps and never pruned
    max_bad_steps: int = 10  # consecutive non-finite steps before the run stops
    stage_dir: str | None = None  # local folder for a remote run_dir (s3://...); null: one under the temp dir
    # a remote run_dir: how long each transfer is retried (exponential backoff) before it counts as failed; 0: only
    # the file system's own retries. A failed upload is a warning, max_failed_uploads of them in a row stop the run
    storage_retry_s: float = 600
    max_failed_uploads: int = 3
    # how long a collective of the training steps waits for the other ranks before this rank stops the run with one
    # line naming the timeout (a hung or stopped rank would otherwise hold every GPU of the job); start-up,
    # checkpoint writes and evaluations keep train/dist.py's 60 minutes (rank 0 may load, write or upload while the
    # others wait). For comparison: torchtitan 100 s after the first step (300 s before), Composer 300 s
    dist_timeout_s: float = 600
    max_restarts: int = 0  # slurm/train.sbatch requeues a job that failed (exit not 0 or 75) up to this many times
    wandb: Literal["online", "offline", "disabled"] = "disabled"
    wandb_project: str = "clip-attention"
    wandb_name: str | None = None
    progress: bool = True  # tqdm bar on rank 0
    ema: EmaConfig = field(default_factory=EmaConfig)


@dataclass
class EvalConfig:
    """Zero-shot classification through eval.zeroshot.evaluate, every `every` steps and at the end (and the validation
    loss, few-shot probes and retrieval at the same steps, where set)."""

    dataset: str | None = None  # ImageFolder tree (with classnames.txt/templates.txt) or clip_benchmark wds folder
    classnames: str | None = None  # null: from the dataset folder; else a file or a built-in name such as imagenet1k
    templates: str | None = None  # null: from the dataset folder; else a file or openai | simple
    every: int = 0  # steps between evaluations; 0 = only at the end
    batch_size: int = 64
    val_shards: str | None = None  # held-out webdataset shards (training format): val_loss at every evaluation
    workers: int = 0
    cache_mb: float = 1024  # per process: eval sets decoded once while they fit in this (eval/replay.py); 0 = never
    # few-shot linear probes on the same image features (eval/fewshot.py: ridge regression as big_vision), logged as
    # fewshot/<k>shot: e.g. [1, 5, 10, 25]; each k-shot accuracy the mean over fewshot_draws draws; [] = none
    fewshot: list[int] = field(default_factory=list)
    fewshot_draws: int = 5
    # image-text retrieval (eval/retrieval.py) at the same cadence: a .csv/.tsv of image-caption rows or a webdataset
    # folder of images with `txt` captions (e.g. the validation shards); recall@1/5/10 both ways as retrieval/<metric>
    retrieval: str | None = None
    retrieval_split: str = "test"  # the split folder of a clip_benchmark webdataset (a folder of .tar: itself)
    # over-smoothing (eval/smoothing.py): on this many images of eval.dataset (an ImageFolder tree), the share of the
    # tokens' differences each image-tower layer's attention keeps, logged as smoothing/layer<i>; 0 = not measured
    smoothing: int = 0


@dataclass
class DistillConfig:
    """Linearising a pretrained CLIP (train/distill.py): with a teacher, training fits the student's attention.

    teacher: the frozen teacher, one of our run or checkpoint folders, a safetensors / torch file (the
    student's size), or open_clip:NAME:TAG; the student (`model`, any attention) starts from its weights unless
    model.pretrained is set. stage: transfer = every attention layer trained to reproduce its teacher layer's
    output on the teacher's hidden states, only attention parameters trainable (LoLCATs' attention transfer);
    distill = the whole student trained on contrastive_weight x the contrastive loss + embedding_weight x
    (1 - cosine to the teacher's image and text embeddings) + similarity_weight x the KL divergence from the
    teacher's image-text similarity distribution over the batch (both directions), each term logged; both = stage
    1 for transfer_steps steps at transfer_lr (optim.lr when null) with transfer_warmup_steps of warm-up (optim's
    when null) in RUN_DIR/transfer, then stage 2 from it in RUN_DIR for train.max_steps with the rest of the config
    (train/stages.py). stage null with a teacher: both, within train.max_steps: transfer_steps (when 0:
    TRANSFER_SHARE of them, rounded, at least 1) of stage 1, the rest of stage 2 (default_stages, said in one line).
    A student after stage 1 alone is not a finished model: its MLPs never saw its attention."""

    teacher: str | None = None
    stage: Literal["transfer", "distill", "both"] | None = None  # null: both with a teacher (see above)
    transfer_steps: int = 0  # stage 1's steps with stage both; 0 with stage null: TRANSFER_SHARE of train.max_steps
    transfer_lr: float | None = None
    transfer_warmup_steps: int | None = None
    contrastive_weight: float = 1.0
    embedding_weight: float = 1.0
    similarity_weight: float = 1.0


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


SECTIONS = typing.get_type_hints(Config)  # section name -> dataclass


def load_config(argv: list[str], warn: bool = True) -> Config:
    """`[CONFIG.yaml, key=value, ...]` -> a validated Config (warnings on stderr unless `warn` is False).

    Keys, types and ranges are checked before torch is imported, the names of attentions and impls with torch and
    the registry alone: `python -m train` runs this before it imports open_clip, torchvision, timm and accelerate,
    so an error shows in under a second or two (train/__main__.py), not after the training code's imports."""
    if not argv or "=" in argv[0]:
        raise ConfigError(
            "usage: python -m train CONFIG.yaml [section.key=value ...]; "
            "give a config file first, e.g. configs/tiny.yaml"
        )
    raw = read_config_file(Path(argv[0]))
    for item in argv[1:]:
        apply_override(raw, item)
    cfg = build_config(raw)
    warning = warmup_warning(cfg)
    if warning and warn:
        print(warning, file=sys.stderr)
    return cfg


def default_run_dir(cfg: Config, config_file: str, now: datetime | None = None) -> str:
    """runs/<config stem>-<image attention>-<text attention>-<YYYYmmdd-HHMMSS>, as open_clip names its runs (a tower
    with several attentions joins their names with '+'); -2, -3, ... after it when a folder of that name exists."""
    towers = ["+".join(tower_names(cfg.model, tower)) for tower in ("image", "text")]
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = "-".join([f"runs/{Path(config_file).stem}", *towers, stamp])
    name, n = base, 1
    while Path(name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def name_run_dir(cfg: Config, config_file: str, world_size: int) -> None:
    """Set a null train.run_dir to default_run_dir, once at the start of a run, so that resume, checkpoints,
    config.yaml and both linearisation stages see one folder. Several processes would each name their own."""
    if cfg.train.run_dir is not None:
        return
    if world_size > 1:
        raise ConfigError(
            f"train.run_dir is not set and this run has {world_size} processes, which would each name a folder of "
            "their own; set train.run_dir, e.g. train.run_dir=runs/NAME"
        )
    cfg.train.run_dir = default_run_dir(cfg, config_file)


def read_yaml(path: Path):
    """yaml.safe_load of a file; a file that is not UTF-8 YAML is a ConfigError naming it and the place."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (not UTF-8); give a YAML config file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}; fix the file") from None


def read_config_file(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The raw sections of a YAML config file, merged over its `base:` file (recursively)."""
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pick one of configs/*.yaml")
    if path.resolve() in seen:
        raise ConfigError(f"config file {path} is its own base (through {', '.join(map(str, seen))}); break the cycle")
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections ({', '.join(SECTIONS)}), not a {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a config file path (relative to {path.parent}), got {base!r}")
    return merge(read_config_file(path.parent / base, (*seen, path.resolve())), raw)


def merge(base: dict, over: dict) -> dict:
    """`over` merged into a copy of `base`: mappings key by key, anything else (lists included) replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


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
    cfg = Config(**sections)
    check_finite(cfg)
    check_ranges(cfg)
    check_caches(cfg)
    check_model_size(cfg.model)
    check_model_names(cfg)  # these two import torch and the attention registry
    check_impl(cfg.model)
    if cfg.train.siglip_exchange != "gather" and cfg.train.loss != "siglip":
        raise ConfigError(
            f"train.siglip_exchange={cfg.train.siglip_exchange} would be ignored: train.loss={cfg.train.loss} gathers "
            "the features of all ranks; set train.loss=siglip or train.siglip_exchange=gather"
        )
    if cfg.train.ema.decay and cfg.train.distributed == "fsdp" and cfg.train.ema.device == "cpu":
        raise ConfigError(
            "train.ema.device=cpu cannot hold the EMA of a model sharded with train.distributed=fsdp (it is sharded "
            "like the model, on its devices); set train.ema.device=model"
        )
    note = default_stages(cfg)
    if note:
        log.info(note)
    if cfg.distill.stage == "both" and not (cfg.distill.teacher and cfg.distill.transfer_steps >= 1):
        raise ConfigError(
            "distill.stage=both runs attention transfer, then distillation: it needs distill.teacher and "
            "distill.transfer_steps >= 1 (stage 1's steps; train.max_steps are stage 2's)"
        )
    if cfg.distill.teacher and cfg.distill.stage == "transfer" and cfg.model.grad_checkpointing:
        raise ConfigError(
            "distill.stage=transfer feeds each attention layer the teacher's hidden states, which a recomputed "
            "(checkpointed) forward would not see; set model.grad_checkpointing=false"
        )
    return cfg


def default_stages(cfg: Config) -> str | None:
    """A teacher without distill.stage: both stages within train.max_steps, distill.transfer_steps (when 0:
    TRANSFER_SHARE of them, rounded, at least 1) of attention transfer, then the rest of distillation. Sets
    distill.stage, distill.transfer_steps and train.max_steps (stage 2's, as `both` counts them); returns the line
    that says so, or None when the config chose (or has no teacher)."""
    d, total = cfg.distill, cfg.train.max_steps
    if not d.teacher or d.stage is not None:
        return None
    transfer = d.transfer_steps or max(1, math.floor(TRANSFER_SHARE * total + 0.5))
    steps = f"{transfer} step{'s' * (transfer != 1)} of"
    if transfer >= total:
        raise ConfigError(
            f"distill.teacher without distill.stage runs attention transfer, then distillation, within "
            f"train.max_steps={total}: {steps} transfer leave none for distillation; raise train.max_steps (or "
            "lower distill.transfer_steps), or set distill.stage to transfer or distill"
        )
    d.stage, d.transfer_steps, cfg.train.max_steps = "both", transfer, total - transfer
    return (
        f"distill: teacher given without distill.stage: running both stages, {steps} attention transfer then "
        f"{total - transfer} of distillation (set distill.stage to choose)"
    )


def at_least(low):
    return lambda v: v >= low, f">= {low}"


def above(low):
    return lambda v: v > low, f"> {low}"


# (section, key) -> (test, the allowed range in words); None values of optional keys are not tested
RANGES = {
    ("optim", "lr"): above(0),
    ("optim", "betas"): (lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    ("optim", "eps"): above(0),
    ("optim", "weight_decay"): at_least(0),
    ("optim", "warmup_steps"): at_least(0),
    ("optim", "min_lr_ratio"): (lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("optim", "grad_clip_norm"): above(0),
    ("optim", "image_lr"): above(0),
    ("optim", "text_lr"): above(0),
    ("optim", "image_weight_decay"): at_least(0),
    ("optim", "text_weight_decay"): at_least(0),
    ("optim", "image_layer_decay"): (lambda v: 0 < v <= 1, "in (0, 1]"),
    ("optim", "text_layer_decay"): (lambda v: 0 < v <= 1, "in (0, 1]"),
    ("optim", "lock_image_unlocked_groups"): at_least(0),
    ("optim", "lock_text_unlocked_layers"): at_least(0),
    ("data", "batch_size"): above(0),
    ("data", "workers"): at_least(0),
    ("data", "shuffle_buffer"): at_least(1),
    ("data", "max_image_pixels"): at_least(1),
    ("data", "max_caption_bytes"): at_least(1),
    ("data", "train_num_samples"): at_least(1),
    ("data", "seed"): (lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
    ("model", "patch_dropout"): (lambda v: 0 <= v < 1, "in [0, 1)"),
    ("model", "layer_scale"): above(0),
    ("model", "image_registers"): at_least(0),
    ("train", "max_steps"): at_least(1),
    ("train", "accum_freq"): at_least(1),
    ("train", "keep_last"): at_least(1),
    ("train", "max_failed_saves"): at_least(1),
    ("train", "max_bad_steps"): at_least(1),
    ("train", "log_every"): at_least(0),
    ("train", "save_every"): at_least(0),
    ("train", "seed"): (lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
    ("train", "keep_steps"): (lambda v: all(s >= 0 for s in v), "a list of steps >= 0"),
    ("train", "dist_timeout_s"): above(0),
    ("train", "max_restarts"): at_least(0),
    # rank 0 retries inside a checkpoint save, while the other ranks wait up to 60 minutes (train/dist.py)
    ("train", "storage_retry_s"): (lambda v: 0 <= v <= 1800, "in [0, 1800]: the other ranks wait for the upload"),
    ("train", "max_failed_uploads"): at_least(1),
    ("train.ema", "decay"): (lambda v: 0 <= v < 1, "in [0, 1)"),
    ("train.ema", "warmup_power"): above(0),
    ("train.ema", "every"): at_least(1),
    ("eval", "every"): at_least(0),
    ("eval", "batch_size"): above(0),
    ("eval", "workers"): at_least(0),
    ("eval", "cache_mb"): at_least(0),
    ("eval", "fewshot"): (lambda v: all(k >= 1 for k in v), "a list of shots >= 1"),
    ("eval", "fewshot_draws"): at_least(1),
    ("eval", "smoothing"): at_least(0),
    ("data", "cache_mb"): at_least(0),
    ("data", "max_skip_fraction"): (lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("data", "shard_timeout_s"): above(0),
    ("data", "shard_retries"): at_least(0),
    ("distill", "transfer_steps"): at_least(0),
    ("distill", "transfer_lr"): above(0),
    ("distill", "transfer_warmup_steps"): at_least(0),
}


def check_ranges(cfg: Config) -> None:
    """Every number in its allowed range (RANGES); the first one outside is a one-line ConfigError."""
    for (section, key), (test, allowed) in RANGES.items():
        value = getattr(functools.reduce(getattr, section.split("."), cfg), key)
        if value is not None and not test(value):
            raise ConfigError(f"{section}.{key}={value!r} is out of range: it must be {allowed}")


def finite(value) -> bool:
    """No inf or nan in a value, nested lists and dicts (attention options) included."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    return all(finite(v) for v in value) if isinstance(value, (list, tuple)) else True


def check_finite(cfg: Config) -> None:
    """Every number of every section finite: YAML's .inf and .nan (and "inf", "nan") fit a float field."""
    for section, values in to_dict(cfg).items():
        for key, value in values.items():
            if not finite(value):
                raise ConfigError(f"{section}.{key}={value!r} is not a finite number; give a finite value")


def machine_mb() -> float | None:
    """This machine's memory in MB (2**20 bytes, as data.cache_mb and eval.cache_mb count), None where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (AttributeError, ValueError, OSError):
        return None


def check_caches(cfg: Config) -> None:
    """data.cache_mb and eval.cache_mb within this machine's memory (a bigger cache could never be filled)."""
    total = machine_mb()
    for section in ("data", "eval"):
        mb = getattr(cfg, section).cache_mb
        if total is not None and mb > total:
            raise ConfigError(
                f"{section}.cache_mb={mb:g} is more than this machine's memory ({total:.0f} MB); "
                f"set it below {total:.0f}, or 0 for no cache"
            )


def did_you_mean(name, known) -> str:
    """'; did you mean X?' for the closest of `known` (difflib), or ''."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def tower_names(model: ModelConfig, tower: str) -> list[str]:
    """The distinct attention names of a tower (one name, or one per layer)."""
    value = getattr(model, f"{tower}_attention")
    return list(dict.fromkeys([value] if isinstance(value, str) else value))


def check_model_names(cfg: Config) -> None:
    """Attention and position names known to the registry (and causal where the text tower needs it), so a
    sweep or a Slurm job with a typo fails at submission, not on the cluster."""
    from models.attention import get_attention, rope  # torch: the checks before this one answer without it
    from models.vit import POOLS

    for tower, causal in (("image", False), ("text", True)):
        for name in tower_names(cfg.model, tower):
            try:
                get_attention(name).check_causal(causal)
            except ValueError as e:
                raise ConfigError(f"model.{tower}_attention: {e}") from None
        kind = getattr(cfg.model, f"{tower}_pos_embed")
        if kind not in rope.KINDS:
            raise ConfigError(f"model.{tower}_pos_embed={kind!r} is not known; use one of {', '.join(rope.KINDS)}")
    if cfg.model.image_pool not in POOLS:
        raise ConfigError(f"model.image_pool={cfg.model.image_pool!r} is not known; use one of {', '.join(POOLS)}")


def check_impl(model: ModelConfig) -> None:
    """model.attention_impl one of the dispatcher's (models/attention/ops/dispatch.py). With RoPE, a variant with a
    rope_feature_map (linear_elu) runs rope.rotated_linear in PyTorch ops whatever its impl says (Attention.forward),
    so an impl other than auto or torch, from attention_impl or the tower's options, is refused, not ignored."""
    from models.attention import get_attention
    from models.attention.ops.dispatch import IMPL_NAMES

    impl = model.attention_impl
    if impl not in IMPL_NAMES:
        known = ", ".join(IMPL_NAMES) + did_you_mean(impl, IMPL_NAMES)
        raise ConfigError(f"model.attention_impl={impl!r} is not known; use one of {known}")
    for tower in ("image", "text"):
        if getattr(model, f"{tower}_pos_embed") != "rope":
            continue
        options = getattr(model, f"{tower}_attention_options")
        for name in tower_names(model, tower):
            own = options[name] if isinstance(options.get(name), dict) else options
            key = f"model.{tower}_attention_options impl" if "impl" in own else "model.attention_impl"
            asked = own.get("impl", impl)
            if get_attention(name).rope_feature_map is not None and asked not in ("auto", "torch"):
                raise ConfigError(
                    f"{key}={asked} would be ignored: with model.{tower}_pos_embed=rope, {name} runs its rotary form "
                    f"in PyTorch ops whatever the impl (models/attention/rope.py); set {key}=auto (or torch), "
                    f"or model.{tower}_pos_embed=learnable"
                )


def check_model_size(model: ModelConfig) -> None:
    """model.name a known size, model.image_size a multiple of its patch size, context_length >= 2 (resolved_size)."""
    try:
        resolved_size(model)
    except (ValueError, KeyError) as e:
        message = str(e).splitlines()[0]
        raise ConfigError(message if message.startswith("model.") else f"model.name: {message}") from None


def warmup_warning(cfg: Config) -> str | None:
    """A warmup longer than the run is allowed (smoke runs of a real config do it) but said once."""
    if cfg.optim.warmup_steps <= cfg.train.max_steps:
        return None
    return (
        f"warning: optim.warmup_steps={cfg.optim.warmup_steps} is more than train.max_steps={cfg.train.max_steps}: "
        "the learning rate never reaches optim.lr; make it <= train.max_steps for the full schedule"
    )


def build_section(name: str, cls: type, values: dict):
    if not isinstance(values, dict):
        raise ConfigError(f"config section {name!r} must be a mapping of keys to values, not {values!r}")
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    values = dict(values)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(
                f"unknown config key {name}.{key}; valid keys of {name!r}: {', '.join(fields)}"
                + did_you_mean(key, fields)
            )
        if dataclasses.is_dataclass(hints[key]):  # a section inside the section, e.g. train.ema
            values[key] = build_section(f"{name}.{key}", hints[key], value if value is not None else {})
            continue
        value = values[key] = coerce_float(value, hints[key])
        if not matches(value, hints[key]):
            allowed = choices(hints[key])
            if allowed:
                raise ConfigError(f"{name}.{key} must be one of {', '.join(map(str, allowed))}, got {value!r}")
            raise ConfigError(f"{name}.{key} must be {type_name(hints[key])}, got {type(value).__name__} {value!r}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section {name!r}: {e}") from None


def choices(hint) -> tuple:
    """The allowed values of a `Literal[...]` field (also inside `Literal[...] | None`), else ()."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(v for a in typing.get_args(hint) for v in choices(a))
    return ()


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
    if origin is Literal:
        return value in args
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
