"""eval.smoothing during training: each evaluation logs each image-tower layer's kept share of token spread
(eval/smoothing.py); an eval.dataset that is not an ImageFolder tree is one line before training."""

import pytest

from eval.smoothing import curve_of
from tests.train.common import metrics, run, tiny_config
from train.config import ConfigError


def test_every_evaluation_logs_the_kept_share_per_layer(tmp_path, synthetic):
    config = tiny_config(tmp_path, synthetic, eval={"dataset": synthetic["eval"], "every": 2, "smoothing": 8})
    assert run(config) == 0
    logged = [r for r in metrics(tmp_path / "run") if "zeroshot/top1" in r]
    assert len(logged) == 2 and all(0 <= r["smoothing/layer1"] <= 1 and "smoothing/layer2" in r for r in logged)
    curve = curve_of(tmp_path / "run")
    assert [s for s, _ in curve] == [r["samples_seen"] for r in logged] and len(curve[0][1]) >= 2


def test_smoothing_needs_an_image_folder(tmp_path, synthetic):
    config = tiny_config(tmp_path, synthetic, eval={"dataset": None, "smoothing": 8})
    with pytest.raises(ConfigError, match=r"eval.smoothing=8 measures on images of eval.dataset, which must be an Im"):
        run(config)
