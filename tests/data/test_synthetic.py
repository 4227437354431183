"""The embedded synthetic data set: layout, determinism, readable by plain webdataset."""

import json
from pathlib import Path

import pytest
import webdataset as wds
from torchvision.datasets import ImageFolder

from data import DataConfig, build_train_data
from data.synthetic import COLOURS, SHAPES, main, make_synthetic
from tests.data.shardmaker import to_tensor


def test_shards_read_back_by_plain_webdataset(tmp_path):
    spec = make_synthetic(tmp_path, train_samples=250, eval_per_class=2, shard_size=100, image_size=16)
    assert spec == str(tmp_path / "train" / "{00000..00002}.tar")
    sizes = json.loads((tmp_path / "train" / "sizes.json").read_text())
    assert sizes == {"00000.tar": 100, "00001.tar": 100, "00002.tar": 50}
    samples = list(wds.WebDataset(spec, shardshuffle=False).decode("pil"))
    assert len(samples) == 250 and len({s["__key__"] for s in samples}) == 250
    for sample in samples[:20]:
        meta = sample["json"]
        assert sample["jpg"].size == (16, 16)
        assert meta["colour"] in sample["txt"] and meta["shape"] in sample["txt"]


def test_eval_set_is_an_image_folder_with_names_in_class_order(tmp_path):
    make_synthetic(tmp_path, train_samples=10, eval_per_class=3, image_size=16)
    folder = ImageFolder(str(tmp_path / "eval"))
    names = (tmp_path / "eval" / "classnames.txt").read_text().splitlines()
    assert len(folder) == 3 * len(COLOURS) * len(SHAPES) and len(names) == 24
    assert names == [c.replace("_", " ") for c in folder.classes]
    templates = (tmp_path / "eval" / "templates.txt").read_text().splitlines()
    assert templates and all("{c}" in t for t in templates)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    paths = [
        make_synthetic(tmp_path / name, train_samples=30, eval_per_class=1, seed=seed)
        for name, seed in (("a", 0), ("b", 0), ("c", 1))
    ]
    a, b, c = (Path(p).read_bytes() for p in paths)
    assert a == b and a != c


def test_command_line_writes_data_the_loader_reads(tmp_path):
    spec = main([str(tmp_path), "--train-samples", "40", "--eval-per-class", "1", "--image-size", "16"])
    data = build_train_data(
        DataConfig(train_shards=spec, batch_size=8, workers=0), to_tensor, lambda texts: [len(t) for t in texts]
    )
    images = [images for images, _ in data.loader]
    assert len(images) == 5 and images[0].shape == (8, 3, 16, 16)


def test_validation_split_is_held_out_and_captions_fit_a_short_context(tmp_path):
    """The validation shards have the training format and their own samples; every caption fits the 16-token
    context of the demo sizes (configs/models/demo-*.json), start and end tokens included."""
    from models.config import open_clip_with_sizes

    open_clip = open_clip_with_sizes()  # open_clip with the demo sizes registered

    make_synthetic(tmp_path, train_samples=200, val_samples=150, eval_per_class=1, shard_size=100, image_size=16)
    assert json.loads((tmp_path / "val" / "sizes.json").read_text()) == {"00000.tar": 100, "00001.tar": 50}
    val = list(wds.WebDataset(str(tmp_path / "val" / "{00000..00001}.tar"), shardshuffle=False).decode("pil"))
    train = list(wds.WebDataset(str(tmp_path / "train" / "{00000..00001}.tar"), shardshuffle=False).decode("pil"))
    assert len(val) == 150 and all(v["jpg"].size == (16, 16) for v in val)
    assert [v["txt"] for v in val[:20]] != [t["txt"] for t in train[:20]]
    tokens = open_clip.get_tokenizer("demo-w32")([s["txt"] for s in train + val])
    assert tokens.shape[1] == 16 and bool((tokens[:, -1] == 0).all()), "a caption was cut at 16 tokens"


