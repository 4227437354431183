"""scripts.rope_resolution in seconds: both position kinds trained, each evaluated at every size, the table
written (the accuracies themselves are the script's result, docs/rope_resolution.md, not asserted)."""

import os
from types import SimpleNamespace

import pytest

from data import make_synthetic
from scripts import rope_resolution
from train.rope_resolution import rebuild, write


# eight training and evaluation processes: ~40 s of a test worker, too much for the 10-minute suite; RoPE at other
# sizes is tested in tests/models/test_rope.py and tests/train/test_cli_errors.py
@pytest.mark.skipif(not os.environ.get("RUN_SLOW"), reason="eight training processes take ~40 s; RUN_SLOW=1 runs it")
def test_rope_resolution_trains_both_and_evaluates_each_size(tmp_path, quick_polls):
    make_synthetic(tmp_path / "data", train_samples=128, val_samples=16, eval_per_class=1, image_size=32, seed=0)
    argv = ["--data", str(tmp_path / "data"), "--steps", "3", "--eval-sizes", "64", "--finetune-steps", "2"]
    text = rope_resolution.main([*argv, "--out", str(tmp_path / "o")]).read_text()
    assert "| image positions | 64 px (64 patches) |" in text
    for kind in ("learnable", "rope"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {kind} |"))
        assert row.count("%") == 1, row
        tuned = next(line for line in text.splitlines() if line.startswith(f"| {kind}, tuned |"))
        assert tuned.count("%") == 1, tuned
    config = (tmp_path / "o" / "learnable-tuned" / "config.yaml").read_text()
    assert "image_size: 64" in config and str(tmp_path / "o" / "learnable") in config


def test_the_page_is_its_data_written_again(tmp_path):
    args = SimpleNamespace(size="demo-w32", steps=800, lr=2e-3, finetune_steps=100)
    results = {("learnable", 32): 0.6, ("learnable", 64): 0.45, ("rope", 32): 0.61, ("rope-tuned", 64): 0.52}
    page = write(tmp_path, args, results, 120.0)
    text = page.read_text()
    assert "| learnable | 60.0% | 45.0% |" in text and "| rope, tuned |  | 52.0% |" in text
    assert rebuild(page) == text
