"""Memory of a long loader run: the RSS of the main process and of the DataLoader workers while our loader and
open_clip's webdataset pipeline each stream the same shards with 1% corrupt samples: the measurements and the page of
scripts/bench_soak.py.

    spec = soak.write_shards(folder, shards, per_shard, corrupt_every)
    rows = soak.soak(spec, "ours", transform, tokenizer, args)      # one row per --every samples
    soak.write_report(rows, out, args, argv)                        # <out>/bench_soak.csv, .json, .png, .md
"""

from __future__ import annotations

import contextlib
import csv
import io
import random
import tarfile
import time
from argparse import Namespace
from functools import partial
from pathlib import Path

import psutil
from PIL import Image

from data import DataConfig, build_train_data
from eval import pages, study_page

MB = 2**20
FLAT = 0.05  # the curve counts as flat when no point after the first lies more than 5% above it


def jpeg(rng: random.Random, side: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), tuple(rng.randrange(256) for _ in range(3))).save(buffer, format="JPEG")
    return buffer.getvalue()


def write_shards(folder: Path, shards: int, per_shard: int, corrupt_every: int, side: int = 64) -> str:
    """`shards` tars of `per_shard` samples (side x side JPEG + caption); every `corrupt_every`-th sample's image is
    random bytes (corrupt_image). Returns the brace spec."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        with tarfile.open(folder / f"{shard:05d}.tar", "w") as tar:
            for i in range(per_shard):
                key = shard * per_shard + i
                image = rng.randbytes(2000) if key % corrupt_every == corrupt_every - 1 else jpeg(rng, side)
                for name, data in ((f"{key:08d}.jpg", image), (f"{key:08d}.txt", f"a photo number {key}".encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(folder / f"{{00000..{shards - 1:05d}}}.tar")


def ours(spec: str, transform, tokenizer, args):
    cfg = DataConfig(
        train_shards=spec,
        train_num_samples=2 * args.samples,  # an epoch longer than the soak: no worker ends before the last reading
        resampled=True,
        batch_size=args.batch_size,
        workers=args.workers,
        max_skip_fraction=None,
    )
    return build_train_data(cfg, transform, tokenizer).loader


def open_clips(spec: str, transform, tokenizer, args):
    import open_clip_train.data
    from open_clip_train.data import get_wds_dataset
    from webdataset.tariterators import tar_file_expander

    # see train/bench/loader.py: webdataset >= 0.2.96's EOF dict, webdataset issue #384
    open_clip_train.data.tar_file_expander = partial(tar_file_expander, eof_value=None)
    options = Namespace(
        train_data=spec,
        val_data=None,
        dataset_resampled=True,
        train_num_samples=2 * args.samples,
        train_data_upsampling_factors=None,
        seed=0,
        batch_size=args.batch_size,
        workers=args.workers,
        world_size=1,
    )
    return get_wds_dataset(options, transform, is_train=True, epoch=0, tokenizer=tokenizer).dataloader


LOADERS = {"ours": ours, "open_clip": open_clips}


def rss_mb() -> tuple[float, float]:
    """(RSS of this process, summed RSS of its child processes: the DataLoader workers), in MB."""
    me = psutil.Process()
    workers = 0.0
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a worker that just ended
            workers += child.memory_info().rss
    return me.memory_info().rss / MB, workers / MB


def soak(spec: str, name: str, transform, tokenizer, args) -> list[dict]:
    """Stream `args.samples` samples through loader `name`; a row every `args.every` samples."""
    rows, seen, mark, start = [], 0, args.every, time.perf_counter()
    for images, _ in LOADERS[name](spec, transform, tokenizer, args):
        seen += images.shape[0]
        if seen >= mark:
            main, workers = rss_mb()
            rows.append(
                {
                    "loader": name,
                    "samples": seen,
                    "main_rss_mb": round(main, 1),
                    "workers_rss_mb": round(workers, 1),
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
            print(f"{name:9s} {seen:7d} samples: main {main:.0f} MB, workers {workers:.0f} MB")
            mark += args.every
        if seen >= args.samples:
            break
    return rows


def growth(rows: list[dict], name: str, key: str) -> float:
    """The largest rise of `key` over its first value, as a fraction of it."""
    values = [r[key] for r in rows if r["loader"] == name]
    return max(values) / values[0] - 1


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in LOADERS:
        mine = [r for r in rows if r["loader"] == name]
        samples = [r["samples"] for r in mine]
        ax.plot(samples, [r["main_rss_mb"] for r in mine], marker="o", label=f"{name}: main process")
        ax.plot(samples, [r["workers_rss_mb"] for r in mine], marker="s", ls="--", label=f"{name}: workers (sum)")
    ax.set_xlabel("samples streamed")
    ax.set_ylabel("RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SETTINGS = ("samples", "image_size", "corrupt_every", "workers", "batch_size", "every")


def write_report(rows: list[dict], out: Path, args, argv: list[str]) -> Path:
    """<out>/bench_soak.csv, .json (the header's stamp, the arguments the page reads, the rows), .png and .md (its
    findings kept); returns the .md."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_soak.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    figure(rows, out / "bench_soak.png")
    meta = {k: getattr(args, k) for k in SETTINGS} | {"argv": argv, "flat": FLAT}
    page = out / "bench_soak.md"
    return pages.write_page(page, rebuild, pages.stamp(), meta, rows)


