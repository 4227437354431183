"""models/run_folder.py, the one owner of the run/checkpoint layout: writing, verifying, finding the newest complete
checkpoint; and the readers built on it (pretrained weights from a file, a checkpoint folder or a run)."""

import json

import pytest
import torch
from safetensors.torch import save_file

import models
from models import run_folder
from models.run_folder import MANIFEST, CheckpointError
from tests.hostile import code_pickle


def fake_checkpoint(run_dir, step: int, finish: bool = True):
    """A checkpoint folder with the files a training checkpoint has (tiny contents)."""
    tmp = run_folder.tmp_folder(run_dir, step)
    (tmp / "state").mkdir(parents=True)
    meta = {"step": step, "samples_seen": 16 * step, "config": {"model": {"name": "tiny-s"}}}
    (tmp / "meta.json").write_text(json.dumps(meta))
    save_file({"w": torch.full((3,), float(step))}, str(tmp / "model.safetensors"))
    (tmp / "data_state_0.json").write_text("{}")
    torch.save({"last_epoch": step}, tmp / "state" / "scheduler.bin")
    torch.save({"torch_manual_seed": torch.get_rng_state()}, tmp / "state" / "random_states_0.pkl")
    return run_folder.finish(tmp) if finish else tmp


def test_finish_writes_the_manifest_last_renames_and_points_latest(tmp_path):
    folder = fake_checkpoint(tmp_path, 5)
    assert folder.name == "step_00000005" and not run_folder.tmp_folder(tmp_path, 5).exists()
    manifest = json.loads((folder / MANIFEST).read_text())
    assert sorted(manifest["files"]) == sorted(run_folder.files_of(folder)) and len(manifest["files"]) == 5
    assert manifest["files"]["meta.json"]["size"] == (folder / "meta.json").stat().st_size
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000005\n"
    assert run_folder.check(folder) == run_folder.Check(None, {})


def test_newest_complete_skips_and_reports_each_bad_one(tmp_path):
    fake_checkpoint(tmp_path, 1)
    two, three = fake_checkpoint(tmp_path, 2), fake_checkpoint(tmp_path, 3)
    fake_checkpoint(tmp_path, 4, finish=False)  # an interrupted write: never a candidate
    (three / "data_state_0.json").unlink()
    size = (two / "state" / "scheduler.bin").stat().st_size
    with open(two / "state" / "scheduler.bin", "ab") as f:
        f.write(b"x")
    reports = []
    folder, result = run_folder.newest_complete(tmp_path, reports.append)
    assert folder.name == "step_00000001" and result.problem is None
    assert reports == [
        f"skipping checkpoint {three}: data_state_0.json is missing",
        f"skipping checkpoint {two}: state/scheduler.bin has {size + 1} bytes where manifest.json says {size} "
        "(truncated or replaced)",
    ]


def test_a_manifest_that_does_not_list_a_required_file_is_incomplete(tmp_path):
    folder = fake_checkpoint(tmp_path, 1)
    manifest = json.loads((folder / MANIFEST).read_text())
    del manifest["files"]["meta.json"]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert run_folder.check(folder).problem == "meta.json is not listed in manifest.json"
    (folder / MANIFEST).write_text("[1, 2")
    assert run_folder.check(folder).problem.startswith("manifest.json is not readable JSON (JSONDecodeError")


def test_meta_without_config_is_refused(tmp_path):
    tmp = fake_checkpoint(tmp_path, 1, finish=False)
    (tmp / "meta.json").write_text(json.dumps({"step": 1, "samples_seen": 16}))
    folder = run_folder.finish(tmp)
    assert run_folder.check(folder).problem == "meta.json holds no config.model (not written by this project's trainer)"


def test_a_folder_without_manifest_is_checked_by_loading(tmp_path):
    folder = fake_checkpoint(tmp_path, 1)
    (folder / MANIFEST).unlink()
    assert run_folder.check(folder).problem is None
    (folder / "state" / "random_states_0.pkl").write_bytes(code_pickle(tmp_path / "ran"))
    result = run_folder.check(folder)
    assert result.problem is None and result.optional["state/random_states_0.pkl"].startswith(
        "does not load (UnpicklingError"
    )
    blob = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(blob[:-4])
    assert run_folder.check(folder).problem.startswith("model.safetensors does not load (")
    assert not (tmp_path / "ran").exists()


def test_file_problem_checks_one_file_against_the_manifest(tmp_path):
    folder = fake_checkpoint(tmp_path, 1)
    name = "state/random_states_0.pkl"
    assert run_folder.file_problem(folder, name) is None
    data = bytearray((folder / name).read_bytes())
    data[-1] ^= 1
    (folder / name).write_bytes(bytes(data))
    assert run_folder.file_problem(folder, name) == "differs from its SHA-256 in manifest.json (changed or corrupt)"
    assert run_folder.file_problem(folder, "state/random_states_1.pkl") == "is missing"


def test_prune_keeps_the_newest_and_the_one_just_written(tmp_path):
    for step in (1, 2, 3, 4):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 9, finish=False)
    gone = run_folder.prune(tmp_path, 2)
    assert [p.name for p in run_folder.step_folders(tmp_path)] == ["step_00000004", "step_00000003"]
    assert {p.name for p in gone} == {"step_00000001", "step_00000002", ".tmp_step_00000009"}
    run_folder.prune(tmp_path, 1, keep=tmp_path / "checkpoints" / "step_00000003")
    assert [p.name for p in run_folder.step_folders(tmp_path)] == ["step_00000003"]


def test_find_checkpoint_for_folders_runs_and_neither(tmp_path):
    one = fake_checkpoint(tmp_path / "run", 1)
    two = fake_checkpoint(tmp_path / "run", 2)
    assert run_folder.find_checkpoint(tmp_path / "run") == two
    assert run_folder.find_checkpoint(one) == one
    (two / "meta.json").write_text("{}")
    with pytest.raises(CheckpointError, match=rf"^checkpoint {two}: meta.json has 2 bytes where manifest.json says"):
        run_folder.find_checkpoint(two)
    assert run_folder.find_checkpoint(tmp_path / "run", lambda message: None) == one
    with pytest.raises(CheckpointError, match=r"is neither a checkpoint folder .* nor a run directory"):
        run_folder.find_checkpoint(tmp_path)


def test_read_state_dict_from_files_folders_and_runs(tmp_path):
    two = fake_checkpoint(tmp_path / "run", 2)
    assert torch.equal(models.read_state_dict(tmp_path / "run")["w"], torch.full((3,), 2.0))
    assert torch.equal(models.read_state_dict(two / "model.safetensors")["w"], torch.full((3,), 2.0))
    evil = tmp_path / "evil.pt"
    evil.write_bytes(code_pickle(tmp_path / "ran"))
    with pytest.raises(CheckpointError) as caught:
        models.read_state_dict(evil)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        f"checkpoint {evil} does not load as a torch (weights_only=True) file (UnpicklingError"
    )
    assert not (tmp_path / "ran").exists()
    torch.save({"step": 3}, tmp_path / "not_weights.pt")
    with pytest.raises(CheckpointError, match="holds no state dict of tensors"):
        models.read_state_dict(tmp_path / "not_weights.pt")
    with pytest.raises(CheckpointError, match="does not exist"):
        models.read_state_dict(tmp_path / "missing.safetensors")
