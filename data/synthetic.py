"""The embedded default dataset: procedurally drawn shapes with captions that describe them.

    python -m data.synthetic OUT [--train-samples 10000] [--val-samples 1000] [--eval-per-class 20]
                                 [--seed 0] [--image-size 32] [--shard-size 1000] [--captions short|long]
                                 [--extent 0.35 0.75] [--patterns] [--task shapes|scenes]

`--task scenes` writes data.scenes's task instead (the main job's: concepts with Zipf frequencies, 120 zero-shot
classes; its docstring); the rest of this text is the `shapes` task.

Every image shows one shape (circle, square, triangle, cross) in one of six colours, in one of
nine cells of a 3 x 3 grid (jittered), of a size drawn uniformly between 35% and 75% of the image
side (`--extent`), on a random grey background. Captions name colour and shape in varied wording, most also
position and size ("small" below 55% of the side, "large" above). The output is fully determined by
the arguments (each shard and each eval class has its own seeded stream).

Difficulty is graded, so that more compute and bigger models keep paying off instead of one factor
flipping at once: colour is a property of single patches (learnt first), position is which patches
(easy for a ViT), size is how many, and shape is the arrangement of several patches, harder the
smaller the shape (a small shape covers a few pixels). The validation split has the training
distribution; the zero-shot set asks for colour and shape only.

`--captions long` (data.synthetic_long) writes, in the same layout, images of three to six smaller shapes whose
captions describe each shape in turn (60-300 CLIP tokens, "shapes" in the JSON instead of one shape's fields),
the same zero-shot set, and a retrieval set OUT/retrieval/test/ (clip_benchmark's retrieval webdataset, read by
`python -m eval.retrieval ... --dataset OUT/retrieval`) of 24 x eval-per-class images in groups of four that
differ only in the last shape, described after the 77th token. The default (`short`) never reaches that code.

On-disk layout (the contract with the trainer and the zero-shot evaluation):

    OUT/train/00000.tar ... 0000K.tar   webdataset shards as img2dataset writes them; each sample
                                        is KEY.jpg (RGB JPEG), KEY.txt (UTF-8 caption) and KEY.json
                                        ({"key", "caption", "colour", "shape", "position", "size"}),
                                        KEY = 9 digits, unique over the whole set.
    OUT/train/sizes.json                {"00000.tar": n0, ...} samples per shard (open_clip format)
    OUT/val/00000.tar ..., sizes.json   the validation split, in the same format (its own seeded stream)
    OUT/eval/<colour>_<shape>/NNNNN.png torchvision ImageFolder layout, 24 class folders such as
                                        red_circle; class index = position in sorted folder order
    OUT/eval/classnames.txt             one class name per line in that same order ("red circle")
    OUT/eval/templates.txt              zero-shot prompt templates, one per line, "{c}" = class name

The train spec is "OUT/train/{00000..0000K}.tar" (returned by `make_synthetic`). Chance level
of the 24-way colour+shape zero-shot task is 1/24; colour alone or shape alone are easier, so
the combined task leaves room between attention variants.
"""

import argparse
import functools
import inspect
import io
import json
import multiprocessing
import os
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 85, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 135, 25),
}
SHAPES = ("circle", "square", "triangle", "cross")
ROWS = ("top", "middle", "bottom")
COLUMNS = ("left", "center", "right")
EXTENT = (0.35, 0.75)  # shape size as a fraction of the image side, drawn uniformly
LARGE = 0.55  # captions call a shape of at least this extent "large", else "small"
CELL = 0.22  # distance of the outer grid cells' centres from the image centre, as a fraction of the side
CAPTIONS = ("short", "long")  # --captions: one shape with a short caption, or data.synthetic_long
TASKS = ("shapes", "scenes")  # --task: this module's shapes, or data.scenes (Zipf-frequent concepts, 120 classes)
# --patterns: each shape plain or with a pattern of 1-pixel lines at the data's own resolution, in a darker shade of
# its colour: striped = every other row, barred = every other column, checked = a checkerboard. A view at half the
# resolution averages each pattern to the same shade, so telling them apart needs the full resolution.
PATTERNS = ("plain", "striped", "barred", "checked")
SHADE = 0.55  # a pattern's pixels: the shape's colour times this
TEMPLATES = (
    "a photo of a {c}.",
    "a drawing of a {c}.",
    "a picture of a {c}.",
    "an image of a {c}.",
    "a {c}.",
    "a small {c}.",
    "a large {c}.",
)


