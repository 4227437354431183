"""A learning-rate sweep at several sizes (lr_sweep.size: [smallest, largest]): an attention's chosen multiple is
used at every size only where the sweep shows that it transfers (train/lr_sweep.apply)."""

import json
import math
from types import SimpleNamespace

import pytest
import yaml

from eval.study_report import sweep_table
from train.lr_sweep import adopt, apply, sweep_jobs
from train.study import REPO, StudyError, budget_steps, jobs_of, load_study

DEMO = REPO / "configs" / "study" / "demo.yaml"
PATHS = {"train": "t/{0..1}.tar", "val": "v/{0..1}.tar", "eval": "e"}


def study_swept_at(tmp_path, sizes):
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("rates_from")  # a sweep in the study instead of the 4-size study's rates
    scales = {"softmax": [0.25, 0.5, 1.0], "linear_affine": [0.25, 0.5, 1.0]}
    scales["linear_affine_nodenom"] = [0.125, 0.25, 0.5]
    raw["lr_sweep"] = {"size": sizes, "scales": scales, "metric": "val_loss"}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    return load_study(tmp_path / "study.yaml")


def rows(choices: dict[tuple[str, str], float]) -> list[dict]:
    """Sweep rows at multiples 0.25, 0.5, 1 per (size, attention), the given multiple chosen."""
    out = []
    for (size, attention), best in choices.items():
        for scale in (0.25, 0.5, 1.0):
            out.append({"size": size, "attention": attention, "scale": scale, "lr": scale, "val_loss": 1.0 + scale})
            out[-1] |= {"top1": 0.5, "chosen": scale == best}
    return out


def test_the_sweep_runs_at_each_listed_size(tmp_path):
    study = study_swept_at(tmp_path, ["demo-w16", "demo-w64"])
    pairs = sweep_jobs(study, tmp_path, PATHS, 0)
    assert {job.size for _, job in pairs} == {"demo-w16", "demo-w64"}
    assert len(pairs) == 2 * sum(len(v) for v in study.lr_sweep["scales"].values())
    with pytest.raises(StudyError, match=r"lr_sweep.size must be one of the study's sizes, or a list of them"):
        study_swept_at(tmp_path, ["demo-w16", "demo-w99"])


def test_a_choice_transfers_only_where_the_sizes_agree(tmp_path):
    study = study_swept_at(tmp_path, ["demo-w16", "demo-w64"])
    choices = {(size, "softmax"): 0.5 for size in ("demo-w16", "demo-w64")}
    choices |= {(size, "linear_affine"): 1.0 for size in ("demo-w16", "demo-w64")}
    choices |= {("demo-w16", "linear_affine_nodenom"): 0.25, ("demo-w64", "linear_affine_nodenom"): 1.0}
    swept = rows(choices)
    apply(study, swept)
    assert study.per_attention["softmax"]["lr_scale"] == 0.5 and "softmax" not in study.lr_by_size["demo-w32"]
    # Eq. 7 chose differently: each swept size its own, demo-w32 (as near to both) the smaller size's
    assert {s: study.lr_by_size[s]["linear_affine_nodenom"] for s in study.sizes} == {
        "demo-w16": 0.25,
        "demo-w32": 0.25,
        "demo-w64": 1.0,
    }
    lr = {
        (j.size, j.attention): next(a for a in j.argv if a.startswith("optim.lr="))
        for j in jobs_of(study, tmp_path, PATHS, 0)
        if j.after is None
    }
    assert lr["demo-w64", "linear_affine_nodenom"] == f"optim.lr={2.5e-3 * 1.0}"
    assert lr["demo-w16", "linear_affine_nodenom"] == f"optim.lr={5.0e-3 * 0.25}"
    assert lr["demo-w32", "softmax"] == f"optim.lr={4.0e-3 * 0.5}"
    text = sweep_table(swept, study.lr_sweep)
    assert (
        "| linear_affine_nodenom | demo-w64 | 1x |" in text
        and "Does not transfer across sizes: linear_affine_nodenom." in text
    )


