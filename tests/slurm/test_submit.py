"""The submit command: run directory choice, --dry-run, submission, sweeps (job arrays, cooldown branches) with
their manifest, eval jobs.
sbatch is a stand-in here (tests/slurm/conftest.py); test_cluster.py submits to a real Slurm."""

import csv
import json
import math
import shlex

import pytest

from tests.train.common import REPO
from train.submit import main


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("model:\n  name: tiny-s\ndata:\n  batch_size: 32\ntrain:\n  max_steps: 5\n")
    return path


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


def test_a_remote_run_dir_stays_a_url_and_the_job_files_go_to_its_stage_dir(
    config, tmp_path, monkeypatch, capsys, fake_sbatch
):
    monkeypatch.chdir(tmp_path)
    stage = tmp_path / "stage"
    main([str(config), "--time", "10", "train.run_dir=s3://bucket/runs/a", f"train.stage_dir={stage}"])
    assert capsys.readouterr().out.splitlines() == ["submitted job 1001", "run dir: s3://bucket/runs/a"]
    script = (stage / "train.sbatch").read_text()
    assert "train.run_dir=s3://bucket/runs/a" in script and f"#SBATCH --output={stage}/slurm-%j.out" in script
    assert not (tmp_path / "s3:").exists()


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


def read_manifest(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_sweep_is_one_job_array_and_the_manifest_maps_its_tasks(config, tmp_path, capsys, fake_sbatch):
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
            "--max-running",
            "3",
            "--sweep-dir",
            str(sweep_dir),
            "optim.lr=0.001",
        ]
    )
    assert capsys.readouterr().out.splitlines() == [
        "submitted array job 1001 (8 tasks): train",
        f"manifest: {sweep_dir / 'manifest.csv'}",
    ]
    assert fake_sbatch.read_text().splitlines() == [f"sbatch --parsable {sweep_dir / 'train.sbatch'}"]
    rows = read_manifest(sweep_dir / "manifest.csv")
    assert [(r["array"], r["job_id"], r["task_id"]) for r in rows] == [("train", "1001", str(i)) for i in range(8)]
    assert len({r["run_dir"] for r in rows}) == 8
    script = (sweep_dir / "train.sbatch").read_text()
    assert "#SBATCH --array=0-7%3" in script and f"#SBATCH --output={sweep_dir}/logs/train-%A_%a.out" in script
    for row in rows:
        overrides = shlex.split(row["overrides"])
        assert "optim.lr=0.001" in overrides and f"model.name={row['size']}" in overrides
        assert f"model.image_attention={row['attention']}" in overrides
        assert f"model.text_attention={row['attention']}" in overrides
        assert f"train.max_steps={math.ceil(int(row['samples']) / 32)}" in overrides
        assert row["max_steps"] == str(math.ceil(int(row["samples"]) / 32))
        assert overrides[-1] == f"train.run_dir={row['run_dir']}"
        assert row["log"] == f"{sweep_dir}/logs/train-1001_{row['task_id']}.out"
        # the script's case entry for this task id runs exactly the manifest's overrides
        assert f"  {row['task_id']}) TRAIN_ARGS=({shlex.join([str(config), *overrides])}) ;;" in script


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
    rows = list(csv.DictReader(out[out.index("array,job_id,") :].splitlines()))
    assert [r["attention"] for r in rows] == ["softmax", "linear_elu"]
    assert all("train.save_every=7" in r["overrides"] for r in rows)
    assert out.count("#!/bin/bash") == 1 and "#SBATCH --array=0-1\n" in out


def test_cooldown_sweep_file(config, tmp_path, capsys):
    spec = tmp_path / "cooldowns.yaml"
    spec.write_text(
        f"config: {config.name}\nattentions: [softmax]\ncooldowns_at: [8, 16]\ncooldown_fraction: 0.25\n"
        "overrides: [optim.warmup_steps=2]\n"
    )
    main(["sweep", str(spec), "--time", "20", "--dry-run"])
    out = capsys.readouterr().out
    rows = list(csv.DictReader(out[out.index("array,job_id,") :].splitlines()))
    assert [r["array"] for r in rows] == ["constant-6", "constant-12", "cooldown-8", "cooldown-16"]
    assert "#SBATCH --dependency=aftercorr:<job id of constant-12>" in out and out.count("#!/bin/bash") == 4


def cooldown_sweep(config, sweep_dir, *extra):
    main(
        [
            "sweep",
            str(config),
            "--sizes",
            "tiny-s,tiny-m",
            "--cooldowns-at",
            "100,200,400",
            "--cooldown-fraction",
            "0.25",
            "--time",
            "20",
            "--gpus-per-node",
            "0",
            "--sweep-dir",
            str(sweep_dir),
            "optim.warmup_steps=5",
            *extra,
        ]
    )


