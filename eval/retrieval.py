"""Image-text retrieval recall@k in both directions (as in CLIP, Radford et al. 2021, table 13), COCO/Flickr style:
several captions per image.

    python -m eval.retrieval RUN_OR_CHECKPOINT --dataset pairs.csv [--csv-img-key filepath --csv-caption-key title]
    python -m eval.retrieval --open-clip-model ViT-B-16 --checkpoint FILE --dataset WDS_DIR --out result.json

text_to_image_R@k: the fraction of captions whose image is among the k images most similar to the caption.
image_to_text_R@k: the fraction of images with at least one of their own captions among their k nearest captions.

With `shard=Shard(rank, world_size)` each rank of a job embeds its slice of the pairs; the features are gathered
in rank order and every rank scores the whole set (eval.sharding).
"""

import argparse
import logging
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from eval import checkpoint, datasets
from eval.datasets import EvalInputError
from eval.sharding import Shard, count_skipped, gather_objects, gather_rows
from models.preprocess import CachedTokenizer

log = logging.getLogger(__name__)


def recall_at_k(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    image_of_text: torch.Tensor,
    ks=(1, 5, 10),
    chunk: int = 1024,
) -> dict:
    """Recall@k both ways from normalised features [I, D] and [T, D]; image_of_text [T] is each caption's image.

    Scores are computed `chunk` rows at a time so COCO-size sets (25k x 5k) need no full similarity matrix.
    """
    num_images, num_texts = len(image_features), len(text_features)
    t2i = torch.zeros(len(ks))
    for start in range(0, num_texts, chunk):
        scores = text_features[start : start + chunk] @ image_features.T
        top = scores.topk(min(max(ks), num_images), dim=1).indices
        own = top == image_of_text[start : start + chunk, None]
        t2i += torch.tensor([float(own[:, :k].any(dim=1).sum()) for k in ks])
    i2t = torch.zeros(len(ks))
    for start in range(0, num_images, chunk):
        scores = image_features[start : start + chunk] @ text_features.T
        top = scores.topk(min(max(ks), num_texts), dim=1).indices
        own = image_of_text[top] == torch.arange(start, start + len(scores))[:, None]
        i2t += torch.tensor([float(own[:, :k].any(dim=1).sum()) for k in ks])
    result = {}
    for j, k in enumerate(ks):
        result[f"text_to_image_R@{k}"] = t2i[j].item() / num_texts
        result[f"image_to_text_R@{k}"] = i2t[j].item() / num_images
    result["mean_recall"] = (t2i.sum().item() / num_texts + i2t.sum().item() / num_images) / (2 * len(ks))
    return result


@torch.no_grad()
def embed_pairs(model, loader, tokenizer, device, progress: bool = False):
    """Normalised image features [I, D], caption features [T, D], each caption's image [T], skipped names, how
    many captions were cut to the context length (open_clip's truncation, counted, never silent), and how many
    empty captions (blank lines of a webdataset `txt`) were dropped."""
    images_out, texts_out, owner, skipped = [], [], [], []
    tokenizer = tokenizer if hasattr(tokenizer, "truncated") else CachedTokenizer(tokenizer)
    truncated = empty = 0
    for images, groups, bad in tqdm(loader, desc="pairs", disable=not progress):
        skipped += bad
        if images is None:
            continue
        captions = [[c for c in group if c.strip()] for group in groups]
        empty += sum(len(g) for g in groups) - sum(len(g) for g in captions)
        first = sum(len(x) for x in images_out)
        images_out.append(F.normalize(model.encode_image(images.to(device)).float(), dim=-1).cpu())
        flat = [c for group in captions for c in group]
        texts_out.append(F.normalize(model.encode_text(tokenizer(flat).to(device)).float(), dim=-1).cpu())
        truncated += tokenizer.truncated(flat)
        owner += [first + i for i, group in enumerate(captions) for _ in group]
    if not images_out:
        return None, None, torch.zeros(0, dtype=torch.long), skipped, truncated, empty
    owner = torch.as_tensor(owner, dtype=torch.long)
    return torch.cat(images_out), torch.cat(texts_out), owner, skipped, truncated, empty


