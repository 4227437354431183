"""optim.name: torch's AdamW or timm's optimizers (train/optim.py); the Muon family updates the blocks' weight matrices
and leaves the rest to AdamW; every optimizer's state survives a save and a weights_only load exactly; a resumed Muon
run equals the uninterrupted one; an unknown name is one line listing the known ones."""

import io

import pytest
import torch

from models import ModelConfig, build_clip
from tests.train.common import checkpoints, run, tiny_config, train_records, weights
from train.config import ConfigError, OptimConfig
from train.optim import build_optimizer, check_optimizer, known_optimizers, param_groups


def tiny(seed: int = 0):
    torch.manual_seed(seed)
    return build_clip(ModelConfig(name="tiny-s"))


def loss_of(model, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    images, tokens = torch.rand(4, 3, 32, 32, generator=generator), torch.randint(0, 500, (4, 32), generator=generator)
    image_features, text_features, scale = model(images, tokens)[:3]
    logits = scale * image_features @ text_features.T
    return torch.nn.functional.cross_entropy(logits, torch.arange(4))


def step(model, optimizer, schedule, seed: int) -> None:
    optimizer.zero_grad()
    loss_of(model, seed).backward()
    optimizer.step()
    schedule.step()


def test_an_unknown_optimizer_is_one_line_with_the_known_ones():
    with pytest.raises(ConfigError) as caught:
        check_optimizer(OptimConfig(name="moun"))
    text = str(caught.value)
    assert text.startswith("optim.name='moun' is not an optimizer (did you mean muon?); known: adamw, ")
    assert "lion" in text and "\n" not in text and "bnb" not in text
    check_optimizer(OptimConfig(name="lion"))


def test_muon_takes_the_blocks_matrices_and_leaves_the_rest_to_adamw():
    model = tiny()
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, OptimConfig(name="muon"))
    muon = {names[id(p)] for g in groups if not g.get("use_fallback") for p in g["params"]}
    fallback = {names[id(p)] for g in groups if g.get("use_fallback") for p in g["params"]}
    assert muon and all(".resblocks." in f".{n}" and dict(model.named_parameters())[n].ndim == 2 for n in muon)
    for name in ("visual.conv1.weight", "visual.proj", "text_projection", "token_embedding.weight", "logit_scale"):
        assert name in fallback
    assert "transformer.resblocks.0.mlp.c_fc.weight" in muon and "transformer.resblocks.0.mlp.c_fc.bias" in fallback
    assert not any("use_fallback" in g for g in param_groups(model, OptimConfig(name="lion")))


@pytest.mark.parametrize("name", ["adamw", "muon", "lion", "lamb", "adopt", "laprop"])
def test_each_optimizer_trains_and_resumes_exactly_from_a_weights_only_state(name):
    cfg = OptimConfig(name=name, lr=1e-3, warmup_steps=1)
    assert name in known_optimizers()
    model = tiny()
    optimizer, schedule = build_optimizer(model, cfg, max_steps=10)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for seed in range(2):
        step(model, optimizer, schedule, seed)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    buffer = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}, buffer
    )
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    copy = tiny(seed=1)
    copy.load_state_dict(saved["model"])
    optimizer2, schedule2 = build_optimizer(copy, cfg, max_steps=10)
    optimizer2.load_state_dict(saved["optimizer"])
    schedule2.load_state_dict(saved["schedule"])
    for seed in (2, 3):
        step(model, optimizer, schedule, seed)
        step(copy, optimizer2, schedule2, seed)
    assert all(torch.equal(p, dict(copy.named_parameters())[n]) for n, p in model.named_parameters())


def test_a_resumed_muon_run_equals_the_uninterrupted_one(tmp_path, synthetic):
    train = {"max_steps": 4, "save_every": 2, "keep_last": 4, "deterministic": True}
    optim = {"name": "muon", "lr": 2e-3}
    (tmp_path / "whole").mkdir()
    (tmp_path / "half").mkdir()
    whole = tiny_config(tmp_path / "whole", synthetic, optim=optim, train=train)
    assert run(whole) == 0
    half = tiny_config(tmp_path / "half", synthetic, optim=optim, train={**train, "max_steps": 2})
    assert run(half) == 0
    assert run(half, "train.max_steps=4") == 0
    losses = [(r["step"], r["loss"]) for r in train_records(tmp_path / "half" / "run")]
    assert losses == [(r["step"], r["loss"]) for r in train_records(tmp_path / "whole" / "run")]
    final = weights(checkpoints(tmp_path / "half" / "run")[-1])
    expected = weights(checkpoints(tmp_path / "whole" / "run")[-1])
    assert all(torch.equal(final[k], expected[k]) for k in expected)
