"""Long captions for the synthetic set (`python -m data.synthetic OUT --captions long`).

Every image shows three to six shapes (the colours and shapes of data.synthetic), each in its own cell of the
3 x 3 grid, of a size between 12% and 20% of the side so that neighbours do not touch (at 32 px a shape is a few
pixels; --image-size 64 shows them better). Its caption opens with one sentence on the scene and then describes
each shape in turn, in its own sentence (colour, shape, size, position, in varied wording): 60-300 tokens of the
CLIP BPE tokenizer, so a 77-token text tower sees only the first few shapes.

The retrieval set comes in groups of GROUP images that share the background, the first five shapes and the
wording, and differ only in the colour and kind of the sixth shape, described after at least PREFIX tokens:
a text tower cut at 77 tokens cannot tell the captions of a group apart.

Wording is drawn as a fixed number of uniform numbers per shape (`caption_draws`), so a caption's first
sentences depend only on the first shapes, never on the ones described after them.
"""

import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from data.synthetic import CELL, COLOURS, COLUMNS, ROWS, SHAPES, add_file, paint, with_article

SHAPE_COUNTS = (3, 6)  # fewest and most shapes of a scene
EXTENT = (0.12, 0.20)  # shape size as a fraction of the image side, drawn uniformly
LARGE = 0.16  # captions call a shape of at least this extent "large", else "small"
GROUP = 4  # retrieval images per group: the same scene and wording but for the last shape
PREFIX = 80  # tokens (at least) before the last shape's description in a retrieval caption; CLIP keeps 75
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six")
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")


def random_shape(rng: np.random.Generator, row: str, column: str) -> dict:
    """Colour, kind and extent of one shape in a given cell, with its jitter (dx, dy: fractions of the side)
    and tint (added to the colour), so that drawing needs no random numbers."""
    return {
        "colour": str(rng.choice(list(COLOURS))),
        "shape": str(rng.choice(SHAPES)),
        "row": row,
        "column": column,
        "extent": float(rng.uniform(*EXTENT)),
        "dx": float(rng.uniform(-0.02, 0.02)),
        "dy": float(rng.uniform(-0.02, 0.02)),
        "tint": [int(t) for t in rng.integers(-20, 21, 3)],
    }


