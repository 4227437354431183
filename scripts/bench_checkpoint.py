"""What verifying checkpoints costs: writing a checkpoint's files against hashing them into the manifest
(`models.layout.finish`) and checking them before a resume (`models.layout.check`).

    python -m scripts.bench_checkpoint [--params 62.3e6] [--rounds 3] [--dir /tmp]

The files have the sizes a CLIP of `--params` parameters writes with AdamW: model.safetensors and
state/model.safetensors (4 bytes a parameter each), state/optimizer.bin (exp_avg and exp_avg_sq, 8 bytes a
parameter), plus the small ones. 62.3e6 is ViT-S-16, 149.6e6 ViT-B-16, 427.7e6 ViT-L-16. Each round writes a
fresh checkpoint in a temporary folder under `--dir` (so the file system is the one checkpoints live on),
finishes it and checks it; the figures are medians over rounds. Writes docs/bench_checkpoint.csv and .md.
"""

import argparse
import csv
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from eval import pages
from models import layout

DOCS = Path(__file__).resolve().parents[1] / "docs"


def write_files(tmp: Path, params: int) -> int:
    """The files of one checkpoint of `params` parameters (random contents, 4M-element tensors); returns bytes."""
    chunk, count = 4_000_000, max(1, round(params / 4_000_000))
    weights = {f"w{i}": torch.rand(chunk) for i in range(count)}
    (tmp / layout.STATE).mkdir(parents=True)
    save_file(weights, str(tmp / layout.MODEL))
    save_file(weights, str(tmp / layout.STATE / layout.MODEL))
    # distinct tensors: torch.save stores a storage once however often it is referenced
    moments = {i: {"exp_avg": w.clone(), "exp_avg_sq": w.clone()} for i, w in enumerate(weights.values())}
    torch.save({"state": moments, "param_groups": []}, tmp / layout.STATE / "optimizer.bin")
    torch.save({"last_epoch": 1}, tmp / layout.STATE / "scheduler.bin")
    torch.save({"torch_manual_seed": torch.get_rng_state()}, tmp / layout.STATE / "random_states_0.pkl")
    meta = {"step": 1, "samples_seen": 1, "config": {"model": {"name": "bench"}}}
    (tmp / layout.META).write_text(json.dumps(meta))
    (tmp / "data_state_0.json").write_text("{}")
    return sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())


def one_round(root: Path, params: int, step: int) -> dict:
    tmp = layout.tmp_folder(root, step)
    start = time.perf_counter()
    size = write_files(tmp, params)
    written = time.perf_counter()
    folder = layout.finish(tmp)
    finished = time.perf_counter()
    assert layout.check(folder).problem is None
    checked = time.perf_counter()
    layout.prune(root, 1, keep=folder)
    return {"bytes": size, "write_s": written - start, "finish_s": finished - written, "check_s": checked - finished}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=62.3e6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        rounds = [one_round(Path(root), int(args.params), step) for step in range(1, args.rounds + 1)]
    row = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    row["params"], row["hash_mb_per_s"] = int(args.params), row["bytes"] / 1e6 / row["check_s"]
    row["finish_over_write"] = row["finish_s"] / row["write_s"]
    write_page(row, args.out)
    return row


def write_page(row: dict, out: Path) -> None:
    line = (
        f"{row['params'] / 1e6:.1f}M parameters, {row['bytes'] / 1e9:.2f} GB of checkpoint files: write "
        f"{row['write_s']:.1f} s, finish (hash into the manifest, fsync, rename) {row['finish_s']:.1f} s "
        f"({row['finish_over_write']:.2f}x the write), check before resume {row['check_s']:.1f} s "
        f"({row['hash_mb_per_s']:.0f} MB/s)"
    )
    print(line)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_checkpoint.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    (out / "bench_checkpoint.md").write_text(
        pages.header("Checkpoint verification cost", f"python -m scripts.bench_checkpoint --params {row['params']:.4g}")
        + "Median of the rounds (other jobs share the cores and the disk).\n\n"
        f"{line}.\n"
    )


if __name__ == "__main__":
    main()
