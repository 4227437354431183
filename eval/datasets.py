"""Readers for evaluation sets: ImageFolder trees, clip_benchmark webdatasets, image-caption CSVs.

Classification sets yield `(image [3, H, W] | None, label, name)`; `None` marks an unreadable image, which
`collate_skipping` drops and counts, so one bad file never stops an evaluation. `make_loader` reads one rank's
slice of a set (eval.sharding).

Class names and templates come from, in order: the caller (a list, a file, `imagenet1k`, `openai`, `simple`),
then `classnames.txt` / `templates.txt` (or clip_benchmark's `zeroshot_classification_templates.txt`) inside the
dataset folder or beside it, then ImageNet-1k's names when the folder holds exactly 1000 WordNet-id folders.
Class folders map to labels by sorted name, or by their number when every folder is a number (ImageNet-V2's
0 ... 999, which sorted as text would put '10' before '2').
"""

import csv
import io
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import webdataset as wds
from open_clip import zero_shot_metadata
from PIL import Image

from eval.sharding import Shard

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
WNID = re.compile(r"^n\d{8}$")
NUMBER = re.compile(r"^[0-9]+$")
TEMPLATE_FILES = ("templates.txt", "zeroshot_classification_templates.txt")
BUILTIN_TEMPLATES = {
    "openai": zero_shot_metadata.OPENAI_IMAGENET_TEMPLATES,
    "simple": zero_shot_metadata.SIMPLE_IMAGENET_TEMPLATES,
}


class EvalInputError(ValueError):
    """Bad evaluation input; the message is one line naming the problem and the fix."""


@dataclass
class ShardList:
    """A webdataset read in shard order: its tar files and `decode(sample) -> tuple` for each sample."""

    urls: list[str]
    decode: Callable


@dataclass
class ClassificationSet:
    """A dataset of `(image, label, name)` (map-style, or a ShardList) plus what is known about its classes."""

    dataset: torch.utils.data.Dataset | ShardList
    classnames: list[str]
    templates: list
    info: dict = field(default_factory=dict)


def load_image(path_or_bytes, transform: Callable):
    """Decode one image to RGB and transform it; None when the file cannot be read as an image."""
    try:
        source = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
        with Image.open(source) as image:
            return transform(image.convert("RGB"))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def class_folders(root: Path) -> list[str]:
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


class ImageFolderSet(torch.utils.data.Dataset):
    """ImageNet-style tree `ROOT/<class_dir>/<image>`; `labels` maps the class folders to read to their labels
    (default: every folder, labelled in sorted order)."""

    def __init__(self, root: Path, transform: Callable, labels: dict[str, int] | None = None):
        self.root, self.transform = Path(root), transform
        self.class_dirs = class_folders(self.root) if labels is None else sorted(labels)
        if not self.class_dirs:
            raise EvalInputError(f"{root} has no class folders; expected ImageFolder layout ROOT/<class>/<image>")
        labels = labels or {d: i for i, d in enumerate(self.class_dirs)}
        self.samples = []
        for d in self.class_dirs:
            files = sorted(p for p in (self.root / d).iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
            if not files:
                raise EvalInputError(
                    f"class folder {self.root / d} has no images ({'/'.join(IMAGE_EXTENSIONS)}); "
                    "remove it or add its images"
                )
            self.samples += [(str(f), labels[d]) for f in files]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        return load_image(path, self.transform), label, path


def folder_labels(root: Path, class_dirs: list[str], num_names: int, source: str) -> dict[str, int]:
    """Each class folder's label: its number when every folder is a number, else its place in sorted order.

    Numbered folders must be exactly 0 ... num_names-1 (one per class name); a tree mixing numbered and named
    folders, or whose numbers do not match the class names, is refused rather than paired by guesswork.
    """
    numbered = [d for d in class_dirs if NUMBER.match(d)]
    if numbered and len(numbered) < len(class_dirs):
        named = next(d for d in class_dirs if not NUMBER.match(d))
        raise EvalInputError(
            f"{root} mixes numbered class folders (e.g. {numbered[0]!r}) with named ones (e.g. {named!r}); "
            "an ImageFolder tree uses one kind: move the other folders out"
        )
    if not numbered:
        if num_names != len(class_dirs):
            raise EvalInputError(
                f"{num_names} class names from {source} but {len(class_dirs)} classes in {root}; "
                "give one name per class folder, in sorted folder order"
            )
        return {d: i for i, d in enumerate(class_dirs)}
    numbers = sorted(int(d) for d in numbered)
    if numbers != list(range(num_names)):
        raise EvalInputError(
            f"the {len(numbered)} class folders of {root} are numbered {numbers[0]} ... {numbers[-1]}"
            f"{' with repeats' if len(set(numbers)) < len(numbers) else ''}, but the {num_names} class names "
            f"from {source} need exactly the folders 0 ... {num_names - 1}; give the class names of this tree "
            "or fix its folders"
        )
    return {d: int(d) for d in numbered}


def collate_skipping(batch):
    """Stack the readable samples of a batch -> (images [b,3,H,W] | None, targets (list of b), names of skipped)."""
    kept = [s for s in batch if s[0] is not None]
    skipped = [s[2] for s in batch if s[0] is None]
    images = torch.stack([s[0] for s in kept]) if kept else None
    return images, [s[1] for s in kept], skipped


def read_lines(path: Path) -> list[str]:
    return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]