def test_extent_draws_shapes_in_its_range_and_calls_the_upper_half_large(tmp_path, capsys):
    """--extent: small shapes at a high resolution (a task that needs the resolution); the size words split the
    range in the middle; a range outside (0.02, 0.9) is one error line."""
    spec = make_synthetic(tmp_path, train_samples=60, eval_per_class=1, image_size=64, extent=(0.1, 0.2))
    metas = [s["json"] for s in wds.WebDataset(spec, shardshuffle=False).decode()]
    assert len(metas) == 60 and all(0.1 <= m["extent"] <= 0.2 for m in metas)
    assert all(m["size"] == ("large" if m["extent"] >= 0.15 else "small") for m in metas)
    assert {m["size"] for m in metas} == {"large", "small"}
    try:
        main([str(tmp_path / "bad"), "--train-samples", "4", "--extent", "0.5", "0.3"])
    except SystemExit as e:
        assert "extent [0.5, 0.3] must be two fractions 0.02 <= low <= high <= 0.9" in str(e.code)
    else:
        raise AssertionError("a reversed extent was accepted")


def test_patterns_need_the_full_resolution(tmp_path):
    """--patterns: classes colour x pattern; the patterns are 1-pixel lines in the shape, which a half-resolution view
    averages to one shade (what the resolution study, configs/study/resolution.yaml, needs)."""
    import numpy as np
    from PIL import Image

    from data.synthetic import PATTERNS, draw

    spec = make_synthetic(tmp_path, train_samples=40, eval_per_class=1, image_size=64, patterns=True)
    names = (tmp_path / "eval" / "classnames.txt").read_text().splitlines()
    assert len(names) == 24 and "red striped shape" in names and "blue plain shape" in names
    metas = [s["json"] for s in wds.WebDataset(spec, shardshuffle=False).decode()]
    assert all(m["pattern"] in PATTERNS and m["pattern"] in m["caption"] for m in metas)
    scene = {"shape": "square", "colour": "red", "row": "middle", "column": "center", "extent": 0.7}
    views = {
        p: np.asarray(draw(**scene, image_size=64, rng=np.random.default_rng(0), pattern=p), dtype=float)
        for p in PATTERNS
    }
    half = {
        p: np.asarray(Image.fromarray(v.astype(np.uint8)).resize((32, 32), Image.BICUBIC), float)
        for p, v in views.items()
    }
    centre = (slice(24, 40), slice(24, 40))
    assert abs(views["striped"][centre] - views["barred"][centre]).mean() > 10  # apart at full resolution
    assert abs(half["striped"][12:20, 12:20] - half["barred"][12:20, 12:20]).mean() < 3  # one shade at half
    assert abs(half["plain"][12:20, 12:20] - half["striped"][12:20, 12:20]).mean() > 10  # plain stays lighter
    with pytest.raises(ValueError, match="patterns go with short captions only"):
        make_synthetic(tmp_path / "long", train_samples=4, captions="long", patterns=True)


@pytest.mark.parametrize("task", ["shapes", "scenes"])
def test_shards_written_by_two_processes_are_the_same_bytes(tmp_path, task):
    options = {"train_samples": 250, "val_samples": 120, "eval_per_class": 1, "shard_size": 100, "task": task}
    make_synthetic(tmp_path / "one", **options)
    make_synthetic(tmp_path / "two", workers=2, **options)
    for split, shards in (("train", 3), ("val", 2)):
        names = sorted(p.name for p in (tmp_path / "one" / split).iterdir())
        assert len(names) == shards + 1  # the shards and sizes.json
        for name in names:
            assert (tmp_path / "two" / split / name).read_bytes() == (tmp_path / "one" / split / name).read_bytes()
    with pytest.raises(ValueError, match="workers >= 1"):
        make_synthetic(tmp_path / "none", workers=0, **options)
