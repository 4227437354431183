"""eval/equal_compute.py: loss against model size at equal training compute, over seeds, from seeds pages' data."""

import json

import pytest

from eval import equal_compute
from scripts.equal_compute import main

NOISE = [1.0, 1.03, 0.97]  # per seed


def run(attention, size, params, gmacs, ends):
    """A run with cooled-down budget ends {samples: validation loss}."""
    budgets = [[n, 0.5, loss] for n, loss in sorted(ends.items())]
    out = {"attention": attention, "size": size, "params_without_token_embedding": params, "gmacs_per_sample": gmacs}
    return out | {"budgets": budgets, "curve": [[n, 0.5] for n in sorted(ends)], "samples_seen": max(ends)}


def folder(path, runs_of_seed):
    path.mkdir(parents=True)
    for i, noise in enumerate(NOISE):
        (path / f"seed{i}").mkdir()
        (path / f"seed{i}" / "runs.json").write_text(json.dumps(runs_of_seed(noise)))
    (path / "seeds.json").write_text(json.dumps({"seeds": [str(i) for i in range(len(NOISE))]}))
    return path


def studies(tmp_path, soft_ratio=(0.8, 0.64), eq7_ratio=(1.2, 1.3)):
    """The smallest size trained long in one study (reference: 8,000 samples x 1 GMAC), the larger ones in another
    that repeats its short budget; 'm' and 'l' reach the reference's compute exactly, 'far' only a tenth of it."""

    def long(noise):
        return [run(a, "s", 100, 1.0, {1000: 2.0, 8000: 1.0 * noise}) for a in ("softmax", "eq7")]

    def ladder(noise):
        out = []
        for a, (m, big) in (("softmax", soft_ratio), ("eq7", eq7_ratio)):
            out += [run(a, "s", 100, 1.0, {1000: 2.0}), run(a, "far", 800, 8.0, {100: 3.0})]
            out += [run(a, "m", 400, 4.0, {1000: 1.5, 2000: m * noise}), run(a, "l", 1600, 16.0, {500: big * noise})]
        return out

    return folder(tmp_path / "flat" / "data", long), folder(tmp_path / "ladder" / "data", ladder)


def test_loss_at_equal_compute_per_size_and_attention(tmp_path):
    flat, ladder = studies(tmp_path)
    out = main([str(flat), str(ladder), "--out", str(tmp_path / "page" / "equal.md")])
    saved = json.loads(out.with_suffix(".json").read_text())
    per = {(s["attention"], s["size"]): s for s in saved["meta"]["per_size"]}
    assert per["softmax", "m"]["ratio"]["mean"] == pytest.approx(0.8) and per["softmax", "m"]["over_compute"] == 1.0
    assert per["softmax", "l"]["ratio"]["mean"] == pytest.approx(0.64) and per["softmax", "l"]["samples"] == [500]
    assert per["eq7", "l"]["vs_softmax"]["mean"] == pytest.approx(1.3 / 0.64)
    assert ("softmax", "far") not in per and saved["meta"]["left_out"][0][:2] == ["eq7", "far"]
    text = out.read_text()
    assert "- softmax: at equal compute the validation loss falls with parameters" in text
    assert "- eq7: at equal compute the validation loss rises with parameters" in text
    assert equal_compute.rebuild(out) == text and (tmp_path / "page" / "equal" / "equal_compute.png").stat().st_size
    assert "](equal/equal_compute.png)" in text


def test_a_size_within_noise_of_the_reference_does_not_move(tmp_path):
    flat, ladder = studies(tmp_path, soft_ratio=(1.0, 0.9))
    rows = [
        r for seed, runs in equal_compute.merged([flat, ladder]).items() for r in equal_compute.seed_rows(runs, seed)
    ]
    sizes = [s for s in equal_compute.per_size(rows) if s["attention"] == "softmax"]
    assert equal_compute.direction(sizes) == "does not move distinguishably with parameters"


def test_a_folder_without_seeds_data_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "not a seeds page's data folder (no seeds.json)" in capsys.readouterr().err