def find_file(root: Path, names) -> Path | None:
    """The first of `names` inside `root`, then beside it (the synthetic set keeps them inside)."""
    for folder in (root, root.parent):
        for name in names:
            if (folder / name).is_file():
                return folder / name
    return None


def resolve_templates(spec, root: Path) -> tuple[list, str]:
    """Templates as a list of `str` with `{c}` (or `{}`) or callables, and where they came from."""
    if spec is None:
        found = find_file(root, TEMPLATE_FILES)
        spec = str(found) if found else "openai"
    if isinstance(spec, (list, tuple)):
        templates, source = list(spec), "list"
    elif spec in BUILTIN_TEMPLATES:
        templates, source = list(BUILTIN_TEMPLATES[spec]), spec
    elif Path(spec).is_file():
        templates, source = read_lines(Path(spec)), str(spec)
    else:
        raise EvalInputError(f"templates {spec!r} is neither a file nor one of {sorted(BUILTIN_TEMPLATES)}")
    bad = [t for t in templates if isinstance(t, str) and "{c}" not in t and "{}" not in t]
    if not templates or bad:
        raise EvalInputError(
            f"templates from {source}: every line needs a {{c}} placeholder, got {bad[:1] or 'no templates'}"
        )
    return templates, source


def fill_template(template, classname: str) -> str:
    if callable(template):
        return template(classname)
    return template.format(c=classname) if "{c}" in template else template.format(classname)


def parse_names_file(path: Path) -> tuple[list[str], dict[str, int] | None]:
    """Names file: one name a line, or `wnid<TAB or space>name` lines (ImageNet-21K style, file order kept)."""
    lines = read_lines(path)
    pairs = [line.split(None, 1) for line in lines]
    if lines and all(len(p) == 2 and WNID.match(p[0]) for p in pairs):
        return [p[1].strip() for p in pairs], {p[0]: i for i, p in enumerate(pairs)}
    return lines, None


def resolve_classnames(spec, root: Path, class_dirs: list[str] | None) -> tuple[list[str], dict[str, int] | None, str]:
    """Class names, each class folder's label (None for a webdataset) and where the names came from.

    A plain list names the classes in label order: one name per class folder, sorted folder order (as ImageNet's
    sorted wnids map to open_clip's IMAGENET_CLASSNAMES) or the folders' numbers. A wnid-keyed file defines the
    classifier's classes itself, so an ImageNet-21K folder may hold images of only some of its 21,841 classes.
    `class_dirs` is None for a webdataset, whose labels are checked against the names while reading.
    """
    all_wnids = bool(class_dirs) and all(WNID.match(d) for d in class_dirs)
    if spec is None:
        found = find_file(root, ("classnames.txt",))
        spec = str(found) if found else ("imagenet1k" if all_wnids and len(class_dirs) == 1000 else None)
    if spec is None:
        raise EvalInputError(
            f"no class names for {root}: pass --classnames FILE (or imagenet1k) "
            "or put classnames.txt in the dataset folder"
        )
    wnid_labels, source = None, str(spec)
    if isinstance(spec, (list, tuple)):
        names, source = list(spec), "list"
    elif spec == "imagenet1k":
        names = list(zero_shot_metadata.IMAGENET_CLASSNAMES)
    elif Path(spec).is_file():
        names, wnid_labels = parse_names_file(Path(spec))
    else:
        raise EvalInputError(f"class names {spec!r} is neither a file nor 'imagenet1k'")
    if class_dirs is None:
        return names, None, source
    if wnid_labels is None:
        return names, folder_labels(root, class_dirs, len(names), source), source
    missing = [d for d in class_dirs if d not in wnid_labels]
    if missing:
        raise EvalInputError(
            f"class folder {missing[0]} ({len(missing)} in all) is not in names file {spec}; "
            "use the names file that matches this dataset"
        )
    return names, {d: wnid_labels[d] for d in class_dirs}, source


def wds_shards(root: Path, split: str) -> list[str]:
    """Tar shards of a clip_benchmark webdataset (`ROOT/SPLIT/{0..n-1}.tar` + nshards.txt) or of a folder."""
    folder = root / split if (root / split).is_dir() else root
    nshards = folder / "nshards.txt"
    if nshards.is_file():
        return [str(folder / f"{i}.tar") for i in range(int(nshards.read_text().strip()))]
    return sorted(str(p) for p in folder.glob("*.tar"))


def is_webdataset(root: Path, split: str = "test") -> bool:
    return root.is_dir() and bool(wds_shards(root, split))


def image_bytes(sample: dict) -> bytes | None:
    return next((sample[k] for k in ("webp", "png", "jpg", "jpeg") if k in sample), None)


