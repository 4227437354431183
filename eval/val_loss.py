"""Held-out contrastive validation loss: the run's loss on fixed batches of validation shards.

The definition gives the same number on any number of ranks:
- the validation shards (webdataset, the training format) are read in the order of their spec and cut into
  consecutive batches of `batch_size` raw samples; a last, shorter batch is left out, so every batch has the
  same size (the contrastive loss depends on the batch size: its chance level is log(batch_size));
- batch j goes to rank j % world_size; unreadable samples are left out of their batch;
- each batch's loss is the run's loss function on that batch alone (no features gathered from other ranks);
- the sums and counts of batch losses are all-reduced: val_loss = the mean over batches.

Every rank runs the same number of forward passes (a rank with one batch fewer repeats its last one and does
not count it), so sharded models, whose forward passes are collective, stay in step. The training random state
is untouched: torch's generators are forked, and images get the deterministic eval transform.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from data.errors import BadSample
from data.sources import check_local, expand_spec
from data.stream import decode, tar_samples
from eval.replay import Replay

MAX_PIXELS = 89_478_485  # PIL's decompression-bomb limit, as data.max_image_pixels


UNREADABLE = "unreadable"  # rank_batches' mark for a batch of this rank without a readable sample


class ValidationError(ValueError):
    """Validation shards that cannot give a loss (too few samples); one line naming the fix."""


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def raw_batches(spec: str, batch_size: int) -> Iterator[list[dict]]:
    """Consecutive lists of `batch_size` raw samples over the shards of `spec`, in order; the remainder is dropped."""
    urls, _ = expand_spec(spec)
    samples = (sample for url in urls for sample in tar_samples(url))
    while len(batch := list(itertools.islice(samples, batch_size))) == batch_size:
        yield batch


def to_tensors(raw: list[dict], image_transform: Callable, tokenizer: Callable) -> tuple[Tensor, Tensor] | None:
    """(images [b, 3, H, W], tokens [b, L]) of the readable samples of a raw batch; None when none is readable."""
    images, captions = [], []
    for sample in raw:
        try:
            image, caption = decode(sample, MAX_PIXELS)
        except BadSample:
            continue
        images.append(image_transform(image))
        captions.append(caption)
    return (torch.stack(images), tokenizer(captions)) if images else None


def batch_loss(model: nn.Module, loss_fn: nn.Module, batch, device, logit_bias: Tensor | None) -> Tensor:
    images, tokens = (t.to(device) for t in batch)
    image_features, text_features, scale = model(images, tokens)
    return loss_fn(image_features, text_features, scale, logit_bias).double()


def rank_batches(spec: str, batch_size: int, image_transform, tokenizer, rank: int, world: int) -> Iterator:
    """(j, batch) for every validation batch j: its tensors where this rank scores it (j % world == rank) or needs
    it as the spare for the last round (batch 0, which every rank reads), else (j, None); (j, UNREADABLE) for a
    batch of this rank without a readable sample, so that every rank still runs its forward passes (validation_loss
    then raises on every rank alike)."""
    for j, raw in enumerate(raw_batches(spec, batch_size)):
        if j % world != rank and j != 0:
            yield j, None
            continue
        batch = to_tensors(raw, image_transform, tokenizer)
        if batch is None and j == 0:
            raise ValidationError(unreadable(j, spec))
        yield j, UNREADABLE if batch is None else batch


def unreadable(j: int, spec: str) -> str:
    return f"validation batch {j} of {spec} has no readable sample; check the shards"


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    spec: str,
    loss_fn: nn.Module,
    *,
    batch_size: int,
    image_transform: Callable,
    tokenizer: Callable,
    device: torch.device | str = "cpu",
    logit_bias: Tensor | None = None,
    replay: Replay | None = None,
) -> float:
    """The mean contrastive loss over the fixed validation batches (module docstring), the same on every rank.

    model(images, tokens) -> (image features [b, D], text features [b, D], logit scale); loss_fn(image features,
    text features, logit scale, logit bias) must not gather across ranks (train.loss.build_loss(..., gather=False)).
    replay: the same shards evaluated again and again (eval.replay.Replay): decoded once while they fit.
    """
    device = torch.device(device)
    rank, world = rank_and_world()
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of batch losses, number of batches]
    last, batches, bad = None, 0, -1

    def make_batches():
        return rank_batches(spec, batch_size, image_transform, tokenizer, rank, world)

    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for j, batch in replay(make_batches) if replay is not None else make_batches():
                batches = j + 1
                if batch is UNREADABLE:  # a forward pass all the same (collective under FSDP), uncounted
                    bad = j if bad < 0 else bad
                    batch_loss(model, loss_fn, last, device, logit_bias)
                elif j % world == rank:
                    total += torch.stack([batch_loss(model, loss_fn, batch, device, logit_bias), total.new_ones(())])
                if batch is not None and batch is not UNREADABLE:
                    last = batch
            if batches == 0:
                raise ValidationError(
                    f"validation shards {spec} hold fewer than eval.batch_size={batch_size} samples; "
                    "add samples or lower eval.batch_size"
                )
            # Equal forward passes on every rank: ranks short of a batch in the last round repeat one, uncounted.
            for _ in range(math.ceil(batches / world) - len(range(rank, batches, world))):
                batch_loss(model, loss_fn, last, device, logit_bias)
    finally:
        model.train(was_training)
    first_bad = torch.tensor([bad], dtype=torch.int64, device=device)
    if world > 1:
        dist.all_reduce(total)
        dist.all_reduce(first_bad, op=dist.ReduceOp.MAX)  # any rank's (the last one found, when several are)
    if first_bad.item() >= 0:
        raise ValidationError(unreadable(int(first_bad.item()), spec))
    return float(total[0] / total[1])


def check_val_shards(spec: str) -> None:
    """Start-up check: the spec expands and its local shards exist (DataError otherwise)."""
    urls, _ = expand_spec(spec)
    check_local(urls)
