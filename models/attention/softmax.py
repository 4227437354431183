"""Standard softmax attention, softmax(q k^T / sqrt(D)) v, through torch SDPA (flash / memory-efficient kernels where
available)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from models.attention import reference
from models.attention.base import Attention
from models.attention.registry import register_attention


def sdpa_mask(key_mask: Tensor | None, n_query: int, causal: bool) -> Tensor | None:
    """Bool mask [B, 1, Nq, Nk] (True = attend) from a key mask [B, Nk] and causality, or None if neither.

    A query row left with no key (a causal row before the first real token) attends to every
    key instead, so it stays finite; such rows are padding and their output is never used.
    """
    if key_mask is None:
        return None
    mask = key_mask[:, None, None, :].expand(-1, 1, n_query, -1)
    if causal:
        n_key = key_mask.shape[1]
        mask = mask & torch.ones(n_query, n_key, dtype=torch.bool, device=key_mask.device).tril(n_key - n_query)
    return mask | ~mask.any(-1, keepdim=True)


def softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
) -> Tensor:
    """[B, H, N, D] x3 -> [B, H, N, D]."""
    mask = sdpa_mask(key_mask, q.shape[-2], causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)


@register_attention("softmax")
class SoftmaxAttention(Attention):
    """Vaswani et al. 2017; O(N^2) time, O(N) memory with SDPA's fused kernels."""

    under_autocast = True
    function = staticmethod(softmax_attention)
    reference = staticmethod(reference.softmax)
