"""Locking a tower (LiT), per-tower learning rates and weight decay, layer-wise learning-rate decay
(train/towers.py): which parameters train, at which rate; a locked tower is bit-identical after training and holds no
optimizer state; the trainable count is logged."""

import json

import pytest
import torch

from models import ModelConfig, build_clip
from tests.train.common import checkpoints, run, tiny_config, weights
from train.config import OptimConfig
from train.optim import build_optimizer, param_groups
from train.towers import block_counts, group_of, lock_towers, tower_of


@pytest.fixture
def model():
    torch.manual_seed(0)
    return build_clip(ModelConfig(name="tiny-s"))


def trainable(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


def test_groups_follow_depth_in_both_towers(model):
    blocks = block_counts(model)
    assert blocks["image"] >= 2 and blocks["text"] >= 2
    last = {tower: n + 1 for tower, n in blocks.items()}
    expected = {
        "visual.conv1.weight": 0,
        "visual.class_embedding": 0,
        "visual.ln_pre.weight": 0,
        "visual.transformer.resblocks.1.attn.in_proj_weight": 2,
        "visual.ln_post.weight": last["image"],
        "visual.proj": last["image"],
        "token_embedding.weight": 0,
        "positional_embedding": 0,
        "transformer.resblocks.0.mlp.c_fc.weight": 1,
        "ln_final.weight": last["text"],
        "text_projection": last["text"],
    }
    names = dict(model.named_parameters())
    for name, group in expected.items():
        assert name in names, name
        assert group_of(name, blocks[tower_of(name)]) == group, name
    assert (
        tower_of("logit_scale") is None and tower_of("visual.proj") == "image" and tower_of("ln_final.bias") == "text"
    )


@pytest.mark.parametrize(
    "options, image_trains",
    [
        ({"lock_image": True}, set()),
        (
            {"lock_image": True, "lock_image_unlocked_groups": 1},
            {"visual.ln_post.weight", "visual.ln_post.bias", "visual.proj"},
        ),
        ({"lock_image": True, "lock_image_unlocked_groups": 1, "lock_image_freeze_layer_norm": True}, {"visual.proj"}),
    ],
)
def test_locking_the_image_tower_leaves_its_last_groups_and_the_text_tower(model, options, image_trains):
    everything = trainable(model)
    lock_towers(model, OptimConfig(**options))
    assert {n for n in trainable(model) if n.startswith("visual.")} == image_trains
    assert {n for n in trainable(model) if not n.startswith("visual.")} == {
        n for n in everything if not n.startswith("visual.")
    }


def test_locking_the_text_tower_but_its_last_block_and_head(model):
    blocks = block_counts(model)["text"]
    lock_towers(model, OptimConfig(lock_text=True, lock_text_unlocked_layers=2, lock_text_freeze_layer_norm=True))
    text = {n for n in trainable(model) if tower_of(n) == "text"}
    assert "text_projection" in text and "ln_final.weight" not in text and "token_embedding.weight" not in text
    assert all(n.startswith(f"transformer.resblocks.{blocks - 1}.") for n in text - {"text_projection"})
    assert not any(".ln_" in n for n in text)
    assert all(p.requires_grad for n, p in model.named_parameters() if n.startswith("visual."))


def test_per_tower_rates_weight_decay_and_layer_decay(model):
    cfg = OptimConfig(lr=1e-3, image_lr=2e-3, text_weight_decay=0.05, image_layer_decay=0.5, warmup_steps=0)
    groups = param_groups(model, cfg)
    of = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    top = block_counts(model)["image"] + 1  # the head's group
    assert of[id(names["visual.proj"])] == (2e-3, 0.2)
    assert of[id(names["visual.conv1.weight"])] == (2e-3 * 0.5**top, 0.2)
    assert of[id(names["visual.transformer.resblocks.0.attn.in_proj_weight"])] == (2e-3 * 0.5 ** (top - 1), 0.2)
    assert of[id(names["visual.ln_pre.weight"])] == (2e-3 * 0.5**top, 0.0)  # never decayed
    assert of[id(names["text_projection"])] == (1e-3, 0.05)
    assert of[id(names["transformer.resblocks.0.mlp.c_fc.weight"])] == (1e-3, 0.05)
    assert of[id(names["logit_scale"])] == (1e-3, 0.0)
    assert sum(len(g["params"]) for g in groups) == len(names)
    optimizer, _ = build_optimizer(model, cfg, max_steps=10)
    assert sorted({g["lr"] for g in optimizer.param_groups}) == sorted({lr for lr, _ in of.values()})


def test_without_tower_settings_the_groups_are_the_two_of_before(model):
    groups = param_groups(model, OptimConfig(lr=1e-3, weight_decay=0.1))
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(1e-3, 0.1), (1e-3, 0.0)]


def test_a_locked_tower_holds_no_optimizer_state(model):
    lock_towers(model, OptimConfig(lock_image=True))
    optimizer, _ = build_optimizer(model, OptimConfig(warmup_steps=0), max_steps=10)
    images, tokens = torch.rand(2, 3, 32, 32), torch.randint(0, 100, (2, 32))
    image_features, text_features, scale = model(images, tokens)[:3]
    (image_features @ text_features.T * scale).sum().backward()
    optimizer.step()
    moments = sum(t.numel() for state in optimizer.state.values() for k, t in state.items() if k != "step")
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert moments == 2 * trained  # AdamW's two moments, of the trained parameters only
    assert all(p.grad is None for p in model.visual.parameters())


def test_a_locked_tower_is_bit_identical_after_training_and_the_count_is_logged(tmp_path, synthetic, capsys):
    optim = {"lock_image": True, "lock_image_unlocked_groups": 1}
    config = tiny_config(tmp_path, synthetic, optim=optim, train={"max_steps": 3, "save_every": 1, "keep_last": 3})
    capsys.readouterr()
    assert run(config) == 0
    first, last = (
        weights(folder) for folder in checkpoints(tmp_path / "run")[:: len(checkpoints(tmp_path / "run")) - 1]
    )
    frozen = [n for n in first if n.startswith("visual.") and not n.startswith(("visual.proj", "visual.ln_post"))]
    assert frozen and all(torch.equal(first[n], last[n]) for n in frozen)
    assert not torch.equal(first["visual.proj"], last["visual.proj"])
    assert not torch.equal(first["text_projection"], last["text_projection"])
    err = capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert f"trainable parameters: {summary['params_trainable']:,} of {summary['params']:,}" in err
    assert summary["params_trainable"] < summary["params"] - summary["params_image"] + 64 * 64 + 2 * 64 + 1


def test_registers_are_an_embedding_undecayed_in_the_first_group():
    """ViT registers (model.image_registers, timm's reg_token) train with the embeddings: group 0 (frozen with them
    by lock_image_unlocked_groups) and no weight decay, as timm leaves them."""
    from train.optim import decays

    model = build_clip(ModelConfig(name="tiny-s", image_registers=2))
    names = dict(model.named_parameters())
    assert group_of("visual.reg_token", block_counts(model)["image"]) == 0
    assert not decays("visual.reg_token", names["visual.reg_token"], model.visual)
