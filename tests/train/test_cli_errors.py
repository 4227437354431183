"""Bad input files given to the command lines (python -m train, train.submit, data.synthetic): one `error:` line
naming the file and what is wrong, a non-zero exit, nothing written."""

import json

import pytest

from models import create_model, summary
from tests.hostile import code_pickle
from tests.train.common import cli, finish, run, tiny_config
from train.config import ConfigError


def test_python_m_train_on_a_file_that_is_not_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  max_steps: [1, 2\n")
    code, _, err = finish(cli([str(bad)]))
    assert code == 1 and err.startswith(f"error: {bad} is not valid YAML at line 3, column 1: ")
    assert err.count("\n") == 1


def test_training_at_another_size_and_a_size_the_patch_does_not_divide(tmp_path, synthetic):
    """model.image_size / model.context_length train the size at another resolution and text length (the summary's
    sizes follow); an image size the patch does not divide is one error line naming the nearest valid sizes."""
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 1})
    assert run(path, "model.image_size=64", "model.context_length=24", "optim.warmup_steps=1") == 0
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    expected = summary(create_model("tiny-s", image_size=64, context_length=24))
    assert written["image_gmacs"] == pytest.approx(expected["image_gmacs"])
    assert written["image_gmacs"] > 3 * summary(create_model("tiny-s"))["image_gmacs"]  # 64 image tokens, not 16
    argv = [str(path), "model.image_size=70", "optim.warmup_steps=1", f"train.run_dir={tmp_path / 'bad'}"]
    code, _, err = finish(cli(argv))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: model.image_size=70 is not a multiple of tiny-s's patch size 8; nearest")
    assert "sizes: 64, 72" in err and not (tmp_path / "bad").exists()


def test_resume_from_a_checkpoint_with_a_code_running_pickle(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 1, "save_every": 1})
    assert run(path, "optim.warmup_steps=1") == 0
    folder = tmp_path / "run" / "checkpoints" / "step_00000001"
    (folder / "state" / "optimizer.bin").write_bytes(code_pickle(tmp_path / "ran"))
    with pytest.raises(ConfigError) as caught:
        run(path, f"train.resume={folder}", "train.max_steps=2", f"train.run_dir={tmp_path / 'other'}")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"train.resume={folder} is not a loadable checkpoint (")
    assert "state/optimizer.bin has " in message and not (tmp_path / "ran").exists()
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("command", [[], ["sweep"]], ids=["train", "sweep"])
def test_submit_with_a_config_that_is_not_yaml(tmp_path, command):
    from train.submit import main

    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    extra = ["--sizes", "tiny-s"] if command else []
    with pytest.raises(SystemExit) as caught:
        main([*command, str(bad), *extra, "--time", "10", "--dry-run"])
    assert str(caught.value) == f"train.submit: error: {bad} is not a text file (not UTF-8); give a YAML config file"


def test_synthetic_refuses_an_output_it_cannot_write_and_writes_nothing(tmp_path):
    from data.synthetic import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as caught:
        main([str(blocker / "data")])
    assert str(caught.value) == f"error: output {blocker} is a file, not a folder; give a new or existing folder"
    with pytest.raises(SystemExit) as caught:
        main([str(tmp_path / "out"), "--train-samples", "0"])
    assert str(caught.value).startswith("error: synthetic data: need train_samples >= 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_retrieval_set_that_is_not_there_is_one_line_before_training(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic)
    code, _, err = finish(cli([str(path), f"eval.retrieval={tmp_path / 'captions'}"]))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: eval.retrieval: {tmp_path / 'captions'} is neither a .csv/.tsv file nor a folder")
    assert err.rstrip().endswith("or set eval.retrieval=null") and not (tmp_path / "run").exists()
