"""Linformer (Wang et al. 2020): keys and values projected along the tokens to a fixed length m.

    head = softmax(q (E K)^T / sqrt(D)) (F V),   E, F [m, max_length] learned, shared by all heads,

so the attention matrix is N x m: O(N m) time and memory. Options: `length` (m, default 64) and
`max_length` (the most tokens the layer accepts, default 256). An input of N < max_length uses the
first N columns of E and F, and padded tokens' k and v are zeroed before the projection, so a
right-padded input gives exactly the truncated input's result.

Init: xavier-uniform with gain 1/sqrt(2), as the authors' fairseq implementation initialises its
`compress_k` / `compress_v` layers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import reference
from models.attention.base import Attention
from models.attention.registry import register_attention


def positive_int(value, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"attention 'linformer': option {option}={value!r} must be a positive integer")
    return value


@register_attention("linformer")
class LinformerAttention(Attention):
    """Wang et al. 2020, Eq. 7; proj_k = E and proj_v = F [length, max_length]. Not causal."""

    supports_causal = False
    why_not_causal = "its projection along the tokens mixes future tokens into every projected key and value"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        qkv_bias: bool = True,
        length: int = 64,
        max_length: int = 256,
        **options,
    ):
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias)
        if options:
            raise ValueError(
                f"attention 'linformer': unknown options {', '.join(sorted(options))}; it takes length and max_length"
            )
        self.length, self.max_length = positive_int(length, "length"), positive_int(max_length, "max_length")
        self.proj_k = nn.Parameter(torch.empty(self.length, self.max_length))
        self.proj_v = nn.Parameter(torch.empty(self.length, self.max_length))
        for p in (self.proj_k, self.proj_v):
            nn.init.xavier_uniform_(p, gain=1 / math.sqrt(2))

    def check_length(self, n: int) -> None:
        if n > self.max_length:
            raise ValueError(
                f"attention 'linformer': {n} tokens exceed max_length={self.max_length}; "
                f"build it with option max_length >= {n}"
            )

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """[B, H, N, D] x3 -> [B, H, N, D]: E K and F V [B, H, m, D] by matmul, then SDPA over the m keys."""
        n = k.shape[-2]
        self.check_length(n)
        if key_mask is not None:
            padded = ~key_mask[:, None, :, None]
            k, v = k.masked_fill(padded, 0), v.masked_fill(padded, 0)
        k_proj = self.proj_k[:, :n].to(k.dtype) @ k  # [m, N] @ [B, H, N, D] -> [B, H, m, D]
        v_proj = self.proj_v[:, :n].to(v.dtype) @ v
        return F.scaled_dot_product_attention(q, k_proj, v_proj)

    def attention_reference(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        self.check_length(k.shape[-2])
        return reference.linformer(q, k, v, self.proj_k, self.proj_v, key_mask=key_mask)
