"""Every generated study page is written again from the data committed beside it and compared with the committed
page (eval/study_page.py): every number on it comes from docs/<page>/data/, none is typed by hand outside its
"## Findings" section."""

import importlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from eval import seeds_page, study_page
from eval.study_page import findings_of, page_text

DOCS = Path(__file__).resolve().parents[1] / "docs"
# a page and what writes it again: a study's report (page.json beside its data) or the study over seeds (seeds.json)
WRITERS = {"page.json": study_page.rebuild, "seeds.json": seeds_page.rebuild}
GENERATED = sorted(
    (p, writer)
    for p in DOCS.glob("*.md")
    for data, writer in WRITERS.items()
    if (DOCS / p.stem / "data" / data).is_file()
)


def bench_pages() -> list[tuple[Path, str]]:
    """Benchmark and experiment pages written from their data: (page, the module whose rebuild writes it again), from
    each JSON in docs/ that names its writer (train/bench/: attention_page.py, long.py and, through
    eval.pages.write_page, every other benchmark's page; train/linearise.py, long_clip.py, rope_resolution.py)."""
    found = []
    for data in sorted(DOCS.glob("*.json")):
        writer = json.loads(data.read_text()).get("writer")
        if writer and data.with_suffix(".md").is_file():
            found.append((data.with_suffix(".md"), writer))
    return found


@pytest.mark.parametrize("page,writer", bench_pages(), ids=lambda p: getattr(p, "name", ""))
def test_a_benchmark_page_is_its_data_written_again(page, writer):
    assert importlib.import_module(writer).rebuild(page) == page.read_text()


def test_the_main_jobs_pages_are_generated():
    assert {DOCS / "study.md", DOCS / "study_seeds.md"} <= {page for page, _ in GENERATED}


@pytest.mark.parametrize("page,writer", GENERATED, ids=lambda p: getattr(p, "name", ""))
def test_a_generated_page_is_its_data_written_again(page, writer):
    assert writer(page) == page.read_text()
    linked = {line.split("](")[1].split(")")[0] for line in page.read_text().splitlines() if "![" in line}
    assert linked and all((DOCS / name).is_file() for name in linked)


def test_findings_stay_after_the_header_and_links_move_into_the_pages_folder(tmp_path):
    report = "# Title\n\n`python -m x`; header.\n\n9 runs.\n\n## Runs\n\n![curves](learning_curves.png)\n"
    findings = "## Findings\n\nLinear attention reaches 40%.\n"
    text = page_text(report, "study", findings)
    assert text.startswith("# Title\n\n`python -m x`; header.\n\n9 runs.\n\n" + findings + "\n## Runs")
    assert "](study/learning_curves.png)" in text
    (tmp_path / "study.md").write_text(text)
    assert findings_of(tmp_path / "study.md") == findings


def test_the_readmes_results_table_is_the_seeds_pages_data_written_again():
    """The README's results block (between its markers) is what eval/seeds_page.py writes from the data of the page
    over seeds: no number in it is typed by hand."""
    readme = (DOCS.parent / "README.md").read_text()
    pages = [
        p
        for p, writer in GENERATED
        if writer is seeds_page.rebuild and seeds_page.README_START.format(page=p.stem) in readme
    ]
    assert pages, "the README has no results block of a page over seeds"
    for page in pages:
        assert seeds_page.readme_block(page) in readme


def bench_frame():
    import pandas as pd

    rows = []
    for variant, scale in (("softmax", 1.0), ("linear_affine_nodenom", 0.3)):
        for n in (77, 1024):
            rows.append(
                {"variant": variant, "mode": "full", "dtype": "float32", "passes": "fwd+bwd", "N": n}
                | {"extrapolated": "", "status": "", "time_ms": scale * n / 97.0, "median_ms": scale * n / 90.0}
                | {"reps": 3, "peak_mb": 0.1 * n, "impl": "" if variant == "softmax" else "cpu"}
                | {"gbs": float("nan") if variant == "softmax" else 1.234567, "gflops": 10.0 / 3}
            )
    return pd.DataFrame(rows)