def decode_labelled(transform: Callable) -> Callable:
    """clip_benchmark classification sample {image, cls} -> (image | None, label (-1 without cls), key)."""

    def decode(sample):
        label = int(sample["cls"].decode()) if "cls" in sample else -1
        raw = image_bytes(sample)
        return (load_image(raw, transform) if raw is not None else None), label, sample["__key__"]

    return decode


def open_classification(
    path, transform: Callable, classnames=None, templates=None, split: str = "test"
) -> ClassificationSet:
    """An ImageFolder tree or a clip_benchmark-format webdataset, with its class names and templates."""
    root = Path(path)
    if not root.is_dir():
        raise EvalInputError(f"dataset {root} is not a folder; pass an ImageFolder tree or a webdataset folder")
    templates, template_source = resolve_templates(templates, root)
    if is_webdataset(root, split):
        names, _, name_source = resolve_classnames(classnames, root, None)
        dataset = ShardList(wds_shards(root, split), decode_labelled(transform))
        kind = "webdataset"
    else:
        names, labels, name_source = resolve_classnames(classnames, root, class_folders(root))
        dataset, kind = ImageFolderSet(root, transform, labels), "imagefolder"
    info = {"dataset": str(path), "format": kind, "classnames": name_source, "templates": template_source}
    return ClassificationSet(dataset, names, templates, info)


class CaptionCSVSet(torch.utils.data.Dataset):
    """CSV/TSV of image-caption pairs, one row per caption; the rows of one image become its caption list.

    Image paths are relative to the CSV's folder unless absolute (open_clip's `filepath`/`title` columns).
    """

    def __init__(
        self,
        path: Path,
        transform: Callable,
        img_key: str = "filepath",
        caption_key: str = "title",
        separator: str | None = None,
    ):
        self.transform = transform
        separator = separator or ("\t" if path.suffix == ".tsv" else ",")
        with open(path, newline="") as f:
            reader = csv.DictReader(f, delimiter=separator)
            for key, flag in ((img_key, "--csv-img-key"), (caption_key, "--csv-caption-key")):
                if key not in (reader.fieldnames or []):
                    raise EvalInputError(
                        f"{path} has no column {key!r} (columns: {reader.fieldnames}); pass {flag} or --csv-separator"
                    )
            groups: dict[str, list[str]] = {}
            empty = []  # row numbers (the header is row 1) of captions with no text: skipped and counted
            for number, row in enumerate(reader, start=2):
                if not (row[caption_key] or "").strip():
                    empty.append(number)
                    continue
                groups.setdefault(row[img_key], []).append(row[caption_key])
        self.items = [(str(path.parent / image), captions) for image, captions in groups.items()]
        self.empty_captions = len(empty)
        if empty:
            log.warning("%s: rows with an empty caption skipped: %d (the first is row %d)", path, len(empty), empty[0])

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        image, captions = self.items[i]
        return load_image(image, self.transform), captions, image


def open_retrieval(
    path,
    transform: Callable,
    split: str = "test",
    img_key: str = "filepath",
    caption_key: str = "title",
    separator: str | None = None,
) -> CaptionCSVSet | ShardList:
    """Image-caption pairs yielding `(image | None, captions, name)` from a CSV/TSV or a webdataset folder.

    Webdataset samples hold one image and a `txt` with one caption a line (clip_benchmark's retrieval format).
    """
    root = Path(path)
    if root.is_file() and root.suffix in (".csv", ".tsv"):
        return CaptionCSVSet(root, transform, img_key, caption_key, separator)
    if not is_webdataset(root, split):
        raise EvalInputError(f"{root} is neither a .csv/.tsv file nor a folder of .tar shards")

    def decode(sample):
        # empty lines stay in: retrieval.embed_pairs drops and counts them (captions_empty), as the CSV reader does
        captions = sample.get("txt", b"").decode().splitlines()
        raw = image_bytes(sample)
        image = load_image(raw, transform) if raw is not None and any(c.strip() for c in captions) else None
        return image, captions, sample["__key__"]

    return ShardList(wds_shards(root, split), decode)


def make_loader(dataset, batch_size: int, workers: int = 0, shard: Shard | None = None) -> torch.utils.data.DataLoader:
    """A loader over this rank's slice of `dataset` (all of it for one process), in dataset order.

    A webdataset gets at most one worker per shard it reads (each worker reads whole shards).
    """
    shard = shard or Shard()
    if isinstance(dataset, ShardList):
        urls, split_samples = shard.split_urls(dataset.urls)
        workers = min(workers, len(urls))
        stream = wds.WebDataset(urls, shardshuffle=False, nodesplitter=None, empty_check=False)
        if split_samples:
            # every rank reads the same stream (worker k of each rank the same shards) and keeps its share
            stream = stream.compose(shard.every_nth)
        dataset = stream.map(dataset.decode)
    elif shard.distributed:
        dataset = torch.utils.data.Subset(dataset, shard.index_range(len(dataset)))
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        shuffle=False,
        collate_fn=collate_skipping,
        persistent_workers=False,
    )
