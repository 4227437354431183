"""Evaluate one model on a list of data sets: zero-shot classification and image-text retrieval, one JSON per data
set and a CSV table of them all.

    python -m eval.suite RUN_OR_CHECKPOINT --suite configs/eval_suite.yaml [--out DIR]
    python -m eval.suite RUN --dataset imagenet-v2=/data/imagenetv2 --dataset coco=/data/wds_mscoco_captions
    torchrun --nproc_per_node 8 -m eval.suite RUN --suite configs/eval_suite.yaml    # each process a slice of every set
    python -m eval.suite --open-clip-model ViT-B-16 --checkpoint FILE --suite S.yaml --out DIR

A suite file maps names to data sets: `datasets: {NAME: PATH}` or `{NAME: {path, task, classnames, templates,
split, csv_img_key, csv_caption_key, csv_separator}}`. The names of eval.benchmarks (imagenet1k, imagenet-v2,
imagenet-sketch, imagenet-a, imagenet-r, objectnet, coco, flickr30k) bring clip_benchmark's class names, class
subsets and templates; any other name is an ImageFolder tree, a clip_benchmark webdataset or a caption CSV read as
eval.zeroshot / eval.retrieval read them (task: the `task` key, else retrieval for a .csv/.tsv or a webdataset whose
dataset_type.txt says so, else classification).

Writes OUT/<name>.json (eval.zeroshot's or eval.retrieval's keys, the model summary, `dataset` = the name,
`dataset_path`, `task`) and OUT/results.csv (one row per data set). OUT defaults to RUN/eval/<checkpoint folder>/.
Every data set is opened and checked before the first is evaluated, so bad input writes nothing.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import models
from eval import benchmarks, checkpoint, datasets, retrieval, zeroshot
from eval.datasets import EvalInputError
from eval.sharding import Shard, init_from_environment

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
OPTIONS = ("path", "task", "classnames", "templates", "split", "csv_img_key", "csv_caption_key", "csv_separator")
FIRST_COLUMNS = ("dataset", "task", "top1", "top5", "mean_per_class_recall", "mean_recall", "num_images")


@dataclass
class Entry:
    """One data set of the suite."""

    name: str
    path: str
    task: str
    benchmark: benchmarks.Benchmark | None = None
    options: dict = field(default_factory=dict)  # classnames, templates, split, csv_* as given


def detect_task(path: Path) -> str:
    if path.is_file() and path.suffix in (".csv", ".tsv"):
        return "retrieval"
    kind = path / "dataset_type.txt"
    return "retrieval" if kind.is_file() and kind.read_text().strip().lower() == "retrieval" else "classification"


def make_entry(name: str, spec, source: str) -> Entry:
    """Check one suite item (`PATH` or a mapping of OPTIONS) and resolve its task."""
    spec = {"path": spec} if isinstance(spec, str) else spec
    if not NAME.match(str(name)):
        raise EvalInputError(f"data set name {name!r} in {source} must be letters, digits, '.', '_' or '-'")
    if not isinstance(spec, dict) or "path" not in spec or set(spec) - set(OPTIONS):
        raise EvalInputError(
            f"{name} in {source}: give a path, or a mapping with 'path' and any of {', '.join(OPTIONS[1:])}"
        )
    path, benchmark = Path(str(spec["path"])), benchmarks.lookup(str(name))
    if not path.exists():
        raise EvalInputError(f"{name}: {path} (from {source}) does not exist; fix the path")
    task = spec.get("task") or (benchmark.task if benchmark else detect_task(path))
    if task not in benchmarks.TASKS or (benchmark and task != benchmark.task):
        allowed = benchmark.task if benchmark else " or ".join(benchmarks.TASKS)
        raise EvalInputError(f"{name} in {source}: task {task!r} must be {allowed}")
    options = {k: v for k, v in spec.items() if k not in ("path", "task")}
    return Entry(benchmark.name if benchmark else str(name), str(path), task, benchmark, options)


def read_suite(suite: str | None, pairs: list[str]) -> list[Entry]:
    """The data sets of the --suite file, then those of --dataset NAME=PATH (which replace a same-named one)."""
    items: dict[str, Entry] = {}
    if suite:
        try:
            spec = yaml.safe_load(Path(suite).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise EvalInputError(f"cannot read suite file {suite}: {e}".replace("\n", " ")) from None
        if not isinstance(spec, dict) or set(spec) != {"datasets"} or not isinstance(spec["datasets"], dict):
            raise EvalInputError(f"suite file {suite} must hold one key, datasets: a mapping of name -> path")
        for name, value in spec["datasets"].items():
            entry = make_entry(str(name), value, suite)
            items[entry.name] = entry
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not path:
            raise EvalInputError(f"--dataset {pair!r} must be NAME=PATH, e.g. imagenet-v2=/data/imagenetv2")
        entry = make_entry(name, path, "--dataset")
        items[entry.name] = entry
    if not items:
        raise EvalInputError("no data sets: pass --suite FILE or --dataset NAME=PATH (repeatable)")
    return list(items.values())


def output_folder(args: argparse.Namespace, loaded: checkpoint.LoadedModel) -> Path:
    """--out, else RUN/eval/<checkpoint folder name>/ for one of our checkpoints."""
    if args.out:
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise EvalInputError(f"--out {args.out} is a file; give a folder for the results")
        return Path(args.out)
    if args.open_clip_model:
        raise EvalInputError("--open-clip-model needs --out DIR for the results")
    folder = Path(loaded.info["checkpoint"])
    run = folder.parent.parent if folder.parent.name == "checkpoints" else folder.parent
    return run / "eval" / folder.name


def open_entry(entry: Entry, transform):
    """The opened data set of an entry: a ClassificationSet or a pair set for retrieval."""
    o = entry.options
    if entry.task == "retrieval":
        keys = {k: o[k] for k in ("csv_img_key", "csv_caption_key") if k in o}
        return datasets.open_retrieval(
            entry.path, transform, o.get("split", "test"), **keys, separator=o.get("csv_separator")
        )
    if entry.benchmark:
        return benchmarks.open_classification(
            entry.benchmark, entry.path, transform, o.get("split", "test"), o.get("classnames"), o.get("templates")
        )
    return datasets.open_classification(
        entry.path, transform, o.get("classnames"), o.get("templates"), o.get("split", "test")
    )


def evaluate_entry(entry: Entry, data, loaded, args, shard: Shard) -> dict:
    options = dict(
        batch_size=args.batch_size, device=args.device, workers=args.workers, progress=shard.rank == 0, shard=shard
    )
    if entry.task == "retrieval":
        return retrieval.evaluate_pairs(loaded.model, data, loaded.tokenizer, **options)
    return zeroshot.evaluate_set(loaded.model, data, loaded.tokenizer, **options)


def write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def table(results: list[dict]) -> str:
    """CSV text: one row per data set, the main metrics first, then every other scalar key."""
    scalar = [{k: v for k, v in r.items() if isinstance(v, (str, int, float)) or v is None} for r in results]
    rest = sorted({k for r in scalar for k in r} - set(FIRST_COLUMNS))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=[*FIRST_COLUMNS, *rest], lineterminator="\n")
    writer.writeheader()
    writer.writerows(scalar)
    return text.getvalue()


def headline(result: dict) -> str:
    if result["task"] == "retrieval":
        scores = f"text->image R@1 {result['text_to_image_R@1']:.4f}, image->text R@1 {result['image_to_text_R@1']:.4f}"
    else:
        scores = f"top1 {result['top1']:.4f}, top5 {result['top5']:.4f}"
    return f"{result['dataset']}: {scores} ({result['num_images']} images, {result['seconds']:.1f} s)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m eval.suite", description=__doc__.split("\n\n")[0])
    checkpoint.add_model_arguments(parser)
    parser.add_argument("--suite", help="YAML file: datasets: {NAME: PATH or {path, task, classnames, ...}}")
    parser.add_argument(
        "--dataset", action="append", default=[], metavar="NAME=PATH", help="a data set to add (repeatable)"
    )
    parser.add_argument("--out", help="folder for NAME.json and results.csv (default: RUN/eval/<checkpoint>/)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch and process")
    checkpoint.add_workers_argument(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Evaluate every data set of the suite; returns the results (on every rank) in suite order."""
    args = parse_args(argv)
    with checkpoint.one_line_errors():
        entries = read_suite(args.suite, args.dataset)
        shard, device = init_from_environment(args.device)
        args.device = str(device)
        loaded = checkpoint.load_from_args(args)
        for note in loaded.notes if shard.rank == 0 else ():
            print(note, file=sys.stderr)
        out = output_folder(args, loaded)
        opened = [open_entry(entry, loaded.transform) for entry in entries]
        summary = {**loaded.info, **models.summary(loaded.model), "world_size": shard.world_size}
        results = []
        for entry, data in zip(entries, opened):
            result = evaluate_entry(entry, data, loaded, args, shard)
            result.update(summary, dataset=entry.name, dataset_path=entry.path, task=entry.task)
            results.append(result)
            if shard.rank == 0:
                out.mkdir(parents=True, exist_ok=True)
                write_atomic(out / f"{entry.name}.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
                write_atomic(out / "results.csv", table(results))
                print(headline(result), file=sys.stderr)
    if shard.rank == 0:
        print(f"results: {out / 'results.csv'}")
    return results


if __name__ == "__main__":
    main()
