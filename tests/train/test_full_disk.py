"""Storage that refuses a checkpoint (disk full, quota, file-size limit, I/O error): the run stops with one
`error:` line naming the file, the cause and the checkpoint kept, leaves no `.tmp_*` folder, exits 1, and a rerun
resumes from the kept checkpoint. Injected in-process and on one of two ranks, and for real in a child under
`ulimit -f`.

`python -m tests.train.test_full_disk STEP RANK CONFIG [overrides]` is `python -m train` whose rank RANK meets a
full disk writing its data position into the checkpoint of STEP (test-only fault injection).
"""

import errno
import os
import resource
import shutil
import signal
import sys
import traceback
from pathlib import Path

import pytest
from safetensors import SafetensorError
from torch.distributed.checkpoint.api import CheckpointException

import train.checkpoint
from models import run_folder
from tests.train.common import TORCHRUN, cli, finish, reset_accelerate, run, tiny_config, train_records
from train.checkpoint import write_failure
from train.main import cli as train_cli

pytestmark = pytest.mark.trains
TORCH_SHORT_WRITE = "the write failed (disk full or file-size limit?)"


def lines_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    "error, cause",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
        (OSError(errno.EFBIG, "File too large"), "file too large (over the file-size limit, ulimit -f)"),
        (OSError(errno.EIO, "Input/output error"), "input/output error"),
        (
            SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
            "no space left on device",
        ),
        (
            SafetensorError("Error while serializing: IoError(Os { code: 122, kind: FilesystemQuotaExceeded"),
            "disk quota exceeded",
        ),
        (RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1152 vs 1040"), TORCH_SHORT_WRITE),
        (RuntimeError("some other failure"), None),
        # FSDP's torch.distributed.checkpoint: the failure of any rank
        (
            CheckpointException("save", {1: (OSError(errno.ENOSPC, "No space"), traceback.StackSummary())}),
            "no space left on device",
        ),
    ],
)
def test_each_storage_failure_is_named(error, cause):
    assert write_failure(error) == cause


@pytest.mark.parametrize("step, kept", [(1, None), (2, "step_00000001")])
def test_a_full_disk_is_one_line_and_the_last_checkpoint_is_kept(tmp_path, synthetic, monkeypatch, capsys, step, kept):
    real = train.checkpoint.save_file
    target = run_folder.tmp_folder(tmp_path / "run", step) / run_folder.MODEL

    def full_disk(tensors, filename, *args, **kwargs):
        if filename != str(target):
            return real(tensors, filename, *args, **kwargs)
        Path(filename).write_bytes(bytes(4096))  # a real write gets this far, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(train.checkpoint, "save_file", full_disk)
    config = tiny_config(tmp_path, synthetic, train={"max_steps": 3, "save_every": 1, "keep_last": 3})
    reset_accelerate()
    capsys.readouterr()
    assert train_cli([str(config)]) == 1
    err = capsys.readouterr().err
    after = f"{kept} (a rerun resumes from it)" if kept else "none (a rerun starts afresh)"
    assert lines_of(err) == [
        f"error: checkpoint {run_folder.step_name(step)} not written: no space left on device (writing {target}); "
        f"its partial folder is removed; kept checkpoint: {after}"
    ]
    assert err.rstrip().splitlines()[-1].startswith("error:") and "Traceback" not in err
    run_dir = tmp_path / "run"
    assert not list((run_dir / run_folder.CHECKPOINTS).glob(run_folder.TMP_PREFIX + "*"))
    found = run_folder.newest_complete(run_dir)
    assert (found[0].name if found else None) == kept
    if kept:
        monkeypatch.undo()
        assert run(config) == 0
        assert f"resumed from {found[0]} at step 1" in capsys.readouterr().err
        assert [r["step"] for r in train_records(run_dir)] == [1, 2, 3]


