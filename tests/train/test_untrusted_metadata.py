"""FSDP's sharded state is read by torch.distributed.checkpoint with pickle.load (its .metadata) and
torch.load(weights_only=False) (its non-tensor entries). A manifest in the same folder shows a file unchanged, not
who wrote it, so a crafted folder carries a matching one: both pickles are checked to hold only their own types
before anything unpickles them, and a file that would run code is refused in one line and never runs."""

import pickle
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo

from models import run_folder
from tests.hostile import code_pickle
from tests.train.common import TORCHRUN, checkpoints, cli, finish, reset_accelerate, tiny_config
from train.checkpoint import load_checkpoint
from train.main import cli as train_cli

pytestmark = pytest.mark.trains
REFUSED = "does not load (UnpicklingError: posix.system is not a type of torch.distributed.checkpoint metadata)"
MODEL_METADATA, OPTIMIZER_METADATA = "state/pytorch_model_fsdp_0/.metadata", "state/optimizer_0/.metadata"


def sharded(folder: Path) -> dict:
    """A torch.distributed.checkpoint folder of a tensor and two non-tensor entries, as FSDP's optimizer has."""
    state = {"w": torch.arange(6.0).reshape(2, 3), "lr": 0.1, "betas": (0.9, 0.95)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
    return state


def test_genuine_metadata_and_entries_load(tmp_path):
    sharded(tmp_path)
    assert run_folder.load_problem(tmp_path / run_folder.DCP_METADATA) is None


def test_a_metadata_pickle_that_runs_code_is_refused_unrun(tmp_path):
    sharded(tmp_path)
    marker = tmp_path / "code-ran"
    (tmp_path / run_folder.DCP_METADATA).write_bytes(code_pickle(marker))
    assert run_folder.load_problem(tmp_path / run_folder.DCP_METADATA) == REFUSED
    assert not marker.exists()
    # what the check prevents: torch.distributed.checkpoint's own reader runs it
    with pytest.raises(BaseException):  # noqa: B017 - whatever the reader makes of os.system's return value
        dcp.FileSystemReader(tmp_path).read_metadata()
    assert marker.exists()


def test_a_non_tensor_entry_that_runs_code_is_refused_unrun(tmp_path):
    """An honest-looking .metadata whose `lr` entry points at a pickle that runs code."""
    state = sharded(tmp_path)
    marker, payload = tmp_path / "code-ran", code_pickle(tmp_path / "code-ran")
    (tmp_path / "evil.distcp").write_bytes(payload)
    metadata = dcp.FileSystemReader(tmp_path).read_metadata()  # the genuine file, written just above
    lr = next(index for index in metadata.storage_data if index.fqn == "lr")
    metadata.storage_data[lr] = _StorageInfo("evil.distcp", 0, len(payload))
    (tmp_path / run_folder.DCP_METADATA).write_bytes(pickle.dumps(metadata))
    reason = run_folder.load_problem(tmp_path / run_folder.DCP_METADATA)
    assert reason.startswith("does not load (UnpicklingError: Weights only load failed"), reason
    assert not marker.exists()
    with pytest.raises(BaseException):  # noqa: B017 - CheckpointException derives from BaseException
        dcp.load(dict(state), storage_reader=dcp.FileSystemReader(tmp_path), no_dist=True)
    assert marker.exists()


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, synthetic):
    """(config, run dir) of 2 steps under FSDP on 2 gloo processes, with sharded checkpoints at steps 1 and 2."""
    folder = tmp_path_factory.mktemp("fsdp_metadata")
    config = tiny_config(folder, synthetic, train={"max_steps": 2, "save_every": 1, "keep_last": 2})
    code, _, err = fsdp(config, "train.distributed=fsdp")
    assert code == 0, err[-3000:]
    yield config, folder / "run"
    shutil.rmtree(folder, ignore_errors=True)


def fsdp(config: Path, *overrides: str) -> tuple[int, str, str]:
    args = [str(config), "optim.warmup_steps=1", *overrides]
    return finish(cli(args, launcher=TORCHRUN, module="scripts.fsdp_on_cpu"), timeout=400)


def crafted_copy(run_dir: Path, tmp_path: Path, name: str, manifest: str) -> tuple[Path, Path, Path]:
    """A copy of the run whose step 2 has `name` replaced by a pickle that runs code; its manifest.json "rewritten"
    to match (an attacker's folder), "stale" (as the trainer wrote it) or "deleted". -> (run dir, step 2, marker)"""
    copy, marker = tmp_path / "run", tmp_path / "code-ran"
    shutil.copytree(run_dir, copy)
    step2 = checkpoints(copy)[-1]
    (step2 / name).write_bytes(code_pickle(marker))
    if manifest == "rewritten":
        run_folder.write_manifest(step2)
    elif manifest == "deleted":
        (step2 / run_folder.MANIFEST).unlink()
    return copy, step2, marker


def test_real_fsdp_checkpoints_pass(fsdp_run):
    for step in checkpoints(fsdp_run[1]):
        assert {p.relative_to(step).as_posix() for p in step.rglob(run_folder.DCP_METADATA)} == {
            MODEL_METADATA,
            OPTIMIZER_METADATA,
        }
        assert run_folder.check(step).problem is None
        assert run_folder.sharded_problem(step) is None


@pytest.mark.parametrize("manifest", ["rewritten", "stale", "deleted"])
def test_resume_refuses_crafted_metadata_in_one_line(fsdp_run, tmp_path, capsys, manifest):
    config, run_dir = fsdp_run
    copy, step2, marker = crafted_copy(run_dir, tmp_path, MODEL_METADATA, manifest)
    reset_accelerate()
    capsys.readouterr()
    assert train_cli([str(config), f"train.run_dir={copy}", f"train.resume={step2}", "train.max_steps=3"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    reason = "has " if manifest == "stale" else REFUSED  # a stale manifest's size check comes first
    assert len(errors) == 1 and errors[0].startswith(
        f"error: train.resume={step2} is not a loadable checkpoint ({MODEL_METADATA} {reason}"
    ), errors
    assert not marker.exists()


def test_load_refuses_before_anything_is_unpickled(fsdp_run, tmp_path):
    """The check of every rank just before the load, for a folder that changed after it was picked."""
    _, step2, marker = crafted_copy(fsdp_run[1], tmp_path, OPTIMIZER_METADATA, "rewritten")
    loads = []
    accelerator = SimpleNamespace(process_index=0, num_processes=1, load_state=loads.append)
    with pytest.raises(run_folder.CheckpointError, match=re.escape(f"{step2}: {OPTIMIZER_METADATA} {REFUSED};")):
        load_checkpoint(accelerator, step2)
    assert loads == [] and not marker.exists()


def test_fsdp_resume_skips_the_crafted_checkpoint_and_resumes_the_previous(fsdp_run, tmp_path):
    config, run_dir = fsdp_run
    copy, step2, marker = crafted_copy(run_dir, tmp_path, OPTIMIZER_METADATA, "rewritten")
    code, _, err = fsdp(config, "train.distributed=fsdp", f"train.run_dir={copy}")
    assert code == 0, err[-3000:]
    assert f"warning: skipping checkpoint {step2}: {OPTIMIZER_METADATA} {REFUSED}" in err, err[-3000:]
    assert f"resumed from {checkpoints(copy)[0]} at step 1" in err
    assert not marker.exists()
