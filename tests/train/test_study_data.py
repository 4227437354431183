"""A study run in parts (--sizes, then --resume into the same folder): its embedded data set is made once per
folder, settings and seed (train/study.py make_data; other settings, another seed or an interrupted make write it
again), and the runs of an earlier part keep their wall and CPU seconds (their folders' study_times.json)."""

import json
import math
import sys
from types import SimpleNamespace

import train.study
from eval.study_analysis import run_times, saved_times
from eval.study_report import clock_sentence
from models.run_folder import STUDY_TIMES
from train.study import MADE, REPO, Job, load_study, make_data
from train.study_local import run_jobs

DEMO = REPO / "configs" / "study" / "demo.yaml"


def test_the_same_settings_and_seed_keep_the_data_and_others_remake_it(tmp_path, monkeypatch):
    study = load_study(DEMO, quick=True)  # 256 training samples
    folder = tmp_path / "data"
    paths = make_data(folder, study, seed=3)
    assert json.loads((folder / MADE).read_text()) == {"seed": 3, **study.data}
    shard = folder / "train" / "00000.tar"
    made_at, reports = shard.stat().st_mtime_ns, []
    made = []
    real = train.study.make_synthetic
    monkeypatch.setattr(train.study, "make_synthetic", lambda *a, **k: made.append(k["seed"]) or real(*a, **k))
    assert make_data(folder, study, seed=3, report=reports.append) == paths
    assert made == [] and shard.stat().st_mtime_ns == made_at and "kept" in reports[0]
    make_data(folder, study, seed=4)  # another seed: written again
    assert made == [4] and json.loads((folder / MADE).read_text())["seed"] == 4
    (folder / MADE).unlink()  # as a make interrupted before its end leaves it
    make_data(folder, study, seed=4)
    assert made == [4, 4]
    study.data["val_samples"] = 32  # other settings
    make_data(folder, study, seed=4)
    assert made == [4, 4, 4] and json.loads((folder / MADE).read_text())["val_samples"] == 32


def test_a_run_of_an_earlier_part_keeps_its_times_when_runs_json_lacks_it(tmp_path):
    first = Job(
        "demo-w64", "softmax", tmp_path / "runs" / "w64", [sys.executable, "-c", "import time; time.sleep(0.3)"]
    )
    run_jobs([first], parallel=1, threads=1, report=lambda line: None)
    saved = json.loads((first.run_dir / STUDY_TIMES).read_text())
    assert saved["wall_seconds"] == first.wall_seconds >= 0.3
    # the last part's runs.json holds only its own runs (--sizes demo-w16)
    other = {"run_dir": str(tmp_path / "runs" / "w16"), "wall_seconds": 5.0, "cpu_seconds": 4.0}
    (tmp_path / "runs.json").write_text(json.dumps([other]))
    again = [Job("demo-w64", "softmax", first.run_dir, []), Job("demo-w16", "softmax", tmp_path / "runs" / "w16", [])]
    run_times(tmp_path, again)
    assert again[0].wall_seconds == first.wall_seconds and again[0].cpu_seconds == first.cpu_seconds
    assert (again[1].wall_seconds, again[1].cpu_seconds) == (5.0, 4.0)  # a folder without the file: runs.json


def test_a_reanalysis_reads_the_clock_of_its_own_study_only(tmp_path):
    """Studies resumed into one folder (sizes_long, then depth) share runs.json's runs but not a clock: a
    re-analysis of sizes_long there gives no study time rather than depth's, and says whose the clock is."""
    (tmp_path / "runs.json").write_text("[]")
    clock = {"wall": 60.0, "cpu": 90.0, "load": [1.0], "final": True, "study": "depth.yaml", "machine": "m"}
    (tmp_path / "clock.json").write_text(json.dumps(clock))
    assert saved_times(tmp_path, [], study="depth.yaml")["wall"] == 60.0
    other = saved_times(tmp_path, [], study="sizes_long.yaml")
    assert math.isnan(other["wall"]) and other["other_study"] == "depth.yaml" and other["machine"] == "m"
    text = clock_sentence(other, SimpleNamespace(jobs=2, threads_per_job=1), "here")
    assert "another study (depth.yaml) ran last" in text and "minutes wall" not in text
    del clock["study"]  # a folder from before clocks named their study: its clock is read as before
    (tmp_path / "clock.json").write_text(json.dumps(clock))
    assert saved_times(tmp_path, [], study="sizes_long.yaml")["wall"] == 60.0
