import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from eval.scaling import ScalingInputError, ScalingWarning, fit, load_points, main, plot
from eval.scaling_fit import fit_procedure, frontier
from eval.scaling_io import evaluate

N_BOOT = 200


def synthetic(alpha, beta, c=0.0, noise=0.03, n=16, seed=0, lo=1e6, hi=1e9, **columns):
    """Points y = beta x^alpha + c with multiplicative log-normal noise (fixed seed)."""
    rng = np.random.default_rng(seed)
    x = np.geomspace(lo, hi, n)
    y = (beta * x**alpha + c) * np.exp(rng.normal(0.0, noise, n))
    return pd.DataFrame({"params": x, "loss": y, **columns})


def test_power_fit_recovers_alpha_beta_with_covering_intervals():
    covered_alpha = covered_beta = 0
    for seed in range(20):
        g = fit(synthetic(-0.36, 40.0, seed=seed), "params", "loss", n_boot=N_BOOT, seed=seed)["groups"]["all"]
        assert g["alpha"] == pytest.approx(-0.36, abs=0.015)
        assert g["beta"] == pytest.approx(40.0, rel=0.25)
        # Informative, not merely wide: 3% noise on 16 points over three decades.
        assert g["alpha_ci"][1] - g["alpha_ci"][0] < 0.03
        covered_alpha += g["alpha_ci"][0] < -0.36 < g["alpha_ci"][1]
        covered_beta += g["beta_ci"][0] < 40.0 < g["beta_ci"][1]
    # A 95% percentile interval on 16 points covers ~88% of the time (measured over 100 data sets).
    assert covered_alpha >= 15 and covered_beta >= 15
    assert g["n_points"] == 16 and "c" not in g


def test_same_seed_same_report_and_extrapolation_interval():
    df = synthetic(-0.36, 40.0)
    a = fit(df, "params", "loss", n_boot=N_BOOT, seed=3, extrapolate=[1e10])
    b = fit(df, "params", "loss", n_boot=N_BOOT, seed=3, extrapolate=[1e10])
    assert a == b
    (e,) = a["groups"]["all"]["extrapolation"]
    assert e["y"] == pytest.approx(40.0 * 1e10**-0.36, rel=0.1)
    assert e["y_ci"][0] < e["y"] < e["y_ci"][1]


def _two_groups(alpha_b):
    first = synthetic(-0.36, 40.0, seed=1, attention="softmax")
    second = synthetic(alpha_b, 40.0, seed=2, attention="linear")
    return pd.concat([first, second], ignore_index=True)


def test_different_exponents_differ():
    report = fit(_two_groups(-0.25), "params", "loss", group="attention", n_boot=N_BOOT)
    (comparison,) = report["comparisons"]
    assert (comparison["a"], comparison["b"]) == ("linear", "softmax")
    assert comparison["alpha_diff"] == pytest.approx(0.11, abs=0.02)
    assert comparison["verdict"] == "differ"
    assert comparison["alpha_diff_ci"][0] > 0


def test_same_exponents_not_distinguishable():
    report = fit(_two_groups(-0.36), "params", "loss", group="attention", n_boot=N_BOOT)
    (comparison,) = report["comparisons"]
    assert comparison["verdict"] == "not distinguishable at 95%"
    lo, hi = comparison["alpha_diff_ci"]
    assert lo < 0 < hi
    assert "not distinguishable" in comparison["summary"]


def test_reference_compares_first_against_others():
    df = pd.concat([_two_groups(-0.25), synthetic(-0.36, 40.0, seed=5, attention="mamba")], ignore_index=True)
    report = fit(df, "params", "loss", group="attention", n_boot=N_BOOT, reference="softmax")
    assert [(c["a"], c["b"]) for c in report["comparisons"]] == [("linear", "softmax"), ("mamba", "softmax")]
    assert len(fit(df, "params", "loss", group="attention", n_boot=N_BOOT)["comparisons"]) == 3


def test_frontier_hand_computed():
    # log10 x spans [0, log10 200 = 2.301]; 2 bins split at 1.151: {1, 2, 10} and {20, 100, 200}.
    x = np.array([1.0, 2.0, 10.0, 20.0, 100.0, 200.0])
    y = np.array([5.0, 3.0, 1.0, 0.5, 0.1, 0.2])
    fx, fy = frontier(x, y, bins=2)
    assert fx.tolist() == [10.0, 100.0] and fy.tolist() == [1.0, 0.1]
    # The line through (10, 1) and (100, 0.1): y = 10 x^-1.
    (alpha, beta, c), _, _ = fit_procedure(x, y, "power", frontier_bins=2)
    assert alpha == pytest.approx(-1.0) and beta == pytest.approx(10.0) and c == 0.0
    with pytest.warns(ScalingWarning, match="intervals are not informative"):
        report = fit(pd.DataFrame({"gmacs": x, "err": y}), "gmacs", "err", frontier_bins=2, n_boot=N_BOOT)
    assert report["groups"]["all"]["frontier"] == [[10.0, 1.0], [100.0, 0.1]]
    assert report["groups"]["all"]["alpha"] == pytest.approx(-1.0)