def random_scene(rng: np.random.Generator, count: int) -> dict:
    """A grey background and `count` shapes in distinct grid cells, in the order the caption describes them."""
    background = int(rng.integers(70, 190))
    cells = rng.permutation(len(ROWS) * len(COLUMNS))[:count]
    shapes = [random_shape(rng, ROWS[c // len(COLUMNS)], COLUMNS[c % len(COLUMNS)]) for c in cells]
    return {"background": background, "shapes": shapes}


def draw_scene(scene: dict, image_size: int) -> Image.Image:
    """Draw every shape of the scene; drawn at 4x (up to 128 px) then downscaled for smooth edges."""
    scale = max(1, min(4, 128 // image_size))
    side = image_size * scale
    image = Image.new("RGB", (side, side), (scene["background"],) * 3)
    pen = ImageDraw.Draw(image)
    for s in scene["shapes"]:
        cx = side * (0.5 + CELL * (COLUMNS.index(s["column"]) - 1) + s["dx"])
        cy = side * (0.5 + CELL * (ROWS.index(s["row"]) - 1) + s["dy"])
        fill = tuple(int(np.clip(c + t, 0, 255)) for c, t in zip(COLOURS[s["colour"]], s["tint"]))
        paint(pen, s["shape"], fill, cx, cy, s["extent"] * side / 2)
    return image.resize((image_size, image_size), Image.BOX) if scale > 1 else image


def pick(options: tuple | list, u: float) -> str:
    """The option at the place of u in [0, 1)."""
    return options[int(u * len(options))]


def place(row: str, column: str, u: float) -> str:
    """Say where a shape is, e.g. 'in the top left corner', 'on the right side', 'in the middle'."""
    if row == "middle" and column == "center":
        return pick(("in the middle", "in the center", "at the very center"), u)
    if row == "middle":
        return pick((f"on the {column} side", f"at the {column} edge", f"in the middle of the {column} side"), u)
    if column == "center":
        return pick((f"at the {row}", f"near the {row} edge", f"in the {row} center"), u)
    return pick((f"in the {row} {column} corner", f"at the {row} {column}", f"near the {row} {column} corner"), u)


def caption_draws(count: int) -> int:
    """How many uniform numbers the wording of a scene of `count` shapes takes: one for the opening, two a shape."""
    return 1 + 2 * count


def opening(scene: dict, u: float) -> str:
    count = NUMBERS[len(scene["shapes"])]
    shade = "dark" if scene["background"] < 110 else "medium" if scene["background"] < 150 else "light"
    forms = (
        f"a picture of {count} shapes on a {shade} gray background, described one by one from the first to the last.",
        f"this image shows {count} flat shapes spread over a {shade} gray background, and here they are in turn.",
        f"on a {shade} gray background there are {count} shapes, each one in its own place on the grid.",
        f"{count} simple shapes are drawn flat on a {shade} gray background, and each of them is described below.",
    )
    return pick(forms, u)


def sentence(s: dict, index: int, u: tuple[float, float]) -> str:
    """One sentence on one shape: colour, shape, size and position (at least 16 tokens)."""
    colour, shape, nth = s["colour"], s["shape"], ORDINALS[index]
    size = "large" if s["extent"] >= LARGE else "small"
    where = place(s["row"], s["column"], u[1])
    a_colour = with_article(colour)
    forms = (
        f"the {nth} shape is a {size} {colour} {shape}, and it is placed {where} of the picture.",
        f"{where}, there is a {size} {shape} painted in solid {colour}, the {nth} of the shapes.",
        f"the {nth} of them is {a_colour} {shape} of {size} size, which can be found {where}.",
        f"next comes {a_colour} {shape}, the {nth} one; it is {size} for the picture and sits {where}.",
        f"the {nth} one is a {shape} in {colour}, {size} in size, drawn {where} on the gray.",
    )
    return pick(forms, u[0])


def describe(scene: dict, u: np.ndarray) -> list[str]:
    """The sentences of a scene's caption, the opening first and then one a shape in scene order; u holds
    caption_draws(len(shapes)) uniform numbers."""
    shapes = scene["shapes"]
    return [opening(scene, u[0])] + [sentence(s, i, u[1 + 2 * i : 3 + 2 * i]) for i, s in enumerate(shapes)]


def min_tokens(text: str) -> int:
    """A lower bound on the CLIP BPE tokens of a text (start and end not counted): its pre-tokens (letter runs,
    single digits, runs of other non-space characters), each at least one token."""
    return len(re.findall(r"[a-z]+|[0-9]|[^\sa-z0-9]+", text.lower()))


def scene_meta(scene: dict) -> list[dict]:
    """What the JSON of a sample says of each shape."""
    return [
        {
            "colour": s["colour"],
            "shape": s["shape"],
            "position": f"{s['row']} {s['column']}",
            "size": "large" if s["extent"] >= LARGE else "small",
            "extent": s["extent"],
        }
        for s in scene["shapes"]
    ]


def write_long_shard(path: Path, first_key: int, count: int, seed: int, stream: tuple, image_size: int) -> None:
    """Write `count` long-caption samples (KEY.jpg, KEY.txt, KEY.json with "shapes") with keys first_key..;
    seeded by (seed, split, shard) = `stream`."""
    rng = np.random.default_rng([seed, *stream])
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in range(first_key, first_key + count):
            scene = random_scene(rng, int(rng.integers(SHAPE_COUNTS[0], SHAPE_COUNTS[1] + 1)))
            text = " ".join(describe(scene, rng.random(caption_draws(len(scene["shapes"])))))
            jpg = io.BytesIO()
            draw_scene(scene, image_size).save(jpg, format="JPEG", quality=90)
            meta = {"key": f"{key:09d}", "caption": text, "shapes": scene_meta(scene)}
            add_file(tar, f"{key:09d}.jpg", jpg.getvalue())
            add_file(tar, f"{key:09d}.txt", text.encode("utf-8"))
            add_file(tar, f"{key:09d}.json", json.dumps(meta).encode("utf-8"))


def retrieval_group(rng: np.random.Generator) -> list[tuple[dict, str]]:
    """GROUP scenes of six shapes with their captions: the same scene and wording but for the last shape's
    colour and kind (all different), described after at least PREFIX tokens."""
    scene = random_scene(rng, SHAPE_COUNTS[1])
    kinds = [(colour, shape) for colour in COLOURS for shape in SHAPES]
    u = rng.random(caption_draws(SHAPE_COUNTS[1]))
    while min_tokens(" ".join(describe(scene, u)[:-1])) < PREFIX:
        u = rng.random(len(u))
    group = []
    for k in rng.permutation(len(kinds))[:GROUP]:
        last = scene["shapes"][-1] | {"colour": kinds[k][0], "shape": kinds[k][1]}
        member = scene | {"shapes": [*scene["shapes"][:-1], last]}
        group.append((member, " ".join(describe(member, u))))
    return group


def write_retrieval(out: Path, images: int, seed: int, image_size: int) -> None:
    """Write the long-caption retrieval set as clip_benchmark's retrieval webdataset (what eval.retrieval reads):
    OUT/test/0.tar of KEY.png, KEY.txt (the caption) and KEY.json (with "group"), and OUT/test/nshards.txt."""
    folder = out / "test"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 3])
    with tarfile.open(folder / "0.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in range(images):
            if key % GROUP == 0:
                group = retrieval_group(rng)
            scene, text = group[key % GROUP]
            png = io.BytesIO()
            draw_scene(scene, image_size).save(png, format="PNG")
            meta = {"key": f"{key:09d}", "group": key // GROUP, "caption": text, "shapes": scene_meta(scene)}
            add_file(tar, f"{key:09d}.png", png.getvalue())
            add_file(tar, f"{key:09d}.txt", text.encode("utf-8"))
            add_file(tar, f"{key:09d}.json", json.dumps(meta).encode("utf-8"))
    (folder / "nshards.txt").write_text("1\n")
