"""Zero-shot classification (Radford et al. 2021, CLIP section 3.1.4): class embeddings are the normalised mean
of the normalised text embeddings of every template filled with the class name; an image's prediction is its
most similar class.

    python -m eval.zeroshot RUN_OR_CHECKPOINT --dataset DIR [--classnames imagenet1k|FILE] [--templates openai|FILE]
    python -m eval.zeroshot --open-clip-model ViT-B-16 --checkpoint FILE --dataset DIR --out result.json

`evaluate(..., shard=Shard(rank, world_size))` on every rank of a job scores each rank's slice of the images and
sums the counts over the ranks (eval.sharding): every rank returns the result of the whole set.

Memory stays bounded for ImageNet-21K (21,841 classes x 80 templates): the classifier is built a few classes at
a time and images are scored against it in chunks of classes, keeping a running top-5.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from eval import checkpoint, datasets
from eval.datasets import EvalInputError
from eval.fewshot import accuracies as fewshot_accuracies
from eval.replay import Replay
from eval.sharding import Shard, count_skipped, sum_over_ranks


@torch.no_grad()
def build_classifier(
    model,
    tokenizer,
    classnames: list[str],
    templates: list,
    device,
    texts_per_batch: int = 1024,
    progress: bool = False,
) -> torch.Tensor:
    """Class embeddings [D, C]: normalise(mean_t normalise(encode_text(template_t(class)))), a few classes a time."""
    chunk = max(1, texts_per_batch // len(templates))
    weights = []
    for start in tqdm(range(0, len(classnames), chunk), desc="classifier", disable=not progress, leave=False):
        names = classnames[start : start + chunk]
        texts = [datasets.fill_template(t, c) for c in names for t in templates]
        embeddings = F.normalize(model.encode_text(tokenizer(texts).to(device)).float(), dim=-1)
        weights.append(F.normalize(embeddings.view(len(names), len(templates), -1).mean(dim=1), dim=-1))
    return torch.cat(weights).T.contiguous()


def topk_chunked(
    features: torch.Tensor, classifier: torch.Tensor, k: int = 5, class_chunk: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k (scores, class ids) [B, k] of features [B, D] against classifier [D, C], scoring C in chunks."""
    best_scores = best_ids = None
    for start in range(0, classifier.shape[1], class_chunk):
        scores = features @ classifier[:, start : start + class_chunk]
        scores, ids = scores.topk(min(k, scores.shape[1]), dim=1)
        ids = ids + start
        if best_scores is not None:
            scores, ids = torch.cat([best_scores, scores], 1), torch.cat([best_ids, ids], 1)
            scores, order = scores.topk(min(k, scores.shape[1]), dim=1)
            ids = ids.gather(1, order)
        best_scores, best_ids = scores, ids
    return best_scores, best_ids


class Tally:
    """Running top-1/top-5 hits and per-class recall counts."""

    def __init__(self, num_classes: int):
        self.total = torch.zeros(num_classes, dtype=torch.long)
        self.hit1 = torch.zeros(num_classes, dtype=torch.long)
        self.hit5 = 0

    def add(self, top_ids: torch.Tensor, targets: torch.Tensor) -> None:
        """top_ids [B, k] best first, targets [B]."""
        top_ids, targets = top_ids.cpu(), targets.cpu()
        n = len(self.total)
        self.total += torch.bincount(targets, minlength=n)
        self.hit1 += torch.bincount(targets[top_ids[:, 0] == targets], minlength=n)
        self.hit5 += int((top_ids[:, :5] == targets[:, None]).any(dim=1).sum())

    def sum_over_ranks(self, shard: Shard, device) -> None:
        """Replace this rank's counts by the counts of all ranks (one all-reduce of [2C + 1] integers)."""
        n = len(self.total)
        counts = sum_over_ranks(torch.cat([self.total, self.hit1, torch.tensor([self.hit5])]), shard, device)
        self.total, self.hit1, self.hit5 = counts[:n], counts[n : 2 * n], int(counts[-1])

    def result(self) -> dict:
        count = int(self.total.sum())
        present = self.total > 0
        recall = (self.hit1[present].double() / self.total[present]).mean().item() if count else float("nan")
        return {
            "top1": int(self.hit1.sum()) / max(count, 1),
            "top5": self.hit5 / max(count, 1),
            "mean_per_class_recall": recall,
            "num_images": count,
        }


def check_labels(targets: torch.Tensor, num_classes: int) -> None:
    bad = targets[(targets < 0) | (targets >= num_classes)]
    if len(bad) and bad[0] < 0:
        raise EvalInputError(
            f"a sample without a .cls label (label {int(bad[0])}) among {num_classes} classes; give every "
            "evaluation sample its class index in a .cls file"
        )
    if len(bad):
        raise EvalInputError(
            f"label {int(bad[0])} out of range for {num_classes} class names; give the class names file of this dataset"
        )


def evaluate(
    model,
    *,
    dataset,
    tokenizer,
    transform,
    classnames=None,
    templates=None,
    split: str = "test",
    **options,
) -> dict:
    """Zero-shot top-1/top-5 (fractions) and mean per-class recall of `model` on an ImageFolder tree or a
    clip_benchmark webdataset. Unreadable images are skipped and counted under `skipped`.

    Returns top1, top5 (over min(5, num_classes) guesses), mean_per_class_recall (over classes with images),
    num_images, skipped, skipped_examples (first 10), num_classes, num_templates, dataset, format, classnames
    and templates (their sources), seconds, images_per_s. `options` go to `evaluate_set`.
    """
    evalset = datasets.open_classification(dataset, transform, classnames, templates, split)
    return evaluate_set(model, evalset, tokenizer, **options)


