"""A remote train.run_dir: a real S3 server on loopback (moto's server mode) and fsspec's local file system.

Checked: checkpoints, metrics and config reach the remote; resume=auto from an empty staging folder downloads
the newest complete checkpoint and continues exactly; a half upload (files without manifest, a truncated file,
a changed byte) is never taken for a checkpoint; a failed upload leaves no manifest behind."""

import json
import logging
import shutil

import pytest

from tests.train.common import run, s3_filesystem, tiny_config, train_records
from train.config import ConfigError, load_config
from train.loop import TrainingError
from train.main import preflight

SETTINGS = {"max_steps": 4, "save_every": 2, "keep_last": 1, "deterministic": True, "storage_retry_s": 0}


@pytest.fixture(scope="module")
def s3():
    """An S3 server on 127.0.0.1 with a bucket `runs`; yields the s3fs file system that talks to it."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with s3_filesystem(f"http://{host}:{port}") as fs:
        yield fs
    server.stop()


def remote_steps(fs, run: str) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{run}/checkpoints") if "step_" in p)


def test_s3_run_dir_uploads_and_resumes_from_an_empty_stage(s3, tmp_path, synthetic, capsys):
    url, stage = "s3://runs/a", tmp_path / "stage"
    path = tiny_config(tmp_path, synthetic, train={**SETTINGS, "run_dir": url, "stage_dir": str(stage)})
    assert run(path) == 0
    assert remote_steps(s3, "runs/a") == ["step_00000004"]  # keep_last=1 pruned step 2 remotely
    assert s3.cat_file("runs/a/checkpoints/latest") == b"step_00000004\n"
    manifest = json.loads(s3.cat_file("runs/a/checkpoints/step_00000004/manifest.json"))
    for name, entry in manifest["files"].items():
        assert s3.info(f"runs/a/checkpoints/step_00000004/{name}")["size"] == entry["size"]
    assert load_config([str(path)]) == load_config([str(stage / "config.yaml")])
    assert s3.cat_file("runs/a/config.yaml") == (stage / "config.yaml").read_bytes()
    last = json.loads(s3.cat_file("runs/a/metrics.jsonl").splitlines()[-1])
    assert last["end"] == "done" and last["step"] == 4 and last["skipped_total"] == 0

    shutil.rmtree(stage)  # requeued on another node: nothing local
    capsys.readouterr()
    assert run(path, "train.max_steps=6") == 0
    assert f"resumed from {stage / 'checkpoints' / 'step_00000004'} at step 4" in capsys.readouterr().err
    assert [p.name for p in (stage / "checkpoints").glob("step_*")] == ["step_00000006"]  # the stage keeps one

    (tmp_path / "local").mkdir()  # the same history on a local run directory: 4 steps, then on to 6
    local = tiny_config(tmp_path / "local", synthetic, train=SETTINGS)
    assert run(local) == 0 and run(local, "train.max_steps=6") == 0
    remote = [json.loads(line) for line in s3.cat_file("runs/a/metrics.jsonl").splitlines()]
    expected = [(r["step"], r["loss"]) for r in train_records(tmp_path / "local" / "run")]
    assert [(r["step"], r["loss"]) for r in remote if "loss" in r] == expected and len(expected) == 6


def test_half_uploads_are_never_taken_for_checkpoints(s3, tmp_path, synthetic, capsys):
    url, stage = "s3://runs/b", tmp_path / "stage"
    path = tiny_config(tmp_path, synthetic, train={**SETTINGS, "run_dir": url, "stage_dir": str(stage)})
    assert run(path) == 0
    good = stage / "checkpoints" / "step_00000004"
    for step, damage in ((9, "no manifest"), (8, "truncated"), (7, "flipped")):
        dest = f"runs/b/checkpoints/step_0000000{step}"
        s3.put(str(good) + "/", dest, recursive=True)
        if damage == "no manifest":
            s3.rm_file(f"{dest}/manifest.json")
        elif damage == "truncated":
            s3.pipe_file(f"{dest}/state/optimizer.bin", (good / "state" / "optimizer.bin").read_bytes()[:100])
        else:
            data = bytearray((good / "state" / "optimizer.bin").read_bytes())
            data[len(data) // 2] ^= 0xFF
            s3.pipe_file(f"{dest}/state/optimizer.bin", bytes(data))
    shutil.rmtree(stage)
    capsys.readouterr()
    assert run(path, "train.max_steps=5") == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipping checkpoint" in line]
    assert skipped[0] == (
        "warning: skipping checkpoint s3://runs/b/checkpoints/step_00000009: manifest.json is missing "
        "(an upload or a deletion that did not finish)"
    )
    assert skipped[1].startswith("warning: skipping checkpoint s3://runs/b/checkpoints/step_00000008: ")
    assert "state/optimizer.bin has 100 bytes where manifest.json says" in skipped[1]
    assert skipped[2].startswith("warning: skipping checkpoint s3://runs/b/checkpoints/step_00000007: ")
    assert "state/optimizer.bin differs from its SHA-256 in manifest.json" in skipped[2]
    assert "(found after downloading it to" in skipped[2] and len(skipped) == 3
    assert f"resumed from {stage / 'checkpoints' / 'step_00000004'} at step 4" in err


def test_a_failed_upload_leaves_no_manifest_and_resume_falls_back(s3, tmp_path, synthetic, capsys, monkeypatch):
    """The manifest is uploaded last: when the upload dies before it, the remote folder never counts."""
    real = s3.put_file  # fsspec hands the trainer this same (cached) file system instance

    def put_file(lpath, rpath, *args, **kwargs):
        if rpath.endswith("step_00000004/manifest.json"):
            raise ConnectionError("connection reset by peer")
        return real(lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(s3, "put_file", put_file)
    url, stage = "s3://runs/c", tmp_path / "stage"
    path = tiny_config(tmp_path, synthetic, train={**SETTINGS, "run_dir": url, "stage_dir": str(stage), "keep_last": 2})
    with pytest.raises(
        TrainingError, match=r"^the run finished, but 1 checkpoint\(s\) are not on s3://runs/c: step_00000004"
    ):
        run(path)  # the final upload failed: the run does not end as done (tests/train/test_remote_faults.py)
    assert "warning: upload of step_00000004 to s3://runs/c failed (ConnectionError: connection reset by peer)" in (
        capsys.readouterr().err
    )
    assert s3.exists("runs/c/checkpoints/step_00000004/model.safetensors")
    assert not s3.exists("runs/c/checkpoints/step_00000004/manifest.json")
    monkeypatch.setattr(s3, "put_file", real)
    shutil.rmtree(stage)
    assert run(path) == 0
    assert f"resumed from {stage / 'checkpoints' / 'step_00000002'} at step 2" in capsys.readouterr().err


def test_file_url_run_dir_with_fsspec_local(tmp_path, synthetic, capsys):
    remote, stage = tmp_path / "mounted", tmp_path / "stage"
    url = f"file://{remote}"
    path = tiny_config(tmp_path, synthetic, train={**SETTINGS, "run_dir": url, "stage_dir": str(stage)})
    assert run(path) == 0
    assert sorted(p.name for p in (remote / "checkpoints").iterdir()) == ["latest", "step_00000004"]
    assert (remote / "checkpoints" / "step_00000004" / "manifest.json").is_file()
    assert [r["step"] for r in train_records(remote)] == [1, 2, 3, 4]
    shutil.rmtree(stage)
    assert run(path, "train.max_steps=5") == 0
    assert f"resumed from {stage / 'checkpoints' / 'step_00000004'} at step 4" in capsys.readouterr().err
    assert [r["step"] for r in train_records(remote)] == [1, 2, 3, 4, 5]


def test_a_remote_run_dir_is_checked_before_any_work(tmp_path, synthetic, monkeypatch):
    path = tiny_config(tmp_path, synthetic, train={"run_dir": "nosuchprotocol://bucket/run"})
    with pytest.raises(ConfigError, match=r"^train.run_dir=nosuchprotocol://bucket/run cannot be used \(ValueError"):
        preflight(load_config([str(path)]), 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    path = tiny_config(tmp_path, synthetic, train={"run_dir": f"file://{tmp_path}/remote"})
    with pytest.raises(ConfigError, match=r"spans several nodes: set train\.stage_dir to a folder every node sees"):
        preflight(load_config([str(path)]), 2)
