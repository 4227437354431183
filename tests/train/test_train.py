"""In-process runs of train.main.main on the synthetic shards: run directory, NaN handling, resume checks, variants."""

import json
import math

import pytest
import torch

from models.attention import ATTENTIONS
from tests.train.common import checkpoints, metrics, poison_steps, run, tiny_config, train_records, weights
from train.config import ConfigError, load_config, to_dict
from train.loop import TrainingError


def test_smoke_run_directory(tmp_path, synthetic):
    path = tiny_config(
        tmp_path,
        synthetic,
        train={"max_steps": 3, "save_every": 2, "keep_last": 1},
        eval={"dataset": synthetic["eval"], "every": 2},
    )
    assert run(path) == 0
    run_dir = tmp_path / "run"
    assert load_config([str(run_dir / "config.yaml")]) == load_config([str(path)])
    assert len((run_dir / "git_commit.txt").read_text().strip()) >= 7
    steps = train_records(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3] and [r["samples_seen"] for r in steps] == [16, 32, 48]
    for r in steps:
        assert math.isfinite(r["loss"]) and r["lr"] > 0 and r["samples_per_s"] > 0 and r["data_wait_s"] >= 0
        assert 1 < r["logit_scale"] <= 100 and sum(r["skipped"].values()) == 0
    evals = [r for r in metrics(run_dir) if "zeroshot/top1" in r]
    assert [r["step"] for r in evals] == [2, 3] and all(
        0 <= r["zeroshot/top1"] <= r["zeroshot/top5"] <= 1 for r in evals
    )
    assert [p.name for p in checkpoints(run_dir)] == ["step_00000003"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_00000003"
    meta = json.loads((run_dir / "checkpoints" / "step_00000003" / "meta.json").read_text())
    assert meta["step"] == 3 and meta["samples_seen"] == 48 and meta["config"] == to_dict(load_config([str(path)]))
    from models import ModelConfig, build_clip

    rebuilt = build_clip(ModelConfig(**meta["config"]["model"]))
    rebuilt.load_state_dict(weights(run_dir / "checkpoints" / "step_00000003"))  # strict: our keys = the model's


def test_nan_step_is_skipped(tmp_path, synthetic, capsys, monkeypatch):
    poison_steps(monkeypatch, {2})
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 3, "save_every": 1, "keep_last": 3})
    assert run(path) == 0
    assert (
        "warning: step 2: non-finite loss nan or gradient norm nan, optimizer step skipped (1 in a row)"
        in capsys.readouterr().err
    )
    steps = train_records(tmp_path / "run")
    assert steps[1]["loss"] is None and steps[1]["bad_steps"] == 1 and math.isfinite(steps[2]["loss"])
    one, two, three = (weights(p) for p in checkpoints(tmp_path / "run"))
    assert all(torch.equal(one[k], two[k]) for k in one)  # the skipped step changed nothing
    assert not all(torch.equal(two[k], three[k]) for k in two)


def test_consecutive_nan_steps_stop_the_run(tmp_path, synthetic, monkeypatch):
    poison_steps(monkeypatch, {2, 3})
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 6, "save_every": 1, "keep_last": 9, "max_bad_steps": 2})
    with pytest.raises(TrainingError, match="stopped at step 3: 2 consecutive steps with a non-finite"):
        run(path)
    saved = checkpoints(tmp_path / "run")
    assert [p.name for p in saved] == ["step_00000001", "step_00000002"]
    assert all(torch.isfinite(t).all() for p in saved for t in weights(p).values())


def test_nan_weights_are_never_saved(tmp_path, synthetic, monkeypatch):
    import train.loop

    original = train.loop.clamp_logit_scale

    def poison(model):  # the model goes NaN after step 2; the checkpoint of step 2 must be refused
        original(model)
        if train_step[0] == 1:
            with torch.no_grad():
                model.visual.proj.fill_(float("nan"))
        train_step[0] += 1

    train_step = [0]
    monkeypatch.setattr(train.loop, "clamp_logit_scale", poison)
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 3, "save_every": 1, "keep_last": 9})
    with pytest.raises(RuntimeError, match="refusing to write checkpoint step_00000002: the model holds NaN"):
        run(path)
    assert [p.name for p in checkpoints(tmp_path / "run")] == ["step_00000001"]