def test_an_attention_benchmark_page_is_its_data_written_again(tmp_path):
    """A benchmark page (train/bench/attention_page.py) is written from its CSV and JSON, so writing it again from
    them gives the page, its findings section kept."""
    from types import SimpleNamespace

    from train.bench import attention_page

    info = {"machine": "a test machine", "gemm": 100.0, "gemm_bf16": 200.0, "chunk_n": 1024}
    info |= {"chunk_cumsum_ms": 1.0, "chunk_loop_ms": 2.0, "load_start": 0.5, "load_end": 0.7}
    args = SimpleNamespace(batch=1, heads=6, head_dim=64, budget=0.1, device="cpu", argv=["--quick"])
    args.out = str(tmp_path / "bench")
    page = attention_page.write(attention_page.add_ratios(bench_frame(), info), info, args)
    text = page.read_text()
    assert attention_page.rebuild(page) == text and "| 0.3x" not in text and "(0.3x)" in text
    first = text.index("\n## ")
    page.write_text(
        text[: first + 1] + "## Findings\n\nlinear_affine_nodenom takes 0.3x softmax's time.\n" + text[first:]
    )
    assert attention_page.rebuild(page) == page.read_text()
    attention_page.write(attention_page.add_ratios(bench_frame(), info), info, args)  # measured again: findings stay
    assert "## Findings\n\nlinear_affine_nodenom takes 0.3x" in page.read_text()


def test_the_long_sequence_page_is_its_data_written_again(tmp_path):
    """train/bench/long.py writes bench_long.md from its CSV and JSON, so writing it again from them gives the page."""
    from types import SimpleNamespace

    from train.bench import long

    rows = [
        {"part": part, "length": n, "tokens": n + 1, "attention": a, "checkpointing": ckpt, "how": "measured"}
        | {"seconds": n * (1.0 if a == "softmax" else 0.4) / 977, "peak_mb": None if ckpt else n / 3, "ratio": 1.0}
        | {"flop_bound": 1.0 if a == "softmax" else 0.31}
        for part in ("image", "text")
        for n in (64, 256, 1024)
        for a in ("softmax", "linear_affine_nodenom")
        for ckpt in (False, True)
    ]
    args = SimpleNamespace(out=str(tmp_path), size="demo-w32", bf16=False, steps=2, argv=["--quick"])
    page = long.write(rows, args, SimpleNamespace(device="cpu"), 61.0)
    assert long.rebuild(page) == page.read_text() and "total 1.0 min" in page.read_text()
    page.write_text(page.read_text() + "\n## Findings\n\nLinear attention takes 0.4x softmax's time.\n")
    assert long.rebuild(page) == page.read_text()


def written_step(out: Path) -> Path:
    from train.bench import step

    rows = [
        dict(zip(step.FIELDS, (setting, attention, name, rate, rate / 700, rate / 715)))
        for setting in ("one run alone", "two runs at once")
        for attention in ("softmax", "linear_affine_nodenom")
        for name, rate in (("baseline", 715.3), ("ours", 1112.7))
    ]
    args = SimpleNamespace(out=str(out), baseline="8fc8415", steps=200, rounds=2)
    return step.write(rows, args, {"ours": {"data.workers": 0, "data.cache_mb": 512}, "baseline": {}}, 6.52)


def written_distill(out: Path) -> Path:
    from train.bench import distill_step

    rows = [
        dict(zip(distill_step.FIELDS, ("tiny-s", 4, kind, s, s / 0.1234)))
        for kind, s in (("training", 0.1234), ("transfer", 0.15), ("distill", 0.21))
    ]
    args = SimpleNamespace(out=str(out), argv=["--sizes", "tiny-s"], attention="linear_affine_nodenom", steps=1)
    return distill_step.write(rows, args, "cpu", 0.25)


def written_train(out: Path) -> Path:
    from train.bench import training

    rows = [
        training.row("vs_open_clip", "ViT-S-16", 224, "fp32", "softmax", (0.5123, 130.0), (0.6, None)),
        training.row("vs_open_clip", "ViT-S-16", 224, "bf16", "softmax", (0.3, None), (0.31, None)),
        training.row("attention", "ViT-S-16", 64, "fp32", "softmax", (0.2, 10.0), (0.2, 10.0)),
        training.row("attention", "ViT-S-16", 64, "fp32", "linear_elu", (float("nan"), None), (0.2, 10.0)),
    ]
    args = SimpleNamespace(out=str(out), command="python -m scripts.bench_train --steps 1", batch_size=4, steps=1)
    args.attention_size, args.attention_batch_size = "ViT-S-16", 2
    return training.write_outputs(rows, args, SimpleNamespace(device="cpu"), 61.0)


