"""eval.multiplier: samples to a target error, the multiplier over a reference curve, and its bootstrap interval."""

import math

import numpy as np
import pytest

from eval.multiplier import first_reach, multiplier

SAMPLES = [100, 200, 400, 800]


def test_first_reach_interpolates_in_log_samples():
    # halfway in error between 200 and 400 samples is sqrt(200 * 400) in log-linear interpolation
    assert first_reach(SAMPLES, [0.9, 0.6, 0.4, 0.3], 0.5) == pytest.approx(math.sqrt(200 * 400))
    assert first_reach(SAMPLES, [0.9, 0.6, 0.4, 0.3], 0.6) == pytest.approx(200)  # reached exactly at an evaluation
    assert first_reach(SAMPLES, [0.2, 0.6, 0.4, 0.3], 0.5) == 100  # already there at the first evaluation
    assert first_reach(SAMPLES, [0.9, 0.6, 0.4, 0.3], 0.1) == math.inf
    # the first crossing counts, not a later one after the curve went back up
    assert first_reach(SAMPLES, [0.9, 0.4, 0.7, 0.3], 0.5) == pytest.approx(100 * 2 ** (0.4 / 0.5))


def test_bad_curves_are_refused():
    with pytest.raises(ValueError, match="increasing"):
        first_reach([100, 100], [0.5, 0.4], 0.3)
    with pytest.raises(ValueError, match="one error per evaluation"):
        first_reach([100, 200], [0.5], 0.3)
    with pytest.raises(ValueError, match="target error"):
        multiplier((SAMPLES, [0.5] * 4), (SAMPLES, [0.5] * 4), 1.5, n_images=100)


def test_multiplier_of_a_curve_shifted_by_two_is_two_and_its_interval_narrows_with_more_images():
    errors = [0.8, 0.5, 0.3, 0.2]
    reference = (SAMPLES, errors)
    slower = ([2 * s for s in SAMPLES], errors)  # the same curve, needing twice the samples
    widths = []
    for n_images in (200, 20000):
        m = multiplier(slower, reference, 0.4, n_images=n_images, n_boot=400)
        assert m.k == pytest.approx(2.0) and not m.censored and m.lo <= 2.0 <= m.hi
        widths.append(m.hi - m.lo)
    assert widths[1] < widths[0] / 3
    assert "2.00x [" in m.text()


def test_a_curve_that_never_reaches_the_target_gives_a_lower_bound():
    m = multiplier((SAMPLES, [0.9, 0.8, 0.7, 0.6]), (SAMPLES, [0.8, 0.5, 0.3, 0.2]), 0.3, n_images=10000, n_boot=50)
    assert m.censored and m.k == pytest.approx(800 / 400) and m.text() == "> 2.00x (never reached)"
    assert np.isinf(m.hi)  # no replicate reaches it either
    m = multiplier((SAMPLES, [0.9, 0.8, 0.7, 0.6]), (SAMPLES, [0.9, 0.8, 0.7, 0.6]), 0.1, n_images=100, n_boot=20)
    assert math.isnan(m.k) and m.reference_missed == 20 and m.text().startswith("n/a")


def test_the_bootstrap_is_repeatable_for_a_seed():
    args = ((SAMPLES, [0.8, 0.6, 0.45, 0.35]), (SAMPLES, [0.7, 0.5, 0.3, 0.25]), 0.45)
    a, b = multiplier(*args, n_images=300, n_boot=200, seed=3), multiplier(*args, n_images=300, n_boot=200, seed=3)
    assert a == b


def test_a_reference_at_the_target_from_its_first_evaluation_gives_no_multiplier():
    # both curves start below 60%: each first evaluation is only an upper bound on its samples to the target, so
    # k = 2 would be the ratio of the first evaluations, not a measurement
    m = multiplier(([2 * s for s in SAMPLES], [0.5, 0.4, 0.3, 0.2]), (SAMPLES, [0.5, 0.4, 0.3, 0.2]), 0.6, 1000, 20)
    assert m.reference_at_start and m.at_start and m.text().startswith("n/a (the reference is there at its first")
    # the curve alone at the target at its first evaluation: an upper bound on k
    m = multiplier((SAMPLES, [0.5, 0.4, 0.3, 0.2]), (SAMPLES, [0.8, 0.7, 0.5, 0.2]), 0.6, 1000, 20)
    assert (
        m.at_start and not m.reference_at_start and m.text() == "< 0.35x (there at its first evaluation)"
    )  # 100 / sqrt(200 * 400)
