"""The named sets read as clip_benchmark reads them: the same class names, class subsets, labels and templates
(compared against clip_benchmark's own dataset builders on trees made here), in ImageFolder and webdataset
layouts; folders that do not belong to a set are refused with one line."""

import io
import json
import os
import tarfile

import pytest
from clip_benchmark.datasets import builder, objectnet
from open_clip import zero_shot_metadata
from PIL import Image

from eval import benchmarks, datasets
from eval.datasets import EvalInputError


def tree(root, folders, files=("0.png",)):
    """Class folders with empty image files: torchvision's ImageFolder lists files without opening them."""
    for folder in folders:
        (root / folder).mkdir(parents=True)
        for name in files:
            (root / folder / name).write_bytes(b"")
    return root


def labels_of(evalset) -> dict[str, int]:
    return {path: label for path, label in evalset.dataset.samples}


@pytest.mark.parametrize("name", ["imagenet-a", "imagenet-r"])
def test_200_class_subsets_equal_clip_benchmark(name, tmp_path):
    benchmark = benchmarks.BENCHMARKS[name]
    root = tree(tmp_path / name, benchmarks.wnids(benchmark), files=("0.png", "1.png"))
    ours = benchmarks.open_classification(benchmark, root, transform=None)
    theirs = builder.build_dataset(name, root=str(root), transform=None, download=False)
    assert len(ours.classnames) == 200 and ours.classnames == theirs.classes
    assert labels_of(ours) == dict(theirs.samples)
    assert ours.templates == theirs.templates and len(ours.templates) == 80


def test_imagenet_wnid_tree_equals_clip_benchmark(tmp_path):
    root = tree(tmp_path / "sketch", builder.all_imagenet_wordnet_ids)
    ours = benchmarks.open_classification(benchmarks.lookup("imagenet_sketch"), root, transform=None)
    theirs = builder.build_dataset("imagenet_sketch", root=str(root), transform=None, download=False)
    assert ours.classnames == theirs.classes == list(zero_shot_metadata.IMAGENET_CLASSNAMES)
    assert labels_of(ours) == dict(theirs.samples) and ours.templates == theirs.templates


def test_imagenet_subset_of_folders_keeps_all_classes(tmp_path):
    """A few wnid folders of ImageNet-R: each keeps its label among the 200 (not its place among the few)."""
    subset = benchmarks.wnids(benchmarks.BENCHMARKS["imagenet-r"])
    root = tree(tmp_path / "r", [subset[3], subset[150]])
    ours = benchmarks.open_classification(benchmarks.BENCHMARKS["imagenet-r"], root, transform=None)
    assert len(ours.classnames) == 200 and sorted(labels_of(ours).values()) == [3, 150]


def test_imagenet_v2_numbered_folders_map_by_number(tmp_path):
    """clip_benchmark's ImageNetV2Dataset labels an image by int(its folder name); so do we."""
    root = tree(tmp_path / "v2", [str(i) for i in range(1000)])
    ours = benchmarks.open_classification(benchmarks.lookup("imagenetv2"), root, transform=None)
    assert all(label == int(os.path.basename(os.path.dirname(p))) for p, label in ours.dataset.samples)
    assert ours.classnames == list(zero_shot_metadata.IMAGENET_CLASSNAMES) and len(ours.dataset) == 1000


def write_objectnet(root):
    """A miniature ObjectNet: 4 folders (one without an ImageNet counterpart) and its 4 mapping files."""
    folders = {"alarm_clock": "Alarm clock", "banana": "Banana", "chair": "Chair", "zebra_toy": "Zebra toy"}
    tree(root / "objectnet-1.0" / "images", folders, files=("a.png", "b.png"))
    imagenet = ["tench", "analog clock", "digital clock", "banana", "folding chair"]
    (root / "folder_to_objectnet_label.json").write_text(json.dumps(folders))
    mapped = {"Alarm clock": "analog clock; digital clock", "Banana": "banana", "Chair": "folding chair"}
    (root / "objectnet_to_imagenet_1k.json").write_text(json.dumps(mapped))
    (root / "pytorch_to_imagenet_2012_id.json").write_text(json.dumps({str(i): 4 - i for i in range(5)}))
    (root / "imagenet_to_label_2012_v2").write_text("\n".join(imagenet) + "\n")
    return root