def test_saturating_recovers_c():
    df = synthetic(-0.4, 30.0, c=1.5, noise=0.01, n=24, lo=1e3, hi=1e9)
    g = fit(df, "params", "loss", form="saturating", n_boot=N_BOOT)["groups"]["all"]
    assert g["c"] == pytest.approx(1.5, rel=0.05)
    assert g["c_ci"][0] < 1.5 < g["c_ci"][1]
    assert g["alpha"] == pytest.approx(-0.4, abs=0.05)
    assert g["alpha_ci"][0] < -0.4 < g["alpha_ci"][1]
    # A pure power law cannot bend towards the floor: it fits a much shallower exponent.
    assert fit(df, "params", "loss", n_boot=N_BOOT)["groups"]["all"]["alpha"] > -0.3


def test_degenerate_resamples_are_redrawn():
    # Three points, three parameters: most resamples repeat an x and must be redrawn.
    df = synthetic(-0.4, 30.0, c=1.5, n=3, lo=1e3, hi=1e9)
    with pytest.warns(ScalingWarning, match="not informative"):
        g = fit(df, "params", "loss", form="saturating", n_boot=N_BOOT)["groups"]["all"]
    assert g["bootstrap_redraws"] > 0 and np.isfinite(g["alpha_ci"]).all()


def test_derived_columns_compute_and_error():
    df = pd.DataFrame(
        {"gmacs_per_sample": [2.0, 2.0, 4.0], "samples_seen": [10.0, 100.0, 1000.0], "top1": [50.0, 60.0, 90.0]}
    )
    report = fit(df, "compute", "error", n_boot=N_BOOT)
    same = fit(df.assign(top1=df.top1 / 100), "gmacs_per_sample*samples_seen", "1-top1", n_boot=N_BOOT)
    assert report["groups"]["all"]["alpha"] == pytest.approx(same["groups"]["all"]["alpha"])
    # Points (20, 0.5), (200, 0.4), (4000, 0.1).
    expected = np.polyfit(np.log([20, 200, 4000]), np.log([0.5, 0.4, 0.1]), 1)[0]
    assert report["groups"]["all"]["alpha"] == pytest.approx(expected)
    # One vocabulary (models.summary): the per-sample cost is gmacs_per_sample, and nothing else stands in for it.
    with pytest.raises(ScalingInputError, match=r"column 'gmacs_per_sample' \(in 'compute = "):
        fit(df.rename(columns={"gmacs_per_sample": "gmacs"}), "compute", "error", n_boot=N_BOOT)


def test_numeric_groups_in_natural_order():
    df = pd.concat([synthetic(-0.3, 40.0, width=128), synthetic(-0.3, 40.0, seed=1, width=64)], ignore_index=True)
    report = fit(df, "params", "loss", group="width", n_boot=N_BOOT)
    assert list(report["groups"]) == ["64", "128"]
    assert [(c["a"], c["b"]) for c in report["comparisons"]] == [("64", "128")]


BAD_INPUTS = [
    ("too few points", pd.DataFrame({"params": [1e6], "loss": [2.0]}), {}, "needs at least 2"),
    (
        "saturating needs 3",
        pd.DataFrame({"params": [1e6, 1e7], "loss": [2.0, 1.0]}),
        {"form": "saturating"},
        "at least 3",
    ),
    (
        "non-positive",
        pd.DataFrame({"params": [1e6, 1e7, 1e8], "loss": [2.0, 0.0, -1.0]}),
        {},
        "2 of 3 values of y 'loss' are <= 0",
    ),
    (
        "missing column",
        pd.DataFrame({"params": [1e6, 1e7], "loss_val": [2.0, 1.0]}),
        {},
        "column 'loss' not found; available columns: params, loss_val",
    ),
    (
        "NaNs leave too few",
        pd.DataFrame({"params": [1e6, 1e7, np.nan], "loss": [2.0, np.nan, 1.0]}),
        {},
        "needs at least 2",
    ),
    ("text column", pd.DataFrame({"params": ["ViT-B", "ViT-L"], "loss": [2.0, 1.0]}), {}, "'params' is not numeric"),
    (
        "frontier too coarse",
        pd.DataFrame({"params": [1e6, 2e6, 1e9], "loss": [2.0, 1.5, 1.0]}),
        {"frontier_bins": 1},
        "frontier",
    ),
]


