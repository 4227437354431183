"""The page of scripts/rope_resolution.py (RoPE against a resampled position table at other resolutions), written from
its data: OUT/rope_resolution.json (each position kind's zero-shot top-1 at each evaluation size, the settings, the
stamp) and OUT/rope_resolution.md from it alone (rebuild; tests/test_docs_regenerate.py writes docs/ pages again)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from eval import pages, study_page
from models.config import size_config

KINDS = ("learnable", "rope")
PAGE_ARGS = ("size", "steps", "lr", "finetune_steps")


def write(out: Path, args, results: dict, seconds: float) -> Path:
    """results {(kind, size): top-1} -> OUT/rope_resolution.json and .md."""
    meta = {name: getattr(args, name) for name in PAGE_ARGS} | {"seconds": seconds}
    rows = [{"kind": kind, "size": size, "top1": top1} for (kind, size), top1 in results.items()]
    return pages.write_page(out / "rope_resolution.md", rebuild, pages.stamp(), meta, rows)


def rebuild(page: Path) -> str:
    """rope_resolution.md written from rope_resolution.json beside it, with the page's findings section."""
    saved = pages.load_data(page)
    args = SimpleNamespace(**saved["meta"])
    results = {(r["kind"], r["size"]): r["top1"] for r in saved["rows"]}
    sizes = sorted({s for _, s in results})
    patch = size_config(args.size)["vision_cfg"]["patch_size"]
    lines = [
        pages.header(
            "RoPE against a resampled position table at other resolutions",
            pages.command(
                "scripts.rope_resolution", ["--size", args.size, "--steps", str(args.steps), "--lr", str(args.lr)]
            ),
            made=saved["made"],
        ),
        f"{args.seconds / 60:.1f} min. Trained at 32 px (softmax, cosine over "
        f"{args.steps} steps of 64), zero-shot top-1 on the embedded 24-class set at each evaluation size; "
        "learnable: the table resampled on load (bicubic), rope: no table; tuned: then fine-tuned "
        f"{args.finetune_steps} steps at {sizes[-1]} px (the 32 px training images upsampled by the transform), from "
        "the table resampled (learnable) or as is (rope).",
        "",
        "| image positions | " + " | ".join(f"{s} px ({(s // patch) ** 2} patches)" for s in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for kind in [row for base in KINDS for row in (base, f"{base}-tuned")]:
        if any((kind, s) in results for s in sizes):
            cells = (f"{100 * results[kind, s]:.1f}%" if (kind, s) in results else "" for s in sizes)
            lines.append(f"| {kind.replace('-tuned', ', tuned')} | " + " | ".join(cells) + " |")
    return study_page.with_findings(page, "\n".join(lines) + "\n")
