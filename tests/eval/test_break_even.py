"""eval/break_even.py: Eq. 7's time to target over softmax's per token count, over seeds, and the break-even."""

import json
import math

import pytest

from eval import break_even
from eval.claims import NODENOM
from eval.seeds import reach
from scripts.break_even import main

SAMPLES = [1000, 2000, 4000, 8000]


def run(attention, size, tokens, reach_at, rate):
    """A run whose zero-shot error first reaches 10% at `reach_at` samples (never: None)."""
    curve = [[s, 0.95 if reach_at is not None and s >= reach_at else 0.5] for s in SAMPLES]
    return {
        "attention": attention,
        "size": size,
        "image_tokens": tokens,
        "params_without_token_embedding": 100,
        "curve": curve,
        "samples_seen": SAMPLES[-1],
        "samples_per_s": rate,
    }


def data(folder, size, tokens, eq7_at, step_ratio, seeds=3):
    """A seeds page's data: softmax reaches 10% at 2,000 samples at 100 samples/s; Eq. 7 at `eq7_at[i]` (seed i)
    with steps `step_ratio` x softmax's time."""
    folder.mkdir(parents=True)
    for i in range(seeds):
        runs = [run("softmax", size, tokens, 2000, 100.0), run(NODENOM, size, tokens, eq7_at[i], 100.0 / step_ratio)]
        (folder / f"seed{i}").mkdir()
        (folder / f"seed{i}" / "runs.json").write_text(json.dumps(runs))
    (folder / "seeds.json").write_text(json.dumps({"seeds": [str(i) for i in range(seeds)]}))
    return folder


def test_time_ratio_per_token_count_and_the_break_even(tmp_path):
    # 100 tokens: 2x the samples at half the step time -> time ratio 1.0; 400 tokens: 2x at 1/4 -> 0.5 at every seed
    short = data(tmp_path / "a" / "data", "m@32px", 100, [4000] * 3, 0.5)
    long = data(tmp_path / "b" / "data", "m@64px", 400, [4000] * 3, 0.25)
    out = main([str(short), str(long), "--out", str(tmp_path / "page.md")])
    saved = json.loads(out.with_suffix(".json").read_text())
    ratios = {p["tokens"]: p["mean"] for p in saved["meta"]["per_tokens"]}
    assert ratios == pytest.approx({100: 1.0, 400: 0.5})
    found = saved["meta"]["break_even"]
    # the line through (100, 1.0) and (400, 0.5) crosses 1 at 100 tokens with slope -0.5
    assert found["tokens"] == pytest.approx(100.0) and found["slope"] == pytest.approx(-0.5)
    assert (tmp_path / "page" / "break_even.png").stat().st_size > 0
    assert break_even.rebuild(out) == out.read_text() and "Break-even at 100 image tokens" in out.read_text()


def test_seeds_that_disagree_widen_the_interval_and_lower_bounds_stay_out_of_the_fit(tmp_path):
    short = data(tmp_path / "a" / "data", "m@32px", 100, [2000, 4000, 8000], 0.5)
    long = data(tmp_path / "b" / "data", "m@64px", 400, [4000, 4000, None], 0.25)  # seed 2 never reaches 10%
    skipped = []
    rows = break_even.seed_rows(short, 0.1, skipped) + break_even.seed_rows(long, 0.1, skipped)
    assert [r["bound"] for r in rows] == ["", "", "", "", "", ">"] and not skipped
    softmax_reach = reach(run("softmax", "m", 400, 2000, 100.0), 0.1)  # eval/multiplier.py's first reach
    assert rows[-1]["ratio"] == pytest.approx(8000 / softmax_reach * 0.25)  # counted at its samples seen
    found = break_even.break_even(rows, n_boot=200)
    assert found["n"] == 5 and found["lo"] < found["tokens"] < found["hi"]
    per = {p["tokens"]: p for p in break_even.per_tokens(rows)}
    assert per[400]["bound"] == ">" and per[400]["hi"] == math.inf and per[100]["lo"] < 1 < per[100]["hi"]


def test_a_size_softmax_never_brings_to_the_target_is_left_out_and_said(tmp_path):
    folder = data(tmp_path / "a" / "data", "m@32px", 100, [4000] * 3, 0.5)
    for i in range(3):
        path = folder / f"seed{i}" / "runs.json"
        runs = json.loads(path.read_text())
        runs[0]["curve"] = [[s, 0.5] for s in SAMPLES]
        path.write_text(json.dumps(runs))
    skipped = []
    assert break_even.seed_rows(folder, 0.1, skipped) == [] and {s["why"] for s in skipped} == {
        "softmax never reaches it"
    }
    assert break_even.break_even([]) is None


def test_not_a_seeds_data_folder_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "not a seeds page's data folder" in capsys.readouterr().err
