"""The evaluation suite in one process: a YAML list plus --dataset, named sets with clip_benchmark's conventions
and custom ones in every layout, one JSON per set with the model summary, one CSV per model; bad input is one
line and writes nothing."""

import csv
import json
import shutil

import numpy as np
import pytest
import yaml

from eval import benchmarks, scaling_io, suite
from tests.eval import evalsets
from tests.eval.test_benchmarks import write_objectnet

CPU = ["--workers", "0", "--device", "cpu"]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """A run with one checkpoint, and a suite of: ImageNet-R as 2 of its 200 wnid folders (synthetic images), the
    synthetic set as a custom ImageFolder, caption pairs as a clip_benchmark retrieval webdataset."""
    root = tmp_path_factory.mktemp("suite")
    synthetic = evalsets.synthetic_eval(root / "synthetic", per_class=2)
    subset = benchmarks.wnids(benchmarks.BENCHMARKS["imagenet-r"])
    evalsets.renamed_copy(synthetic, root / "imagenet-r", [subset[0], subset[7]])
    (root / "one_template.txt").write_text("a photo of a {c}.\n")
    pairs = evalsets.caption_pairs(root / "pairs", count=6, broken=None)
    spec = {
        "imagenet-r": {"path": str(root / "imagenet-r"), "templates": str(root / "one_template.txt")},
        "shapes": str(synthetic),
    }
    (root / "suite.yaml").write_text(yaml.safe_dump({"datasets": spec}))
    return {"root": root, "suite": root / "suite.yaml", "run": evalsets.tiny_run(root / "run"), "pairs": pairs}


def test_suite_writes_a_json_per_set_and_a_csv(sets, capsys):
    results = suite.main(
        [str(sets["run"]), "--suite", str(sets["suite"]), "--dataset", f"coco={sets['pairs'] / 'wds'}", *CPU]
    )
    out = sets["run"] / "eval" / "step_00000005"
    assert capsys.readouterr().out.strip() == f"results: {out / 'results.csv'}"
    assert [r["dataset"] for r in results] == ["imagenet-r", "shapes", "coco"]
    for result in results:
        assert json.loads((out / f"{result['dataset']}.json").read_text()) == result
        assert result["step"] == 5 and result["samples_seen"] == 160 and result["model"] == "tiny-s"
        assert result["params"] > result["params_without_token_embedding"] > 0 and result["gmacs_per_sample"] > 0
        assert result["image_attention"] == result["text_attention"] == "softmax" and result["world_size"] == 1
    imagenet_r, shapes, coco = results
    assert imagenet_r["task"] == "classification" and imagenet_r["num_classes"] == 200
    assert imagenet_r["num_images"] == 4 and imagenet_r["num_templates"] == 1
    assert imagenet_r["classnames"] == "clip_benchmark imagenet-r"
    assert (
        shapes["num_classes"] == 24
        and shapes["num_images"] == 48
        and shapes["dataset_path"] == str(sets["root"] / "synthetic" / "eval")
    )
    assert coco["task"] == "retrieval" and coco["num_captions"] == 12 and 0 <= coco["text_to_image_R@1"] <= 1
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["dataset"] for r in rows] == ["imagenet-r", "shapes", "coco"]
    assert float(rows[1]["top1"]) == shapes["top1"] and rows[2]["top1"] == ""
    assert float(rows[2]["text_to_image_R@1"]) == coco["text_to_image_R@1"]
    # eval.scaling reads each JSON as one point with its model summary
    points = scaling_io.load_points([str(out / "imagenet-r.json"), str(out / "shapes.json")])
    assert list(points["dataset"]) == ["imagenet-r", "shapes"]
    assert list(scaling_io.evaluate(points, "compute")) == [shapes["gmacs_per_sample"] * 160] * 2
    # --y error@NAME: one data set's points; plain `error` over several data sets is refused
    on_shapes = scaling_io.evaluate(points, "error@shapes")
    assert np.isnan(on_shapes[0]) and on_shapes[1] == 1 - shapes["top1"]
    assert scaling_io.evaluate(points, "error@imagenet-r")[0] == 1 - imagenet_r["top1"]
    with pytest.raises(scaling_io.ScalingInputError, match=r"2 data sets .*imagenet-r, shapes.*error@imagenet-r"):
        scaling_io.evaluate(points, "error")
    with pytest.raises(scaling_io.ScalingInputError, match=r"no evaluation on data set 'objectnet'.*imagenet-r"):
        scaling_io.evaluate(points, "error@objectnet")
    # results.csv is one point per data set too, retrieval metrics named with their own "@"
    table = scaling_io.load_points(str(out / "results.csv"))
    assert scaling_io.evaluate(table, "text_to_image_R@1@coco")[2] == coco["text_to_image_R@1"]
    # a training run folder: its own evaluations in metrics.jsonl and the suite's under RUN/eval/<checkpoint>/
    (sets["run"] / "metrics.jsonl").write_text(json.dumps({"step": 5, "samples_seen": 160, "zeroshot/top1": 0.5}))
    run = scaling_io.load_points(str(sets["run"]), y="error@shapes", points="all")
    assert list(run["dataset"]) == ["shapes"] and scaling_io.evaluate(run, "error@shapes")[0] == 1 - shapes["top1"]
    assert scaling_io.evaluate(run, "compute")[0] == shapes["gmacs_per_sample"] * 160


