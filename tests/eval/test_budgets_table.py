"""eval/study_report.budgets_table: each cooled-down budget's row carries its validation loss's change per doubling
of samples from the budget before (how far the run is from flat), put per doubling whatever the budgets' spacing."""

from eval.study_report import budgets_table


def test_each_budget_row_gives_the_change_per_doubling_from_the_budget_before():
    run = dict(size="w16", attention="softmax", params_without_token_embedding=10,
               budgets=[[100, 0.2, 1.0], [200, 0.3, 0.8], [800, 0.4, 0.512], [1600, 0.41, 0.512]])  # fmt: skip
    rows = [line.split(" | ") for line in budgets_table([run]).splitlines()[2:]]
    assert [r[-1].rstrip(" |") for r in rows] == ["", "-20%", "-20%", "+0%"]  # 0.8 -> 0.512 over two doublings
    assert [r[2] for r in rows] == ["100", "200", "800", "1,600"]
