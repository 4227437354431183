"""The optimizer as a study axis (train/study.py `optimizers:`) and the optimizer study's verdicts over seeds
(eval/optimizer_study.py)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from eval import optimizer_study, seeds_page
from eval.seeds import Seed
from eval.seeds_page import body_of
from scripts import demo, study_seeds
from train.lr_sweep import adopt, sweep_jobs
from train.study import StudyError, data_paths, done_before, jobs_of, load_study

STUDY = demo.REPO / "configs" / "study" / "optimizers.yaml"
PATHS = {"train": "t/{0..1}.tar", "val": "v/{0..1}.tar", "eval": "e"}


def test_optimizers_are_an_axis_beside_the_attentions(tmp_path):
    """Every attention with each optimizer: arms ATTENTION@OPTIMIZER whose runs set both towers' attention and
    optim.name, each sweeping its attention's learning-rate multiples; an unknown optimizer is one line."""
    study = load_study(STUDY)
    assert study.attentions == [
        "softmax@adamw",
        "softmax@muon",
        "linear_affine_nodenom@adamw",
        "linear_affine_nodenom@muon",
    ]
    job = next(j for j in jobs_of(study, tmp_path, PATHS, 0) if j.attention == "linear_affine_nodenom@muon")
    assert job.run_dir.name == "demo-w64-linear_affine_nodenom@muon"
    assert {"optim.name=muon", "model.image_attention=linear_affine_nodenom"} <= set(job.argv)
    assert "model.text_attention=linear_affine_nodenom" in job.argv
    scales = {(j.attention, s) for s, j in sweep_jobs(study, tmp_path, PATHS, 0)}
    assert ("softmax@muon", 1.0) in scales and ("linear_affine_nodenom@muon", 0.125) in scales
    assert ("linear_affine_nodenom@muon", 2.0) not in scales
    raw = yaml.safe_load(STUDY.read_text()) | {"optimizers": ["adamw", "muonn"]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(StudyError, match=r"optimizers: 'muonn' is not an optimizer; known: adamw, .*muon"):
        load_study(tmp_path / "bad.yaml")


def test_a_seed_may_train_with_the_rates_another_seeds_sweep_chose(tmp_path):
    """--rates-from FOLDER: each arm's chosen multiple from FOLDER/lr_sweep.json, no sweep; a folder that chose no
    rate for an arm is one line."""
    study = load_study(STUDY)
    chosen = {"softmax@adamw": 0.5, "softmax@muon": 1.0, "linear_affine_nodenom@adamw": 0.25}
    rows = [{"attention": a, "scale": x, "chosen": True} for a, x in chosen.items()]
    (tmp_path / "lr_sweep.json").write_text(json.dumps(rows))
    with pytest.raises(StudyError, match=r"no learning rate chosen for linear_affine_nodenom@muon: give a finished"):
        adopt(study, tmp_path)
    rows.append({"attention": "linear_affine_nodenom@muon", "scale": 0.125, "chosen": True})
    rows.append({"attention": "softmax@muon", "scale": 0.25, "chosen": False})
    (tmp_path / "lr_sweep.json").write_text(json.dumps(rows))
    adopt(study, tmp_path)
    assert not study.lr_sweep and study.per_attention["softmax@muon"]["lr_scale"] == 1.0
    job = next(j for j in jobs_of(study, tmp_path, PATHS, 1) if j.attention == "linear_affine_nodenom@muon")
    assert f"optim.lr={2.5e-3 * 0.125}" in job.argv and "optim.name=muon" in job.argv


def curve(samples_to_60: int, seed: int) -> list[list[float]]:
    """A learning curve whose error falls through 60% at about `samples_to_60` samples."""
    samples = np.arange(1, 11) * 1000
    error = np.clip(0.9 - 0.3 * samples / samples_to_60 + 0.004 * seed, 0.05, 0.95)
    return [[int(s), float(1 - e)] for s, e in zip(samples, error)]


def seed_of(seed: int, muon_speed: dict[str, float]) -> Seed:
    runs = []
    for attention, speed in muon_speed.items():
        for optimizer, to_60 in (("adamw", 6000), ("muon", 6000 / speed)):
            points = curve(int(to_60 * (1 + 0.02 * seed)), seed)
            runs.append(
                {
                    "attention": f"{attention}@{optimizer}",
                    "size": "demo-w64",
                    "params_without_token_embedding": 1000,
                    "curve": points,
                    "samples_seen": points[-1][0],
                    "top1": points[-1][1],
                    "val_loss": 1.0 / points[-1][1],
                    "fewshot": {"1shot": 0.3, "5shot": 0.5},
                }
            )
    return Seed(str(seed), Path(f"runs/optimizers-seed{seed}"), runs, {}, [])


def test_the_report_says_which_optimizer_converges_faster_per_attention():
    """Muon at 1.5x AdamW's speed on softmax (every seed) is faster; at AdamW's speed on Eq. 7 it is undetermined."""
    seeds = [seed_of(s, {"softmax": 1.5, "linear_affine_nodenom": 1.0}) for s in range(3)]
    text = body_of(seeds, [0.8, 0.7, 0.6], "python -m scripts.study_seeds", 720, None)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if "vs adamw" in line}
    assert "**faster**" in rows["softmax"] and "target 60% error: 0.6" in rows["softmax"]
    assert "**undetermined**" in rows["linear_affine_nodenom"]
    assert "| softmax@muon | 0.30 / 0.30 / 0.30" not in text  # multipliers per seed, not placeholders
    assert "| 5-shot probe accuracy, seeds 0 / 1 / 2 |" in text.replace("| arm ", "")
    slower = [seed_of(s, {"softmax": 0.5}) for s in range(3)]
    assert "**slower**" in body_of(slower, [0.6], "python -m x", None, None)


