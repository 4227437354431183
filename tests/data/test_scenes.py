"""data.scenes: the concepts' frequencies follow the Zipf law the module states, captions name what is drawn, pairs
never touch, the zero-shot set has its 120 classes, and a seed gives the same data."""

import json
import tarfile

import numpy as np
import pytest

from data import make_synthetic
from data.scenes import COLOURS, SHAPES, ZIPF, random_scene, zipf_order

ORDERS = {"colour": zipf_order(COLOURS, 0), "shape": zipf_order(SHAPES, 1)}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    """The objects of 40,000 scenes (seed 0), drawn once for both concepts' frequencies."""
    rng = np.random.default_rng(0)
    return [obj for _ in range(40_000) for obj in random_scene(rng, ORDERS)["objects"]]


@pytest.mark.parametrize("concept, names", [("colour", COLOURS), ("shape", SHAPES)])
def test_concept_frequencies_follow_the_stated_zipf_law(objects, concept, names):
    counts = dict.fromkeys(names, 0)
    for obj in objects:
        counts[obj[concept]] += 1
    ranked = np.array([counts[name] for name in ORDERS[concept]], dtype=float)
    slope = np.polyfit(np.log(np.arange(1, len(ranked) + 1)), np.log(ranked), 1)[0]
    assert slope == pytest.approx(-ZIPF, abs=0.05)
    assert ranked[0] / ranked[-1] == pytest.approx(len(ranked) ** ZIPF, rel=0.25)  # the rarest is K^ZIPF x rarer


def test_captions_name_every_object_and_pairs_sit_in_opposite_cells(tmp_path):
    make_synthetic(tmp_path, train_samples=400, eval_per_class=1, val_samples=0, task="scenes", shard_size=400)
    with tarfile.open(tmp_path / "train" / "00000.tar") as tar:
        metas = [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")]
    assert len(metas) == 400 and {m["count"] for m in metas} == {1, 2}
    for meta in metas:
        for obj in meta["objects"]:
            assert obj["colour"] in meta["caption"] and obj["shape"] in meta["caption"]
        if len(meta["objects"]) == 2:
            a, b = meta["objects"]
            assert (a["row"] != b["row"]) + (a["column"] != b["column"]) == 1
            assert {a["row"], b["row"]} == {"top", "bottom"} or {a["column"], b["column"]} == {"left", "right"}
    classes = (tmp_path / "eval" / "classnames.txt").read_text().splitlines()
    assert len(classes) == len(COLOURS) * len(SHAPES) == 120 and "red star" in classes


def test_a_seed_gives_the_same_shards_and_another_seed_other_ones(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        make_synthetic(tmp_path / name, train_samples=50, eval_per_class=0, val_samples=0, task="scenes", seed=seed)
    same = [(tmp_path / n / "train" / "00000.tar").read_bytes() for n in "abc"]
    assert same[0] == same[1] != same[2]


def test_the_scenes_task_refuses_the_shapes_options(tmp_path):
    with pytest.raises(ValueError, match="scenes task has its own"):
        make_synthetic(tmp_path, train_samples=10, task="scenes", patterns=True)
    with pytest.raises(ValueError, match="task 'scene' is not one of shapes, scenes"):
        make_synthetic(tmp_path, train_samples=10, task="scene")
