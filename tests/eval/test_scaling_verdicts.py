"""Issue 49: no verdict where a group's points give no interval; a floor at its bound and a degenerate prediction
interval said in words; the extrapolated figure keeps a panel of the data range."""

import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from eval.scaling import fit, format_table, main, points_of
from eval.scaling_fit import floor_at_bound
from eval.scaling_plot import axis_label, build_figure

N_BOOT = 200


def budgets(alpha, attention, xs, per_x=1, noise=0.02, seed=0):
    """per_x points at each x of xs on y = 40 x^alpha, with multiplicative noise (fixed seed)."""
    rng = np.random.default_rng(seed)
    x = np.repeat(np.asarray(xs, dtype=float), per_x)
    y = 40.0 * x**alpha * np.exp(rng.normal(0.0, noise, len(x)))
    return pd.DataFrame({"compute": x, "loss": y, "attention": attention})


def run_main(df, tmp_path, capsys, *extra):
    df.to_csv(tmp_path / "runs.csv", index=False)
    out = tmp_path / "out"
    argv = [str(tmp_path / "runs.csv"), "--x", "compute", "--y", "loss", "--group", "attention"]
    assert main([*argv, "--n-boot", str(N_BOOT), "--reference", "softmax", *extra, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    return printed.out, printed.err, json.loads((out / "report.json").read_text())


def test_two_budgets_per_group_give_undetermined_everywhere(tmp_path, capsys):
    # The case: two budgets per attention; softmax with three seeds at each (a bootstrap spread), the
    # linear one with one run at each (an exact fit: every bootstrap fit is the same line).
    df = pd.concat(
        [budgets(-0.36, "softmax", [1e8, 1e9], per_x=3), budgets(-0.25, "linear", [1e8, 1e9], seed=1)],
        ignore_index=True,
    )
    out, err, report = run_main(df, tmp_path, capsys, "--extrapolate", "1e12")
    reason = {
        g: f"group '{g}' has only 2 distinct x for a 2-parameter power form: no interval" for g in report["groups"]
    }
    assert "group 'linear' has only 2 distinct x for a 2-parameter power form; its intervals are not informative" in err
    (line,) = [line for line in out.splitlines() if line.startswith("alpha(")]
    assert line.startswith("alpha(linear) - alpha(softmax) = +0.1")
    assert line.endswith(f": undetermined ({reason['linear']}; {reason['softmax']})")
    assert "differ" not in out and "95% CI" not in line
    (comparison,) = report["comparisons"]
    assert comparison["verdict"] == "undetermined" and comparison["summary"] == line
    assert comparison["reason"] == f"{reason['linear']}; {reason['softmax']}"
    for name, g in report["groups"].items():
        assert g["no_interval"] == reason[name] and reason[name] in out.splitlines()
        (e,) = g["extrapolation"]
        assert e["no_interval"] == reason[name]
        assert f"{name}: predicted y at x = 1e+12: {e['y']:.4g}, interval undetermined ({reason[name]})" in out
        assert f"{g['alpha']:.4g} [no interval]" in out


def test_well_posed_groups_still_give_a_verdict(tmp_path, capsys):
    xs = np.geomspace(1e6, 1e9, 6)
    df = pd.concat([budgets(-0.36, "softmax", xs), budgets(-0.25, "linear", xs, seed=1)], ignore_index=True)
    out, err, report = run_main(df, tmp_path, capsys, "--extrapolate", "1e12")
    (comparison,) = report["comparisons"]
    assert comparison["verdict"] == "differ" and comparison["reason"] is None
    assert comparison["summary"].endswith(": the exponents differ (the interval excludes 0)")
    assert comparison["alpha_diff_ci"][0] > 0.05 and comparison["summary"] in out
    assert "undetermined" not in out and "no interval" not in out and err == ""
    for name, g in report["groups"].items():
        (e,) = g["extrapolation"]
        assert g["no_interval"] is None and e["no_interval"] is None and e["y_ci"][0] < e["y"] < e["y_ci"][1]
        assert f"{name}: predicted y at x = 1e+12: {e['y']:.4g} [{e['y_ci'][0]:.4g}, {e['y_ci'][1]:.4g}]" in out


def test_zero_width_prediction_is_not_an_interval():
    # Points exactly on a power law: every bootstrap fit is the same line, so the interval has no width.
    report = fit(
        budgets(-0.3, "all", np.geomspace(1e6, 1e9, 6), noise=0.0), "compute", "loss", n_boot=50, extrapolate=[1e12]
    )
    (e,) = report["groups"]["all"]["extrapolation"]
    assert e["no_interval"] == "every bootstrap fit predicts the same value: a zero-width interval"
    assert f"all: predicted y at x = 1e+12: {e['y']:.4g}, interval undetermined ({e['no_interval']})" in format_table(
        report
    )


def test_floor_at_its_bound_is_said():
    # A pure power law has no floor: the saturating fit leaves c at its lower bound (scipy's start, 1e-10).
    df = budgets(-0.3, "all", np.geomspace(1e6, 1e9, 8), noise=0.0)
    report = fit(df, "compute", "loss", form="saturating", n_boot=50)
    g = report["groups"]["all"]
    assert g["c"] <= 1e-9 and g["c_at_bound"] == "lower"
    assert f"all: c = {g['c']:.3g}: the floor is at its bound: the data do not show a floor" in format_table(report)
    # A real floor is not at a bound, and says nothing.
    x = np.geomspace(1e3, 1e9, 24)
    floored = fit(
        pd.DataFrame({"compute": x, "loss": 30 * x**-0.4 + 1.5}), "compute", "loss", form="saturating", n_boot=50
    )
    assert floored["groups"]["all"]["c_at_bound"] is None and "bound" not in format_table(floored)
    assert floor_at_bound(0.02, 0.02) == "upper" and floor_at_bound(0.01, 0.02) is None


def test_extrapolated_figure_has_a_data_panel_and_units(tmp_path, capsys):
    xs = np.geomspace(1e6, 1e9, 6)
    df = pd.concat([budgets(-0.36, "softmax", xs), budgets(-0.25, "linear", xs, seed=1)], ignore_index=True)
    report = fit(df, "compute", "loss", group="attention", n_boot=50, extrapolate=[1e12])
    fig = build_figure(report, points_of(report, df))
    data, extrapolated, data_residuals, _ = fig.axes  # each panel with its residual panel under it
    assert data.get_xlim()[1] < 1e10 < 1e12 < extrapolated.get_xlim()[1]
    assert data_residuals.get_xlabel() == "compute (forward GMACs: GMACs per image-text pair x samples seen)"
    assert data.get_ylabel() == "training loss (contrastive cross-entropy, nats)"
    assert "extrapolated, not measured (95% interval)" in [t.get_text() for t in extrapolated.get_legend().get_texts()]
    plain = build_figure(fit(df, "compute", "loss", group="attention", n_boot=50), points_of(report, df))
    assert len(plain.axes) == 2 and not any("extrapolated" in t.get_text() for t in plain.axes[0].get_legend().texts)
    frontier = fit(df, "compute", "loss", group="attention", n_boot=50, frontier_bins=3)
    key = [t.get_text() for t in build_figure(frontier, points_of(frontier, df)).axes[0].get_legend().get_texts()]
    assert key[-2:] == ["frontier point (fitted)", "off the frontier (not fitted)"]
    assert axis_label("error@imagenet-v2") == "zero-shot top-1 error on imagenet-v2 (fraction)"
    assert axis_label("1-top1") == "1-top1"
    run_main(df, tmp_path, capsys, "--extrapolate", "1e12")
    with Image.open(tmp_path / "out" / "scaling.png") as image:
        assert image.format == "PNG" and image.size[0] > image.size[1] * 1.6  # two panels side by side


def test_every_fit_has_its_r2_and_residuals_and_a_poor_one_is_marked():
    xs = np.geomspace(1e6, 1e9, 6)
    # a plateau then a drop: no power law describes it
    bent = pd.DataFrame({"compute": xs, "loss": [0.7, 0.69, 0.68, 0.6, 0.1, 0.01], "attention": "bent"})
    df = pd.concat([budgets(-0.36, "softmax", xs), bent], ignore_index=True)
    report = fit(df, "compute", "loss", group="attention", n_boot=50)
    good, poor = report["groups"]["softmax"], report["groups"]["bent"]
    assert good["r2"] > 0.99 and poor["r2"] < 0.95 and good["x_range"] == [1e6, 1e9]
    text = format_table(report)
    assert "softmax  6  " in text and f"{good['r2']:.3f}" in text.splitlines()[3]
    assert f"bent: R^2 {poor['r2']:.3f} on log y, below 0.95: the fit does not describe its points" in text
    assert "softmax: R^2" not in text
    # the residual panel: ln y - ln fit of each group's points
    _, residuals = build_figure(report, points_of(report, df)).axes
    x, y = points_of(report, df)["bent"]
    drawn = residuals.collections[0].get_offsets()  # groups in order: bent, softmax
    fitted = np.log(y) - np.log(poor["beta"] * x ** poor["alpha"])
    assert np.allclose(drawn[:, 0], x) and np.allclose(drawn[:, 1], fitted)
    assert 1 - np.sum(fitted**2) / np.sum((np.log(y) - np.log(y).mean()) ** 2) == pytest.approx(poor["r2"])


def test_a_fit_without_finite_parameters_is_labelled_not_drawn_as_a_formula():
    """A fit that failed (NaN or infinite coefficient) labels its group "no finite fit" where the study's figures
    had stopped with an error; a finite one is written out."""
    from eval.scaling_plot import _formula

    assert _formula((-0.5, float("nan"), 0.0)) == "no finite fit"
    assert _formula((float("-inf"), 2.0, None)) == "no finite fit"
    assert _formula((-0.5, 2.0, 0.1)) == r"$y = 2\, x^{-0.500} + 0.1$"
