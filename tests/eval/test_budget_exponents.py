"""eval/budget_exponents.py: claim (c)'s exponent at each cooled-down budget, over seeds."""

import math
from pathlib import Path

import pytest

from eval import budget_exponents, seeds_page
from eval.claims import NODENOM
from eval.seeds import PARAMS_FIT, Seed

PARAMS = {"w16": 1e4, "w32": 4e4, "w48": 9e4, "w64": 1.6e5}
BUDGETS = [1000, 2000, 4000]
REPO = Path(__file__).resolve().parents[2]


def seed(name: str, alphas: dict[str, list[float]], sizes=PARAMS, budgets=BUDGETS) -> Seed:
    """A study whose validation loss at budget j is 3 * params^alphas[attention][j] exactly."""
    runs = []
    for attention, per_budget in alphas.items():
        for size, params in sizes.items():
            ends = [[b, 0.5, 3 * params**a] for b, a in zip(budgets, per_budget)]
            runs.append(
                {"attention": attention, "size": size, "params_without_token_embedding": params, "budgets": ends}
            )
    return Seed(name, Path(name), runs, {}, [])


def test_each_budgets_exponent_and_its_difference_from_softmax_paired_by_seed():
    seeds = [
        seed("0", {"softmax": [-0.2, -0.25, -0.3], NODENOM: [-0.1, -0.2, -0.3]}),
        seed("1", {"softmax": [-0.22, -0.27, -0.32], NODENOM: [-0.12, -0.22, -0.30]}),
    ]
    rows = budget_exponents.rows(seeds)
    assert [(r.samples, r.attention) for r in rows] == [(b, a) for b in BUDGETS for a in ("softmax", NODENOM)]
    first = rows[1]  # Eq. 7 at 1,000 samples
    assert first.exponent.values == pytest.approx([-0.1, -0.12])
    assert first.minus_softmax.values == pytest.approx([0.1, 0.1]) and first.minus_softmax.mean == pytest.approx(0.1)
    last = rows[-1]
    assert last.minus_softmax.values == pytest.approx([0.0, 0.02])
    assert math.isfinite(last.minus_softmax.lo) and last.minus_softmax.lo < 0.01 < last.minus_softmax.hi
    assert rows[0].minus_softmax is None and rows[0].r2 == pytest.approx((1.0, 1.0))
    table = budget_exponents.table(seeds)
    assert table[2].startswith("| 1,000 | softmax | -0.200 / -0.220 |") and "+0.100" in table[3]


def test_nothing_to_show_with_one_budget_two_sizes_or_one_model_at_several_image_sizes(tmp_path):
    two = {k: PARAMS[k] for k in ("w16", "w64")}
    alphas = {"softmax": [-0.2, -0.3, -0.3], NODENOM: [-0.2, -0.3, -0.3]}
    assert budget_exponents.rows([seed("0", alphas)])
    assert budget_exponents.rows([seed("0", alphas, sizes=two)]) == []
    assert budget_exponents.rows([seed("0", {a: v[:1] for a, v in alphas.items()}, budgets=[4000])]) == []
    one_model = seed("0", alphas)
    for r in one_model.runs:
        r["size"] = "w64@" + r["size"]
    assert budget_exponents.rows([one_model]) == []
    assert not budget_exponents.figure([one_model], tmp_path / "f.png") and not (tmp_path / "f.png").exists()
    assert budget_exponents.figure([seed("0", alphas), seed("1", alphas)], tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_the_full_budget_row_is_the_fit_claim_c_reads_on_the_one_depth_ladders_page():
    loaded, _ = seeds_page.load_data(REPO / "docs" / "study_depth2_seeds" / "data")
    full = [
        r for r in budget_exponents.rows(loaded) if r.samples == max(r.samples for r in budget_exponents.rows(loaded))
    ]
    for r in full:
        fitted = [s.fits[PARAMS_FIT]["groups"][r.attention]["alpha"] for s in loaded]
        assert r.exponent.values == pytest.approx(fitted, abs=1e-9)


def test_the_fall_per_doubling_between_budgets_shrinks_only_where_a_floor_is_near():
    """A loss 2 * n^-0.5 (no floor) falls 1 - 2^-0.5 = 29% per doubling at every budget; 0.5 + 2 * n^-0.5 falls
    less and less."""
    seeds = [seed(str(i), {"softmax": [-0.2, -0.3, -0.4], NODENOM: [-0.2, -0.3, -0.4]}) for i in range(2)]
    for s in seeds:
        for r in s.runs:
            floor = 0.5 if r["attention"] == NODENOM else 0.0
            r["budgets"] = [[n, 0.5, floor + 2 * n**-0.5] for n in BUDGETS]
    power = budget_exponents.falls(seeds[0].runs[0])
    assert [(n0, n1) for n0, n1, _ in power] == [(1000, 2000), (2000, 4000)]
    assert [f for _, _, f in power] == pytest.approx([1 - 2**-0.5] * 2)
    floored = [f for _, _, f in budget_exponents.falls(seeds[0].runs[-1])]
    assert floored[1] < floored[0] < 1 - 2**-0.5
    table = budget_exponents.falls_table(seeds)
    assert table[0] == "| attention | size | 1,000 to 2,000 samples | 2,000 to 4,000 samples |"
    assert table[2] == "| softmax | w16 | 29% [29%, 29%] | 29% [29%, 29%] |" and len(table) == 2 + 2 * len(PARAMS)


def test_a_one_size_study_has_no_exponents_but_its_falls_per_doubling_over_seeds():
    """configs/study/depth2_flat.yaml: one size at 8x the budget; how far it is from flat is the question."""
    one = {"w16": PARAMS["w16"]}
    seeds = [seed(str(i), {"softmax": [-0.2, -0.3, -0.4], NODENOM: [-0.2, -0.3, -0.4]}, sizes=one) for i in range(3)]
    assert budget_exponents.rows(seeds) == []
    table = budget_exponents.falls_table(seeds)
    assert len(table) == 2 + 2 and table[2].startswith("| softmax | w16 | ") and table[3].startswith(f"| {NODENOM} |")
    for s in seeds:  # Eq. 7 trained to budgets of its own (twice softmax's): a table of its own
        run = next(r for r in s.runs if r["attention"] == NODENOM)
        run["budgets"] = [[2 * n, t, v] for n, t, v in run["budgets"]]
    table = budget_exponents.falls_table(seeds)
    assert table[0].endswith("| 1,000 to 2,000 samples | 2,000 to 4,000 samples |") and table[3] == ""
    assert table[4].endswith("| 2,000 to 4,000 samples | 4,000 to 8,000 samples |") and table[6].startswith(
        f"| {NODENOM}"
    )