def test_resume_skips_incomplete_and_corrupt_checkpoints(tmp_path, synthetic, monkeypatch, capsys):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 3, "save_every": 1, "keep_last": 9})
    assert run(path) == 0
    root = tmp_path / "run" / "checkpoints"
    blob = (root / "step_00000003" / "model.safetensors").read_bytes()
    (root / "step_00000003" / "model.safetensors").write_bytes(blob[: len(blob) // 2])  # truncated
    (root / "step_00000002" / "meta.json").unlink()  # incomplete
    (root / ".tmp_step_00000004").mkdir()  # a write that never finished
    loads = []
    real_load = torch.load

    def spy(*args, **kwargs):
        loads.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    capsys.readouterr()
    assert run(path, "train.max_steps=4") == 0
    err = capsys.readouterr().err
    assert f"warning: skipping checkpoint {root / 'step_00000003'}: model.safetensors has " in err
    assert f"warning: skipping checkpoint {root / 'step_00000002'}: meta.json is missing\n" in err
    assert f"resumed from {root / 'step_00000001'} at step 1" in err
    assert [r["step"] for r in train_records(tmp_path / "run")] == [1, 2, 3, 4]
    assert loads and all(w is True for w in loads)  # optimizer, scheduler and RNG states: no code from the file
    assert not (root / ".tmp_step_00000004").exists()


def test_resuming_an_older_checkpoint_of_the_same_run_names_the_newer_ones(tmp_path, synthetic):
    """A rollback in place (train.resume=PATH to an older step of this run) would be undone by a requeue and its
    pruning would delete the folder it resumed from: one line naming the newer folders and the fix, nothing lost."""
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 3, "save_every": 1, "keep_last": 2})
    assert run(path) == 0
    root = tmp_path / "run" / "checkpoints"
    with pytest.raises(ConfigError) as e:
        run(path, "train.max_steps=4", f"train.resume={root / 'step_00000002'}")
    assert str(e.value) == (
        f"train.resume={root / 'step_00000002'} is step 2, but this run folder holds newer checkpoints (step_00000003) "
        "that a requeue (train.resume=auto) would resume from and the next save's pruning would keep over it; "
        f"move them out of {root} or train into a new train.run_dir"
    )
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_00000002", "step_00000003"]
    (root / "step_00000003").rename(tmp_path / "step_00000003")
    assert run(path, "train.max_steps=4", f"train.resume={root / 'step_00000002'}") == 0
    assert [r["step"] for r in train_records(tmp_path / "run")][-1] == 4


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 1})
    assert run(path) == 0
    with pytest.raises(
        ConfigError, match=r"holds another model \(model.image_attention='softmax' there\); pick a new train.run_dir"
    ):
        run(path, "train.max_steps=2", "model.image_attention=linear_elu")
    assert run(path, "train.max_steps=2", "model.image_attention=linear_elu", "train.resume=none") == 0


def test_siglip_trains_with_its_own_bias_and_scale(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 2, "loss": "siglip"})
    assert run(path) == 0
    steps = train_records(tmp_path / "run")
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert abs(math.log(steps[-1]["logit_scale"]) - math.log(10)) < 0.01
    bias = weights(checkpoints(tmp_path / "run")[-1])["logit_bias"]
    assert abs(bias.item() + 10) < 0.01 and bias.item() != -10.0


def attention_pairs():
    """Every registered variant in the image tower when it can attend both ways, in the text tower when it can be
    causal (softmax in the other tower)."""
    return [
        (name if cls.supports_bidirectional else "softmax", name if cls.supports_causal else "softmax")
        for name, cls in sorted(ATTENTIONS.items())
    ]