def with_article(word: str) -> str:
    """'a red', 'an orange'."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def where_phrase(row: str, column: str, rng: np.random.Generator) -> str:
    """Say where the shape is, e.g. 'top left', 'on the right', 'in the middle'."""
    if row == "middle" and column == "center":
        return str(rng.choice(["in the middle", "in the center", "at the center"]))
    if row == "middle":
        return str(rng.choice([f"on the {column}", f"at the {column}", f"{column} side"]))
    if column == "center":
        return str(rng.choice([f"at the {row}", f"near the {row}", f"{row} center"]))
    return str(rng.choice([f"{row} {column}", f"at the {row} {column}", f"in the {row} {column}"]))


def caption(colour: str, shape: str, row: str, column: str, size: str, rng: np.random.Generator) -> str:
    """One of several short wordings (at most 14 tokens) that name colour and shape, most also position and size."""
    where = where_phrase(row, column, rng)
    a_colour = with_article(colour)
    forms = (
        f"a {size} {colour} {shape} {where}",
        f"{colour} {shape}, {where}, {size}",
        f"a picture of {a_colour} {shape}",
        f"a {size} {shape} in {colour}, {where}",
        f"{shape}, colour {colour}, {size}",
        f"one {colour} {shape} {where}",
        f"{size} {colour} {shape}",
        f"{a_colour} {shape} {where} on gray",
    )
    text = str(rng.choice(forms))
    return text + "." if rng.random() < 0.3 else text


def draw(
    shape: str,
    colour: str,
    row: str,
    column: str,
    extent: float,
    image_size: int,
    rng: np.random.Generator,
    pattern: str = "plain",
) -> Image.Image:
    """Draw one shape on a grey background; drawn at 4x (up to 128 px) then downscaled for smooth edges; a
    pattern (PATTERNS) is laid on the shape's pixels at the final resolution."""
    scale = max(1, min(4, 128 // image_size))
    side = image_size * scale
    background = int(rng.integers(70, 190))
    image = Image.new("RGB", (side, side), (background,) * 3)
    pen = ImageDraw.Draw(image)
    cx = side * (0.5 + CELL * (COLUMNS.index(column) - 1) + rng.uniform(-0.04, 0.04))
    cy = side * (0.5 + CELL * (ROWS.index(row) - 1) + rng.uniform(-0.04, 0.04))
    fill = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in COLOURS[colour])
    paint(pen, shape, fill, cx, cy, extent * side / 2)
    image = image.resize((image_size, image_size), Image.BOX) if scale > 1 else image
    if pattern == "plain":
        return image
    mask = Image.new("L", (side, side), 0)
    paint(ImageDraw.Draw(mask), shape, 255, cx, cy, extent * side / 2)
    inside = np.asarray(mask.resize((image_size, image_size), Image.BOX)) >= 128
    y, x = np.mgrid[:image_size, :image_size]
    lines = {"striped": y % 2 == 0, "barred": x % 2 == 0, "checked": (x + y) % 2 == 0}[pattern]
    pixels = np.array(image)
    pixels[inside & lines] = (pixels[inside & lines] * SHADE).astype(np.uint8)
    return Image.fromarray(pixels)


def paint(pen: ImageDraw.ImageDraw, shape: str, fill: tuple, cx: float, cy: float, r: float) -> None:
    """Paint one shape of half-width r (pixels) centred at (cx, cy)."""
    if shape == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        pen.rectangle((cx - r * 0.85, cy - r * 0.85, cx + r * 0.85, cy + r * 0.85), fill=fill)
    elif shape == "triangle":
        pen.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    else:
        bar = r * 0.35
        pen.rectangle((cx - r, cy - bar, cx + r, cy + bar), fill=fill)
        pen.rectangle((cx - bar, cy - r, cx + bar, cy + r), fill=fill)


def random_scene(rng: np.random.Generator, extent: tuple[float, float] = EXTENT, patterns: bool = False) -> dict:
    """Pick colour, shape and grid cell uniformly, and the extent uniformly in `extent` (EXTENT); with
    `patterns` also one of PATTERNS."""
    scene = {
        "colour": str(rng.choice(list(COLOURS))),
        "shape": str(rng.choice(SHAPES)),
        "row": str(rng.choice(ROWS)),
        "column": str(rng.choice(COLUMNS)),
        "extent": float(rng.uniform(*extent)),
    }
    if patterns:
        scene["pattern"] = str(rng.choice(PATTERNS))
    return scene


def size_word(extent: float, bounds: tuple[float, float] = EXTENT) -> str:
    """'large' from the middle of the extent's range up (LARGE for the default range), else 'small'."""
    middle = LARGE if tuple(bounds) == EXTENT else (bounds[0] + bounds[1]) / 2
    return "large" if extent >= middle else "small"


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # fixed so that a seed gives byte-identical shards
    tar.addfile(info, io.BytesIO(data))


def write_shard(
    path: Path, first_key: int, count: int, seed: int, stream: int, image_size: int, extent=EXTENT, patterns=False
) -> None:
    """Write `count` samples with keys first_key.. into one tar; seeded by (seed, split, shard) = `stream`."""
    rng = np.random.default_rng([seed, *stream])
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in range(first_key, first_key + count):
            scene = random_scene(rng, extent, patterns)
            image = draw(**scene, image_size=image_size, rng=rng)
            size = size_word(scene["extent"], extent)
            shape = f"{scene['pattern']} {scene['shape']}" if patterns else scene["shape"]
            text = caption(scene["colour"], shape, scene["row"], scene["column"], size, rng)
            jpg = io.BytesIO()
            image.save(jpg, format="JPEG", quality=90)
            meta = {"key": f"{key:09d}", "caption": text, **scene, "size": size}
            meta["position"] = f"{scene['row']} {scene['column']}"
            add_file(tar, f"{key:09d}.jpg", jpg.getvalue())
            add_file(tar, f"{key:09d}.txt", text.encode("utf-8"))
            add_file(tar, f"{key:09d}.json", json.dumps(meta).encode("utf-8"))


def write_split(
    out: Path,
    samples: int,
    shard_size: int,
    seed: int,
    split: int,
    image_size: int,
    captions: str = "short",
    extent=EXTENT,
    patterns: bool = False,
    task: str = "shapes",
    workers: int = 1,
) -> str:
    """Write the shards of one split (0 train, 2 validation) and sizes.json; return the brace spec of the shards.
    With `workers` > 1 the shards are written by that many forked processes: each shard has its own seeded stream,
    so the files are the same byte for byte."""
    out.mkdir(parents=True, exist_ok=True)
    counts = [min(shard_size, samples - start) for start in range(0, samples, shard_size)]
    if task == "scenes":
        from data.scenes import write_scene_shard as write  # data.scenes builds on this module
    elif captions == "long":
        # imported here because data.synthetic_long builds on this module
        from data.synthetic_long import write_long_shard as write
    else:
        write = functools.partial(write_shard, extent=extent, patterns=patterns)
    jobs = [
        (out / f"{k:05d}.tar", k * shard_size, count, seed, (split, k), image_size) for k, count in enumerate(counts)
    ]
    if workers > 1 and len(jobs) > 1:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            list(pool.map(write, *zip(*jobs, strict=True)))
    else:
        for job in jobs:
            write(*job)
    sizes = {f"{shard:05d}.tar": count for shard, count in enumerate(counts)}
    (out / "sizes.json").write_text(json.dumps(sizes, indent=1))
    last = len(counts) - 1
    return str(out / f"{{00000..{last:05d}}}.tar") if last > 0 else str(out / "00000.tar")


def write_eval(
    out: Path, per_class: int, seed: int, image_size: int, extent=EXTENT, patterns: bool = False
) -> list[str]:
    """Write the ImageFolder eval set, classnames.txt and templates.txt; return the class names. The classes are
    colour x shape, or with `patterns` colour x pattern (any shape: "red striped shape")."""
    kind, kinds = ("pattern", PATTERNS) if patterns else ("shape", SHAPES)
    classes = sorted((colour, k) for colour in COLOURS for k in kinds)
    for index, (colour, k) in enumerate(classes):
        folder = out / f"{colour}_{k}"
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, 1, index])
        for i in range(per_class):
            scene = random_scene(rng, extent, patterns) | {"colour": colour, kind: k}
            draw(**scene, image_size=image_size, rng=rng).save(folder / f"{i:05d}.png")
    names = [f"{colour} {k} shape" if patterns else f"{colour} {k}" for colour, k in classes]
    (out / "classnames.txt").write_text("\n".join(names) + "\n")
    (out / "templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    return names


def make_synthetic(
    out: str | Path,
    train_samples: int = 10_000,
    eval_per_class: int = 20,
    seed: int = 0,
    image_size: int = 32,
    shard_size: int = 1000,
    val_samples: int = 512,
    captions: str = "short",
    extent: tuple[float, float] = EXTENT,
    patterns: bool = False,
    task: str = "shapes",
    workers: int = 1,
) -> str:
    """Write the whole data set under `out` (layout in the module docstring); return the train spec.

    task: shapes (this module) or scenes (data.scenes: concepts with Zipf frequencies, 120 zero-shot classes).
    extent: the range of shape sizes as fractions of the image side; small shapes at a high resolution make a task
    that needs the resolution (a shape a few pixels wide loses its form when the model sees the image smaller).
    patterns: shapes plain or patterned in 1-pixel lines (PATTERNS), zero-shot classes colour x pattern: a detail
    that a view at half the resolution loses.
    workers: processes writing the training and validation shards (the same bytes with any number)."""
    if captions not in CAPTIONS:
        raise ValueError(f"synthetic data: captions {captions!r} is not one of {', '.join(CAPTIONS)}")
    if task not in TASKS:
        raise ValueError(f"synthetic data: task {task!r} is not one of {', '.join(TASKS)}")
    if task == "scenes" and (captions != "short" or patterns or tuple(extent) != EXTENT):
        raise ValueError(
            "synthetic data: the scenes task has its own captions and sizes; drop captions, patterns, extent"
        )
    extent = tuple(float(e) for e in extent)
    if captions == "long" and patterns:
        raise ValueError("synthetic data: patterns go with short captions only; drop --patterns or --captions long")
    if len(extent) != 2 or not 0.02 <= extent[0] <= extent[1] <= 0.9 or (captions == "long" and extent != EXTENT):
        raise ValueError(
            f"synthetic data: extent {list(extent)} must be two fractions 0.02 <= low <= high <= 0.9 "
            "(short captions only)"
        )
    if train_samples < 1 or shard_size < 1 or eval_per_class < 0 or image_size < 8 or val_samples < 0 or workers < 1:
        raise ValueError(
            "synthetic data: need train_samples >= 1, shard_size >= 1, eval_per_class >= 0, val_samples >= 0, "
            "image_size >= 8, workers >= 1"
        )
    out = Path(out)
    options = {"captions": captions, "extent": extent, "patterns": patterns, "task": task, "workers": workers}
    spec = write_split(out / "train", train_samples, shard_size, seed, 0, image_size, **options)
    if val_samples:
        write_split(out / "val", val_samples, shard_size, seed, 2, image_size, **options)
    if task == "scenes":
        from data.scenes import write_scene_eval

        names = write_scene_eval(out / "eval", eval_per_class, seed, image_size)
    else:
        names = write_eval(out / "eval", eval_per_class, seed, image_size, extent, patterns)
    if captions == "long" and eval_per_class:
        from data.synthetic_long import write_retrieval

        write_retrieval(out / "retrieval", len(names) * eval_per_class, seed, image_size)
    return spec


def check_out(out: Path) -> None:
    """Refuse, before writing anything, an output path that is a file or lies in a folder we cannot write."""
    existing = next(p for p in [out, *out.parents] if p.exists())
    if not existing.is_dir():
        raise ValueError(f"output {existing} is a file, not a folder; give a new or existing folder")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"output folder {existing} is not writable; give a folder you can write to")


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m data.synthetic", description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--train-samples", type=int, default=10_000)
    parser.add_argument("--val-samples", type=int, default=512)
    parser.add_argument("--eval-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=1, help="processes writing the shards (the same bytes)")
    parser.add_argument("--task", choices=TASKS, default="shapes", help="scenes: Zipf-frequent concepts (data.scenes)")
    parser.add_argument("--captions", choices=CAPTIONS, default="short", help="long: several shapes, 60-300 tokens")
    parser.add_argument(
        "--extent", type=float, nargs=2, default=EXTENT, metavar=("LOW", "HIGH"), help="shape sizes / image side"
    )
    parser.add_argument(
        "--patterns", action="store_true", help="1-pixel patterns on the shapes; classes colour x pattern"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        check_out(Path(args.out))
        # every parameter of make_synthetic is a flag of this command, under the same name
        spec = make_synthetic(**{name: getattr(args, name) for name in inspect.signature(make_synthetic).parameters})
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    extra = f" with long captions and a retrieval set in {args.out}/retrieval" if args.captions == "long" else ""
    print(
        f"wrote {args.train_samples} train samples ({spec}){extra}, {args.val_samples} validation samples and "
        f"{args.eval_per_class} eval images per class to {args.out} in {time.perf_counter() - start:.1f}s"
    )
    return spec


if __name__ == "__main__":
    main()
