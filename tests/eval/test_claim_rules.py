"""Issue 45 item 8: the claim rules and fits on a synthetic table of runs whose true exponents are known.

Run folders as training writes them (config.yaml, summary.json, metrics.jsonl), read by the study's own analysis
(eval/study_analysis: run_rows, scaling_fits) and judged by eval/claims.py and, over seeds, eval/seeds.py. The size
names are not the embedded study's: the rules must work on any study's outputs (a LAION study on Slurm included).
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from eval import study_analysis, study_report
from eval.claims import MARGIN, NODENOM, claims
from eval.seeds import claim_c_seeds, load_seed

SAMPLES = [2000, 4000, 8000, 16000]
ALPHA = 0.35  # the true exponent: val loss = 3 N^-alpha (1 + noise) at the end of each run


def write_run(run_dir, attention: str, size: str, params: float, final: float):
    """One finished run of `params` non-embedding parameters: evaluations at SAMPLES, the last validation loss
    `final`."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"model:\n  image_attention: {attention}\n  name: {size}\n")
    summary = {"params_without_token_embedding": int(params), "gmacs_per_sample": params * 2e-9}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    lines = []
    for step, seen in enumerate(SAMPLES, 1):
        loss = final * (SAMPLES[-1] / seen) ** 0.2  # a learning curve that ends at `final`
        top1 = 1 - min(0.95, loss)
        lines.append({"step": step, "samples_seen": seen, "samples_per_s": 100.0})
        lines.append({"step": step, "samples_seen": seen, "val_loss": loss, "zeroshot/top1": top1, "zeroshot/top5": 1})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def study(folder, alphas: dict[str, float], params, seed: int = 0, noise: float = 0.01, bend: bool = False):
    """The jobs of a study: per attention (true exponent `alphas[attention]`) one run per size in `params`. With
    `bend`, Eq. 7's losses are flat over the smaller half of the sizes and drop after: no power law."""
    rng = np.random.default_rng(seed)
    jobs = []
    for attention, alpha in alphas.items():
        for i, n in enumerate(params):
            size = f"S{i}"
            run_dir = folder / f"{size}-{attention}"
            # bent: flat over the smaller half of the sizes, then three times as steep
            loss = 3 * (
                max(n, params[len(params) // 2]) ** -(3 * alpha) if bend and attention == NODENOM else n**-alpha
            )
            write_run(run_dir, attention, size, n, loss * (1 + noise * rng.standard_normal()))
            times = {"wall_seconds": 10.0, "cpu_seconds": 10.0}
            jobs.append(
                SimpleNamespace(size=size, attention=attention, run_dir=run_dir, after=None, budgets=[], **times)
            )
    return jobs


def judged(tmp_path, monkeypatch, alphas, params, **options):
    """(verdict, numbers) of claim (c) and the fits, from the study's analysis of the synthetic runs."""
    monkeypatch.setattr(study_analysis, "plot", lambda *args, **kwargs: None)  # the figures are tested elsewhere
    jobs = study(tmp_path / "runs", alphas, params, **options)
    spec = SimpleNamespace(fits={"n_boot": 200}, attentions=list(alphas))
    fits = study_analysis.scaling_fits(jobs, tmp_path, spec)
    rows = study_analysis.run_rows(jobs)
    verdicts = {claim[:3]: (verdict, numbers) for claim, verdict, numbers in claims(rows, fits, [0.9], 1000, 50)}
    return verdicts["(c)"], fits


FIVE = np.geomspace(1e5, 3e6, 5)  # 5 sizes spanning 30x


def test_equal_exponents_are_similar(tmp_path, monkeypatch):
    (verdict, numbers), fits = judged(tmp_path, monkeypatch, {"softmax": ALPHA, NODENOM: ALPHA}, FIVE)
    for g in fits["val_loss_params"]["groups"].values():
        assert g["alpha"] == pytest.approx(-ALPHA, abs=0.02) and g["r2"] > 0.99 and g["n_distinct_x"] == 5
    lo, hi = fits["val_loss_params"]["comparisons"][0]["alpha_diff_ci"]
    assert -MARGIN < lo < 0 < hi < MARGIN
    assert verdict == "supported", numbers
    assert "5 sizes spanning 30.0x" in numbers and "compute-frontier exponents of zero-shot error" in numbers


def test_exponents_differing_by_0_2_are_not_similar(tmp_path, monkeypatch):
    (verdict, numbers), fits = judged(tmp_path, monkeypatch, {"softmax": ALPHA, NODENOM: ALPHA - 0.2}, FIVE)
    assert fits["val_loss_params"]["comparisons"][0]["alpha_diff"] == pytest.approx(0.2, abs=0.03)
    assert verdict == "not supported", numbers


@pytest.mark.parametrize(
    "params, why",
    [
        (np.geomspace(1e5, 3e6, 3), "indicative only: 3 sizes spanning 30.0x"),
        (np.geomspace(1e5, 3e6, 2), "too few sizes: 2 sizes spanning 30.0x"),
        (np.geomspace(1e5, 5e5, 5), "too narrow: 5 sizes spanning 5.0x"),
    ],
)
def test_too_few_sizes_or_too_narrow_a_span_are_undetermined(tmp_path, monkeypatch, params, why):
    (verdict, numbers), _ = judged(tmp_path, monkeypatch, {"softmax": ALPHA, NODENOM: ALPHA}, params)
    assert verdict == "undetermined" and why in numbers
    if "indicative" in why:  # the demo's 3 sizes: what the interval alone says is reported beside it
        assert "the interval alone would read: supported" in numbers


def test_a_fit_that_does_not_describe_its_points_is_undetermined(tmp_path, monkeypatch):
    (verdict, numbers), fits = judged(tmp_path, monkeypatch, {"softmax": ALPHA, NODENOM: ALPHA}, FIVE, bend=True)
    assert fits["val_loss_params"]["groups"][NODENOM]["r2"] < 0.95
    assert verdict == "undetermined" and f"{NODENOM}: R^2 " in numbers and "does not describe its points" in numbers


def test_one_size_is_not_fitted_and_undetermined(tmp_path, monkeypatch):
    (verdict, numbers), fits = judged(tmp_path, monkeypatch, {"softmax": ALPHA, NODENOM: ALPHA}, [1e5])
    assert "error" in fits["val_loss_params"] and verdict == "undetermined" and "not fitted" in numbers


@pytest.mark.parametrize("shift, expected", [(0.0, "supported"), (0.2, "not supported")])
def test_the_same_rule_over_seeds(tmp_path, monkeypatch, shift, expected):
    """Three seeds (other noise draws) written as finished study folders (runs.json, fits.json) and judged on the
    interval over seeds of the difference of exponents."""
    monkeypatch.setattr(study_analysis, "plot", lambda *args, **kwargs: None)
    spec = SimpleNamespace(fits={"n_boot": 50}, attentions=["softmax", NODENOM])
    folders = []
    for seed in range(3):
        out = tmp_path / f"seed{seed}"
        jobs = study(out / "runs", {"softmax": ALPHA, NODENOM: ALPHA - shift}, FIVE, seed=seed)
        fits = study_analysis.scaling_fits(jobs, out, spec)
        (out / "runs.json").write_text(json.dumps(study_analysis.run_rows(jobs)))
        (out / "fits.json").write_text(json.dumps({n: study_report.fit_digest(f) for n, f in fits.items()}))
        folders.append(out)
    verdict, numbers = claim_c_seeds([load_seed(f) for f in folders])
    assert verdict == expected, numbers
    assert "5 sizes spanning 30.0x" in numbers and "over 3 seeds" in numbers


@pytest.mark.parametrize("before, expected", [(1.02, "supported"), (1.3, "undetermined")])
def test_equal_exponents_of_runs_that_have_not_flattened_are_undetermined(tmp_path, monkeypatch, before, expected):
    """Each run's cooled-down budget at half its samples: a validation loss 2% above its end (1.4% per doubling:
    flat) leaves the verdict to the exponents; 30% above (23% per doubling) compares sizes at equal samples, not
    converged, and is undetermined, saying so."""
    monkeypatch.setattr(study_analysis, "plot", lambda *args, **kwargs: None)
    jobs = study(tmp_path / "runs", {"softmax": ALPHA, NODENOM: ALPHA}, FIVE)
    spec = SimpleNamespace(fits={"n_boot": 200}, attentions=["softmax", NODENOM])
    fits = study_analysis.scaling_fits(jobs, tmp_path, spec)
    rows = study_analysis.run_rows(jobs)
    for r in rows:
        end = SAMPLES[-1]
        r["budgets"] = [[end // 2, 0.5, r["val_loss"] * before], [end, 0.5, r["val_loss"]]]
    verdicts = {claim[:3]: (verdict, numbers) for claim, verdict, numbers in claims(rows, fits, [0.9], 1000, 50)}
    verdict, numbers = verdicts["(c)"]
    assert verdict == expected, numbers
    fall = 100 * (1 - 1 / before)
    assert f"16,000 samples each; validation loss at the end falling {fall:.0f}% to {fall:.0f}% per doubling" in numbers
    assert ("not flat: the exponents compare the sizes at equal samples" in numbers) == (expected == "undetermined")
