"""scripts/long_clip.py: the four runs of each text attention, as Long-CLIP's comparison needs them."""

from pathlib import Path

from scripts import long_clip
from train.long_clip import ARMS, jobs_of, rebuild, write


def settings(job) -> dict[str, str]:
    return dict(a.split("=", 1) for a in job.argv[4:])


def test_runs_compare_stretching_with_kept_positions_and_scratch(tmp_path):
    args = long_clip.parse_args(["--base-steps", "30", "--tune-steps", "10", "--context", "64", "--keep", "6"])
    data = {"short": tmp_path / "short", "long": tmp_path / "long"}
    for folder in data.values():
        (folder / "train").mkdir(parents=True)
        (folder / "train" / "00000.tar").touch()
    jobs = {job.attention: job for job in jobs_of(tmp_path, data, args)}
    assert list(jobs) == [f"{a} {arm}" for a in ("softmax", "linear_affine_nodenom") for arm in ARMS]
    for attention in ("softmax", "linear_affine_nodenom"):
        base, kept, stretched, scratch = (jobs[f"{attention} {arm}"] for arm in ARMS)
        s = {arm: settings(jobs[f"{attention} {arm}"]) for arm in ARMS}
        assert all(v["model.text_attention"] == attention for v in s.values())
        assert s["base"]["data.train_shards"].startswith(str(data["short"]))
        assert all(
            s[arm]["data.train_shards"].startswith(str(data["long"])) for arm in ("kept", "stretched", "scratch")
        )
        # the fine-tunings start from the base run once it has finished; only the stretched one changes the context
        assert kept.after is base and stretched.after is base and base.after is None and scratch.after is None
        assert s["kept"]["model.pretrained"] == s["stretched"]["model.pretrained"] == str(base.run_dir)
        assert s["kept"]["model.context_length"] == s["base"]["model.context_length"] == "16"
        assert s["stretched"]["model.context_length"] == s["scratch"]["model.context_length"] == "64"
        assert s["stretched"]["model.text_pos_keep"] == "6" and "model.text_pos_keep" not in s["kept"]
        assert "model.pretrained" not in s["scratch"] and s["scratch"]["train.max_steps"] == "40"
        assert float(s["kept"]["optim.lr"]) == float(s["base"]["optim.lr"]) / 4
    assert Path(jobs["softmax base"].run_dir).name == "softmax-base"


def test_the_page_is_its_data_written_again_with_its_findings(tmp_path):
    args = long_clip.parse_args(["--base-steps", "30", "--tune-steps", "10", "--context", "64", "--keep", "6"])
    results = {f"{a} {arm}": {"long_t2i_r1": 0.25, "short_top1": 0.5} for a in args.attentions for arm in ARMS}
    results["softmax scratch"] = {"long_t2i_r1": 0.394, "short_top1": 0.573}
    page = write(tmp_path, args, results, 90.0)
    text = page.read_text()
    assert "| softmax | long captions from scratch | 64 | 40 | 39.4% | 57.3% |" in text and "1.5 min" in text
    page.write_text(text + "\n## Findings\n\nStretching does not help here.\n")
    assert rebuild(page) == page.read_text()  # the findings stay, every number comes from long_clip.json