def refuse_model_files(monkeypatch, run_dir: Path, steps) -> None:
    """The disk is full whenever the model file of one of `steps`' checkpoints is written (every try)."""
    real = train.checkpoint.save_file
    targets = {str(run_folder.tmp_folder(run_dir, step) / run_folder.MODEL) for step in steps}

    def full_disk(tensors, filename, *args, **kwargs):
        if filename not in targets:
            return real(tensors, filename, *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(train.checkpoint, "save_file", full_disk)


@pytest.mark.parametrize("failing, stopped", [((2,), False), ((2, 3), True)], ids=["once", "twice-in-a-row"])
def test_with_max_failed_saves_the_run_trains_on_until_n_saves_in_a_row_failed(
    tmp_path, synthetic, monkeypatch, capsys, failing, stopped
):
    """train.max_failed_saves=2: a refused periodic checkpoint is one warning, the next save tries again; two in a
    row stop the run with the usual line. No partial folder is left either way."""
    refuse_model_files(monkeypatch, tmp_path / "run", failing)
    train_cfg = {"max_steps": 4, "save_every": 1, "keep_last": 4, "max_failed_saves": 2}
    config = tiny_config(tmp_path, synthetic, train=train_cfg)
    reset_accelerate()
    capsys.readouterr()
    assert train_cli([str(config)]) == (1 if stopped else 0)
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "training on, the next checkpoint tries again" in line]
    assert (
        len(warnings) == 1
        and "no space left on device" in warnings[0]
        and "1 of train.max_failed_saves=2" in warnings[0]
    )
    run_dir = tmp_path / "run"
    assert not list((run_dir / run_folder.CHECKPOINTS).glob(run_folder.TMP_PREFIX + "*"))
    complete = [p.name for p in run_folder.step_folders(run_dir) if run_folder.check(p).problem is None]
    if stopped:
        assert lines_of(err) and "checkpoint step_00000003 not written: no space left on device" in lines_of(err)[0]
        assert complete == ["step_00000001"]
    else:
        assert lines_of(err) == [] and sorted(complete) == ["step_00000001", "step_00000003", "step_00000004"]


def test_a_refused_final_checkpoint_stops_the_run_even_with_max_failed_saves(tmp_path, synthetic, monkeypatch, capsys):
    """The final checkpoint is also a periodic one here (save_every divides max_steps): refused, it is tried again
    at the end, and a second refusal ends the run with the usual line, not 'done' without its final weights."""
    refuse_model_files(monkeypatch, tmp_path / "run", [4])
    train_cfg = {"max_steps": 4, "save_every": 2, "keep_last": 4, "max_failed_saves": 2}
    config = tiny_config(tmp_path, synthetic, train=train_cfg)
    reset_accelerate()
    capsys.readouterr()
    assert train_cli([str(config)]) == 1
    err = capsys.readouterr().err
    assert "checkpoint step_00000004 not written: no space left on device" in lines_of(err)[0]
    assert "run done" not in err and [p.name for p in run_folder.step_folders(tmp_path / "run")] == ["step_00000002"]


def test_a_full_disk_after_the_checkpoint_is_complete_says_so(tmp_path, synthetic, monkeypatch, capsys):
    """The disk fills while `latest` is written, after the checkpoint folder is complete and renamed: the line says
    the checkpoint is written and the rerun resumes from it (not 'not written ... kept checkpoint: <the same>')."""
    real = run_folder.write_text_atomic

    def full_disk(path, text):
        if Path(path).name == run_folder.LATEST and text == "step_00000002":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, text)

    monkeypatch.setattr(run_folder, "write_text_atomic", full_disk)
    config = tiny_config(tmp_path, synthetic, train={"max_steps": 3, "save_every": 1, "keep_last": 3})
    reset_accelerate()
    capsys.readouterr()
    assert train_cli([str(config)]) == 1
    assert lines_of(capsys.readouterr().err) == [
        f"error: checkpoint step_00000002 written, but not {tmp_path / 'run' / 'checkpoints' / 'latest'}: no space "
        "left on device; a rerun resumes from step_00000002"
    ]


