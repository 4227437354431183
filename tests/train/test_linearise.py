"""train/linearise.py: the two stages per student from the study's best softmax run, and the steps-to-target."""

import json

import yaml

from train import linearise
from train.linearise import Settings


def fake_study(tmp_path):
    runs = []
    for attention, top1 in (("softmax", 0.9), ("linear_affine_nodenom", 0.7)):
        for size, scale in (("demo-w32", 0.8), ("demo-w64", 1.0)):
            run_dir = tmp_path / "runs" / f"{size}-{attention}"
            run_dir.mkdir(parents=True)
            model = {"name": size, "image_size": None}
            (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": model, "optim": {"lr": 0.004 * scale}}))
            curve = [[6400, 0.3], [12800, 0.5 * scale], [19200, top1 * scale]]
            runs.append({"size": size, "attention": attention, "top1": top1 * scale, "run_dir": str(run_dir)})
            runs[-1] |= {
                "gmacs_per_sample": 0.01 * scale * (1 if attention == "softmax" else 0.9),
                "samples_seen": 19200,
            }
            runs[-1]["run_curve"] = curve
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "00000.tar").touch()
    return tmp_path


def test_students_start_from_the_best_softmax_run_and_count_both_stages(tmp_path):
    study = fake_study(tmp_path / "study")
    args = Settings(study, transfer_steps=20, distill_steps=50)
    teacher, scratch = linearise.study_runs(study)
    assert teacher["size"] == "demo-w64" and list(scratch) == ["linear_affine_nodenom"]
    transfer, distill = linearise.jobs_of(study, tmp_path / "out", teacher, scratch, args)
    s1, s2 = (dict(a.split("=", 1) for a in job.argv[4:]) for job in (transfer, distill))
    assert distill.after is transfer and transfer.after is None
    assert s1["distill.teacher"] == s2["distill.teacher"] == teacher["run_dir"]
    assert (s1["distill.stage"], s2["distill.stage"]) == ("transfer", "distill")
    assert s2["model.pretrained"] == str(transfer.run_dir) and "model.pretrained" not in s1
    assert float(s2["optim.lr"]) == 0.004 and s1["model.image_attention"] == s2["model.text_attention"]
    assert s1["model.name"] == s2["model.name"] == "demo-w64"  # the teacher's model, from its run's config
    # steps to 95% of the teacher's 90% top-1 (85.5%): the linearised curve counts stage 1's 20 steps
    distill.run_dir.mkdir(parents=True)
    records = [{"step": 25, "zeroshot/top1": 0.8}, {"step": 50, "zeroshot/top1": 0.86}]
    (distill.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    transfer.run_dir.mkdir(parents=True)
    mse = [
        {"step": 1, "transfer/mse/visual.0": 2.0, "transfer/mse/text.0": 1.0},
        {"step": 20, "transfer/mse/visual.0": 0.1},
    ]
    mse[1]["transfer/mse/text.0"] = 0.5
    (transfer.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mse))
    assert s1["train.log_every"] == "1"
    result = linearise.compare(tmp_path / "out", teacher, scratch, args)["linear_affine_nodenom"]
    assert result["mse_drop"] == {"visual.0": 20.0, "text.0": 2.0}
    assert result["linearised_steps"] == 70 and result["scratch_steps"] is None and result["scratch_best"] == 0.7
    linearise.write(tmp_path / "out", teacher, {"linear_affine_nodenom": result}, args, 60.0)
    page = tmp_path / "out" / "linearise.md"
    assert "| linear_affine_nodenom | 70 | never (best 70.0%) |" in page.read_text()
    # the page is its data written again; the data keep each student's results under its name (eval/seeds.py)
    saved = json.loads(page.with_suffix(".json").read_text())
    assert saved["writer"] == "train.linearise" and saved["linear_affine_nodenom"]["linearised_steps"] == 70
    assert list(linearise.students_of(saved)) == ["linear_affine_nodenom"]
    assert linearise.rebuild(page) == page.read_text()
    # its compute counts the teacher's training (3 x 0.01 GMACs x 19,200 samples) and its forward pass on every one
    # of the 70 student batches of 64, beside the student's own steps (3 x 0.009 GMACs a sample)
    assert result["teacher_gmacs"] == 3 * 0.01 * 19200
    assert abs(result["linearised_gmacs"] - (576 + 70 * 64 * (3 * 0.009 + 0.01))) < 1e-6
    assert result["scratch_gmacs"] is None


def test_a_student_the_study_did_not_train_takes_the_teachers_rate_and_has_no_scratch_curve(tmp_path):
    study = fake_study(tmp_path / "study")
    args = Settings(study, transfer_steps=20, students=["hedgehog"])
    teacher, scratch = linearise.study_runs(study, args.students)
    assert scratch == {"hedgehog": None}
    transfer, distill = linearise.jobs_of(study, tmp_path / "out", teacher, scratch, args)
    s2 = dict(a.split("=", 1) for a in distill.argv[4:])
    assert s2["model.image_attention"] == "hedgehog" and float(s2["optim.lr"]) == 0.004  # the teacher's
    for job, rows in (
        (distill, [{"step": 25, "zeroshot/top1": 0.88}]),
        (transfer, [{"step": 1, "transfer/mse/v": 1.0}]),
    ):
        job.run_dir.mkdir(parents=True)
        (job.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = linearise.compare(tmp_path / "out", teacher, scratch, args)["hedgehog"]
    assert result["linearised_steps"] == 45 and result["scratch_steps"] is None and result["scratch_curve"] == []
    linearise.write(tmp_path / "out", teacher, {"hedgehog": result}, args, 60.0)
    text = (tmp_path / "out" / "linearise.md").read_text()
    assert "| hedgehog | 45 | no run from scratch in the study |" in text and "--students hedgehog" in text