def rebuild(page: Path) -> str:
    """bench_soak.md written from bench_soak.json beside it, with its findings section (the figure beside it)."""
    return study_page.with_findings(page, markdown(pages.load_data(page)), beside=True)


def markdown(saved: dict) -> str:
    meta, rows, flat = saved["meta"], saved["rows"], saved["meta"]["flat"]
    names = list(dict.fromkeys(r["loader"] for r in rows))
    lines = [
        pages.header(
            "Loader memory over a long run", pages.command("scripts.bench_soak", meta["argv"]), made=saved["made"]
        ),
        f"Each loader streams {meta['samples']:,} samples (resampled shards of {meta['image_size']} px JPEGs, 1 in "
        f"{meta['corrupt_every']} corrupt) in {meta['workers']} workers at batch {meta['batch_size']}; the RSS of the "
        f"main process and the summed RSS of the workers every {meta['every']:,} samples. Flat means no point more "
        f"than {flat:.0%} above the first one.",
        "",
        "| loader | main RSS first / last / max (MB) | growth | workers RSS first / last / max (MB) | growth "
        "| seconds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in names:
        mine = [r for r in rows if r["loader"] == name]
        cells = []
        for key in ("main_rss_mb", "workers_rss_mb"):
            values = [r[key] for r in mine]
            cells += [f"{values[0]:.0f} / {values[-1]:.0f} / {max(values):.0f}", f"{growth(rows, name, key):+.1%}"]
        lines.append(f"| {name} | {' | '.join(cells)} | {mine[-1]['seconds']:.0f} |")
    verdicts = []
    for name in names:
        worst = max(growth(rows, name, key) for key in ("main_rss_mb", "workers_rss_mb"))
        verdicts.append(f"{name}: {'flat' if worst <= flat else 'not flat'} (largest rise {worst:+.1%})")
    ours_last = [r for r in rows if r["loader"] == "ours"][-1]
    theirs_last = [r for r in rows if r["loader"] == "open_clip"][-1]
    total = (ours_last["main_rss_mb"] + ours_last["workers_rss_mb"]) / (
        theirs_last["main_rss_mb"] + theirs_last["workers_rss_mb"]
    )
    lines += [
        "",
        "; ".join(verdicts) + f". Total RSS at the end, ours / open_clip: {total:.2f}.",
        "",
        "![RSS over the run](bench_soak.png)",
        "",
    ]
    return "\n".join(lines)
