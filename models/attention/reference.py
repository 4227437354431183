"""Naive O(N^2) fp32 definitions of every attention variant, written as the papers write them.

Each builds the explicit N x N similarity. Tests compare the fast paths against these, forward and
backward; they are also the fallback a reader can trust. All take q, k, v [B, H, N, D] and return
[B, H, N, D] in the dtype of q. `key_mask` [B, N] is True for real tokens; padded keys leave every
sum, normalisers included.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def upcast(*ts: Tensor) -> list[Tensor]:
    """fp32 for low-precision inputs; fp64 inputs stay fp64 (tests use them for an exact baseline)."""
    return [t.to(torch.promote_types(t.dtype, torch.float32)) for t in ts]


def allowed(q: Tensor, k: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
    """Bool [B or 1, 1, Nq, Nk]: which key n each query i may use."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    ok = torch.ones(1, 1, n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        ok = ok.tril(n_k - n_q)
    if key_mask is not None:
        ok = ok & key_mask[:, None, None, :]
    return ok


def softmax(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None) -> Tensor:
    """o_i = sum_n exp(q_i.k_n / sqrt(D)) v_n / sum_n exp(q_i.k_n / sqrt(D))."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    ok = allowed(q, k, causal, key_mask)
    ok = ok | ~ok.any(-1, keepdim=True)  # a query with no key at all attends everywhere (padding, never used)
    a = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    a = a.masked_fill(~ok, float("-inf"))
    return (a.softmax(-1) @ v).to(dtype)
