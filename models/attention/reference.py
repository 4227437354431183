"""Naive O(N^2) fp32 definitions of every attention variant, written as the papers write them.

Each builds the explicit N x N similarity. Tests compare the fast paths against these, forward and
backward; they are also the fallback a reader can trust. All take q, k, v [B, H, N, D] and return
[B, H, N, D] in the dtype of q. `key_mask` [B, N] is True for real tokens; padded keys leave every
sum, normalisers included.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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


def _kernel_attention(sim: Tensor, v: Tensor, ok: Tensor, normalise: bool) -> Tensor:
    """sum_n sim(i, n) v_n over the allowed keys, divided by sum_n sim(i, n) when `normalise`.

    The linear variants below take **options (e.g. chunk_size) that change how, not what, is computed.

    A query with no allowed key gets 0 (padding, never used) instead of 0 / 0.
    """
    sim = sim.masked_fill(~ok, 0)
    out = sim @ v
    if normalise:
        den = sim.sum(-1, keepdim=True)
        out = out / torch.where(den == 0, torch.ones_like(den), den)
    return out


def linear_affine(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options) -> Tensor:
    """o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), with q^, k^ L2-normalised over D."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = 1 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
    return _kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=True).to(dtype)


def linear_affine_nodenom(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options) -> Tensor:
    """Gerami, Madani, Duraiswami 2026, Eq. 7: o_i = sum_n (1 + q^_i.k^_n) / 2 v_n; no denominator, so o grows with N."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = (1 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)) / 2
    return _kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=False).to(dtype)


def linear_elu(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options) -> Tensor:
    """Katharopoulos et al. 2020: o_i = sum_n (phi(q_i).phi(k_n)) v_n / sum_n phi(q_i).phi(k_n), phi = elu + 1."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)
    return _kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=True).to(dtype)


def efficient(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options) -> Tensor:
    """Shen et al. 2021, "Efficient attention": o_i = sum_n (softmax_D(q_i) . softmax_N(K)_n) v_n, as an N x N matrix.

    The softmax over tokens runs over the real keys only; a batch row without any real key uses all keys.
    """
    if causal:
        raise ValueError("attention 'efficient' cannot be causal: its softmax over all tokens of K looks at future tokens")
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    ok = allowed(q, k, False, key_mask)[..., :1, :].transpose(-1, -2)  # [B or 1, 1, N, 1]
    ok = ok | ~ok.any(-2, keepdim=True)
    k_weights = k.masked_fill(~ok, float("-inf")).softmax(-2)  # softmax over the N tokens, per feature
    sim = q.softmax(-1) @ k_weights.transpose(-1, -2)  # [B, H, N, N]
    return (sim @ v).to(dtype)