def test_another_seed_adopts_the_same_per_size_choice(tmp_path):
    study = study_swept_at(tmp_path, ["demo-w16", "demo-w64"])
    choices = {(s, a): 0.5 for s in ("demo-w16", "demo-w64") for a in study.attentions}
    choices[("demo-w64", "softmax")] = 0.25
    (tmp_path / "lr_sweep.json").write_text(json.dumps(rows(choices)))
    adopt(study, tmp_path)
    assert not study.lr_sweep and study.lr_by_size["demo-w64"]["softmax"] == 0.25
    assert study.per_attention["linear_affine"]["lr_scale"] == 0.5


def test_the_sizes_study_sweeps_its_smallest_and_largest_of_four_sizes():
    """configs/study/sizes.yaml: claim (c)'s 4 sizes spanning >= 10x in parameters, rates swept at both ends."""
    from models import ModelConfig, build_clip
    from models.counts import summary

    study = load_study(REPO / "configs" / "study" / "sizes.yaml")
    assert list(study.sizes) == ["demo-w16", "demo-w32", "demo-w48", "demo-w64"]
    assert study.lr_sweep["size"] == ["demo-w16", "demo-w64"]
    params = [
        summary(build_clip(ModelConfig(name=s)), macs=False)["params_without_token_embedding"] for s in study.sizes
    ]
    assert params == sorted(params) and params[-1] / params[0] >= 10


def test_rates_from_several_folders_take_each_attention_from_the_first_that_swept_it(tmp_path):
    """--rates-from A B: sweeps of separate attentions run as separate studies (each within its time) give one seed's
    rates; a published page's data (page.json's sweep) serves as a folder; an attention no folder chose is one line."""
    study = study_swept_at(tmp_path, "demo-w32")
    first, page, empty = tmp_path / "first", tmp_path / "page", tmp_path / "empty"
    for folder in (first, page, empty):
        folder.mkdir()
    (first / "lr_sweep.json").write_text(json.dumps(rows({("demo-w32", "linear_affine_nodenom"): 1.0})))
    both = rows({("demo-w32", "linear_affine_nodenom"): 0.25, ("demo-w32", "softmax"): 0.5})
    (page / "page.json").write_text(json.dumps({"sweep": both, "study": {}}))
    (empty / "lr_sweep.json").write_text("[]")
    with pytest.raises(StudyError, match=r"has no learning rate chosen for softmax: give a finished study folder"):
        adopt(study_swept_at(tmp_path, "demo-w32"), [empty, first])
    with pytest.raises(StudyError, match=r"no learning rate chosen for linear_affine: "):
        adopt(study, [first, page])
    study.attentions = ["softmax", "linear_affine_nodenom"]
    adopt(study, [empty, first, page])
    assert not study.lr_sweep
    assert study.per_attention["linear_affine_nodenom"]["lr_scale"] == 1.0  # the first folder's choice, not page's
    assert study.per_attention["softmax"]["lr_scale"] == 0.5


def test_the_main_job_trains_with_the_rates_the_four_size_study_swept_at_both_ends(tmp_path):
    """configs/study/demo.yaml's rates_from: the sweep of docs/study_sizes (at demo-w16 and demo-w64) sets every run's
    rate, carried to demo-w32 only where both ends agree; the report names where they come from; --rates-from
    replaces rates_from (not applied twice); a missing folder, or a sweep beside rates_from, is one line."""
    study = load_study(DEMO)
    assert not study.lr_sweep and study.rates_from == ["docs/study_sizes/data"]
    chosen = {(r["size"], r["attention"]): r["scale"] for r in study.adopted if r["chosen"]}
    assert {size for size, _ in chosen} == {"demo-w16", "demo-w64"}  # swept at the smallest and the largest
    lrs = {(j.size, j.attention): j.argv for j in jobs_of(study, tmp_path, PATHS, 0) if j.after is None}
    for (size, attention), argv in lrs.items():
        ends = [chosen[s, attention] for s in ("demo-w16", "demo-w64")]
        own = chosen.get((size, attention), ends[0] if size == "demo-w32" else None)  # w32: the nearer (first) end
        assert f"optim.lr={study.sizes[size]['optim.lr'] * own}" in argv, (size, attention)
    again = load_study(DEMO, rates_from=[REPO / "docs" / "study_sizes" / "data"])
    assert again.per_attention == study.per_attention and again.lr_by_size == study.lr_by_size
    section = sweep_table(study.adopted, {})
    assert section.startswith("## Learning rate per attention\n\nThe rates come from the sweep of `docs/study_sizes/")
    raw = yaml.safe_load(DEMO.read_text())
    (tmp_path / "gone.yaml").write_text(yaml.safe_dump({**raw, "rates_from": ["docs/no_such_study/data"]}))
    with pytest.raises(StudyError, match=r"rates_from: .*no_such_study/data is not a folder; give a finished study"):
        load_study(tmp_path / "gone.yaml")


