"""Every shipped config: loaded and validated, its model built on the meta device (sizes, GMACs, FSDP sharding),
its batch divisible by the world size its header documents; the `base:` mechanism and `Literal` choices."""

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from torch.distributed.tensor import DTensor

from models import ModelConfig, build_clip, summary
from models.config import size_config
from tests.train.common import REPO
from train.config import SECTIONS, ConfigError, TrainConfig, load_config, read_config_file
from train.dist import shard_model

SHIPPED = sorted((REPO / "configs").glob("*.yaml"))
# training configs (sections of train.config, or a base); the others are eval.suite's (one key, datasets)
RUN_CONFIGS = [p for p in SHIPPED if set(yaml.safe_load(p.read_text())) <= {*SECTIONS, "base"}]
MODEL_CONFIGS = sorted((REPO / "configs" / "models").glob("*.json"))
# open_clip's parameter counts (millions, as README.md gives them)
PARAMS_M = {"ViT-S-16": 62.26, "ViT-B-16": 149.62, "ViT-L-16": 427.74}


def documented_world_size(path: Path) -> int:
    """The largest `--nproc_per_node N` of the header's launch commands; 1 when it documents none."""
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    return max([int(n) for n in re.findall(r"--nproc_per_node (\d+)", header)], default=1)


def tower_macs(tokens: int, width: int, layers: int) -> float:
    """MACs of a pre-LN transformer tower of MLP ratio 4: per token and layer 4w^2 (q, k, v, out) + 8w^2 (MLP),
    plus 2 N^2 w per layer for q k^T and the weighted sum of v (Kaplan et al. 2020, Table 1)."""
    return layers * (12 * tokens * width**2 + 2 * tokens**2 * width)


def meta_model(name: str):
    with torch.device("meta"):
        return build_clip(ModelConfig(name=name))


def test_every_shipped_yaml_is_a_training_or_suite_config():
    suites = [p for p in SHIPPED if p not in RUN_CONFIGS]
    assert len(RUN_CONFIGS) >= 5
    for path in suites:  # eval.suite checks the paths when it runs; here the shape
        raw = yaml.safe_load(path.read_text())
        assert set(raw) == {"datasets"}, f"{path.name} is neither a training config nor an evaluation suite"
        assert all(isinstance(v, str) or "path" in v for v in raw["datasets"].values())


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_run_config_loads_and_its_batch_splits(path):
    cfg = load_config([str(path)])
    world = documented_world_size(path)
    cfg.data.validate(world)  # the global batch divides over the documented processes
    assert cfg.data.batch_size // world * world == cfg.data.batch_size
    assert cfg.train.max_steps >= 1 and cfg.train.accum_freq >= 1
    if cfg.train.distributed == "fsdp":
        assert world > 1, "FSDP shards over several GPUs: document a multi-GPU launch"
    model = meta_model(cfg.model.name)
    assert {type(m).__name__ for m in model.modules()} >= set(cfg.train.fsdp_wrap)


