"""eval/study_plots.py's figures from made-up rows: the learning-rate sweep and the samples multipliers, including
bounds (a run that never reaches a target) and intervals that do not straddle their multiplier."""

import math
from pathlib import Path

from eval.multiplier import Multiplier
from eval.study_plots import multiplier_figure, sweep_figure


def test_the_multiplier_figure_draws_intervals_and_bounds(tmp_path):
    def row(attention, size, target, k, lo, hi, censored=False):
        m = Multiplier(target, k, lo, hi, censored, k * 1000, 1000.0)
        return {"attention": attention, "run": {"size": size}, "target": target, "m": m}

    found = [
        row("linear_affine", "w16", 0.8, 1.5, 1.2, 1.9),
        row("linear_affine", "w16", 0.7, 2.0, 2.2, math.inf),  # the bootstrap lies above k
        row("linear_affine_nodenom", "w16", 0.7, 3.0, math.nan, math.nan, censored=True),
        row("linear_affine_nodenom", "w64", 0.8, 0.8, 0.6, 1.1),
    ]
    multiplier_figure(found, ["softmax", "linear_affine", "linear_affine_nodenom"], tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 0


def test_the_sweep_figure_circles_the_chosen_rate(tmp_path, monkeypatch):
    import eval.study_plots as plots

    drawn = []
    monkeypatch.setattr(plots.plt, "close", lambda fig: drawn.append(fig))
    rows = [
        {"attention": a, "scale": s, "lr": 1e-3 * s, "val_loss": 1 + abs(s - 1), "top1": 0.3, "chosen": s == 1}
        for a in ("softmax", "linear_affine")
        for s in (0.5, 1, 2)
    ]
    sweep_figure(rows, ["softmax", "linear_affine"], tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 0
    # each panel's y axis names its metric (not the last line's attention)
    assert [ax.get_ylabel() for ax in drawn[0].axes] == ["final validation loss", "final zero-shot error"]


def test_the_exponent_panel_says_when_no_fit_has_an_exponent(recwarn):
    """A study too small for any fit (one size, as --quick with --sizes X): the panel says so, no empty legend."""
    import matplotlib.pyplot as plt

    from eval.study_plots import exponent_panel

    fig, (empty, drawn) = plt.subplots(1, 2)
    exponent_panel(empty, {"error_params": {"groups": {}}}, ["softmax"])
    fit = {"alpha": -0.3, "alpha_ci": [-0.4, -0.2]}
    exponent_panel(drawn, {"error_params": {"groups": {"softmax": fit}}}, ["softmax"])
    assert empty.get_legend() is None and [t.get_text() for t in empty.texts] == ["no exponent fitted"]
    assert drawn.get_legend() is not None and not drawn.texts
    assert not [w for w in recwarn if "No artists with labels" in str(w.message)]
    plt.close(fig)


def test_the_learning_curves_draw_every_evaluation_as_a_line_and_each_budget_cooled_down_as_a_ring(
    tmp_path, monkeypatch
):
    """A run with budgets: the line is its own evaluations (run_curve, at its constant rate), the rings the budgets'
    cooled-down ends (budgets), in both panels; a run without budgets is its curve alone."""
    import eval.study_plots as plots

    drawn = []
    monkeypatch.setattr(plots.plt, "close", lambda fig: drawn.append(fig))
    with_budgets = {"size": "w16", "attention": "softmax", "run_curve": [[100, 0.2], [200, 0.3]],
                    "curve": [[100, 0.25], [200, 0.3]], "val_curve": [[100, 2.0], [200, 1.5]],
                    "budgets": [[100, 0.25, 1.8], [200, 0.3, 1.5]]}  # fmt: skip
    alone = {"size": "w32", "attention": "linear_affine", "curve": [[100, 0.1], [200, 0.4]],
             "val_curve": [[100, 2.5], [200, 1.2]]}  # fmt: skip
    points = plots.curve_points(with_budgets)
    assert points["error"] == ([100, 200], [0.8, 0.7]) and points["error budgets"] == ([100, 200], [0.75, 0.7])
    assert points["val_loss budgets"] == ([100, 200], [1.8, 1.5])
    assert set(plots.curve_points(alone)) == {"error", "val_loss"}
    plots.learning_curves([with_budgets, alone], ["softmax", "linear_affine"], ["w16", "w32"], tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0
    for ax in drawn[0].axes:
        rings = [line for line in ax.lines if line.get_marker() == "o"]
        assert len(ax.lines) == 3 and len(rings) == 1 and list(rings[0].get_xdata()) == [100, 200]
        assert "end of a budget, cooled down" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_study_pages_learning_curves_are_drawn_again_from_its_data(tmp_path):
    from eval.study_page import redraw

    page = Path(__file__).resolve().parents[2] / "docs" / "study.md"
    assert redraw(page, tmp_path) == tmp_path / "learning_curves.png" and (tmp_path / "learning_curves.png").is_file()