def rates(study, tmp_path) -> dict[tuple[str, str], float]:
    return {
        (j.size, j.attention): float(next(a for a in j.argv if a.startswith("optim.lr=")).split("=")[1])
        for j in jobs_of(study, tmp_path, PATHS, 0)
        if j.after is None
    }


def test_a_sweep_beside_rates_from_sweeps_around_the_rates_it_adopts(tmp_path):
    """lr_sweep with rates_from (e.g. again at a longer budget): each multiple is of the adopted rate at its size; the
    choice multiplies it (per size where it does not transfer); a study adopting that sweep gets the same rates."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["lr_sweep"] = {"size": ["demo-w16", "demo-w64"], "scales": [0.5, 1.0, 2.0]}
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(raw))
    adopted, study = rates(load_study(DEMO), tmp_path), load_study(tmp_path / "both.yaml")
    assert study.lr_sweep and study.adopted
    swept = {(j.size, j.attention, s): j for s, j in sweep_jobs(study, tmp_path, PATHS, 0)}
    for (size, attention, scale), job in swept.items():
        assert f"optim.lr={adopted[size, attention] * scale}" in job.argv
    choices = {(s, a): 1.0 for s in ("demo-w16", "demo-w64") for a in study.attentions}
    choices |= {("demo-w16", "softmax"): 0.5, ("demo-w64", "softmax"): 0.5, ("demo-w64", "linear_affine"): 0.25}
    swept_rows = [{**r, "around": ["docs/study_sizes/data"]} for r in rows(choices)]
    apply(study, swept_rows)
    expect = {(s, a): lr * (0.5 if a == "softmax" else 1.0) for (s, a), lr in adopted.items()}
    expect["demo-w64", "linear_affine"] = adopted["demo-w64", "linear_affine"] * 0.25  # demo-w32: demo-w16's 1x
    assert rates(study, tmp_path) == pytest.approx(expect)
    (tmp_path / "lr_sweep.json").write_text(json.dumps(swept_rows))
    plain = yaml.safe_load(DEMO.read_text())
    plain.pop("rates_from")
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(plain))
    assert rates(load_study(tmp_path / "plain.yaml", rates_from=[tmp_path]), tmp_path) == pytest.approx(expect)
    text = sweep_table(swept_rows, study.lr_sweep)
    assert "x its learning rate (the rate the sweep of `docs/study_sizes/data` chose at that size" in text


def test_the_long_sizes_study_runs_the_four_sizes_at_four_times_the_budget_with_their_swept_rates(tmp_path):
    """configs/study/sizes_long.yaml (claim (c) nearer convergence): the paper's pair at the 4-size study's sizes, 4x
    its steps on 4x its data (each sample seen as often), a cooled-down budget at exactly the 4-size study's, and
    the rates its own sweep at that budget chose (docs/study_sizes_long_sweep: all four sizes, around the 4-size
    study's choices), except at the two ends, where the rates chosen over five seeds around seed 0's choice
    (docs/study_sizes_long_rates.md) decide."""
    short, long = (
        load_study(REPO / "configs" / "study" / "sizes.yaml"),
        load_study(REPO / "configs" / "study" / "sizes_long.yaml"),
    )
    assert list(long.sizes) == list(short.sizes) and long.attentions == ["softmax", "linear_affine_nodenom"]
    steps = long.run["train.max_steps"]
    assert steps == 4 * short.run["train.max_steps"] and 0.25 * steps == 1600 and 0.25 in long.budgets["fractions"]
    assert len(long.budgets["fractions"]) + 1 >= 5  # five cooled-down budget ends per run (issue 45 item 5)
    assert long.data["train_samples"] == 4 * short.data["train_samples"]
    assert not long.lr_sweep
    sweep = load_study(REPO / "configs" / "study" / "sizes_long_sweep.yaml")
    # the sweep's runs are the study's (budgets only add branches; which checkpoints a run keeps is not its config)
    assert sweep.run == long.run and sweep.data == long.data
    assert sweep.budgets["cooldown"] == long.budgets["cooldown"] and set(sweep.budgets["fractions"]) <= set(
        long.budgets["fractions"]
    )
    chosen = swept_choices("study_sizes_long_sweep")  # every choice inside its sweep (the page's claim)
    assert sweep.lr_sweep["size"] == list(long.sizes)
    over_seeds = chosen_over_seeds("study_sizes_long_rates")
    assert {size for size, _ in over_seeds} == {"demo-w16", "demo-w64"}
    assert any(over_seeds[key] != chosen[key] for key in over_seeds)  # the page moved a rate: the config follows it
    lr = rates(long, tmp_path)
    assert set(chosen) == set(lr)
    for key, rate in (chosen | over_seeds).items():
        assert lr[key] == pytest.approx(rate), key


def swept_choices(page: str) -> dict[tuple[str, str], float]:
    """(size, attention) -> the rate a published sweep page chose, each choice inside its sweep (not at an edge)."""
    swept = json.loads((REPO / "docs" / page / "data" / "page.json").read_text())["sweep"]
    chosen = {(r["size"], r["attention"]): r for r in swept if r["chosen"]}
    for (size, attention), row in chosen.items():
        scales = sorted(r["scale"] for r in swept if (r["size"], r["attention"]) == (size, attention))
        assert scales[0] < row["scale"] < scales[-1], (page, size, attention, row["scale"], scales)
    return {key: row["lr"] for key, row in chosen.items()}


def chosen_over_seeds(page: str) -> dict[tuple[str, str], float]:
    """(size, attention) -> the rate a published rates-over-seeds page chose (eval/rate_seeds.py), each inside the
    rates tried, over at least 5 seeds."""
    found = json.loads((REPO / "docs" / f"{page}.json").read_text())["meta"]["groups"]
    for g in found:
        assert not g["edge"] and len(g["seeds"]) >= 5 and not g["left_out"], (page, g["size"], g["attention"])
    return {(g["size"], g["attention"]): g["chosen"] for g in found}


def layers_of(size: str) -> int:
    cfg = json.loads((REPO / "configs" / "models" / f"{size}.json").read_text())
    assert cfg["vision_cfg"]["layers"] == cfg["text_cfg"]["layers"]
    return cfg["vision_cfg"]["layers"]


def test_the_one_depth_ladder_trains_every_size_at_two_layers_at_the_rate_swept_at_its_width_and_depth(tmp_path):
    """configs/study/depth2.yaml: four widths at two layers per tower, spanning over 10x in parameters, on sizes_long's
    data, steps and budgets (so a sizes_long seed's folder resumed keeps its demo-w32 and demo-w48 runs), each size at
    the rate chosen for it over five seeds around its seed-0 sweep's choice (sizes_long's at demo-w32 and demo-w48,
    depth2_sweep's at the two new sizes: docs/study_depth2_rates.md)."""
    long = load_study(REPO / "configs" / "study" / "sizes_long.yaml")
    ladder = load_study(REPO / "configs" / "study" / "depth2.yaml")
    sweep = load_study(REPO / "configs" / "study" / "depth2_sweep.yaml")
    assert ladder.budgets == long.budgets
    for other in (long, sweep):  # the sweep's runs are the study's: budgets only add branches
        assert (ladder.data, ladder.run, ladder.attentions) == (other.data, other.run, other.attentions)
        assert other.budgets["cooldown"] == ladder.budgets["cooldown"]
    assert {layers_of(size) for size in ladder.sizes} == {2} and set(sweep.lr_sweep["size"]) <= set(ladder.sizes)
    chosen = chosen_over_seeds("study_depth2_rates")  # every size: seed 0's sweep choice and its neighbours
    assert set(chosen) == {(s, a) for s in ladder.sizes for a in ladder.attentions}
    lr_long, lr = rates(long, tmp_path), rates(ladder, tmp_path)
    assert set(lr) == {(s, a) for s in ladder.sizes for a in ladder.attentions}
    for key, rate in lr.items():
        assert rate == pytest.approx(chosen[key]), key
        if key[0] in long.sizes:
            assert rate == lr_long[key]  # exactly: the resumed folder's runs are kept


def test_the_depth_study_puts_three_widths_at_two_and_three_layers_at_their_swept_rates(tmp_path):
    """configs/study/depth.yaml: demo-w16, demo-w48 and demo-w64 each at two and three layers per tower, the sizes
    sizes_long and depth2 train at their rates (so their seed folders resumed keep those runs); demo-w48-l3, swept
    nowhere, at its width's rate. Each pair's model configs differ in the layers alone."""
    depth = load_study(REPO / "configs" / "study" / "depth.yaml")
    long, ladder = (load_study(REPO / "configs" / "study" / f"{n}.yaml") for n in ("sizes_long", "depth2"))
    assert (depth.data, depth.run, depth.budgets, depth.attentions) == (
        long.data,
        long.run,
        long.budgets,
        long.attentions,
    )
    trained = rates(long, tmp_path) | rates(ladder, tmp_path)
    lr = rates(depth, tmp_path)
    for size, attention in lr:
        source = ("demo-w48", attention) if size == "demo-w48-l3" else (size, attention)
        assert lr[size, attention] == trained[source], (size, attention)
    for width in ("demo-w16", "demo-w48", "demo-w64"):
        two, three = (s for s in depth.sizes if s.startswith(width + "-") or s == width)
        own, other = (json.loads((REPO / "configs" / "models" / f"{n}.json").read_text()) for n in (two, three))
        assert {layers_of(two), layers_of(three)} == {2, 3}
        for tower in ("vision_cfg", "text_cfg"):
            own[tower].pop("layers"), other[tower].pop("layers")
        assert own == other


def test_lr_by_size_in_a_config_sets_a_rate_per_size_and_attention_and_is_checked_at_load(tmp_path):
    """lr_by_size: {size: {attention: multiple}} of the size's optim.lr (rates chosen by sweeps a study cannot adopt
    through rates_from, e.g. sweeps at two depths); a name the study does not train or a multiple <= 0 is one line."""
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("rates_from")
    raw["sizes"] = {"demo-w16": {"optim.lr": 4.0e-3}, "demo-w64": {"optim.lr": 2.0e-3}}
    raw["lr_by_size"] = {"demo-w64": {"linear_affine_nodenom": 0.5}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    lr = rates(load_study(tmp_path / "study.yaml"), tmp_path)
    assert lr["demo-w64", "linear_affine_nodenom"] == pytest.approx(1.0e-3)
    assert lr["demo-w64", "softmax"] == pytest.approx(2.0e-3) and lr["demo-w16", "linear_affine_nodenom"] == 4.0e-3
    for bad, message in (
        ({"demo-w99": {"softmax": 2}}, "lr_by_size: unknown size 'demo-w99'; the study's sizes: demo-w16, demo-w64"),
        ({"demo-w16": {"elu": 2}}, "lr_by_size.demo-w16: unknown attention 'elu'; the study's: softmax"),
        ({"demo-w16": {"softmax": 0}}, "lr_by_size.demo-w16.softmax: 0 is not a multiple > 0"),
    ):
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**raw, "lr_by_size": bad}))
        with pytest.raises(StudyError, match=message):
            load_study(tmp_path / "bad.yaml")


