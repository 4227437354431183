"""Every generated study page is written again from the data committed beside it and compared with the committed
page (eval/study_page.py): every number on it comes from docs/<page>/data/, none is typed by hand outside its
"## Findings" section."""

import importlib
import json
from pathlib import Path

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
    """Benchmark pages written from their data: (page, the module whose rebuild writes it again), from the JSON
    beside each CSV in docs/ that names its writer (train/bench/attention_page.py, train/bench/long.py)."""
    found = []
    for data in sorted(DOCS.glob("*.json")):
        writer = json.loads(data.read_text()).get("writer") if data.with_suffix(".csv").is_file() else None
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
