"""A training run folder is enough for the scaling fits: summary.json, val_loss at every evaluation."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from eval.scaling import main as scaling_main
from eval.val_loss import validation_loss
from models import create_model, summary, tokenizer, transforms
from models.counts import KEYS
from tests.train.common import TORCHRUN, checkpoints, cli, finish, metrics, run, tiny_config, train_records
from train.loss import build_loss


def val_spec(synthetic: dict) -> str:
    """The validation shards make_synthetic writes beside the train shards."""
    folder = Path(synthetic["train"]).parents[1] / "val"
    return str(folder / f"{{00000..{len(list(folder.glob('*.tar'))) - 1:05d}}}.tar")


def test_run_records_summary_and_val_loss(tmp_path, synthetic, capsys):
    spec = val_spec(synthetic)
    config = tiny_config(tmp_path, synthetic, eval={"dataset": synthetic["eval"], "every": 2, "val_shards": spec})
    assert run(config, "train.max_steps=4", "train.save_every=4") == 0
    sizes = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert list(sizes) == list(KEYS) and sizes == summary(create_model("tiny-s"))
    evals = [r for r in metrics(tmp_path / "run") if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4] and all("zeroshot/top1" in r for r in evals)
    # The logged value is the definition applied to the saved weights.
    model = create_model("tiny-s")
    model.load_state_dict(load_file(str(checkpoints(tmp_path / "run")[-1] / "model.safetensors")))
    expected = validation_loss(
        model,
        spec,
        build_loss("clip", gather=False),
        batch_size=64,
        image_transform=transforms("tiny-s")[1],
        tokenizer=tokenizer("tiny-s"),
    )
    assert evals[-1]["val_loss"] == pytest.approx(expected, rel=1e-5)
    # The README's command works on training run folders: every evaluation is a point.
    out = tmp_path / "fit"
    for y in ("error", "val_loss"):
        argv = [str(tmp_path), "--x", "compute", "--y", y, "--group", "model.image_attention", "--points", "all"]
        assert scaling_main([*argv, "--n-boot", "20", "--out", str(out / y)]) == 0, capsys.readouterr().err
        report = json.loads((out / y / "report.json").read_text())
        assert report["groups"]["softmax"]["n_points"] == 2


def test_val_loss_leaves_the_training_random_state_alone(tmp_path, synthetic):
    """Random crops draw from torch's generator in the training process (workers=0): with and without the
    validation loss the run sees the same crops, so it takes the same steps."""
    losses = []
    for name, val in (("with", val_spec(synthetic)), ("without", None)):
        (tmp_path / name).mkdir()
        config = tiny_config(
            tmp_path / name,
            synthetic,
            data={"workers": 0},
            train={"augment": True},
            eval={"every": 1, "val_shards": val},
        )
        assert run(config, f"train.run_dir={tmp_path / name}") == 0
        losses.append([r["loss"] for r in train_records(tmp_path / name)])
    assert losses[0] == losses[1]


def test_val_loss_is_the_same_on_one_and_two_processes(tmp_path, synthetic):
    """Both runs take the same steps (one step per epoch, as in test_distributed); the validation batches are
    dealt to ranks round-robin (an odd number of them, so one rank repeats one uncounted) and all-reduced."""
    common = ["train.max_steps=2", "data.train_num_samples=16", "data.batch_size=16", "eval.batch_size=56"]
    config = tiny_config(tmp_path, synthetic, eval={"every": 1, "val_shards": val_spec(synthetic)})
    proc = cli([str(config), f"train.run_dir={tmp_path / 'two'}", *common], launcher=TORCHRUN)
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]
    assert run(config, f"train.run_dir={tmp_path / 'one'}", *common) == 0
    one, two = ([r["val_loss"] for r in metrics(tmp_path / d) if "val_loss" in r] for d in ("one", "two"))
    assert len(one) == len(two) == 2 and one == pytest.approx(two, rel=1e-5)