def gather_pairs(image_features, text_features, owner, shard: Shard, device):
    """The features of every rank in rank order, with each caption's image index shifted to the gathered order.

    A rank without readable pairs contributes empty blocks of the others' width.
    """
    width = gather_objects(None if image_features is None else image_features.shape[1], shard)
    width = next((w for w in width if w is not None), None)
    if width is None:
        return None, None, owner
    empty = torch.zeros(0, width)
    image_features = empty if image_features is None else image_features
    text_features = empty if text_features is None else text_features
    offsets = torch.tensor([0, *gather_objects(len(image_features), shard)]).cumsum(0)
    owner = owner + offsets[shard.rank]
    gathered = [gather_rows(t, shard, device) for t in (image_features, text_features, owner)]
    return tuple(gathered)


def evaluate(
    model,
    *,
    dataset,
    tokenizer,
    transform,
    split: str = "test",
    csv_img_key: str = "filepath",
    csv_caption_key: str = "title",
    csv_separator: str | None = None,
    **options,
) -> dict:
    """Recall@k both ways on a CSV/TSV of (image, caption) rows or a webdataset of images with `txt` captions.

    Images that cannot be read are skipped with their captions and counted under `skipped`. `options` go to
    `evaluate_pairs`.
    """
    pairs = datasets.open_retrieval(dataset, transform, split, csv_img_key, csv_caption_key, csv_separator)
    result = evaluate_pairs(model, pairs, tokenizer, **options)
    return {**result, "dataset": str(dataset)}


def evaluate_pairs(
    model,
    pairs,
    tokenizer,
    *,
    batch_size: int = 64,
    device=None,
    workers: int = 0,
    ks=(1, 5, 10),
    amp: bool | None = None,
    progress: bool = False,
    shard: Shard | None = None,
) -> dict:
    """Recall@k of an opened pair set (datasets.open_retrieval); with `shard`, every rank must call it."""
    shard = shard or Shard()
    device = torch.device(device or next(model.parameters()).device)
    amp = device.type == "cuda" if amp is None else amp
    loader = datasets.make_loader(pairs, batch_size, workers, shard)
    was_training, started = model.training, time.perf_counter()
    model.eval()
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            embedded = embed_pairs(model, loader, tokenizer, device, progress)
    finally:
        model.train(was_training)
    image_features, text_features, owner = gather_pairs(*embedded[:3], shard, device)
    num_skipped, skipped = count_skipped(embedded[3], shard)
    if image_features is None:
        raise EvalInputError(f"no readable image-caption pairs ({num_skipped} unreadable); check the dataset path")
    truncated, empty = sum(gather_objects(embedded[4], shard)), sum(gather_objects(embedded[5], shard))
    if empty:
        log.warning("retrieval: %d empty captions (blank lines) dropped", empty)
    if truncated:
        log.warning(
            "retrieval: %d of %d captions were longer than the context (%s tokens) and cut as open_clip cuts them; "
            "evaluate with --context-length to keep them whole",
            truncated,
            len(text_features),
            getattr(tokenizer, "context_length", "?"),
        )
    return {
        "captions_truncated": truncated,
        "captions_empty": empty + getattr(pairs, "empty_captions", 0),  # blank lines, or a CSV's empty rows
        **recall_at_k(image_features, text_features, owner, ks),
        "num_images": len(image_features),
        "num_captions": len(text_features),
        "skipped": num_skipped,
        "skipped_examples": skipped,
        "seconds": time.perf_counter() - started,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m eval.retrieval", description=__doc__.split("\n\n")[0])
    checkpoint.add_model_arguments(parser)
    parser.add_argument("--dataset", required=True, help=".csv/.tsv of image-caption rows or a webdataset folder")
    parser.add_argument("--split", default="test", help="webdataset split folder")
    parser.add_argument("--csv-img-key", default="filepath")
    parser.add_argument("--csv-caption-key", default="title")
    parser.add_argument("--csv-separator", help="default: tab for .tsv, comma otherwise")
    checkpoint.add_run_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    return checkpoint.evaluate_from_args(
        parse_args(argv), evaluate, ("csv_img_key", "csv_caption_key", "csv_separator")
    )


if __name__ == "__main__":
    main()