def test_dataset_option_replaces_a_suite_entry_and_names_its_task(sets, tmp_path):
    entries = suite.read_suite(str(sets["suite"]), [f"shapes={sets['pairs'] / 'pairs.tsv'}"])
    assert [(e.name, e.task) for e in entries] == [("imagenet-r", "classification"), ("shapes", "retrieval")]
    assert suite.read_suite(None, [f"x={sets['pairs'] / 'wds'}"])[0].task == "retrieval"  # its dataset_type.txt
    assert suite.read_suite(None, [f"imagenetv2={sets['root']}"])[0].name == "imagenet-v2"


def bad_suite(kind: str, sets, tmp_path) -> tuple[list[str], str]:
    """Arguments of a suite that is wrong in one way, and words its error must hold."""
    path, good = tmp_path / "bad.yaml", str(sets["root"] / "synthetic" / "eval")
    cases = {
        "top key": ({"datasets": {"a": good}, "batch_size": 8}, "must hold one key, datasets"),
        "option": ({"datasets": {"a": {"path": good, "classes": "x"}}}, "any of task, classnames"),
        "name": ({"datasets": {"a b": good}}, "must be letters, digits"),
        "missing": ({"datasets": {"a": str(tmp_path / "nope")}}, "does not exist"),
        "task": ({"datasets": {"coco": {"path": good, "task": "classification"}}}, "must be retrieval"),
        "layout": ({"datasets": {"a": good, "imagenet-r": good}}, "imagenet-r reads WordNet-id folders"),
    }
    if kind in cases:
        spec, words = cases[kind]
        path.write_text(yaml.safe_dump(spec))
        return [str(sets["run"]), "--suite", str(path)], words
    if kind == "pair":
        return [str(sets["run"]), "--dataset", good], "must be NAME=PATH"
    if kind == "empty":
        return [str(sets["run"])], "no data sets"
    if kind == "out is a file":
        (tmp_path / "file").write_text("")
        return [str(sets["run"]), "--dataset", f"a={good}", "--out", str(tmp_path / "file")], "is a file"
    return ["--open-clip-model", "tiny-s", "--dataset", f"a={good}"], "needs --out"


@pytest.mark.parametrize(
    "kind",
    [
        "top key",
        "option",
        "name",
        "missing",
        "task",
        "layout",
        "pair",
        "empty",
        "out is a file",
        "open_clip without --out",
    ],
)
def test_bad_suite_is_one_line_and_writes_nothing(kind, sets, tmp_path, capsys):
    args, words = bad_suite(kind, sets, tmp_path)
    out = [] if "--out" in args or words == "needs --out" else ["--out", str(tmp_path / "out")]
    before = sorted(p.name for p in sets["run"].iterdir())
    with pytest.raises(SystemExit) as exit_:
        suite.main([*args, *CPU, *out])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and "\n" not in err and words in err, err
    assert not (tmp_path / "out").exists() and sorted(p.name for p in sets["run"].iterdir()) == before


def test_objectnet_layout_through_the_suite(sets, tmp_path):
    """ObjectNet's tree and mapping files: 3 of its 4 folders have an ImageNet counterpart and are scored."""
    root = write_objectnet(tmp_path / "objectnet")
    image = next((sets["root"] / "synthetic" / "eval" / "red_circle").iterdir())
    for path in (root / "objectnet-1.0" / "images").glob("*/*.png"):
        shutil.copy(image, path)
    (tmp_path / "t.txt").write_text("a {c}.\n")
    spec = {"datasets": {"objectnet": {"path": str(root), "templates": str(tmp_path / "t.txt")}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    (result,) = suite.main([str(sets["run"]), "--suite", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o"), *CPU])
    assert result["num_classes"] == 3 and result["num_images"] == 6 and result["dataset"] == "objectnet"
    assert result["num_templates"] == 1 and json.loads((tmp_path / "o" / "objectnet.json").read_text()) == result