@torch.no_grad()
def score_images(
    model, batches, classifier: torch.Tensor, tally: "Tally", device, class_chunk: int, keep: list | None = None
) -> list:
    """Add each batch's top-5 classes to the tally; returns the skipped samples the batches reported. `keep`: a list
    that receives each batch's (normalised features, targets) on the CPU (for the few-shot probes)."""
    skipped = []
    for images, targets, bad in batches:
        skipped += bad
        if images is None:
            continue
        targets = torch.as_tensor(targets)
        check_labels(targets, classifier.shape[1])
        features = F.normalize(model.encode_image(images.to(device)).float(), dim=-1)
        tally.add(topk_chunked(features, classifier, 5, class_chunk)[1], targets)
        if keep is not None:
            keep.append((features.cpu(), targets.cpu()))
    return skipped


def probe_accuracies(kept: list, shard: Shard, fewshot: dict) -> dict[int, float]:
    """Few-shot accuracies (eval/fewshot.py) of the image features that every rank kept; every rank must call it."""
    features = torch.cat([f for f, _ in kept]) if kept else torch.zeros(0, 1)
    targets = torch.cat([t for _, t in kept]) if kept else torch.zeros(0, dtype=torch.long)
    if shard.distributed:
        parts = [None] * shard.world_size
        torch.distributed.all_gather_object(parts, (features, targets))
        features = torch.cat([f for f, t in parts if len(t)])
        targets = torch.cat([t for _, t in parts if len(t)])
    return fewshot_accuracies(features, targets, fewshot["shots"], fewshot["draws"])


def evaluate_set(
    model,
    evalset: datasets.ClassificationSet,
    tokenizer,
    *,
    batch_size: int = 64,
    device=None,
    workers: int = 0,
    class_chunk: int = 4096,
    texts_per_batch: int = 1024,
    amp: bool | None = None,
    progress: bool = False,
    shard: Shard | None = None,
    replay: Replay | None = None,
    fewshot: dict | None = None,
) -> dict:
    """Zero-shot results of an opened set (see `evaluate`); with `shard`, every rank of the job must call it.

    amp: bf16 autocast (default: on for CUDA, off for CPU). The model's train/eval mode is restored after.
    replay: the same set evaluated again and again (eval.replay.Replay): its images decoded once while they fit.
    fewshot: {"shots": [...], "draws": n} adds "fewshot": {k: accuracy} of ridge probes on the same image features
    (eval/fewshot.py), the features of every rank gathered first.
    """
    shard = shard or Shard()
    device = torch.device(device or next(model.parameters()).device)
    amp = device.type == "cuda" if amp is None else amp
    loader = datasets.make_loader(evalset.dataset, batch_size, workers, shard)
    was_training, started = model.training, time.perf_counter()
    model.eval()
    tally, skipped, kept = Tally(len(evalset.classnames)), [], [] if fewshot else None
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            classifier = build_classifier(
                model, tokenizer, evalset.classnames, evalset.templates, device, texts_per_batch, progress
            )
            total = len(loader.dataset) if hasattr(loader.dataset, "__len__") else None
            batches = replay(lambda: loader) if replay is not None else loader
            batches = tqdm(batches, desc="images", total=total and -(-total // batch_size), disable=not progress)
            skipped = score_images(model, batches, classifier, tally, device, class_chunk, kept)
    finally:
        model.train(was_training)
    tally.sum_over_ranks(shard, device)
    num_skipped, skipped = count_skipped(skipped, shard)
    seconds = time.perf_counter() - started
    result = tally.result()
    if result["num_images"] == 0:
        raise EvalInputError(
            f"no readable images in {evalset.info.get('dataset')} ({num_skipped} unreadable); check the dataset path"
        )
    return {
        **result,
        **({"fewshot": probe_accuracies(kept, shard, fewshot)} if fewshot else {}),
        "skipped": num_skipped,
        "skipped_examples": skipped,
        "num_classes": len(evalset.classnames),
        "num_templates": len(evalset.templates),
        "seconds": seconds,
        "images_per_s": result["num_images"] / seconds,
        **evalset.info,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m eval.zeroshot", description=__doc__.split("\n\n")[0])
    checkpoint.add_model_arguments(parser)
    parser.add_argument("--dataset", required=True, help="ImageFolder tree or clip_benchmark webdataset folder")
    parser.add_argument("--split", default="test", help="webdataset split folder")
    parser.add_argument(
        "--classnames",
        help="imagenet1k, or a file: one name a line (sorted class-folder order) "
        "or 'wnid name' lines (ImageNet-21K); default: classnames.txt",
    )
    parser.add_argument(
        "--templates",
        help="openai (80 CLIP templates), simple, or a file with {c} per line; "
        "default: templates.txt in the dataset, else openai",
    )
    parser.add_argument("--class-chunk", type=int, default=4096, help="classes scored at a time")
    parser.add_argument("--texts-per-batch", type=int, default=1024, help="prompts encoded at a time")
    parser.add_argument(
        "--fewshot",
        type=lambda text: {"shots": [int(k) for k in text.split(",")], "draws": 5},
        help="few-shot ridge probes on the same features, e.g. 1,5,10,25 (eval/fewshot.py; 5 draws each)",
    )
    checkpoint.add_run_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    options = ("classnames", "templates", "class_chunk", "texts_per_batch", "fewshot")
    return checkpoint.evaluate_from_args(parse_args(argv), evaluate, options)


if __name__ == "__main__":
    main()
