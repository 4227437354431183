"""A remote train.run_dir whose storage goes away: a real S3 server on loopback (moto) that the tests stop and start.

Checked: an upload retried through an outage succeeds; uploads failing for good stop the run after
train.max_failed_uploads in one line, the checkpoints stay local and a rerun resumes from them and uploads them;
pruning counts only complete remote checkpoints; a manifest naming a path outside its folder is refused before
anything is written; a download that fails during resume is one line naming the URL; a failed final upload ends the
run in one line (not exit 0) and the rerun it asks for uploads the checkpoint."""

import json
import logging
import threading

import pytest

from models import run_folder
from tests.train.common import reset_accelerate, s3_filesystem, tiny_config
from train import checkpoint as train_checkpoint
from train import storage as storage_module
from train.main import cli
from train.storage import RunStorage, retrying

SETTINGS = {"max_steps": 2, "save_every": 1, "keep_last": 2, "deterministic": True}


class Server:
    """A moto S3 server on 127.0.0.1 that can be stopped and started again on its port (moto keeps its buckets)."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.make = lambda port: ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server = self.make(0)
        self.server.start()
        self.host, self.port = self.server.get_host_and_port()
        self.running = True

    def stop(self) -> None:
        if self.running:
            self.server.stop()
            self.running = False

    def start(self) -> None:
        if not self.running:
            self.server = self.make(self.port)
            self.server.start()
            self.running = True


@pytest.fixture(scope="module")
def server():
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = Server()
    yield server
    server.stop()


@pytest.fixture
def s3(server):
    """The s3fs file system of the server (the trainer gets this same cached instance); botocore tries each request
    once, so a stopped server fails at once and the retries under test are the only ones."""
    endpoint = f"http://{server.host}:{server.port}"
    with s3_filesystem(endpoint, AWS_MAX_ATTEMPTS="1", AWS_RETRY_MODE="standard") as fs:
        yield fs
        server.start()


def train(path, *overrides) -> int:
    reset_accelerate()
    return cli([str(path), *overrides])


def stop_at_first_put(monkeypatch, s3, server, restart_after_s: float | None = None) -> None:
    """The server stops at the first upload of checkpoint files (and comes back from a thread after
    `restart_after_s`, None: never)."""
    real = s3.put

    def put(*args, **kwargs):
        if server.running and not getattr(put, "done", False):
            put.done = True
            server.stop()
            if restart_after_s is not None:
                threading.Timer(restart_after_s, server.start).start()
        return real(*args, **kwargs)

    monkeypatch.setattr(s3, "put", put)


def down_from_step_2(s3, server, monkeypatch, capsys, tmp_path, synthetic, name: str, **train_cfg):
    """A run on s3://runs/NAME staged in tmp_path/stage (uploads retried for 0.2 s) whose server stops at the upload of
    step 2 and stays down; it must exit 1. Returns the stage, the config's path, the real s3.put and the run's stderr
    lines."""
    stage = tmp_path / "stage"
    cfg = {**SETTINGS, "run_dir": f"s3://runs/{name}", "stage_dir": str(stage), "storage_retry_s": 0.2, **train_cfg}
    path = tiny_config(tmp_path, synthetic, train=cfg)
    real = s3.put
    monkeypatch.setattr(s3, "put", lambda *a, **k: server.stop() if "step_00000002" in a[1][0] else real(*a, **k))
    assert train(path) == 1
    return stage, path, real, capsys.readouterr().err.splitlines()


def fail(error: Exception):
    raise error


def complete(s3, folder: str) -> bool:
    return RunStorage.of("s3://x").remote_problem(s3, folder)[0] is None


def test_an_upload_outlives_an_outage_of_the_server(s3, server, tmp_path, synthetic, monkeypatch, capsys):
    stop_at_first_put(monkeypatch, s3, server, restart_after_s=1.0)
    stage = tmp_path / "stage"
    train_cfg = {**SETTINGS, "run_dir": "s3://runs/back", "stage_dir": str(stage), "storage_retry_s": 30}
    assert train(tiny_config(tmp_path, synthetic, train=train_cfg)) == 0
    err = capsys.readouterr().err
    assert "warning: upload of s3://runs/back/checkpoints/step_00000001 failed (EndpointConnectionError: " in err
    assert "; attempt 1, trying again in 1.0 s (train.storage_retry_s=30)" in err
    assert "kept in" not in err and "error:" not in err
    assert [complete(s3, f"runs/back/checkpoints/step_0000000{step}") for step in (1, 2)] == [True, True]
    assert [p.name for p in run_folder.step_folders(stage)] == ["step_00000002"]  # uploaded: the stage keeps one
    assert (stage / "checkpoints" / "uploaded").read_text().strip() == "step_00000002"


def test_uploads_failing_for_good_stop_the_run_in_one_line_and_a_rerun_uploads(
    s3, server, tmp_path, synthetic, monkeypatch, capsys
):
    stage, path, real, err = down_from_step_2(
        s3, server, monkeypatch, capsys, tmp_path, synthetic, "gone", max_steps=4, max_failed_uploads=2
    )
    assert err[-1].startswith(
        "error: 2 uploads in a row to s3://runs/gone failed (train.max_failed_uploads=2), the last after retrying "
        "for train.storage_retry_s=0.2 s: EndpointConnectionError: Could not connect to the endpoint URL: "
    )
    assert err[-1].endswith(
        f"; checkpoints kept locally in {stage / 'checkpoints'}: step_00000002, step_00000003; rerun the same "
        "command once the storage is reachable (it resumes from step_00000003 and uploads it)"
    )
    warned = [line for line in err if "kept in" in line]
    assert len(warned) == 1 and warned[0].startswith(
        "warning: upload of step_00000002 to s3://runs/gone failed (EndpointConnectionError: "
    )
    assert warned[0].endswith(
        f"; it is kept in {stage / 'checkpoints' / 'step_00000002'} and uploaded with the next checkpoint (1 of "
        "train.max_failed_uploads=2 in a row)"
    )
    assert [p.name for p in run_folder.step_folders(stage)] == ["step_00000003", "step_00000002"]

    server.start()
    monkeypatch.setattr(s3, "put", real)
    assert train(path) == 0
    err = capsys.readouterr().err
    assert f"resumed from {stage / 'checkpoints' / 'step_00000003'} at step 3" in err
    # the newest, then the one before it that keep_last=2 leaves room for; step 1 is pruned
    steps = sorted(p.rsplit("/", 1)[-1] for p in s3.ls("runs/gone/checkpoints") if "step_" in p)
    assert steps == ["step_00000003", "step_00000004"]
    assert all(complete(s3, f"runs/gone/checkpoints/{name}") for name in steps)
    assert [p.name for p in run_folder.step_folders(stage)] == ["step_00000004"]


def fake_checkpoint(stage, step: int):
    """A folder with the files a manifest must list (models.run_folder.REQUIRED), finished like a real one; it passes
    models.run_folder.check (no file is loaded)."""
    tmp = run_folder.tmp_folder(stage, step)
    for name in run_folder.REQUIRED:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(f"{name} of step {step}")
    (tmp / run_folder.META).write_text(json.dumps({"step": step, "samples_seen": 0, "config": {"model": {}}}))
    return run_folder.finish(tmp)


def test_pruning_counts_only_complete_remote_checkpoints(s3, tmp_path):
    storage = RunStorage.of("s3://runs/prune", str(tmp_path / "stage"))
    for step in (1, 2):
        storage.upload_checkpoint(fake_checkpoint(storage.local, step), keep_last=2)
    base = "runs/prune/checkpoints"
    s3.put(str(fake_checkpoint(tmp_path / "other", 3)) + "/", f"{base}/step_00000003", recursive=True)
    s3.rm_file(f"{base}/step_00000003/manifest.json")  # an upload that died before its manifest
    s3.pipe_file(f"{base}/step_00000009/meta.json", b"{}")  # newer than the newest complete: maybe under way
    storage.upload_checkpoint(fake_checkpoint(storage.local, 4), keep_last=2)
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.ls(base) if "step_" in p)
    # step 3 was counted before (step 2 would be gone); now it is garbage and step 2 is the second one kept
    assert names == ["step_00000002", "step_00000004", "step_00000009"]
    assert complete(s3, f"{base}/step_00000002") and complete(s3, f"{base}/step_00000004")


def test_a_branch_point_whose_upload_failed_goes_up_with_the_next_checkpoint(s3, tmp_path, monkeypatch, capsys):
    """keep_last=1, keep_steps=[2]: step 2's upload fails; the next save uploads it with step 3 and neither the
    remote nor the staging folder prunes it (before, it was left out of the retry and deleted locally)."""
    storage = RunStorage.of("s3://runs/branch", str(tmp_path / "stage"))
    real = RunStorage.put_checkpoint

    def put(self, fs, root, folder):
        if folder.name == "step_00000002" and not put.recovered:
            raise OSError("network down")
        return real(self, fs, root, folder)

    put.recovered = False
    monkeypatch.setattr(RunStorage, "put_checkpoint", put)
    train_checkpoint.upload(storage, fake_checkpoint(storage.local, 1), 1, keep_steps=[2])
    train_checkpoint.upload(storage, fake_checkpoint(storage.local, 2), 1, keep_steps=[2])
    assert "upload of step_00000002 to s3://runs/branch failed (OSError: network down)" in capsys.readouterr().err
    assert [p.name for p in storage.pending()] == ["step_00000002"]
    put.recovered = True
    train_checkpoint.upload(storage, fake_checkpoint(storage.local, 3), 1, keep_steps=[2])
    base = "runs/branch/checkpoints"
    assert sorted(p.rsplit("/", 1)[-1] for p in s3.ls(base) if "step_" in p) == ["step_00000002", "step_00000003"]
    assert complete(s3, f"{base}/step_00000002") and storage.pending() == []


@pytest.mark.parametrize("name", ["../x", "../../escape", "/tmp/abs", "state/../../x", "a\\..\\x", "./x", "a//b", ""])
def test_names_outside_a_checkpoint_folder_are_refused(name):
    assert not run_folder.inside(name)
    assert run_folder.inside("state/random_states_0.pkl") and run_folder.inside("model.safetensors")


def test_a_manifest_with_a_path_outside_its_folder_is_skipped_and_nothing_is_written(s3, tmp_path, capsys):
    stage = tmp_path / "run" / "stage"
    storage = RunStorage.of("s3://runs/evil", str(stage))
    storage.upload_checkpoint(fake_checkpoint(tmp_path / "writer", 1), keep_last=2)
    evil = fake_checkpoint(tmp_path / "writer", 2)
    manifest = json.loads((evil / "manifest.json").read_text())
    manifest["files"]["../x"] = {"size": 3, "sha256": "0" * 64}
    (evil / "manifest.json").write_text(json.dumps(manifest))
    s3.put(str(evil) + "/", "runs/evil/checkpoints/step_00000002", recursive=True)
    s3.pipe_file("runs/evil/checkpoints/x", b"bad")  # the file it points at exists, with its size

    found, result = storage.newest_complete()
    assert found == stage / "checkpoints" / "step_00000001" and result.problem is None
    assert capsys.readouterr().err == (
        "warning: skipping checkpoint s3://runs/evil/checkpoints/step_00000002: manifest.json lists '../x', a path "
        "that leaves the checkpoint folder (refused)\n"
    )
    with pytest.raises(run_folder.CheckpointError, match="lists a path outside the folder"):
        storage.fetch(s3, "runs/evil/checkpoints/step_00000002", manifest)
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert not [p for p in written if p.endswith("/x") or p == "x" or not p.startswith(("run/stage/", "writer/"))]
    assert run_folder.check(evil).problem.startswith("manifest.json lists '../x', a path that leaves the checkpoint")


def test_a_download_failing_during_resume_is_one_line_naming_the_url(s3, tmp_path, synthetic, monkeypatch, capsys):
    stage = tmp_path / "stage"
    train_cfg = {**SETTINGS, "run_dir": "s3://runs/down", "stage_dir": str(stage), "storage_retry_s": 0}
    path = tiny_config(tmp_path, synthetic, train=train_cfg)
    assert train(path) == 0
    run_folder.prune(stage, 0)  # another node: nothing local
    monkeypatch.setattr(s3, "get", lambda *args, **kwargs: fail(ConnectionError("connection reset")))
    capsys.readouterr()
    assert train(path, "train.max_steps=3", "train.storage_retry_s=0.1") == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: download from s3://runs/down/checkpoints/step_00000002 failed (ConnectionError: connection reset) "
        "after retrying for train.storage_retry_s=0.1 s; rerun when the storage is reachable, or raise "
        "train.storage_retry_s"
    )


def test_only_transient_errors_are_retried(monkeypatch, capsys):
    monkeypatch.setattr(storage_module, "FIRST_WAIT_S", 0.01)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("reset")
        return "ok"

    assert retrying("upload of s3://b/r", flaky, 5) == "ok" and len(calls) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("warning: upload of s3://b/r failed (ConnectionError: reset); attempt 2, trying again")
    for error in (FileNotFoundError("gone"), PermissionError("denied"), ValueError("bad"), OSError(28, "full")):
        calls.clear()
        with pytest.raises(type(error)):
            retrying("x", lambda e=error: calls.append(1) or fail(e), 5)
        assert len(calls) == 1
    with pytest.raises(ConnectionError):  # 0 s: no retry of our own
        retrying("x", lambda: fail(ConnectionError("reset")), 0)


def test_a_failed_final_upload_is_one_line_and_the_rerun_uploads_it(
    s3, server, tmp_path, synthetic, monkeypatch, capsys
):
    stage, path, real, err = down_from_step_2(
        s3, server, monkeypatch, capsys, tmp_path, synthetic, "last", max_steps=2, max_failed_uploads=3
    )
    assert err[-1] == (
        "error: the run finished, but 1 checkpoint(s) are not on s3://runs/last: step_00000002 kept in "
        f"{stage / 'checkpoints'}; rerun the same command once the storage is reachable: it finds the run finished "
        "and uploads them"
    )
    server.start()
    monkeypatch.setattr(s3, "put", real)
    assert train(path) == 0
    assert "nothing to do: the run is at step 2" in capsys.readouterr().err
    assert complete(s3, "runs/last/checkpoints/step_00000002")
    assert [p.name for p in run_folder.step_folders(stage)] == ["step_00000002"]
