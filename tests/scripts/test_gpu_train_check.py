"""The CPU rehearsal of scripts/gpu_train_check.py, with open_clip and webdataset made unimportable, as on the
GPU machine: both checks (DDP on one process, FSDP on two) run the real loop and write their rows."""

import csv
import os
import sys

from tests.train.common import REPO, finish, popen

BLOCK = "import sys\nsys.modules['open_clip'] = None\nsys.modules['webdataset'] = None\n"


def test_rehearsal_without_open_clip_or_webdataset(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK)  # imported by every Python process started below
    out = tmp_path / "out"
    args = ["--out", str(out), "--device", "cpu", "--model", "tiny-s", "--sharded-model", "tiny-m"]
    args += ["--steps", "10", "--batch", "8", "--sharded-batch", "8", "--precision", "fp32"]
    code, stdout, err = finish(
        popen(
            [sys.executable, "-m", "scripts.gpu_train_check", *args], env={"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
        ),
        timeout=400,
    )
    assert code == 0, err[-12000:]
    rows = list(csv.DictReader((out / "gpu_train_check.csv").read_text().splitlines()))
    assert [(r["check"], r["model"], r["processes"], r["status"]) for r in rows] == [
        ("ddp-1", "tiny-s", "1", "ok"),
        ("fsdp-2", "tiny-m", "2", "ok"),
    ]
    for r in rows:
        assert float(r["samples_per_s"]) > 0 and float(r["tflops_per_gpu"]) > 0 and r["max_memory_gb"] == ""
        per_gpu = float(r["samples_per_s_per_gpu"]) * int(r["processes"])
        assert abs(per_gpu / float(r["samples_per_s"]) - 1) < 1e-3  # figures kept to 4 significant digits
        assert float(r["last_loss"]) < float(r["first_loss"])  # 10 steps on one repeated batch: it memorises
    assert (out / "runs" / "fsdp-2" / "checkpoints" / "latest").is_file()  # a sharded checkpoint, as on GPUs
    assert "| fsdp-2 | tiny-m | fsdp | 2 |" in (out / "gpu_train_check.md").read_text()
    assert "| ddp-1 |" in stdout