@pytest.fixture(scope="module")
def one_step(tmp_path_factory, synthetic):
    """A run with its checkpoint at step 1, and the tiny config."""
    folder = tmp_path_factory.mktemp("one_step")
    config = tiny_config(folder, synthetic, train={"max_steps": 1, "save_every": 1})
    assert run(config) == 0
    yield folder, config
    shutil.rmtree(folder, ignore_errors=True)


def file_size_limit(limit: int):
    """preexec_fn of a child whose files may not grow past `limit` bytes: a write past it fails with EFBIG
    (SIGXFSZ ignored, as Python does by default, instead of killing the process)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize(
    "fails, cause",
    [
        ("state/model.safetensors", "file too large (over the file-size limit, ulimit -f)"),  # safetensors' writer
        ("state/optimizer.bin", TORCH_SHORT_WRITE),  # torch.save's, which keeps no errno
    ],
)
def test_a_file_size_limit_in_a_child_is_one_line(one_step, tmp_path, fails, cause):
    """The limit lies between the sizes of accelerate's model file and its optimizer file (written after it), or
    below the model file's: the checkpoint of step 2 fails at the file named, the one of step 1 is kept."""
    source, config = one_step
    run_dir = tmp_path / "run"
    shutil.copytree(source / "run", run_dir)
    step1 = run_dir / run_folder.CHECKPOINTS / run_folder.step_name(1)
    model, optimizer = ((step1 / name).stat().st_size for name in ("state/model.safetensors", "state/optimizer.bin"))
    assert model < optimizer
    limit = model // 2 if fails == "state/model.safetensors" else (model + optimizer) // 2
    args = [str(config), f"train.run_dir={run_dir}", "train.max_steps=2"]
    code, _, err = finish(cli(args, preexec_fn=file_size_limit(limit)))
    assert code == 1, err[-3000:]
    tmp = run_folder.tmp_folder(run_dir, 2)
    assert err.rstrip().splitlines()[-1] == (
        f"error: checkpoint {run_folder.step_name(2)} not written: {cause} (writing {tmp / fails}); "
        f"its partial folder is removed; kept checkpoint: {step1.name} (a rerun resumes from it)"
    ), err[-3000:]
    assert len(lines_of(err)) == 1 and "Traceback" not in err
    assert not list((run_dir / run_folder.CHECKPOINTS).glob(run_folder.TMP_PREFIX + "*"))
    assert run_folder.newest_complete(run_dir)[0] == step1


def fail_data_state(step: int, rank: int) -> None:
    """In this process: rank `rank`'s data_state file in the checkpoint of `step` meets a full disk."""
    real = run_folder.write_json

    def write_json(path: Path, obj) -> None:
        if path.parent.name == run_folder.TMP_PREFIX + run_folder.step_name(
            step
        ) and path.name == run_folder.data_state_name(rank):
            path.write_text("{")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, obj)

    run_folder.write_json = write_json


def test_a_full_disk_on_another_rank_stops_every_rank(tmp_path, synthetic):
    """Rank 1 fails while rank 0 writes on: both learn of it where they would wait for each other, and stop."""
    config = tiny_config(tmp_path, synthetic, train={"max_steps": 3, "save_every": 1})
    proc = cli(["2", "1", str(config)], launcher=TORCHRUN, module="tests.train.test_full_disk")
    code, _, err = finish(proc)
    assert code != 0
    run_dir = tmp_path / "run"
    failed = run_folder.tmp_folder(run_dir, 2) / run_folder.data_state_name(1)
    line = (
        f"error: checkpoint {run_folder.step_name(2)} not written: no space left on device (writing {failed}); "
        f"its partial folder is removed; kept checkpoint: {run_folder.step_name(1)} (a rerun resumes from it)"
    )
    assert lines_of(err) == [line, line], err[-3000:]  # one from each rank
    assert not list((run_dir / run_folder.CHECKPOINTS).glob(run_folder.TMP_PREFIX + "*"))
    assert run_folder.newest_complete(run_dir)[0].name == run_folder.step_name(1)


if __name__ == "__main__":
    fail_data_state(int(sys.argv[1]), int(sys.argv[2]))
    sys.exit(train_cli(sys.argv[3:]))
