"""The named evaluation sets of the suite and clip_benchmark's conventions for each.

| name | task | class names | class folder -> label |
| --- | --- | --- | --- |
| imagenet1k, imagenet-sketch | classification | ImageNet-1k's 1000 | wnid folder: its place among the wnids |
| imagenet-v2 | classification | ImageNet-1k's 1000 | folders 0 ... 999: their number; or wnid folders |
| imagenet-a, imagenet-r | classification | clip_benchmark's 200-class subsets | wnid: its place in the subset |
| objectnet | classification | the 113 classes that overlap ImageNet | ObjectNet's mapping files (in the dataset) |
| coco, flickr30k | retrieval | - | - |

Everything is read from the installed packages, nothing is copied here: ImageNet's class names and the sorted
wnid list from clip_benchmark (its names equal open_clip's IMAGENET_CLASSNAMES), the -A/-R wnid subsets from
clip_benchmark's `build_dataset` (where they are literals), ObjectNet's classes through clip_benchmark's
`objectnet.get_metadata` on the mapping files that ship with ObjectNet, and the templates as clip_benchmark picks
them (the set's own entry in its templates file, else ImageNet's 80 OpenAI templates).

A clip_benchmark webdataset folder (`wds_<name>`: test/{0..n-1}.tar, classnames.txt,
zeroshot_classification_templates.txt) uses the class names and templates it holds; the conventions above fill
in what it lacks. Class names or templates given by the caller win over both.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from clip_benchmark.datasets import builder, objectnet

from eval import datasets
from eval.datasets import EvalInputError

TASKS = ("classification", "retrieval")


@dataclass(frozen=True)
class Benchmark:
    """A named set: our name (the `dataset` key of results), its task, and clip_benchmark's name for it."""

    name: str
    task: str
    clip_benchmark: str
    subset: str | None = None  # the variable of clip_benchmark's build_dataset holding its wnid subset


BENCHMARKS = {
    b.name: b
    for b in [
        Benchmark("imagenet1k", "classification", "imagenet1k"),
        Benchmark("imagenet-v2", "classification", "imagenetv2"),
        Benchmark("imagenet-sketch", "classification", "imagenet_sketch"),
        Benchmark("imagenet-a", "classification", "imagenet-a", "imagenet_a_wnids"),
        Benchmark("imagenet-r", "classification", "imagenet-r", "imagenet_r_wnids"),
        Benchmark("objectnet", "classification", "objectnet"),
        Benchmark("coco", "retrieval", "mscoco_captions"),
        Benchmark("flickr30k", "retrieval", "flickr30k"),
    ]
}
# clip_benchmark's own names are accepted too
ALIASES = {b.clip_benchmark: b.name for b in BENCHMARKS.values()}


def lookup(name: str) -> Benchmark | None:
    return BENCHMARKS.get(ALIASES.get(name, name))


def clip_benchmark_json(filename: str) -> dict:
    return json.loads((resources.files("clip_benchmark.datasets") / filename).read_text())


@functools.cache
def imagenet_classnames() -> tuple[str, ...]:
    return tuple(clip_benchmark_json("en_classnames.json")["imagenet1k"])


@functools.cache
def wnid_subset(variable: str) -> tuple[str, ...]:
    """A wnid list that clip_benchmark's build_dataset defines inline (imagenet_a_wnids, imagenet_r_wnids), sorted."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(builder.build_dataset)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [variable]:
            return tuple(sorted(ast.literal_eval(node.value)))
    raise EvalInputError(
        f"the installed clip_benchmark defines no {variable} in build_dataset; install clip-benchmark==1.6.2"
    )


def wnids(benchmark: Benchmark) -> tuple[str, ...]:
    """The classes of an ImageNet-style set as WordNet ids, in label order."""
    return wnid_subset(benchmark.subset) if benchmark.subset else tuple(builder.all_imagenet_wordnet_ids)


def classnames(benchmark: Benchmark) -> list[str]:
    """ImageNet's names of the set's classes, masked to its subset as clip_benchmark does."""
    kept = set(wnids(benchmark))
    return [name for wnid, name in zip(builder.all_imagenet_wordnet_ids, imagenet_classnames()) if wnid in kept]


def templates(benchmark: Benchmark) -> list[str]:
    """clip_benchmark's choice: the set's own templates, else ImageNet's."""
    table = clip_benchmark_json("en_zeroshot_classification_templates.json")
    return list(builder.value_from_first_key_found(table, [benchmark.clip_benchmark, "imagenet1k"]))


