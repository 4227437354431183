"""The `scenes` task of the embedded data (`python -m data.synthetic OUT --task scenes`): compositional scenes whose
concepts occur with Zipf-distributed frequencies, so that scaling can show.

Every image shows one or two objects on a grey background. An object is a colour (COLOURS, 12) and a shape (SHAPES,
10), drawn independently, each with Zipf frequencies: the concept of rank r (its place in a fixed, seeded order)
has probability proportional to r^-ZIPF; the most frequent colour and shape are seen 12 and 10 times as often as
the rarest: a model learns the frequent concepts first and the rare ones later, so its zero-shot error keeps
falling with compute instead of dropping at once (the mechanism of Michaud et al. 2023, "The Quantization Model of
Neural Scaling"). Size (small, large), position (a cell of the 3 x 3 grid), count (one or two of the same object:
"two red stars") and, for a scene of two different objects, their relation ("a red star left of a blue ring") are
drawn uniformly and named in the caption in varied wording.

The zero-shot set is colour x shape, 120 classes ("red star"), with the same number of images per class: it asks
for every concept, rare or frequent, so its accuracy measures how far down the frequency list a model has come.
The validation split has the training distribution. The on-disk layout is data.synthetic's (its docstring), the
JSON of a sample {"key", "caption", "objects": [{"colour", "shape", "row", "column", "extent"}, ...], "count"}.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from data import synthetic
from data.synthetic import CELL, COLUMNS, ROWS, add_file, where_phrase

COLOURS = {  # data.synthetic's six and six more, spread over hue and lightness; the grey background (70-190) is none
    **synthetic.COLOURS,
    "pink": (250, 140, 200),
    "brown": (120, 70, 30),
    "cyan": (40, 210, 220),
    "lime": (170, 240, 60),
    "navy": (20, 30, 110),
    "white": (250, 250, 250),
}
SHAPES = ("circle", "square", "triangle", "cross", "diamond", "ring", "star", "hexagon", "arrow", "bar")
ZIPF = 1.0  # the exponent of the concepts' frequencies: p(rank r) ~ r^-ZIPF
EXTENT = (0.30, 0.55)  # one object's size as a fraction of the image side (two objects: 0.6 x this)
LARGE = 0.42
TWO = 0.5  # share of scenes with two objects (half of them two of the same: a count)
# relation -> (rows, columns) from the first object to the second: the two sit in opposite outer cells, so that
# they never touch
RELATIONS = {"left of": (0, 2), "right of": (0, -2), "above": (2, 0), "below": (-2, 0)}
TEMPLATES = ("a photo of a {c}.", "a drawing of a {c}.", "a picture of a {c}.", "a {c}.", "a small {c}.")


def zipf_order(names, seed: int) -> list[str]:
    """The concepts' frequency ranks: a fixed order drawn from the data seed (rank 1 first)."""
    order = list(names)
    np.random.default_rng([seed, 7]).shuffle(order)
    return order


def zipf_probabilities(count: int, exponent: float = ZIPF) -> np.ndarray:
    ranks = np.arange(1, count + 1, dtype=float)
    weights = ranks**-exponent
    return weights / weights.sum()


def pick(rng: np.random.Generator, order: list[str]) -> str:
    return order[int(rng.choice(len(order), p=zipf_probabilities(len(order))))]


def polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """The outline of the shapes data.synthetic does not draw (but ring and bar)."""
    if shape == "star":
        a = np.arange(10) * np.pi / 5 - np.pi / 2
        radius = np.where(np.arange(10) % 2 == 0, r, 0.45 * r)
        return list(zip(cx + radius * np.cos(a), cy + radius * np.sin(a), strict=True))
    if shape == "arrow":
        w = 0.3 * r
        return [
            (cx - r, cy - w),
            (cx, cy - w),
            (cx, cy - r),
            (cx + r, cy),
            (cx, cy + r),
            (cx, cy + w),
            (cx - r, cy + w),
        ]
    corners = {"hexagon": 6, "diamond": 4}[shape]
    return [(cx + r * np.cos(a), cy + r * np.sin(a)) for a in np.arange(corners) * 2 * np.pi / corners]


def paint(pen: ImageDraw.ImageDraw, shape: str, fill: tuple, cx: float, cy: float, r: float, ground: tuple) -> None:
    """Paint one shape of half-width r (pixels) centred at (cx, cy); `ground` fills a ring's hole."""
    if shape in synthetic.SHAPES:
        synthetic.paint(pen, shape, fill, cx, cy, r)
    elif shape == "ring":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        pen.ellipse((cx - 0.5 * r, cy - 0.5 * r, cx + 0.5 * r, cy + 0.5 * r), fill=ground)
    elif shape == "bar":
        pen.rectangle((cx - r, cy - 0.3 * r, cx + r, cy + 0.3 * r), fill=fill)
    else:
        pen.polygon(polygon(shape, cx, cy, r), fill=fill)


def random_object(rng: np.random.Generator, orders: dict, row: int, column: int, scale: float = 1.0) -> dict:
    return {
        "colour": pick(rng, orders["colour"]),
        "shape": pick(rng, orders["shape"]),
        "row": ROWS[row],
        "column": COLUMNS[column],
        "extent": float(rng.uniform(*EXTENT) * scale),
        "jitter": [float(x) for x in rng.uniform(-0.04, 0.04, 2)],
        "tint": [int(x) for x in rng.integers(-20, 21, 3)],
    }


