"""Trust nothing on disk: every file of a checkpoint corrupted in turn (a flipped byte, a pickle that would run
code, with and without the manifest); resume reports it in one line naming the file and falls back to the
newest checkpoint that passes; a bad random-state file is a warning and the checkpoint is still used."""

import json
import shutil

import pytest

from models import run_folder
from tests.hostile import code_pickle
from tests.train.common import run, tiny_config, train_records
from train.checkpoint import rng_not_restored, with_vanished_ranks

HARD_FILES = [
    "meta.json",
    "model.safetensors",
    "data_state_0.json",
    "state/model.safetensors",
    "state/optimizer.bin",
    "state/scheduler.bin",
]
RNG = "state/random_states_0.pkl"


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory, synthetic):
    """A finished run with complete checkpoints at steps 1, 2 and 3."""
    folder = tmp_path_factory.mktemp("three")
    path = tiny_config(folder, synthetic, train={"max_steps": 3, "save_every": 1, "keep_last": 3})
    assert run(path) == 0
    yield folder
    shutil.rmtree(folder, ignore_errors=True)  # 150 MB of checkpoints


def corrupt(path, kind: str, marker) -> None:
    if kind == "flip":  # same size, one byte changed in the middle: only the SHA-256 can tell
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(code_pickle(marker))


def resume_copy(three_steps, tmp_path, name: str, kind: str, manifest: bool = True):
    """Copy the run, corrupt `name` in step 3, resume to step 4; returns (stderr, run dir, marker)."""
    run_dir = tmp_path / "run"
    shutil.copytree(three_steps / "run", run_dir)
    step3 = run_dir / "checkpoints" / "step_00000003"
    if not manifest:
        (step3 / run_folder.MANIFEST).unlink()
    marker = tmp_path / "code-ran"
    corrupt(step3 / name, kind, marker)
    return run_dir, step3, marker


@pytest.mark.parametrize(
    "name, kind, manifest",
    [(name, "flip", True) for name in HARD_FILES]
    + [(name, "code", True) for name in HARD_FILES if name.endswith(".bin")]
    + [("state/optimizer.bin", "code", False), ("state/scheduler.bin", "code", False)],
)
def test_a_corrupt_file_is_named_and_resume_falls_back(three_steps, tmp_path, synthetic, capsys, name, kind, manifest):
    run_dir, step3, marker = resume_copy(three_steps, tmp_path, name, kind, manifest)
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 4, "save_every": 1, "keep_last": 3})
    capsys.readouterr()
    assert run(path) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipping checkpoint" in line]
    assert len(skipped) == 1 and skipped[0].startswith(f"warning: skipping checkpoint {step3}: {name} ")
    expected = {
        "flip": "differs from its SHA-256 in manifest.json",
        "code": "bytes where manifest.json says" if manifest else "does not load (UnpicklingError: Weights only",
    }[kind]
    assert expected in skipped[0], skipped[0]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_00000002'} at step 2" in err
    assert [r["step"] for r in train_records(run_dir)] == [1, 2, 3, 4]
    assert not marker.exists()  # nothing from the file ever ran


@pytest.mark.parametrize("kind, manifest", [("flip", True), ("code", True), ("code", False)])
def test_a_bad_random_state_is_a_warning_and_the_checkpoint_is_used(
    three_steps, tmp_path, synthetic, capsys, kind, manifest
):
    _, step3, marker = resume_copy(three_steps, tmp_path, RNG, kind, manifest)
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 4, "save_every": 1, "keep_last": 3})
    capsys.readouterr()
    assert run(path) == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint" not in err
    assert f"resumed from {step3} at step 3" in err
    line = next(line for line in err.splitlines() if "random state not restored" in line)
    assert line.startswith(f"warning: random state not restored: {step3 / RNG} ")
    assert ("differs from its SHA-256" if kind == "flip" and manifest else "") in line
    assert "random augmentations differ from an uninterrupted run" in line
    assert not marker.exists()


def test_a_random_state_that_was_not_applied_is_detected(three_steps, tmp_path):
    """accelerate only logs (at info level) when it cannot restore the RNG: the trainer compares for itself."""
    rng_file = three_steps / "run" / "checkpoints" / "step_00000003" / RNG
    saved = run_folder.torch_load(rng_file)["torch_manual_seed"]
    import torch

    torch.set_rng_state(saved)
    assert rng_not_restored(rng_file) is None
    torch.rand(3)
    assert rng_not_restored(rng_file) == "was not applied"
    assert rng_not_restored(tmp_path / "random_states_5.pkl").startswith("is missing")


def test_every_checkpoint_bad_starts_afresh_and_keeps_the_new_checkpoints(three_steps, tmp_path, synthetic, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(three_steps / "run", run_dir)
    for step in (1, 2, 3):
        corrupt(run_dir / "checkpoints" / f"step_0000000{step}" / "state" / "optimizer.bin", "flip", None)
    path = tiny_config(tmp_path, synthetic, train={"max_steps": 1, "save_every": 1, "keep_last": 2})
    assert run(path, "optim.warmup_steps=1") == 0
    err = capsys.readouterr().err
    assert err.count("warning: skipping checkpoint") == 3 and "resumed from" not in err
    # the fresh run's checkpoint is kept although three (bad) ones have higher step numbers
    assert (run_dir / "checkpoints" / "step_00000001" / run_folder.MANIFEST).is_file()
    assert run_folder.check(run_dir / "checkpoints" / "step_00000001").problem is None


def test_a_job_resumed_on_fewer_ranks_keeps_the_skip_counts_of_the_ranks_it_lost(tmp_path):
    """Written by 3 ranks, resumed on 1: rank 0 carries ranks 1 and 2's counts (each rank restores only its own)."""
    for rank, (corrupt, seen) in enumerate([(1, 10), (2, 20), (3, 30)]):
        state = {"rank": rank, "skipped": {"corrupt_image": corrupt}, "captions": {"seen": seen, "truncated": 0}}
        (tmp_path / run_folder.data_state_name(rank)).write_text(json.dumps(state))
    own = json.loads((tmp_path / run_folder.data_state_name(0)).read_text())
    merged = with_vanished_ranks(tmp_path, own, world=1)
    assert merged["skipped"] == {"corrupt_image": 6} and merged["captions"] == {"seen": 60, "truncated": 0}
    assert with_vanished_ranks(tmp_path, own, world=3) == own and own["skipped"] == {"corrupt_image": 1}


def test_a_gpu_random_state_not_applied_is_named(tmp_path, monkeypatch):
    """accelerate applies the CUDA generators' states after the CPU's, inside one try that only logs: the check
    compares them too (CUDA stood in for by two fake generator states)."""
    import torch

    gpus = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
    path = tmp_path / "random_states_0.pkl"
    torch.save({"torch_manual_seed": torch.get_rng_state(), "torch_cuda_manual_seed": gpus}, path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [g.clone() for g in gpus])
    assert rng_not_restored(path) is None
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [gpus[0], gpus[0]])
    assert rng_not_restored(path) == "was not applied on the GPUs (2 saved, 2 visible)"
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: gpus[:1])
    assert rng_not_restored(path) == "was not applied on the GPUs (2 saved, 1 visible)"