def imagenet_labels(benchmark: Benchmark, root: Path, names: list[str]) -> dict[str, int]:
    """Class folder -> label for an ImageNet-style tree: wnid folders by their place among the set's wnids,
    numbered folders by their number (datasets.folder_labels)."""
    class_dirs = datasets.class_folders(root)
    if not class_dirs:
        raise EvalInputError(f"{root} has no class folders; point {benchmark.name} at the folder holding them")
    other = [d for d in class_dirs if not datasets.WNID.match(d)]
    if other and any(datasets.NUMBER.match(d) for d in class_dirs):
        return datasets.folder_labels(root, class_dirs, len(names), benchmark.name)
    if other:
        raise EvalInputError(
            f"{root} holds class folders such as {other[0]!r}, but {benchmark.name} reads WordNet-id folders "
            f"(n01440764 ...) or numbered ones (0 ... {len(names) - 1}); point it at its own folder or give classnames"
        )
    index = {wnid: i for i, wnid in enumerate(wnids(benchmark))}
    stray = [d for d in class_dirs if d not in index]
    if stray:
        raise EvalInputError(
            f"class folder {root / stray[0]} ({len(stray)} in all) is not one of the {len(index)} classes of "
            f"{benchmark.name}; point {benchmark.name} at its own folder"
        )
    return {d: index[d] for d in class_dirs}


def objectnet_tree(root: Path) -> tuple[Path, list[str], dict[str, int]]:
    """(images folder, the 113 class names, folder -> label) of ObjectNet as clip_benchmark reads it.

    `root` holds ObjectNet's mapping files (from objectnet-1.0/mappings/) and objectnet-1.0/images/; the
    folders without an ImageNet counterpart are left out.
    """
    mappings = next(
        (m for m in (root, root / "objectnet-1.0" / "mappings") if (m / "objectnet_to_imagenet_1k.json").is_file()),
        None,
    )
    images = next((i for i in (root / "objectnet-1.0" / "images", root / "images") if i.is_dir()), None)
    if mappings is None or images is None:
        raise EvalInputError(
            f"{root} is not ObjectNet as clip_benchmark reads it: it needs objectnet-1.0/images/ and ObjectNet's "
            "mapping files (cp objectnet-1.0/mappings/* into it)"
        )
    try:
        _, _, folder_ids, folder_names = objectnet.get_metadata(mappings)
    except (OSError, KeyError, ValueError) as e:
        raise EvalInputError(f"ObjectNet mapping files in {mappings} cannot be read ({e}); copy them again") from None
    folders = sorted(folder_ids)
    names = [folder_names[f].lower() for f in folders]
    present = {f: i for i, f in enumerate(folders) if (images / f).is_dir()}
    return images, names, present


def open_classification(
    benchmark: Benchmark, path, transform: Callable, split: str = "test", names=None, prompts=None
) -> datasets.ClassificationSet:
    """A named classification set in ImageFolder or clip_benchmark webdataset layout, with its conventions."""
    root = Path(path)
    if not root.is_dir():
        raise EvalInputError(f"{benchmark.name}: {root} is not a folder; give its ImageFolder tree or webdataset")
    if datasets.is_webdataset(root, split):
        found = datasets.find_file(root, ("classnames.txt",))
        if names is None and found is None and benchmark.name == "objectnet":
            raise EvalInputError(f"objectnet webdataset {root} has no classnames.txt; add the one clip_benchmark ships")
        names = names or (str(found) if found else classnames(benchmark))
        prompts = prompts or (None if datasets.find_file(root, datasets.TEMPLATE_FILES) else templates(benchmark))
        return datasets.open_classification(root, transform, names, prompts, split)
    if names is not None:
        return datasets.open_classification(root, transform, names, prompts or templates(benchmark), split)
    if benchmark.name == "objectnet":
        root, names, labels = objectnet_tree(root)
    else:
        names = classnames(benchmark)
        labels = imagenet_labels(benchmark, root, names)
    source = f"clip_benchmark {benchmark.clip_benchmark}"
    prompts, template_source = datasets.resolve_templates(prompts or templates(benchmark), root)
    template_source = source if template_source == "list" else template_source
    info = {"dataset": str(path), "format": "imagefolder", "classnames": source, "templates": template_source}
    return datasets.ClassificationSet(datasets.ImageFolderSet(root, transform, labels), names, prompts, info)
