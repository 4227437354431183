"""The submit command: run directory choice, --dry-run, submission, sweeps with their manifest, eval jobs.
sbatch is a stand-in here (tests/slurm/conftest.py); test_cluster.py submits to a real Slurm."""

import csv
import json
import math
import os

import pytest

from train.submit import main


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("model:\n  name: tiny-s\ndata:\n  batch_size: 32\ntrain:\n  max_steps: 5\n")
    return path


@pytest.fixture
def fake_sbatch(stub_bin, monkeypatch):
    monkeypatch.setenv("PATH", f"{stub_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(stub_bin.parent / "calls.log"))
    return stub_bin.parent / "calls.log"


def test_dry_run_prints_the_script_and_submits_nothing(config, tmp_path, monkeypatch, capsys, fake_sbatch):
    monkeypatch.chdir(tmp_path)
    main([str(config), "--nodes", "2", "--gpus-per-node", "4", "--time", "30", "train.max_steps=9", "--dry-run"])
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/bash") and "#SBATCH --gres=gpu:4" in script
    run_dir = script.split("train.run_dir=", 1)[1].split(")")[0]
    assert run_dir.startswith(str(tmp_path / "runs" / "tiny-"))
    assert "train.max_steps=9" in script
    assert not fake_sbatch.exists() and not (tmp_path / "runs").exists()


def test_submit_prints_job_id_and_run_dir(config, tmp_path, capsys, fake_sbatch):
    run_dir = tmp_path / "my-run"
    main(
        [
            str(config),
            "--gpus-per-node",
            "0",
            "--procs-per-node",
            "2",
            "--time",
            "10",
            "--partition",
            "debug",
            f"train.run_dir={run_dir}",
        ]
    )
    assert capsys.readouterr().out.splitlines() == ["submitted job 1001", f"run dir: {run_dir}"]
    script = (run_dir / "train.sbatch").read_text()
    assert fake_sbatch.read_text().splitlines() == [f"sbatch --parsable {run_dir / 'train.sbatch'}"]
    assert "#SBATCH --partition=debug" in script and "--gres" not in script
    assert script.count("train.run_dir=") == 1


def test_run_dir_of_the_config_file_is_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  run_dir: runs/fixed\n")
    main([str(path), "--time", "10", "--dry-run"])
    assert f"train.run_dir={tmp_path / 'runs' / 'fixed'})" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--time", "10", "train.no_such_key=1"], "unknown config key train.no_such_key"),
        (["--time", "1h"], "not a Slurm time"),
        (["--time", "2", "--signal-seconds", "120"], "not below the time limit"),
        (["--time", "10", "--gpus-per-node", "8", "--procs-per-node", "4"], "one process per GPU"),
        (["--time", "10", "train.run_dir=/tmp/a b"], "holds whitespace"),
    ],
)
def test_bad_input_is_one_line(config, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(config), *argv, "--dry-run"])
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_sweep_submits_the_grid_and_writes_the_manifest(config, tmp_path, capsys, fake_sbatch):
    sweep_dir = tmp_path / "sweep"
    main(
        [
            "sweep",
            str(config),
            "--sizes",
            "tiny-s,tiny-m",
            "--attentions",
            "softmax,linear_affine_nodenom",
            "--samples",
            "1000,2000",
            "--time",
            "20",
            "--gpus-per-node",
            "0",
            "--sweep-dir",
            str(sweep_dir),
            "optim.lr=0.001",
        ]
    )
    with open(sweep_dir / "manifest.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    assert [r["job_id"] for r in rows] == [str(1001 + i) for i in range(8)]
    assert len({r["run_dir"] for r in rows}) == 8
    for row in rows:
        overrides = row["overrides"].split()
        assert "optim.lr=0.001" in overrides and f"model.name={row['size']}" in overrides
        assert f"model.image_attention={row['attention']}" in overrides
        assert f"model.text_attention={row['attention']}" in overrides
        assert f"train.max_steps={math.ceil(int(row['samples']) / 32)}" in overrides
        assert f"train.run_dir={row['run_dir']}" in overrides
        assert (tmp_path / "sweep" / row["run_dir"].rsplit("/", 1)[1] / "train.sbatch").is_file()


def test_sweep_without_axes_is_refused(config):
    with pytest.raises(SystemExit, match="at least one of --sizes"):
        main(["sweep", str(config), "--time", "20", "--dry-run"])


def test_sweep_file(config, tmp_path, capsys):
    spec = tmp_path / "grid.yaml"
    spec.write_text(
        f"config: {config.name}\nsizes: [tiny-s]\nattentions: [softmax, linear_elu]\noverrides: [train.save_every=7]\n"
    )
    main(["sweep", str(spec), "--time", "20", "--dry-run"])
    out = capsys.readouterr().out
    rows = list(csv.DictReader(out[out.index("job_id,") :].splitlines()))
    assert [r["attention"] for r in rows] == ["softmax", "linear_elu"]
    assert all("train.save_every=7" in r["overrides"] for r in rows)
    assert out.count("#!/bin/bash") == 2


def fake_run(root, steps):
    for step in steps:
        folder = root / "checkpoints" / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps({"step": step}))
    return root


def test_eval_job_lists_checkpoints_and_outputs(tmp_path, capsys, fake_sbatch):
    run = fake_run(tmp_path / "run", [10, 20])
    dataset = tmp_path / "synthetic" / "eval"
    dataset.mkdir(parents=True)
    main(
        [
            "eval",
            str(run / "checkpoints" / "step_00000010"),
            str(run),
            "--dataset",
            str(dataset),
            "--time",
            "15",
            "--gpus-per-node",
            "0",
            "--batch-size",
            "16",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    expected = [run / "eval" / "zeroshot-step_00000010-eval.json", run / "eval" / "zeroshot-latest-eval.json"]
    assert out[0] == "submitted job 1001" and out[1] == "results: " + " ".join(map(str, expected))
    script = next((run / "eval").glob("eval-*.sbatch")).read_text()
    assert f"CHECKPOINTS=({run / 'checkpoints' / 'step_00000010'} {run})" in script
    assert f"OUTPUTS=({expected[0]} {expected[1]})" in script
    assert f"EVAL_ARGS=(--dataset {dataset} --batch-size 16)" in script
    assert "python -m eval.zeroshot" in script and "--gres" not in script


def test_eval_refuses_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="neither a checkpoint folder"):
        main(["eval", str(tmp_path), "--dataset", str(tmp_path), "--time", "5", "--dry-run"])


def test_eval_refuses_a_missing_dataset(tmp_path):
    run = fake_run(tmp_path / "run", [10])
    with pytest.raises(SystemExit, match=r"--dataset .* is not a folder"):
        main(["eval", str(run), "--dataset", str(tmp_path / "nope"), "--time", "5", "--dry-run"])