def test_objectnet_equals_clip_benchmark(tmp_path):
    root = write_objectnet(tmp_path / "objectnet")
    ours = benchmarks.open_classification(benchmarks.BENCHMARKS["objectnet"], root, transform=None)
    theirs = objectnet.ObjectNetDataset(str(root), transform=None)
    assert ours.classnames == theirs.classes == ["alarm clock", "banana", "chair"]
    assert labels_of(ours) == {p: theirs.label_map[os.path.basename(os.path.dirname(p))] for p, _ in theirs.samples}
    assert len(ours.dataset) == 6 and ours.templates == benchmarks.templates(benchmarks.BENCHMARKS["imagenet1k"])


def write_wds(root, labels):
    """A clip_benchmark classification webdataset of blank images with the given labels, without names files."""
    (root / "test").mkdir(parents=True)
    with tarfile.open(root / "test" / "0.tar", "w") as tar:
        for i, label in enumerate(labels):
            image = io.BytesIO()
            Image.new("RGB", (8, 8)).save(image, format="PNG")
            for suffix, data in (("png", image.getvalue()), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"s{i:04d}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (root / "test" / "nshards.txt").write_text("1\n")
    return root


def test_webdataset_uses_its_own_files_then_the_conventions(tmp_path):
    benchmark = benchmarks.BENCHMARKS["imagenet-r"]
    root = write_wds(tmp_path / "wds_imagenet-r", [0, 199])
    bare = benchmarks.open_classification(benchmark, root, transform=None)
    assert bare.info["format"] == "webdataset" and bare.classnames == benchmarks.classnames(benchmark)
    assert bare.templates == benchmarks.templates(benchmark)
    (root / "classnames.txt").write_text("\n".join(f"class {i}" for i in range(200)) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("a {c}.\n")
    own = benchmarks.open_classification(benchmark, root, transform=None)
    assert own.classnames[199] == "class 199" and own.templates == ["a {c}."]
    given = benchmarks.open_classification(benchmark, root, transform=None, names=["x"] * 200, prompts=["b {c}."])
    assert given.classnames == ["x"] * 200 and given.templates == ["b {c}."]


@pytest.mark.parametrize(
    "name, make, words",
    [
        ("imagenet-r", lambda r: tree(r, ["n01440764"]), ["n01440764", "not one of the 200 classes of imagenet-r"]),
        ("imagenet1k", lambda r: tree(r, ["n01440764", "cat"]), ["such as 'cat'", "WordNet-id folders"]),
        ("imagenet-v2", lambda r: tree(r, ["0", "1"]), ["numbered 0 ... 1", "folders 0 ... 999"]),
        ("objectnet", lambda r: tree(r, ["a"]), ["objectnet-1.0/images", "mapping files"]),
        ("objectnet", lambda r: write_wds(r, [0]), ["no classnames.txt"]),
        ("imagenet-a", lambda r: r.mkdir(), ["has no class folders"]),
    ],
    ids=["stray wnid", "mixed names", "few numbers", "no mappings", "objectnet wds", "empty"],
)
def test_folders_of_another_set_are_refused(name, make, words, tmp_path):
    root = tmp_path / "data"
    make(root)
    with pytest.raises(EvalInputError) as error:
        benchmarks.open_classification(benchmarks.BENCHMARKS[name], root, transform=None)
    assert "\n" not in str(error.value) and all(w in str(error.value) for w in words), str(error.value)


def test_clip_benchmark_names_are_accepted():
    assert benchmarks.lookup("imagenetv2").name == "imagenet-v2"
    assert benchmarks.lookup("mscoco_captions").name == "coco" and benchmarks.lookup("cifar10") is None
    assert datasets.WNID.match(benchmarks.wnids(benchmarks.BENCHMARKS["imagenet-a"])[0])