def random_scene(rng: np.random.Generator, orders: dict) -> dict:
    """One or two objects; two in neighbouring cells, either two of a kind (a count) or two in a relation."""
    if rng.random() >= TWO:
        first = random_object(rng, orders, int(rng.integers(3)), int(rng.integers(3)))
        return {"objects": [first], "count": 1}
    relation = str(rng.choice(list(RELATIONS)))
    dr, dc = RELATIONS[relation]
    row = (0 if dr > 0 else 2) if dr else int(rng.integers(3))
    column = (0 if dc > 0 else 2) if dc else int(rng.integers(3))
    first = random_object(rng, orders, row, column, 0.6)
    second = random_object(rng, orders, row + dr, column + dc, 0.6)  # `first` is `relation` of `second`
    if rng.random() < 0.5:
        second |= {"colour": first["colour"], "shape": first["shape"]}
        return {"objects": [first, second], "count": 2}
    return {"objects": [first, second], "count": 1, "relation": relation}


def draw(scene: dict, image_size: int, background: int) -> Image.Image:
    """The scene on a grey background, drawn at 4x (up to 128 px) then downscaled for smooth edges."""
    scale = max(1, min(4, 128 // image_size))
    side = image_size * scale
    ground = (background,) * 3
    image = Image.new("RGB", (side, side), ground)
    pen = ImageDraw.Draw(image)
    for obj in scene["objects"]:
        cx = side * (0.5 + CELL * (COLUMNS.index(obj["column"]) - 1) + obj["jitter"][0])
        cy = side * (0.5 + CELL * (ROWS.index(obj["row"]) - 1) + obj["jitter"][1])
        fill = tuple(int(np.clip(c + t, 0, 255)) for c, t in zip(COLOURS[obj["colour"]], obj["tint"], strict=True))
        paint(pen, obj["shape"], fill, cx, cy, obj["extent"] * side / 2, ground)
    return image.resize((image_size, image_size), Image.BOX) if scale > 1 else image


def size_word(obj: dict) -> str:
    """A single object's size in words (a pair's objects are drawn smaller and not sized in captions)."""
    return "large" if obj["extent"] >= LARGE else "small"


def caption(scene: dict, rng: np.random.Generator) -> str:
    """Name every object's colour and shape, and the count or the relation; most wordings also size and place."""
    first = scene["objects"][0]
    thing = f"{first['colour']} {first['shape']}"
    if scene["count"] == 2:
        forms = (f"two {thing}s", f"a pair of {thing}s", f"two {thing}s side by side", f"{thing} twice")
    elif "relation" in scene:
        other = scene["objects"][1]
        forms = (
            f"a {thing} {scene['relation']} a {other['colour']} {other['shape']}",
            f"{thing} {scene['relation']} {other['colour']} {other['shape']}",
            f"a {other['colour']} {other['shape']} and a {thing}",
        )
    else:
        where, size = where_phrase(first["row"], first["column"], rng), size_word(first)
        forms = (f"a {size} {thing} {where}", f"{thing}, {where}", f"a picture of a {thing}", f"{size} {thing}")
    text = str(rng.choice(forms))
    return text + "." if rng.random() < 0.3 else text


def write_scene_shard(path: Path, first_key: int, count: int, seed: int, stream: tuple, image_size: int) -> None:
    """`count` samples with keys first_key.. in one tar, seeded by (seed, split, shard); the frequency order by
    the seed alone, so every split shares it."""
    rng = np.random.default_rng([seed, *stream])
    orders = {"colour": zipf_order(COLOURS, seed), "shape": zipf_order(SHAPES, seed + 1)}
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in range(first_key, first_key + count):
            scene = random_scene(rng, orders)
            image = draw(scene, image_size, int(rng.integers(70, 190)))
            text = caption(scene, rng)
            jpg = io.BytesIO()
            image.save(jpg, format="JPEG", quality=90)
            objects = [{k: o[k] for k in ("colour", "shape", "row", "column", "extent")} for o in scene["objects"]]
            meta = {"key": f"{key:09d}", "caption": text, "objects": objects, "count": scene["count"]}
            add_file(tar, f"{key:09d}.jpg", jpg.getvalue())
            add_file(tar, f"{key:09d}.txt", text.encode("utf-8"))
            add_file(tar, f"{key:09d}.json", json.dumps(meta).encode("utf-8"))


def write_scene_eval(out: Path, per_class: int, seed: int, image_size: int) -> list[str]:
    """The zero-shot set: colour x shape (120 classes, sorted), `per_class` single-object images each."""
    classes = sorted((colour, shape) for colour in COLOURS for shape in SHAPES)
    for index, (colour, shape) in enumerate(classes):
        folder = out / f"{colour}_{shape}"
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, 1, index])
        only = {"colour": [colour], "shape": [shape]}
        for i in range(per_class):
            obj = random_object(rng, only, int(rng.integers(3)), int(rng.integers(3)))
            draw({"objects": [obj]}, image_size, int(rng.integers(70, 190))).save(folder / f"{i:05d}.png")
    names = [f"{colour} {shape}" for colour, shape in classes]
    (out / "classnames.txt").write_text("\n".join(names) + "\n")
    (out / "templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    return names