@pytest.mark.parametrize("case, df, kwargs, message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_error_and_writes_nothing(tmp_path, capsys, case, df, kwargs, message):
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ScalingInputError, match=re.escape(message)):
        warnings.simplefilter("always", ScalingWarning)
        fit(df, "params", "loss", n_boot=N_BOOT, **kwargs)
    assert [str(w.message) for w in caught] == (
        ["dropped 2 of 3 rows with missing or non-finite values (1 in 'params', 1 in 'loss')"] if "NaN" in case else []
    )
    df.to_csv(tmp_path / "runs.csv", index=False)
    flags = {"form": "--form", "frontier_bins": "--frontier-bins"}
    extra = [str(a) for k, v in kwargs.items() for a in (flags[k], v)]
    out = tmp_path / "out"
    assert (
        main([str(tmp_path / "runs.csv"), "--x", "params", "--y", "loss", "--n-boot", "50", "--out", str(out), *extra])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert len(err) == 1 + len(caught) and all(line.startswith("warning: dropped") for line in err[:-1])
    assert not out.exists()


def test_nan_rows_dropped_with_warning():
    df = synthetic(-0.36, 40.0)
    df.loc[[2, 5], "loss"] = np.nan
    with pytest.warns(ScalingWarning, match=r"dropped 2 of 16 rows .*2 in 'loss'"):
        report = fit(df, "params", "loss", n_boot=N_BOOT)
    assert report["groups"]["all"]["n_points"] == 14


def test_nonpositive_x_names_group_and_column():
    df = synthetic(-0.36, 40.0, attention="linear")
    df.loc[0, "params"] = 0.0
    with pytest.raises(ScalingInputError, match=r"group 'linear': 1 of 16 values of x 'params' are <= 0"):
        fit(df, "params", "loss", group="attention", n_boot=N_BOOT)


def test_read_json_files(tmp_path):
    for i, (attention, params) in enumerate([("softmax", 1e6), ("linear", 2e6)]):
        result = {
            "top1": 0.3 + i / 10,
            "params": params,
            "model": "ViT-S",
            "image_attention": attention,
            "extra": {"k": i},
        }
        (tmp_path / f"r{i}.json").write_text(json.dumps(result))
    df = load_points(sorted(tmp_path.glob("*.json")))
    assert df["image_attention"].tolist() == ["softmax", "linear"]
    assert df["params"].tolist() == [1e6, 2e6] and df["extra.k"].tolist() == [0, 1]
    assert df["@source"].tolist() == [str(tmp_path / "r0.json"), str(tmp_path / "r1.json")]


def write_run(run, lines, config=None, evals=None):
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if config is not None:
        (run / "config.yaml").write_text(config)
    for name, result in (evals or {}).items():
        (run / name).parent.mkdir(exist_ok=True)
        (run / name).write_text(json.dumps(result))


def test_read_run_directory(tmp_path):
    lines = [
        {"step": 10, "samples_seen": 640, "loss": 3.0},
        {"step": 10, "samples_seen": 640, "zeroshot/top1": 0.05, "val_loss": 2.0},
        {"step": 20, "samples_seen": 1280, "loss": 2.5},
        {"step": 20, "samples_seen": 1280, "zeroshot/top1": 0.2, "val_loss": 1.5},
    ]
    evals = {
        "eval/step10.json": {"step": 10, "samples_seen": 640, "top1": 0.1, "params": 5e6},
        "zeroshot.json": {"step": 15, "samples_seen": 960, "top1": 0.15},
    }
    config = "model:\n  image_attention: linear_elu\n  width: 64\noptim:\n  schedule: cosine\ntrain:\n  max_steps: 20\n"
    write_run(tmp_path / "runs" / "a", lines, config, evals)
    (tmp_path / "runs" / "a" / "summary.json").write_text(json.dumps({"params": 4e6, "gmacs_per_sample": 0.5}))
    # Every evaluation is a point: the two zero-shot lines of metrics.jsonl and the two eval JSONs, in record order.
    df = load_points([tmp_path / "runs"], y="error", points="all")
    assert df["step"].tolist() == [10, 20, 10, 15]
    assert evaluate(df, "error") == pytest.approx([0.95, 0.8, 0.9, 0.85])
    assert evaluate(df, "compute") == pytest.approx([320, 640, 320, 480])  # summary.json's GMACs x samples seen
    # The run's config and summary go with every point; a record's own values win (params of eval/step10.json).
    assert set(df["model.image_attention"]) == {"linear_elu"} and df["params"].tolist() == [4e6, 4e6, 5e6, 4e6]
    assert set(df["@source"]) == {str(tmp_path / "runs" / "a")}
    # The training loss is read from the per-step lines; val_loss from the evaluation lines.
    assert load_points([tmp_path / "runs"], y="loss", points="all")["loss"].tolist() == [3.0, 2.5]
    (row,) = load_points([tmp_path / "runs" / "a" / "metrics.jsonl"], y="val_loss", points="last").to_dict("records")
    assert (row["val_loss"], row["step"]) == (1.5, 20)
    # cooldown: the final evaluation of a finished run with a decaying schedule; none of a constant one.
    (row,) = load_points([tmp_path / "runs"], y="error", points="cooldown").to_dict("records")
    assert (row["zeroshot/top1"], row["step"]) == (0.2, 20)
    config = config.replace("cosine", "constant")
    write_run(tmp_path / "const" / "b", lines, config)
    with pytest.raises(ScalingInputError, match="no annealed points"):
        load_points([tmp_path / "const"], y="error", points="cooldown")


def test_csv_keeps_its_own_source_column(tmp_path, capsys):
    df = pd.concat([synthetic(-0.3, 40.0, source="lab-a"), synthetic(-0.5, 40.0, seed=1, source="lab-b")])
    df.to_csv(tmp_path / "runs.csv", index=False)
    points = load_points([tmp_path / "runs.csv"])
    assert points["source"].tolist() == df["source"].tolist()
    assert set(points["@source"]) == {str(tmp_path / "runs.csv")}
    args = [str(tmp_path / "runs.csv"), "--x", "params", "--y", "loss", "--group", "source", "--n-boot", "50"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["groups"]["lab-a"]["alpha"] == pytest.approx(-0.3, abs=0.02)
    assert report["groups"]["lab-b"]["alpha"] == pytest.approx(-0.5, abs=0.02)


def test_read_csv_and_mixed_inputs(tmp_path):
    pd.DataFrame({"model": ["a", "b"], "gmacs_total": [1e3, 1e4], "top1": [0.2, 0.4]}).to_csv(
        tmp_path / "r.csv", index=False
    )
    (tmp_path / "c.json").write_text(json.dumps({"model": "c", "gmacs_total": 1e5, "top1": 0.5}))
    df = load_points([tmp_path / "r.csv", tmp_path / "c.json"])
    assert df["model"].tolist() == ["a", "b", "c"] and df["gmacs_total"].tolist() == [1e3, 1e4, 1e5]
    with pytest.raises(ScalingInputError, match="does not exist"):
        load_points([tmp_path / "nope.csv"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ScalingInputError, match=r"no metrics.jsonl"):
        load_points([tmp_path / "empty"])


def test_main_end_to_end_run_directories(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for attention, alpha in [("softmax", -0.36), ("linear", -0.33)]:
        for i, samples in enumerate(np.geomspace(1e5, 1e8, 8)):
            lines = [
                {"step": 1, "samples_seen": 1.0, "loss": 9.0},
                {"step": 2, "samples_seen": samples, "loss": 30 * samples**alpha * np.exp(rng.normal(0, 0.02))},
            ]
            write_run(tmp_path / "runs" / f"{attention}{i}", lines, f"model:\n  image_attention: {attention}\n")
    out = tmp_path / "out"
    argv = [
        str(tmp_path / "runs"),
        "--x",
        "samples_seen",
        "--y",
        "loss",
        "--group",
        "model.image_attention",
        "--n-boot",
        str(N_BOOT),
        "--extrapolate",
        "1e9",
        "--reference",
        "softmax",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "softmax" in printed and "alpha(linear) - alpha(softmax)" in printed and "x = 1e+09" in printed
    report = json.loads((out / "report.json").read_text())
    assert set(report["groups"]) == {"linear", "softmax"}
    assert report["groups"]["softmax"]["alpha"] == pytest.approx(-0.36, abs=0.02)
    assert report["groups"]["softmax"]["n_points"] == 8
    assert len(report["groups"]["linear"]["extrapolation"]) == 1
    with Image.open(out / "scaling.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 300
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "scaling.png"]


def test_plot_api_writes_png(tmp_path):
    df = _two_groups(-0.3)
    report = fit(df, "params", "loss", group="attention", form="saturating", n_boot=50, extrapolate=[1e10])
    plot(report, df, tmp_path / "fig.png")
    with Image.open(tmp_path / "fig.png") as image:
        assert image.format == "PNG"
