"""Throughput of our shard loader against open_clip's webdataset pipeline, on the same shards: the measurements and
the page of scripts/bench_data.py (what it times and how: its docstring).

    rows = loader.rounds(spec, transform, tokenizer, args)   # one row per loader and round
    loader.write_report(rows, out, args)                      # <out>/bench_data.csv, .json and .md
"""

import csv
import statistics
import time
from argparse import Namespace
from functools import partial
from pathlib import Path

import open_clip_train.data
import torch
from open_clip_train.data import get_wds_dataset
from webdataset.tariterators import tar_file_expander

from data import DataConfig, build_train_data
from eval import pages, study_page


def time_epoch(batches) -> tuple[int, float]:
    """(samples, seconds) for one pass, worker start-up included."""
    start, samples = time.perf_counter(), 0
    for images, tokens in batches:
        assert images.shape[0] == tokens.shape[0]
        samples += images.shape[0]
    return samples, time.perf_counter() - start


def ours(spec: str, transform, tokenizer, args) -> tuple[int, float]:
    cfg = DataConfig(train_shards=spec, batch_size=args.batch_size, workers=args.workers)
    return time_epoch(build_train_data(cfg, transform, tokenizer).loader)


def open_clips(spec: str, transform, tokenizer, args) -> tuple[int, float]:
    # webdataset >= 0.2.96 ends every shard with an empty EOF dict that open_clip_train's
    # group_by_keys_nothrow cannot read (KeyError 'fname', webdataset issue #384); the fix from that
    # thread, eof_value=None, restores the behaviour open_clip was written for.
    open_clip_train.data.tar_file_expander = partial(tar_file_expander, eof_value=None)
    options = Namespace(
        train_data=spec,
        val_data=None,
        dataset_resampled=False,
        train_num_samples=None,
        train_data_upsampling_factors=None,
        seed=0,
        batch_size=args.batch_size,
        workers=args.workers,
        world_size=1,
    )
    info = get_wds_dataset(options, transform, is_train=True, epoch=0, tokenizer=tokenizer)
    return time_epoch(info.dataloader)


def write_report(rows: list[dict], out: Path, args) -> Path:
    """<out>/bench_data.csv, .json (the header's stamp, the arguments the page reads, the rows) and .md (its findings
    kept); returns the .md."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_data.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    meta = {k: getattr(args, k) for k in ("samples", "image_size", "batch_size", "workers", "rounds")}
    page = out / "bench_data.md"
    return pages.write_page(page, rebuild, pages.stamp(), meta | {"torch": torch.__version__}, rows)


def rebuild(page: Path) -> str:
    """bench_data.md written from bench_data.json beside it, with its findings section."""
    return study_page.with_findings(page, markdown(pages.load_data(page)))


def markdown(saved: dict) -> str:
    meta, rows = saved["meta"], saved["rows"]
    argv = ["--samples", meta["samples"], "--image-size", meta["image_size"], "--batch-size", meta["batch_size"]]
    argv = [str(a) for a in [*argv, "--workers", meta["workers"], "--rounds", meta["rounds"]]]
    lines = [
        pages.header("Data loader throughput", pages.command("scripts.bench_data", argv), made=saved["made"]),
        f"Other jobs share the cores, so single rounds are noisy; torch {meta['torch']}.",
        "Synthetic JPEG shards; open_clip train transform and ViT-B-16 tokenizer in the workers; one epoch "
        "per round, worker start-up included; median over rounds.",
        "",
        "| loader | samples/s (median) | rounds (samples/s) |",
        "| --- | --- | --- |",
    ]
    for name in ("ours", "open_clip"):
        runs = [r["samples_per_s"] for r in rows if r["loader"] == name]
        lines.append(f"| {name} | {statistics.median(runs):.0f} | {', '.join(f'{x:.0f}' for x in runs)} |")
    ratio = median_rate(rows, "ours") / median_rate(rows, "open_clip")
    lines += [
        "",
        f"Ratio ours / open_clip: **{paired_ratio(rows):.2f}** (median of the per-round ratios; "
        f"ratio of the medians: {ratio:.2f})",
        "",
    ]
    return "\n".join(lines)


def median_rate(rows: list[dict], name: str) -> float:
    return statistics.median(r["samples_per_s"] for r in rows if r["loader"] == name)


def paired_ratio(rows: list[dict]) -> float:
    """Median over rounds of ours / open_clip within the round (both ran back to back)."""
    rate = {(r["loader"], r["round"]): r["samples_per_s"] for r in rows}
    rounds = sorted({r["round"] for r in rows})
    return statistics.median(rate["ours", k] / rate["open_clip", k] for k in rounds)


def rounds(spec: str, transform, tokenizer, args) -> list[dict]:
    """One epoch of each loader per round, `args.rounds` rounds; which goes first alternates, so that drifting load
    on the machine hits both alike."""
    rows, loaders = [], [("ours", ours), ("open_clip", open_clips)]
    for round_ in range(args.rounds):
        for name, run in loaders if round_ % 2 == 0 else loaders[::-1]:
            samples, seconds = run(spec, transform, tokenizer, args)
            rows.append(
                {
                    "loader": name,
                    "round": round_,
                    "samples": samples,
                    "seconds": round(seconds, 3),
                    "samples_per_s": round(samples / seconds, 1),
                    "batch_size": args.batch_size,
                    "workers": args.workers,
                    "image_size": args.image_size,
                }
            )
            print(f"round {round_} {name:9s} {samples} samples in {seconds:.2f}s = {samples / seconds:.0f}/s")
    return rows