@pytest.mark.parametrize("name", [*PARAMS_M, *(p.stem for p in MODEL_CONFIGS)])
def test_size_builds_on_meta_with_its_parameter_count_and_gmacs(name):
    model = meta_model(name)
    assert all(p.is_meta for p in model.parameters())
    s = summary(model)
    if name in PARAMS_M:
        assert round(s["params"] / 1e6, 2) == PARAMS_M[name]
    v, t = size_config(name)["vision_cfg"], size_config(name)["text_cfg"]
    patches = (v["image_size"] // v["patch_size"]) ** 2
    image = tower_macs(patches + 1, v["width"], v["layers"]) + patches * v["width"] * 3 * v["patch_size"] ** 2
    text = tower_macs(t["context_length"], t["width"], t["layers"])
    # the counted figure also has the output projections; on ViT-B/16 timm's published 17.6 image GMACs
    assert s["image_gmacs"] * 1e9 == pytest.approx(image, rel=0.01)
    assert s["text_gmacs"] * 1e9 == pytest.approx(text, rel=0.01)


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    """A 1-process gloo group, so fully_shard can build its mesh in this process; removed afterwards."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "path", [p for p in RUN_CONFIGS if "laion" in p.name] + [REPO / "configs/tiny.yaml"], ids=lambda p: p.name
)
def test_fsdp_shards_every_shipped_model_on_meta(path, one_rank_group):
    """train.distributed=fsdp's wrapping: one unit per block and the root, every parameter a DTensor (a 0-dim
    one, such as open_clip's logit scale, makes fully_shard raise)."""
    cfg = load_config([str(path)])
    model = meta_model(cfg.model.name)
    model.logit_bias = torch.nn.Parameter(torch.full((1,), -10.0, device="meta"))  # SigLIP's, also [1]
    blocks = sum(type(m).__name__ == "Block" for m in model.modules())
    shard_model(model, TrainConfig(distributed="fsdp", precision="bf16"), "cpu")
    units = [m for m in model.modules() if type(m).__name__.startswith("FSDP")]
    assert len(units) == blocks + 1 and units[0] is model
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert model.logit_scale.shape == (1,)


def test_fsdp_wrap_naming_no_class_is_a_config_error(one_rank_group):
    with pytest.raises(ConfigError, match=r"train.fsdp_wrap=\['Blok'\] names no module class of the model"):
        shard_model(meta_model("tiny-s"), TrainConfig(fsdp_wrap=["Blok"]), "cpu")


def test_laion_configs_share_their_base():
    base = read_config_file(REPO / "configs" / "base" / "laion400m.yaml")
    for size, distributed in (("s", "ddp"), ("b", "ddp"), ("l", "fsdp")):
        path = REPO / "configs" / f"vit_{size}16_laion400m.yaml"
        raw = read_config_file(path)
        assert raw["optim"] == base["optim"] and raw["eval"] == base["eval"]
        assert raw["data"]["train_shards"] == base["data"]["train_shards"]
        cfg = load_config([str(path), "optim.lr=1e-4"])
        assert cfg.model.name == f"ViT-{size.upper()}-16" and cfg.train.distributed == distributed
        assert cfg.optim.lr == 1e-4 and cfg.train.precision == "bf16"  # an override beats file and base
        assert len(path.read_text().splitlines()) <= 25


def test_base_merges_key_by_key_and_reports_cycles(tmp_path):
    (tmp_path / "a.yaml").write_text("train: {max_steps: 5, log_every: 2}\noptim: {betas: [0.9, 0.95]}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ntrain: {max_steps: 7}\noptim: {betas: [0.8, 0.9]}\n")
    cfg = load_config([str(tmp_path / "b.yaml")])
    assert (cfg.train.max_steps, cfg.train.log_every, cfg.optim.betas) == (7, 2, [0.8, 0.9])
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    with pytest.raises(ConfigError, match="is its own base"):
        load_config([str(tmp_path / "b.yaml")])
    (tmp_path / "c.yaml").write_text("base: nope.yaml\n")
    with pytest.raises(ConfigError, match=r"nope.yaml' does not exist"):
        load_config([str(tmp_path / "c.yaml")])


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.distributed=zero", "train.distributed must be one of ddp, fsdp, got 'zero'"),
        ("optim.schedule=linear", "optim.schedule must be one of cosine, constant, const-cooldown, got 'linear'"),
        ("train.wandb=true", "train.wandb must be one of online, offline, disabled, got True"),
        ("train.tf32=maybe", "train.tf32 must be bool, got str 'maybe'"),
    ],
)
def test_literal_choices_are_checked(override, message):
    with pytest.raises(ConfigError) as e:
        load_config([str(REPO / "configs" / "tiny.yaml"), override])
    assert message in str(e.value)


@pytest.mark.parametrize("name", PARAMS_M)
def test_sizes_without_open_clip_are_open_clips(name, monkeypatch):
    """configs/models/open_clip/*.json (read where open_clip is not installed) hold open_clip's configs."""
    import open_clip

    import models.config

    theirs = open_clip.get_model_config(name)
    monkeypatch.setattr(models.config, "open_clip_config_dir", lambda: None)  # as where open_clip is not installed
    monkeypatch.setattr(models.config, "open_clip_with_sizes", lambda: None)
    assert size_config(name) == theirs
    with pytest.raises(ValueError, match="unknown model size 'ViT-H-14'"):
        size_config("ViT-H-14")