def test_cooldown_sweep_chains_constant_arrays_and_branch_arrays(config, tmp_path, capsys, fake_sbatch):
    """Run lengths 100, 200, 400 with a quarter cooldown branch at steps 75, 150, 300 of each constant run: arrays
    constant-75 -> constant-150 -> constant-300 (each resuming the last), cooldown-T after constant-(0.75 T)."""
    sweep_dir = tmp_path / "sweep"
    cooldown_sweep(config, sweep_dir)
    names = ["constant-75", "constant-150", "constant-300", "cooldown-100", "cooldown-200", "cooldown-400"]
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == [f"submitted array job {1001 + i} (2 tasks): {name}" for i, name in enumerate(names)]
    after = {"constant-150": 1001, "constant-300": 1002, "cooldown-100": 1001, "cooldown-200": 1002}
    for name in names:
        script = (sweep_dir / f"{name}.sbatch").read_text()
        expected = after.get(name, 1003 if name == "cooldown-400" else None)
        dependencies = [line for line in script.splitlines() if line.startswith("#SBATCH --dependency")]
        assert dependencies == ([f"#SBATCH --dependency=aftercorr:{expected}"] if expected else []), name
        assert "#SBATCH --array=0-1\n" in script
    rows = read_manifest(sweep_dir / "manifest.csv")
    assert [(r["array"], r["task_id"]) for r in rows] == [(n, str(i)) for n in names for i in range(2)]
    for row in rows:
        overrides = shlex.split(row["overrides"])
        name = f"tiny-{row['size'][-1]}"
        assert f"model.name={name}" in overrides and "optim.warmup_steps=5" in overrides
        if row["array"].startswith("constant"):
            stop = int(row["array"].split("-")[1])
            assert row["max_steps"] == str(stop) and row["branch_from"] == ""
            assert overrides[-4:] == [
                "optim.schedule=constant",
                f"train.max_steps={stop}",
                "train.keep_steps=[75,150,300]",
                f"train.run_dir={sweep_dir / f'{name}-constant'}",
            ]
        else:
            end = int(row["array"].split("-")[1])
            parent = sweep_dir / f"{name}-constant" / "checkpoints" / f"step_{end * 3 // 4:08d}"
            assert row["branch_from"] == str(parent) and row["samples"] == str(end * 32)
            assert row["max_steps"] == str(end)
            assert overrides[-5:] == [
                "optim.schedule=const-cooldown",
                f"optim.cooldown_steps={end // 4}",
                f"train.max_steps={end}",
                f"train.branch_from={parent}",
                f"train.run_dir={sweep_dir / f'{name}-cooldown{end}'}",
            ]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--samples", "1000"], "--samples and --cooldowns-at both set the run lengths; give one"),
        (["--cooldown-fraction", "1.5"], "--cooldown-fraction 1.5 must lie between 0 and 1"),
        (["--sbatch-arg=--dependency=afterok:5"], "this sweep sets --array and --dependency itself"),
        (["optim.warmup_steps=80"], "array cooldown-100, task 0 (tiny-s-cooldown100): optim.schedule=const-cooldown"),
        (["--cooldowns-at", "2"], "--cooldowns-at 2 with --cooldown-fraction 0.25 gives a cooldown of 0 steps"),
    ],
)
def test_bad_cooldown_sweeps_are_one_line_and_submit_nothing(config, tmp_path, fake_sbatch, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        cooldown_sweep(config, tmp_path / "sweep", *extra)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)
    assert not fake_sbatch.exists() and not (tmp_path / "sweep").exists()


def test_a_failed_submission_keeps_the_manifest_of_what_was_submitted(
    config, tmp_path, capsys, fake_sbatch, monkeypatch
):
    monkeypatch.setenv("STUB_SBATCH_FAIL_AT", "1002")
    with pytest.raises(SystemExit, match="QOSMaxSubmitJobPerUserLimit; submitted before it: constant-75 "):
        cooldown_sweep(config, tmp_path / "sweep")
    rows = read_manifest(tmp_path / "sweep" / "manifest.csv")
    assert {(r["array"], r["job_id"]) for r in rows} == {("constant-75", "1001")} and len(rows) == 2


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


def test_the_linearisation_config_submits_as_it_is(tmp_path, monkeypatch, capsys, fake_sbatch):
    """Issue 24 on Slurm: the shipped ViT-B-16 config (both stages, train/stages.py) renders a one-node, 8-GPU job
    that trains it; its stages go to RUN/transfer, then RUN."""
    from train.config import load_config
    from train.stages import stage_overrides

    monkeypatch.chdir(tmp_path)
    config = REPO / "configs" / "vit_b16_linearise.yaml"
    main([str(config), "--nodes", "1", "--gpus-per-node", "8", "--time", "24:00:00", "--dry-run"])
    script = capsys.readouterr().out
    assert "#SBATCH --gres=gpu:8" in script and str(config) in script
    run_dir = tmp_path / "runs" / "vit_b16_linearise"
    assert f"train.run_dir={run_dir})" in script
    assert not fake_sbatch.exists()
    cfg = load_config([str(config), f"train.run_dir={run_dir}"])
    stage1, stage2 = stage_overrides(cfg)
    assert f"train.run_dir={run_dir}/transfer" in stage1 and "train.max_steps=2000" in stage1
    assert "optim.lr=0.001" in stage1 and stage2 == ["distill.stage=distill", f"model.pretrained={run_dir}/transfer"]