def test_the_quick_optimizer_study_writes_its_page(tmp_path, quick_polls):
    """The pipeline end to end in seconds: four arms trained, analysed, and the page over two seeds written (the
    second a copy of the first under another seed number: the page's mechanics, not its numbers)."""
    outs = [demo.main(["--study", str(STUDY), "--quick", "--seed", "0", "--out", str(tmp_path / "s0")])]
    outs.append(Path(shutil.copytree(outs[0], tmp_path / "s1")))
    (outs[1] / "report.md").write_text((outs[1] / "report.md").read_text().replace("--seed 0", "--seed 1"))
    assert (outs[0] / "learning_curves.png").stat().st_size > 0
    text = study_seeds.main([*map(str, outs), "--study", str(STUDY), "--out", str(tmp_path / "page.md")])
    title = f"# {load_study(STUDY).title}, over 2 seeds\n"  # the study config's title
    assert text.startswith(title) and "| softmax | muon" in text
    assert seeds_page.rebuild(tmp_path / "page.md").startswith(title)  # kept in the page's data (seeds.json)
    assert (tmp_path / "page" / "curves.png").stat().st_size > 0
    jobs = jobs_of(load_study(STUDY, quick=True), outs[0], data_paths(outs[0] / "data"), 0)
    assert all(done_before(job) for job in jobs)
    jobs[0].argv = [*jobs[0].argv, "optim.lr=0.5"]  # another config: trained again
    assert not done_before(jobs[0])
    first = {r["run_dir"]: r["wall_seconds"] for r in json.loads((outs[0] / "runs.json").read_text())}
    again = demo.main(["--study", str(STUDY), "--quick", "--seed", "0", "--out", str(outs[0]), "--resume"])
    assert "Resumed (--resume): 4 finished runs of the same config were kept" in (again / "report.md").read_text()
    # the kept runs keep their own times (the report's runs table), not 0
    assert {r["run_dir"]: r["wall_seconds"] for r in json.loads((again / "runs.json").read_text())} == first
    assert min(first.values()) > 0
    assert optimizer_study.is_optimizer_study([seed_of(0, {"softmax": 1.0})])


def test_replicates_where_the_reference_misses_the_target_are_left_out():
    """A reference that reaches the target only at its last evaluation misses it in many bootstrap replicates; those
    give no multiplier (as eval/multiplier.py), not a multiplier of 0."""
    from eval.seeds import boot_multiplier

    seeds = [seed_of(s, {"softmax": 1.5}) for s in range(3)]
    for seed in seeds:  # adamw's curve just under 60% error at its last point only
        run = next(r for r in seed.runs if r["attention"] == "softmax@adamw")
        run["curve"] = [[s, min(t, 0.401)] for s, t in run["curve"]]
    lo, hi = boot_multiplier(seeds, "softmax@muon", "demo-w64", 0.6, n_images=50, reference="softmax@adamw")
    assert 0 < lo <= hi < 1