@pytest.mark.parametrize("image_attention, text_attention", attention_pairs())
def test_every_attention_trains(tmp_path, synthetic, image_attention, text_attention):
    path = tiny_config(
        tmp_path,
        synthetic,
        model={"image_attention": image_attention, "text_attention": text_attention},
        data={"batch_size": 8},
        train={"max_steps": 2, "save_every": 1, "keep_last": 2},
    )
    assert run(path) == 0
    assert all(math.isfinite(r["loss"]) and r["bad_steps"] == 0 for r in train_records(tmp_path / "run"))
    first, second = (weights(p) for p in checkpoints(tmp_path / "run"))
    for tower in ("visual.transformer", "transformer"):
        key = f"{tower}.resblocks.0.attn.out_proj.weight"
        assert not torch.equal(first[key], second[key]), key


@pytest.mark.parametrize("attention", ["softmax", "linear_affine_nodenom"])
def test_tiny_clip_learns_zero_shot(tmp_path, synthetic, attention):
    """24 classes: chance is 4.2% top-1 and 21% top-5."""
    path = tiny_config(
        tmp_path,
        synthetic,
        model={"image_attention": attention, "text_attention": attention},
        data={"batch_size": 64},
        optim={"lr": 2.0e-3, "warmup_steps": 5, "weight_decay": 0.1},
        train={"max_steps": 30, "log_every": 10},
        eval={"dataset": synthetic["eval"]},
    )
    assert run(path) == 0
    result = [r for r in metrics(tmp_path / "run") if "zeroshot/top1" in r][-1]
    assert result["step"] == 30 and result["zeroshot/num_images"] == 120
    assert result["zeroshot/top1"] >= 0.10 and result["zeroshot/top5"] >= 0.40, result


def test_wandb_offline_needs_no_network(tmp_path, synthetic, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there: any network use would fail
    assert run(tiny_config(tmp_path, synthetic, train={"max_steps": 2, "wandb": "offline"})) == 0
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert (tmp_path / "run" / "wandb_id.txt").read_text().strip() in runs[0].name


def test_bf16_reaches_the_forward_pass(tmp_path, synthetic, monkeypatch):
    """train.precision=bf16 runs the model under bf16 autocast (its linear layers compute in bf16); fp32 does not."""
    import train.main

    real, dtypes = train.main.build_model, []

    def build(*args):
        model = real(*args)
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
        return model

    monkeypatch.setattr(train.main, "build_model", build)
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 1})
    assert run(path, "train.precision=bf16", f"train.run_dir={tmp_path / 'a'}") == 0
    assert run(path, "train.precision=fp32", f"train.run_dir={tmp_path / 'b'}") == 0
    assert dtypes == [torch.bfloat16, torch.float32]


def test_a_rerun_with_another_learning_rate_trains_with_it(tmp_path, synthetic):
    """The checkpoint's optimizer and scheduler states carry its rates; a resumed run follows the config's (the
    bad-steps error asks for a lower optim.lr), and its step 3 matches a fresh run at that rate."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    fresh = tiny_config(tmp_path / "a", synthetic, train={"max_steps": 3}, optim={"lr": 1e-4, "weight_decay": 0.0})
    assert run(fresh) == 0
    path = tiny_config(tmp_path / "b", synthetic, train={"max_steps": 2}, optim={"lr": 1e-3, "weight_decay": 0.2})
    assert run(path) == 0
    assert run(path, "train.max_steps=3", "optim.lr=1e-4", "optim.weight_decay=0.0") == 0
    lr = {r["step"]: r["lr"] for r in train_records(tmp_path / "b" / "run")}
    assert lr[3] == pytest.approx(train_records(tmp_path / "a" / "run")[2]["lr"]) and lr[2] > 5 * lr[3]


def test_a_skipped_step_under_fp16_closes_the_gradient_scalers_step():
    """A non-finite loss skips optimizer.step(), where accelerate updates the fp16 scaler; without update() the
    scaler's next unscale_ raises 'unscale_() has already been called on this optimizer since the last update()'
    (GradScaler on CPU stands in for CUDA's: the same bookkeeping)."""
    from types import SimpleNamespace

    from train.loop import close_skipped_step

    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([weight])
    accelerator = SimpleNamespace(scaler=torch.amp.GradScaler("cpu"))
    for _ in range(2):
        accelerator.scaler.scale(weight.sum()).backward()
        accelerator.scaler.unscale_(optimizer)
        close_skipped_step(accelerator)
    close_skipped_step(SimpleNamespace(scaler=None))  # fp32/bf16: nothing to close
