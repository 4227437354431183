"""Bad checkpoints given to the evaluation CLIs: one `error:` line naming the file and the reason, exit 2, nothing
written, no code from a file ever run; a run directory is read at the checkpoint resume would take."""

import json

import pytest
import torch
from safetensors.torch import save_file

from eval import zeroshot
from models import ModelConfig, build_clip, run_folder
from tests.hostile import code_pickle
from tests.models.test_run_folder import fake_checkpoint


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory):
    from data import make_synthetic

    out = tmp_path_factory.mktemp("data")
    make_synthetic(out, train_samples=8, eval_per_class=1, shard_size=8)
    return str(out / "eval")


def weights_folder(folder, model_name: str = "tiny-s"):
    """meta.json + model.safetensors of a fresh tiny model: all that eval needs."""
    folder.mkdir(parents=True)
    cfg = ModelConfig(name=model_name)
    save_file(build_clip(cfg).state_dict(), str(folder / "model.safetensors"))
    meta = {"step": 1, "samples_seen": 8, "config": {"model": vars(cfg)}}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def one_error_line(argv, capsys) -> str:
    """The `error:` line of a failed zeroshot.main (after any `warning:` lines, each naming a skipped file)."""
    with pytest.raises(SystemExit) as caught:
        zeroshot.main([*argv, "--device", "cpu", "--workers", "0"])
    *warnings, err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and err.startswith("error: "), err
    assert all(line.startswith("warning: skipping checkpoint ") for line in warnings), warnings
    return err


def test_model_safetensors_that_is_not_safetensors(tmp_path, eval_set, capsys):
    folder = weights_folder(tmp_path / "ckpt")
    (folder / "model.safetensors").write_bytes(b"this is not a safetensors file at all")
    out = tmp_path / "result.json"
    err = one_error_line([str(folder), "--dataset", eval_set, "--out", str(out)], capsys)
    assert err.startswith(f"error: checkpoint {folder}: model.safetensors does not load (SafetensorError")
    assert not out.exists()


def test_a_copy_of_just_meta_and_weights_is_enough(tmp_path, eval_set):
    folder = weights_folder(tmp_path / "ckpt")
    assert zeroshot.main([str(folder), "--dataset", eval_set, "--device", "cpu", "--workers", "0"])["num_images"] == 24


def test_checkpoint_evil_pt_never_runs(tmp_path, eval_set, capsys):
    evil, marker = tmp_path / "evil.pt", tmp_path / "code-ran"
    evil.write_bytes(code_pickle(marker))
    out = tmp_path / "result.json"
    argv = ["--open-clip-model", "tiny-s", "--checkpoint", str(evil), "--dataset", eval_set, "--out", str(out)]
    err = one_error_line(argv, capsys)
    assert err.startswith(f"error: checkpoint {evil} does not load as a torch (weights_only=True) file (Unpickling")
    assert not marker.exists() and not out.exists()


def test_a_run_directory_is_read_at_the_checkpoint_resume_would_take(tmp_path, eval_set, capsys):
    """The newest step folder has a bad optimizer file: resume would skip it, so eval does too (and says so)."""
    run = tmp_path / "run"
    older, newer = fake_checkpoint(run, 1), fake_checkpoint(run, 2)
    for folder in (older, newer):
        save_file(build_clip(ModelConfig(name="tiny-s")).state_dict(), str(folder / "model.safetensors"))
        (folder / run_folder.MANIFEST).unlink()
        run_folder.write_manifest(folder)
    torch.save({"different": 1}, newer / "state" / "scheduler.bin")
    result = zeroshot.main([str(run), "--dataset", eval_set, "--device", "cpu", "--workers", "0"])
    assert result["checkpoint"] == str(older) and result["step"] == 1
    assert f"warning: skipping checkpoint {newer}: state/scheduler.bin " in capsys.readouterr().err
    (older / "meta.json").write_text("{}")
    err = one_error_line([str(run), "--dataset", eval_set], capsys)
    assert err == (
        f"error: {run} has no complete checkpoint (each one is named above with its problem); "
        "pass a run directory or checkpoint folder written by python -m train"
    )
