"""What verifying checkpoints costs: the measurements and the page of scripts/bench_checkpoint.py (what it times and
how: its docstring).

    rounds = [checkpoint.one_round(root, 62_300_000, step) for step in (1, 2, 3)]   # seconds of each phase
    checkpoint.write_page(checkpoint.summary(rounds, 62_300_000), out)       # <out>/bench_checkpoint.csv, .json, .md
"""

import csv
import json
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from eval import pages, study_page
from models import run_folder


def write_files(tmp: Path, params: int) -> int:
    """The files of one checkpoint of `params` parameters (random contents, 4M-element tensors); returns bytes."""
    chunk, count = 4_000_000, max(1, round(params / 4_000_000))
    weights = {f"w{i}": torch.rand(chunk) for i in range(count)}
    (tmp / run_folder.STATE).mkdir(parents=True)
    save_file(weights, str(tmp / run_folder.MODEL))
    save_file(weights, str(tmp / run_folder.STATE / run_folder.MODEL))
    # distinct tensors: torch.save stores a storage once however often it is referenced
    moments = {i: {"exp_avg": w.clone(), "exp_avg_sq": w.clone()} for i, w in enumerate(weights.values())}
    torch.save({"state": moments, "param_groups": []}, tmp / run_folder.STATE / "optimizer.bin")
    torch.save({"last_epoch": 1}, tmp / run_folder.STATE / "scheduler.bin")
    torch.save({"torch_manual_seed": torch.get_rng_state()}, tmp / run_folder.STATE / "random_states_0.pkl")
    meta = {"step": 1, "samples_seen": 1, "config": {"model": {"name": "bench"}}}
    (tmp / run_folder.META).write_text(json.dumps(meta))
    (tmp / "data_state_0.json").write_text("{}")
    return sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())


def one_round(root: Path, params: int, step: int) -> dict:
    tmp = run_folder.tmp_folder(root, step)
    start = time.perf_counter()
    size = write_files(tmp, params)
    written = time.perf_counter()
    folder = run_folder.finish(tmp)
    finished = time.perf_counter()
    assert run_folder.check(folder).problem is None
    checked = time.perf_counter()
    run_folder.prune(root, 1, keep=folder)
    return {"bytes": size, "write_s": written - start, "finish_s": finished - written, "check_s": checked - finished}


def summary(rounds: list[dict], params: int) -> dict:
    """The medians over rounds, the hashing rate (MB/s) and finish / write."""
    row = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    row["params"], row["hash_mb_per_s"] = params, row["bytes"] / 1e6 / row["check_s"]
    row["finish_over_write"] = row["finish_s"] / row["write_s"]
    return row


def write_page(row: dict, out: Path) -> Path:
    """<out>/bench_checkpoint.csv, .json (the header's stamp and the row) and .md (its findings kept); returns the
    .md."""
    print(line(row))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_checkpoint.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    page = out / "bench_checkpoint.md"
    return pages.write_page(page, rebuild, pages.stamp(), {}, [row])


def line(row: dict) -> str:
    return (
        f"{row['params'] / 1e6:.1f}M parameters, {row['bytes'] / 1e9:.2f} GB of checkpoint files: write "
        f"{row['write_s']:.1f} s, finish (hash into the manifest, fsync, rename) {row['finish_s']:.1f} s "
        f"({row['finish_over_write']:.2f}x the write), check before resume {row['check_s']:.1f} s "
        f"({row['hash_mb_per_s']:.0f} MB/s)"
    )


def rebuild(page: Path) -> str:
    """bench_checkpoint.md written from bench_checkpoint.json beside it, with its findings section."""
    saved = pages.load_data(page)
    row = saved["rows"][0]
    what_ran = f"python -m scripts.bench_checkpoint --params {row['params']:.4g}"
    text = (
        pages.header("Checkpoint verification cost", what_ran, made=saved["made"])
        + "Median of the rounds (other jobs share the cores and the disk).\n\n"
        f"{line(row)}.\n"
    )
    return study_page.with_findings(page, text)
