"""Contrastive losses over the global batch, in the local-loss form.

Every rank gathers the features of all ranks *with* gradients (torch.distributed.nn.functional.all_gather,
whose backward sums the gradients arriving from every rank) and scores only its own rows against the
global batch. With DDP averaging the gradients over ranks this gives exactly the gradient of the loss over
the global batch, while each rank builds only a [b, W*b] logit block instead of [W*b, W*b].
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F
from torch import Tensor, nn

from train.siglip import EXCHANGES, ring_sigmoid_loss

# the autograd-aware gather: gradients flow back to every rank's local features (its replacement in
# _functional_collectives is not differentiable here)
warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_gather is deprecated")


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_with_grad(x: Tensor) -> Tensor:
    """[b, D] on each rank -> [W*b, D], rank-major; gradients flow back to the rank that owns each row."""
    if world()[1] == 1:
        return x
    return torch.cat(dist_fn.all_gather(x.contiguous()), dim=0)


class ContrastiveLoss(nn.Module):
    """A loss over the global batch; `gather=False` scores each rank's batch on its own (the validation loss,
    which must not depend on the number of ranks)."""

    def __init__(self, gather: bool = True):
        super().__init__()
        self.gather = gather

    def rank(self) -> int:
        return world()[0] if self.gather else 0

    def all_rows(self, x: Tensor) -> Tensor:
        """[b, D] -> [W*b, D] gathered with gradients, or [b, D] itself without gathering."""
        return gather_with_grad(x) if self.gather else x


class ClipLoss(ContrastiveLoss):
    """Symmetric InfoNCE (Radford et al. 2021, CLIP; van den Oord et al. 2018).

    loss = (CE(s * I T^T, labels) + CE(s * T I^T, labels)) / 2 over the global batch, where I, T are
    L2-normalised image and text features and s = exp(logit_scale).
    """

    def forward(
        self, image_features: Tensor, text_features: Tensor, logit_scale: Tensor, logit_bias: Tensor | None = None
    ) -> Tensor:
        """image_features, text_features [b, D] (this rank's rows), logit_scale scalar (exp'd) -> scalar."""
        image_features, text_features = image_features.float(), text_features.float()
        rank = self.rank()
        all_images, all_texts = self.all_rows(image_features), self.all_rows(text_features)  # [W*b, D]
        logits_per_image = logit_scale * image_features @ all_texts.T  # [b, W*b]
        logits_per_text = logit_scale * text_features @ all_images.T  # [b, W*b]
        labels = torch.arange(len(image_features), device=image_features.device) + rank * len(image_features)
        return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2


class SigLipLoss(ContrastiveLoss):
    """Pairwise sigmoid loss (Zhai et al. 2023, SigLIP, eq. 1).

    loss = -1/|B| sum_i sum_j log sigmoid(z_ij (s <I_i, T_j> + b)), z_ij = 1 if i == j else -1, over the
    global batch B; this rank sums its own images i against all texts j. `exchange` (train.siglip_exchange) brings
    the other ranks' texts: gather (all_gather with gradients, below) or shift | bidir, a ring exchange between
    neighbouring ranks whose backward recomputes the logits, so saved memory per rank does not grow with the ranks
    (train/siglip.py).
    """

    def __init__(self, gather: bool = True, exchange: str = "gather"):
        super().__init__(gather)
        if exchange not in EXCHANGES:
            raise ValueError(f"unknown siglip exchange {exchange!r}; use one of {', '.join(EXCHANGES)}")
        self.exchange = exchange

    def forward(
        self, image_features: Tensor, text_features: Tensor, logit_scale: Tensor, logit_bias: Tensor | None = None
    ) -> Tensor:
        """image_features, text_features [b, D], logit_scale and logit_bias scalars -> scalar."""
        if logit_bias is None:
            raise ValueError("the siglip loss needs the model's logit_bias; build the model with train.loss=siglip")
        image_features, text_features = image_features.float(), text_features.float()
        if self.gather and self.exchange != "gather" and world()[1] > 1:
            scale, bias = logit_scale.float(), logit_bias.float()
            return ring_sigmoid_loss(image_features, text_features, scale, bias, self.exchange)
        rank = self.rank()
        all_texts = self.all_rows(text_features)  # [W*b, D]
        logits = logit_scale * image_features @ all_texts.T + logit_bias  # [b, W*b]
        b = len(image_features)
        signs = -torch.ones_like(logits)
        signs[torch.arange(b), torch.arange(b) + rank * b] = 1.0
        return -F.logsigmoid(signs * logits).sum() / b


LOSSES = {"clip": ClipLoss, "siglip": SigLipLoss}


def build_loss(name: str, gather: bool = True, siglip_exchange: str = "gather") -> nn.Module:
    """`gather=False`: each rank's batch on its own (validation); siglip_exchange: SigLipLoss's `exchange`."""
    if name == "siglip":
        return SigLipLoss(gather=gather, exchange=siglip_exchange)
    return LOSSES[name](gather=gather)
