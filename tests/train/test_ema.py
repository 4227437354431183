"""train.ema: timm's ModelEmaV3 of the weights, updated every train.ema.every optimizer steps, checkpointed as
ema.safetensors (required by an EMA run's checkpoint) and resumed bit for bit, evaluated beside the weights,
exported as an open_clip state dict."""

import open_clip
import pytest
import torch
from safetensors.torch import load_file

from models import run_folder
from models.clip import load_checkpoint
from scripts import export_open_clip
from tests.train.common import checkpoints, metrics, run, tiny_config, weights
from tests.train.test_preemption import assert_same_run, crashed_copy
from train.checkpoint import problem

# warm-up on and an update every other step, so that resume must restore the update count and the EMA itself
EMA = {"decay": 0.9, "warmup": True, "warmup_power": 0.75, "every": 2}


def ema_weights(folder):
    return load_file(str(folder / run_folder.EMA))


@pytest.fixture
def reference(tmp_path, synthetic):
    """An EMA run of 4 deterministic steps with checkpoints and evaluations at 2 and 4: (config, run dir).
    Function-scoped: a run made in a module fixture's setup differs from the same run in a test in its last bits."""
    evals = {"dataset": synthetic["eval"], "val_shards": synthetic["val"], "every": 2, "batch_size": 32}
    train = {"max_steps": 4, "save_every": 2, "keep_last": 2, "deterministic": True, "ema": EMA}
    path = tiny_config(tmp_path, synthetic, train=train, eval=evals)
    assert run(path) == 0
    return path, tmp_path / "run"


def test_ema_run_of_2n_steps_equals_n_steps_and_a_resume(reference, tmp_path):
    path, run_dir = reference
    resumed = crashed_copy(run_dir, 2, tmp_path / "resumed")
    assert run(path, f"train.run_dir={resumed}") == 0
    assert_same_run(resumed, run_dir)
    final, expected = ema_weights(checkpoints(resumed)[-1]), ema_weights(checkpoints(run_dir)[-1])
    assert final.keys() == weights(checkpoints(run_dir)[-1]).keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)


def test_ema_is_timms_average_and_is_evaluated_beside_the_weights(reference):
    """Updates at steps 2 and 4 (every 2): the first a copy of the weights, the second with decay
    min(0.9, 1 - 2 ** -0.75) = 0.405; at step 2 the EMA's evaluation is the weights'."""
    _, run_dir = reference
    at2, at4 = checkpoints(run_dir)
    assert all(torch.equal(ema_weights(at2)[k], v) for k, v in weights(at2).items())
    decay = min(0.9, 1 - 2**-0.75)
    expected = {k: decay * ema_weights(at2)[k] + (1 - decay) * v for k, v in weights(at4).items()}
    assert all(torch.allclose(ema_weights(at4)[k], v, atol=1e-6) for k, v in expected.items())
    assert not torch.equal(ema_weights(at4)["text_projection"], weights(at4)["text_projection"])
    evals = [r for r in metrics(run_dir) if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all({"ema/val_loss", "ema/zeroshot/top1", "ema/zeroshot/top5"} <= r.keys() for r in evals)
    assert evals[0]["ema/val_loss"] == evals[0]["val_loss"]
    assert evals[0]["ema/zeroshot/top1"] == evals[0]["zeroshot/top1"]
    assert evals[1]["ema/val_loss"] != evals[1]["val_loss"]


def test_an_ema_checkpoint_without_its_ema_file_is_incomplete(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 1, "ema": {"decay": 0.5}, "keep_last": 1})
    assert run(path) == 0
    folder = checkpoints(tmp_path / "run")[-1]
    assert problem(folder) is None
    (folder / run_folder.EMA).unlink()
    assert problem(folder) == "ema.safetensors is missing"  # listed in the manifest
    missing = "ema.safetensors is missing (the run keeps an EMA of the weights, train.ema.decay=0.5)"
    run_folder.write_manifest(folder)  # as a writer that forgot it would leave it
    assert problem(folder) == missing
    (folder / run_folder.MANIFEST).unlink()  # a folder without a manifest is checked by loading its files
    assert problem(folder) == missing


def test_a_resume_from_a_checkpoint_without_ema_starts_it_from_the_weights(tmp_path, synthetic, capsys):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 2, "save_every": 1})
    assert run(path) == 0
    assert run(path, "train.max_steps=3", "train.ema.decay=0.5") == 0
    err = capsys.readouterr().err
    start = checkpoints(tmp_path / "run")[-2]
    assert err.count("EMA") == 1
    assert f"warning: checkpoint {start} holds no ema.safetensors: the EMA starts from its weights at step 2\n" in err
    end = checkpoints(tmp_path / "run")[-1]
    expected = {k: 0.5 * v + 0.5 * weights(end)[k] for k, v in weights(start).items()}
    assert all(torch.allclose(ema_weights(end)[k], v, atol=1e-6) for k, v in expected.items())


def test_export_of_the_ema_loads_in_open_clip(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 2, "ema": {"decay": 0.5}})
    assert run(path) == 0
    assert export_open_clip.main([str(tmp_path / "run"), str(tmp_path / "ema.safetensors"), "--ema"]) == 0
    ours = load_file(str(tmp_path / "ema.safetensors"))
    model = open_clip.create_model("tiny-s", pretrained=str(tmp_path / "ema.safetensors"))
    saved = ema_weights(checkpoints(tmp_path / "run")[-1])
    assert all(torch.equal(v.reshape(saved[k].shape), saved[k]) for k, v in model.state_dict().items())
    assert ours.keys() == saved.keys() and not torch.equal(
        saved["text_projection"], weights(tmp_path / "run" / "checkpoints" / run_folder.step_name(2))["text_projection"]
    )


def test_export_of_the_ema_of_a_run_without_one_is_one_line(tmp_path, synthetic, capsys):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 1})
    assert run(path) == 0
    assert export_open_clip.main([str(tmp_path / "run"), str(tmp_path / "x.safetensors"), "--ema"]) == 1
    assert (
        "ema.safetensors is missing (the run kept no EMA of the weights: train.ema.decay=0)" in capsys.readouterr().err
    )
    assert load_checkpoint(tmp_path / "run").state_dict().keys() == weights(checkpoints(tmp_path / "run")[-1]).keys()
