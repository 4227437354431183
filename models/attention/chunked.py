"""Causal linear attention computed chunk by chunk, shared by every causal linear variant.

o_i = sum_{n <= i} (c + qf_i . kf_n) v_n, with c = 1 for the affine similarities and 0 otherwise.
Inside a chunk of C tokens the sum is an exact masked C x C matmul; the contribution of all earlier
chunks is qf_i S_m, where S_m = sum over earlier chunks of kf^T v is an exclusive cumsum over the
per-chunk states. Everything is a batched matmul over (groups x chunks), so there is no Python loop
over chunks. Time O(N (C F + F E)), memory O(N (C + F E / C)): linear in N.
A Python loop carrying S from chunk to chunk issues ~10 small ops per chunk (thousands at
N = 65536). Measured at N = 16384 (docs/bench_attention.md): on one thread the loop is ~25% faster,
on two threads of a busy machine it is ~3x slower (each small op waits for both threads); the
cumsum form is kept for its fixed, small number of ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def check_chunk_size(chunk_size) -> int:
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(
            f"chunk_size must be a positive integer number of tokens, got {chunk_size!r}; the default is 64"
        )
    return chunk_size


def exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    """Sum of all earlier entries along `dim` (the first entry gets 0)."""
    total = x.cumsum(dim).narrow(dim, 0, x.shape[dim] - 1)
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), total], dim)


def causal_linear(qf: Tensor, kf: Tensor, v: Tensor, *, chunk_size: int = 64, plus_one: bool = False) -> Tensor:
    """qf, kf [G, N, F], v [G, N, E] -> o [G, N, E], o_i = sum_{n <= i} (plus_one + qf_i . kf_n) v_n.

    Padded keys must arrive with kf and v already zeroed.
    """
    G, N, _ = qf.shape
    C = min(check_chunk_size(chunk_size), N)
    pad = -N % C
    if pad:
        # zero rows at the end: they are keys with kf = v = 0 and queries nobody reads
        qf, kf, v = (F.pad(t, (0, 0, 0, pad)) for t in (qf, kf, v))
    M = (N + pad) // C
    qc, kc, vc = (t.reshape(G, M, C, t.shape[-1]) for t in (qf, kf, v))
    scores = qc @ kc.transpose(-1, -2)  # [G, M, C, C]
    if plus_one:
        scores = scores + 1
    keep = torch.ones(C, C, dtype=torch.bool, device=qf.device).tril()
    out = scores.masked_fill(~keep, 0) @ vc  # within the chunk
    states = exclusive_cumsum(kc.transpose(-1, -2) @ vc, 1)  # [G, M, F, E]: earlier chunks only
    out = out + qc @ states
    if plus_one:
        out = out + exclusive_cumsum(vc.sum(2, keepdim=True), 1)  # the "1 x v" part of earlier chunks
    return out.reshape(G, M * C, -1)[:, :N]
