"""The sigmoid loss over the global batch by a ring exchange of text features (train.siglip_exchange).

Definition (Zhai et al. 2023, SigLIP, eq. 1), over the global batch B of W ranks x b pairs:

    loss = -1/|B| sum_i sum_j log sigmoid(z_ij (s <I_i, T_j> + t)),  z_ij = 1 if i == j else -1,

I, T the L2-normalised image and text features [b, D] per rank, s = exp(logit_scale), t = logit_bias. Rank r
scores its own images against every rank's text block and divides its sum by b, as train/loss.py's all-gather
form does, so the mean over ranks (DDP's gradient average) is the loss above.

The text blocks travel between neighbouring ranks instead of being gathered: `shift` passes them to the right,
W-1 hops; `bidir` passes copies both ways at once, ceil((W-1)/2) hops (open_clip's bidir).

Why the backward recomputes: autograd through the hops (open_clip's NeighbourExchange) keeps every received
block and its [b, b] logits for the backward, so a rank's saved memory grows with W, which is what leaving the
all-gather set out to avoid. RingSigmoid saves only this rank's image and text features, s and t. Its backward
sends the blocks around the ring once more (W hops; bidir sends half of each block's rows each way),
recomputes each block's logits, adds this rank's image gradient locally and adds this rank's share of the
block's text gradient to an accumulator that travels with the block, so that it comes home holding the sum
over all ranks: the gradient all_gather's backward (a reduce-scatter) gives. Saved memory per rank is 2 b D
floats (and s, t) for any W; the price is computing each block's logits twice and W hops back, as a block must
reach every rank and its gradient come home, which neighbour hops cannot do in fewer than about W.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

EXCHANGES = ("gather", "shift", "bidir")


def hops(mode: str, world: int) -> list[tuple[int, ...]]:
    """The forward's hops: for each, the directions (+1 right, -1 left) in which text blocks move."""
    if mode == "shift":
        return [(1,)] * (world - 1)
    both, one = divmod(world - 1, 2)
    return [(1, -1)] * both + [(1,)] * one


def pass_on(streams: list[tuple[list[Tensor], int]]) -> list[list[Tensor]]:
    """One hop on the default group: each stream's tensors go to the neighbour `step` away (+1 right, -1 left),
    and tensors of the same shapes arrive from the other side (every rank holds the same shapes)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ops, arrived = [], []
    for tensors, step in streams:
        inbox = [torch.empty_like(t) for t in tensors]
        ops += [dist.P2POp(dist.isend, t.contiguous(), (rank + step) % world) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, (rank - step) % world) for t in inbox]
        arrived.append(inbox)
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return arrived


def signs(b: int, m: int, first: int | None, like: Tensor) -> Tensor:
    """z of eq. 1 [b, m]: -1, and +1 where image first + j meets text j when the m texts are this rank's own rows
    first..first+m (first None: another rank's block, negatives only)."""
    z = -torch.ones(b, m, dtype=like.dtype, device=like.device)
    if first is not None:
        j = torch.arange(m, device=like.device)
        z[first + j, j] = 1.0
    return z


def block_loss(images: Tensor, texts: Tensor, scale: Tensor, bias: Tensor, first: int | None) -> Tensor:
    """images [b, D] against one text block [m, D]: the sum of -log sigmoid(z * logits), a scalar."""
    logits = scale * images @ texts.T + bias  # [b, m]
    return -F.logsigmoid(signs(len(images), len(texts), first, logits) * logits).sum()


def ring_loss(images: Tensor, texts: Tensor, scale: Tensor, bias: Tensor, mode: str) -> Tensor:
    """This rank's loss: its own block, then each block the ring brings, one [b, b] logit block at a time."""
    loss = block_loss(images, texts, scale, bias, 0)
    carried = {1: texts, -1: texts}
    for steps in hops(mode, dist.get_world_size()):
        for step, (block,) in zip(steps, pass_on([([carried[s]], s) for s in steps])):
            carried[step] = block
            loss = loss + block_loss(images, block, scale, bias, None)
    return loss / len(images)


def visit(images, texts, scale, bias, first, weight, acc, sums) -> None:
    """The gradients of one block's term at this rank: the image, scale and bias ones into `sums`, this rank's
    share of the block's text gradient into its travelling accumulator `acc` [m, D]."""
    raw = images @ texts.T  # [b, m]
    z = signs(len(images), len(texts), first, raw)
    g = -z * torch.sigmoid(-z * (scale * raw + bias)) * weight  # d loss / d logits
    sums["images"] += scale * g @ texts
    sums["scale"] += (g * raw).sum()
    sums["bias"] += g.sum()
    acc += scale * g.T @ images


def ring_grads(images, texts, scale, bias, mode: str, weight: Tensor) -> tuple[Tensor, ...]:
    """RingSigmoid's backward: each part of the text rows (all of them for shift, a half each way for bidir)
    visits every rank with its accumulator, then the accumulator takes the last hop home."""
    b, half, world = len(texts), (len(texts) + 1) // 2, dist.get_world_size()
    parts = [(0, b, 1)] if mode == "shift" else [(0, half, 1), (half, b, -1)]
    parts = [(lo, hi, step) for lo, hi, step in parts if hi > lo]
    sums = {"images": torch.zeros_like(images), "scale": scale.new_zeros(()), "bias": bias.new_zeros(())}
    carried = [[texts[lo:hi], torch.zeros_like(texts[lo:hi])] for lo, hi, _ in parts]
    for hop in range(world):
        for (lo, _, _), (block, acc) in zip(parts, carried):
            visit(images, block, scale, bias, lo if hop == 0 else None, weight, acc, sums)
        if hop < world - 1:
            carried = pass_on([(pair, step) for pair, (_, _, step) in zip(carried, parts)])
    homes = pass_on([([acc], step) for (_, acc), (_, _, step) in zip(carried, parts)])
    return sums["images"], torch.cat([acc for (acc,) in homes]), sums["scale"], sums["bias"]


class RingSigmoid(torch.autograd.Function):
    """ring_loss with a backward that saves only this rank's features, s and t (see the module docstring)."""

    @staticmethod
    def forward(ctx, images: Tensor, texts: Tensor, scale: Tensor, bias: Tensor, mode: str) -> Tensor:
        ctx.save_for_backward(images, texts, scale, bias)
        ctx.mode = mode
        return ring_loss(images, texts, scale, bias, mode)

    @staticmethod
    def backward(ctx, grad: Tensor):
        images, texts, scale, bias = ctx.saved_tensors
        d_images, d_texts, d_scale, d_bias = ring_grads(images, texts, scale, bias, ctx.mode, grad / len(images))
        return d_images, d_texts, d_scale.reshape(scale.shape), d_bias.reshape(bias.shape), None


def ring_sigmoid_loss(images: Tensor, texts: Tensor, scale: Tensor, bias: Tensor, mode: str) -> Tensor:
    """images, texts [b, D] (this rank's rows, b equal on every rank), scale (exp'd) and bias scalars or [1],
    mode shift | bidir -> this rank's loss, a scalar; needs an initialised default process group."""
    if mode not in EXCHANGES[1:]:
        raise ValueError(f"unknown siglip exchange {mode!r}; use one of {', '.join(EXCHANGES[1:])}")
    return RingSigmoid.apply(images, texts, scale, bias, mode)