def written_eval(out: Path) -> Path:
    from train.bench import zeroshot

    rows = [
        {"tool": tool, "model": "ViT-S-32", "device": "cpu", "images": 192, "batch_size": 32, "workers": 0}
        | {"seconds": s, "classifier_s": s / 2, "images_per_s": round(192 / s, 2), "top1": 1 / 24, "top5": 0.1771}
        for tool, s in (("ours (eval.zeroshot)", 17.654), ("clip_benchmark 1.6.2", 17.994))
    ]
    args = SimpleNamespace(argv=["--rounds", "4"], model="ViT-S-32", device="cpu", batch_size=32, workers=0, rounds=4)
    return zeroshot.write_outputs(rows, args, out)


def written_data(out: Path) -> Path:
    from train.bench import loader

    rows = [
        {"loader": name, "round": k, "samples": 32, "seconds": 0.5 + k / 10, "samples_per_s": 32 / (0.5 + k / 10) * f}
        | {"batch_size": 8, "workers": 2, "image_size": 32}
        for k in range(3)
        for name, f in (("ours", 1.1), ("open_clip", 1.0))
    ]
    args = SimpleNamespace(samples=32, image_size=32, batch_size=8, workers=2, rounds=3)
    return loader.write_report(rows, out, args)


def written_checkpoint(out: Path) -> Path:
    from train.bench import checkpoint

    rounds = [{"bytes": 1.02e9 + k, "write_s": 8.3 + k, "finish_s": 2.6, "check_s": 2.0 + k / 3} for k in range(3)]
    return checkpoint.write_page(checkpoint.summary(rounds, 62_300_000), out)


def written_soak(out: Path) -> Path:
    from train.bench import soak

    rows = [
        {"loader": name, "samples": n, "main_rss_mb": 400.0 + n / 1e3 * f, "workers_rss_mb": 150.5 * f}
        | {"seconds": n / 100}
        for name, f in (("ours", 1.0), ("open_clip", 1.3))
        for n in (128, 256)
    ]
    args = SimpleNamespace(samples=256, every=128, image_size=32, corrupt_every=10, batch_size=32, workers=1)
    return soak.write_report(rows, out, args, ["--samples", "256"])


def written_profile(out: Path) -> Path:
    from train.bench import profiling

    rows = [{"part": "model step, softmax", "what": "total", "ms": 50.21}]
    rows += [{"part": "model step, softmax", "what": group, "ms": 21.9 / (i + 1)} for i, group in enumerate(["a", "b"])]
    return profiling.write(rows, out, "demo-w64", 0.61)


# each benchmark page written from synthetic rows, as its writer writes it (train/bench/)
WRITTEN = {
    f.__name__: f
    for f in (
        written_step,
        written_distill,
        written_train,
        written_eval,
        written_data,
        written_checkpoint,
        written_soak,
        written_profile,
    )
}


def findings_by_hand(text: str) -> str:
    """The page with a findings section typed in: above bench_eval.md's marker, or before the first section, or at
    the end (as study_page.page_text places the kept one)."""
    findings = "## Findings\n\nOurs is faster.\n"
    cut = text.find("<!-- bench_eval.py results -->")
    cut = cut if cut >= 0 else text.find("\n## ") + 1
    return f"{text[:cut]}{findings}\n{text[cut:]}" if cut > 0 else f"{text}\n{findings}"


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_each_benchmark_page_is_its_data_written_again_and_keeps_its_findings(name, tmp_path):
    """Every benchmark writer of train/bench/ saves <page>.json (its own name, the stamp, what the text reads, the
    rows) beside the CSV, and its rebuild writes the page again from that alone, a hand-written section kept."""
    page = WRITTEN[name](tmp_path)
    saved = json.loads(page.with_suffix(".json").read_text())
    writer = importlib.import_module(saved["writer"])
    assert page.with_suffix(".csv").is_file() and saved["made"]["date"] in page.read_text()
    assert writer.rebuild(page) == page.read_text()
    page.write_text(findings_by_hand(page.read_text()))
    assert writer.rebuild(page) == page.read_text()
    WRITTEN[name](tmp_path)  # measured again: the findings stay
    assert "## Findings\n\nOurs is faster.\n" in page.read_text() and writer.rebuild(page) == page.read_text()
    assert "## Findings" not in writer.rebuild(page).split("## Findings", 1)[1]  # kept once
