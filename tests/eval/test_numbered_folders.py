"""Class folders named by number (ImageNet-V2's raw layout 0 ... 999) map to their number, not to their place in
text order ('10' sorts before '2'); layouts that cannot be paired with the class names without guessing are
refused with one line."""

import shutil

import pytest

from eval import checkpoint, datasets, zeroshot
from eval.datasets import EvalInputError
from tests.eval import evalsets


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """The synthetic 24-class ImageFolder, 2 images a class."""
    return evalsets.synthetic_eval(tmp_path_factory.mktemp("named"), per_class=2)


@pytest.fixture(scope="module")
def numbered(named, tmp_path_factory):
    """The same images in folders 0 ... 23 (folder i = class i of classnames.txt) and the names file beside them."""
    root = tmp_path_factory.mktemp("numbered") / "val"
    evalsets.renamed_copy(named, root, [str(i) for i in range(24)])
    shutil.copy(named / "classnames.txt", root.parent / "classnames.txt")
    return root


def test_numbered_folders_map_by_their_number(named, numbered):
    evalset = datasets.open_classification(numbered, lambda image: image, str(named / "classnames.txt"), "simple")
    labels = {path.split("/")[-2]: label for path, label in evalset.dataset.samples}
    assert labels == {str(i): i for i in range(24)}
    assert labels["10"] == 10 and labels["2"] == 2, "text order would give '10' label 2 and '2' label 12"
    names = datasets.read_lines(named / "classnames.txt")
    assert evalset.classnames == names


def test_numbered_layout_scores_the_same_as_the_named_one(named, numbered):
    """Every image paired with the same class name: the same zero-shot numbers in both layouts."""
    loaded = checkpoint.load_open_clip("tiny-s", None, "cpu")
    kwargs = dict(tokenizer=loaded.tokenizer, transform=loaded.transform, templates="simple", batch_size=16)
    from_names = zeroshot.evaluate(loaded.model, dataset=str(named), **kwargs)
    from_numbers = zeroshot.evaluate(loaded.model, dataset=str(numbered), **kwargs)
    for key in ("top1", "top5", "mean_per_class_recall", "num_images"):
        assert from_numbers[key] == from_names[key], key
    assert from_numbers["num_images"] == 48


def numbered_tree(root, folders):
    for name in folders:
        (root / name).mkdir(parents=True)
        (root / name / "0.png").write_bytes(b"")
    return root


@pytest.mark.parametrize(
    "folders, words",
    [
        (["0", "1", "2", "cat"], ["mixes numbered class folders", "'cat'"]),
        ([str(i) for i in range(1, 5)], ["numbered 1 ... 4", "folders 0 ... 3"]),
        (["0", "1", "3", "4"], ["numbered 0 ... 4", "folders 0 ... 3"]),
        (["0", "1", "2"], ["3 class folders", "folders 0 ... 3"]),
        (["0", "1", "01", "2"], ["numbered 0 ... 2 with repeats"]),
    ],
    ids=["mixed", "one-based", "gap", "too few", "repeats"],
)
def test_ambiguous_numbered_layouts_are_refused(folders, words, tmp_path, capsys):
    root = numbered_tree(tmp_path / "val", folders)
    names = ["a", "b", "c", "d"]
    with pytest.raises(EvalInputError) as error:
        datasets.open_classification(root, lambda image: image, names)
    assert "\n" not in str(error.value) and all(w in str(error.value) for w in words), str(error.value)
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    args = ["--open-clip-model", "tiny-s", "--dataset", str(root), "--classnames", str(tmp_path / "names.txt")]
    with pytest.raises(SystemExit) as exit_:
        zeroshot.main([*args, "--device", "cpu", "--out", str(tmp_path / "out.json")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and "\n" not in err
    assert not (tmp_path / "out.json").exists()


def test_imagenet1k_names_on_numbered_folders(tmp_path):
    """`--classnames imagenet1k` on ImageNet-V2's 0 ... 999: folder '10' is class 10 (not 2 as in text order)."""
    root = numbered_tree(tmp_path / "v2", [str(i) for i in range(1000)])
    names, labels, source = datasets.resolve_classnames("imagenet1k", root, datasets.class_folders(root))
    assert source == "imagenet1k" and len(names) == 1000
    assert labels == {str(i): i for i in range(1000)} and datasets.class_folders(root)[2] == "10"