def test_lr_by_size_follows_the_image_size_and_optimizer_axes(tmp_path):
    """image_sizes names the sizes SIZE@RESpx and optimizers the attentions ATTENTION@OPTIMIZER: a multiple given for
    the size and attention applies to each of them."""
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("rates_from")
    raw["sizes"] = {"demo-w32": {"optim.lr": 2.0e-3}}
    raw |= {"image_sizes": [32, 64], "optimizers": ["adamw", "lion"]}
    raw["lr_by_size"] = {"demo-w32": {"softmax": 0.5}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    lr = rates(load_study(tmp_path / "study.yaml"), tmp_path)
    for res in ("32px", "64px"):
        for optimizer in ("adamw", "lion"):
            assert lr[f"demo-w32@{res}", f"softmax@{optimizer}"] == pytest.approx(1.0e-3)
            assert lr[f"demo-w32@{res}", f"linear_affine@{optimizer}"] == pytest.approx(2.0e-3)


def test_the_sweep_section_names_a_run_trained_at_another_rate_than_the_sweep_chose():
    """A study that adopts a sweep's rates and moves some with lr_by_size (sizes_long: two rates chosen over seeds)
    says so under the sweep's table, which marks the sweep's own choices."""
    swept = [{**r, "size": r["size"], "lr": 1e-3 * r["scale"]} for r in rows({("demo-w64", "softmax"): 0.5})]
    runs = [{"size": "demo-w64", "attention": "softmax", "lr": 2.5e-4}]
    text = sweep_table(swept, {"size": ["demo-w64"]}, runs)
    assert "Trained at another rate than the sweep chose" in text
    assert "softmax at demo-w64 0.00025 (the sweep chose 0.0005)" in text
    runs[0]["lr"] = 5e-4
    assert "another rate" not in sweep_table(swept, {"size": ["demo-w64"]}, runs)


def test_the_flatness_study_trains_depth2s_smallest_size_at_its_rates_for_8x_the_budget(tmp_path):
    """configs/study/depth2_flat.yaml: depth2's smallest size on depth2's data at depth2's rates, 8x its steps,
    with a cooled-down budget at depth2's own schedule (so its 1/8 budget repeats depth2's run) and at each doubling."""
    flat, ladder = (load_study(REPO / "configs" / "study" / f"{n}.yaml") for n in ("depth2_flat", "depth2"))
    assert (flat.data, flat.attentions) == (ladder.data, ladder.attentions)
    assert list(flat.sizes) == list(ladder.sizes)[:1]
    steps = ladder.run["train.max_steps"]
    assert flat.run == {**ladder.run, "train.max_steps": 8 * steps, "eval.every": steps // 2}
    lr, lr_ladder = rates(flat, tmp_path), rates(ladder, tmp_path)
    assert lr == {key: rate for key, rate in lr_ladder.items() if key[0] in flat.sizes}
    budgets = budget_steps(flat, 8 * steps)
    assert budget_steps(ladder, steps)[-1] in budgets
    ends = [t for t, _ in budgets]
    assert ends == [steps // 2 * 2**k for k in range(4)] + [6 * steps, 8 * steps]


def test_a_diverged_run_first_in_the_sweep_does_not_hide_the_others(tmp_path, monkeypatch):
    """The smallest multiple's run ended with a NaN validation loss: the choice is among the finite ones (min()
    over a list starting with NaN returned the NaN and raised 'every run diverged')."""
    import pandas as pd

    from train import lr_sweep

    study = study_swept_at(tmp_path, "demo-w32")
    losses = {"a": math.nan, "b": 0.9, "c": 1.1}
    monkeypatch.setattr(
        lr_sweep,
        "load_points",
        lambda dirs, y, points: pd.DataFrame({"val_loss": [losses[dirs[0].name]], "zeroshot/top1": [0.5]}),
    )
    pairs = [
        (scale, SimpleNamespace(run_dir=tmp_path / name, argv=[f"optim.lr={scale}"], size="demo-w32"))
        for scale, name in ((0.25, "a"), (0.5, "b"), (1.0, "c"))
    ]
    for _, job in pairs:
        job.attention = "softmax"
    chosen = [r for r in lr_sweep.choose(study, pairs) if r["chosen"]]
    assert [(r["scale"], r["val_loss"]) for r in chosen] == [(0.5, 0.9)]
