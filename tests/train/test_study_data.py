"""A study's embedded data set is made once per folder, settings and seed: a resumed study, or one run in parts with
--sizes, keeps the set a finished make left (train/study.py make_data); other settings, another seed or an
interrupted make write it again."""

import json

import train.study
from train.study import MADE, REPO, load_study, make_data

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
