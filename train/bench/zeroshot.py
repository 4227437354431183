"""Zero-shot evaluation throughput, ours (eval.zeroshot) against clip_benchmark 1.6.2, on the same model and image
folder: the measurements and the page of scripts/bench_eval.py (what it times and how: its docstring).

    zeroshot.write_outputs(zeroshot.measure(args), args)    # docs/bench_eval.csv, .json, .png and .md
"""

import csv
import tempfile
import time
from pathlib import Path

import matplotlib
import open_clip
import torch
import torchvision
from clip_benchmark.metrics import zeroshot_classification

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from data import make_synthetic
from eval import datasets, pages, zeroshot

DOCS = Path(__file__).resolve().parents[2] / "docs"


def reference_accuracy(output, target, topk=(1,)):
    """clip_benchmark's top-k accuracy with `.item()` in place of float(1-element array), which NumPy 2.4 refuses."""
    pred = output.topk(max(topk), 1, True, True)[1].t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    return [correct[:k].reshape(-1).float().sum().item() / len(target) for k in topk]


def run_ours(model, preprocess, tokenizer, root: Path, args) -> dict:
    r = zeroshot.evaluate(
        model,
        dataset=str(root),
        tokenizer=tokenizer,
        transform=preprocess,
        batch_size=args.batch_size,
        device=args.device,
        workers=args.workers,
    )
    return {"top1": r["top1"], "top5": r["top5"], "images": r["num_images"]}


def run_clip_benchmark(model, preprocess, tokenizer, root: Path, args) -> dict:
    folder = torchvision.datasets.ImageFolder(str(root), transform=preprocess)
    loader = torch.utils.data.DataLoader(folder, batch_size=args.batch_size, shuffle=False, num_workers=args.workers)
    names, templates = datasets.read_lines(root / "classnames.txt"), datasets.read_lines(root / "templates.txt")
    r = zeroshot_classification.evaluate(
        model, loader, tokenizer, names, templates, args.device, amp=args.device.startswith("cuda")
    )
    return {"top1": r["acc1"], "top5": r["acc5"], "images": len(folder)}


def build_classifier(tool: str, model, tokenizer, root: Path, args):
    """The class-embedding phase alone of either tool (a run's remaining time is its image phase)."""
    names, templates = datasets.read_lines(root / "classnames.txt"), datasets.read_lines(root / "templates.txt")
    if tool.startswith("ours"):
        with torch.no_grad():
            return zeroshot.build_classifier(model, tokenizer, names, templates, args.device)
    amp = args.device.startswith("cuda")
    return zeroshot_classification.zero_shot_classifier(model, tokenizer, names, templates, args.device, amp=amp)


def timed(fn, *args):
    """(fn(*args), seconds), with the GPU's queue drained at both ends."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def measure(args) -> list[dict]:
    zeroshot_classification.accuracy = reference_accuracy
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms(args.model, device=args.device)
    model.eval()
    tokenizer = open_clip.get_tokenizer(args.model)
    tools = {"ours (eval.zeroshot)": run_ours, "clip_benchmark 1.6.2": run_clip_benchmark}
    best, classifier = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        make_synthetic(tmp, train_samples=1, eval_per_class=args.per_class, image_size=args.image_size)
        root = Path(tmp) / "eval"
        for round_ in range(args.rounds):
            for name, fn in tools.items():
                r, seconds = timed(fn, model, preprocess, tokenizer, root, args)
                print(f"round {round_}: {name}: {r['images'] / seconds:.1f} images/s, top1 {r['top1']:.4f}")
                if name not in best or seconds < best[name]["seconds"]:
                    best[name] = {**r, "seconds": seconds}
                seconds = timed(build_classifier, name, model, tokenizer, root, args)[1]
                classifier[name] = min(seconds, classifier.get(name, seconds))
    return [
        {
            "tool": name,
            "model": args.model,
            "device": args.device,
            "images": r["images"],
            "batch_size": args.batch_size,
            "workers": args.workers,
            "seconds": round(r["seconds"], 3),
            "classifier_s": round(classifier[name], 3),
            "images_per_s": round(r["images"] / r["seconds"], 2),
            "top1": r["top1"],
            "top5": r["top5"],
        }
        for name, r in best.items()
    ]


MARKER = "<!-- bench_eval.py results -->"  # the page above it is written by hand and kept; below, from the data


def write_outputs(rows: list[dict], args, out: Path = DOCS) -> Path:
    """<out>/bench_eval.csv, .json (the header's stamp, the arguments the page reads, the rows), .png and .md (the
    hand-written part above MARKER kept); returns the .md."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_eval.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.barh([r["tool"] for r in rows], [r["images_per_s"] for r in rows], color=["tab:blue", "tab:gray"])
    ax.set_xlabel(f"images/s ({args.model}, {args.device}, batch {args.batch_size}, {args.workers} workers)")
    fig.tight_layout()
    fig.savefig(out / "bench_eval.png", dpi=120)
    plt.close(fig)
    meta = {k: getattr(args, k) for k in ("argv", "model", "device", "batch_size", "workers", "rounds")}
    page = out / "bench_eval.md"
    pages.write_page(page, rebuild, pages.stamp(args.device), meta, rows)
    ratio = rows[0]["images_per_s"] / rows[1]["images_per_s"]
    print("\n".join(table(rows)) + f"\nratio ours / clip_benchmark = {ratio:.2f}")
    return page


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| tool | images | seconds | of which class embeddings (s) | images/s | top-1 | top-5 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    return lines + [
        f"| {r['tool']} | {r['images']} | {r['seconds']} | {r['classifier_s']} | {r['images_per_s']} | "
        f"{r['top1']:.4f} | {r['top5']:.4f} |"
        for r in rows
    ]


def rebuild(page: Path) -> str:
    """bench_eval.md written from bench_eval.json beside it: the page's hand-written part above MARKER (a header
    from the saved stamp where there is none), then the results."""
    page, saved = Path(page), pages.load_data(page)
    meta, rows, made = saved["meta"], saved["rows"], saved["made"]
    what_ran = pages.command("scripts.bench_eval", meta["argv"])
    text = page.read_text() if page.is_file() else ""
    head = (
        text.split(MARKER)[0]
        if MARKER in text
        else pages.header("Evaluation throughput and agreement", what_ran, made=made)
    )
    ratio = rows[0]["images_per_s"] / rows[1]["images_per_s"]
    return (
        f"{head}{MARKER}\n\n## Throughput (written by scripts/bench_eval.py)\n\n"
        f"`{what_ran}` on {made['machine']} (load average {made['load']:.1f} at the end), model {meta['model']} "
        f"(random init), {meta['device']}, batch {meta['batch_size']}, {meta['workers']} workers, best of "
        f"{meta['rounds']} alternating rounds:\n\n"
        + "\n".join(table(rows))
        + f"\n\nRatio ours / clip_benchmark: **{ratio:.2f}x**. "
        f"Top-1 difference: {abs(rows[0]['top1'] - rows[1]['top1']) * 100:.2f} points.\n\n![](bench_eval.png)\n"
    )
