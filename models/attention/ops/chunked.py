"""Causal linear attention computed chunk by chunk: the one O(N) product every causal linear op is built from.

product(qf, kf, v)_i = sum_{n <= i} (c + qf_i . kf_n) v_n, with c = 1 for the affine similarities and 0
otherwise; causal_linear_grads is its backward, chunk by chunk the same way. Inside a chunk of C tokens the
sum is an exact masked C x C matmul; the contribution of all earlier chunks is qf_i S_m, where S_m = sum over
earlier chunks of kf^T v is an exclusive cumsum over the per-chunk states. Everything is a batched matmul over
(groups x chunks), so there is no Python loop over chunks. Time O(N (C F + F E)), memory O(N (C + F E / C)):
linear in N.
A sequence of at most one chunk is the causal N x N matrix alone, with no chunk state.
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


def exclusive_cumsum(x: Tensor, dim: int, reverse: bool = False) -> Tensor:
    """Sum of all earlier entries along `dim` (the first entry gets 0); of all later ones when `reverse`."""
    if reverse:
        return exclusive_cumsum(x.flip(dim), dim).flip(dim)
    total = x.cumsum(dim).narrow(dim, 0, x.shape[dim] - 1)
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), total], dim)


def masked_scores(qc: Tensor, kc: Tensor, plus_one: bool) -> Tensor:
    """[..., C, F] x2 -> [..., C, C]: (plus_one + qc kc^T) with the later keys, which a query may not see, zeroed."""
    scores = torch.matmul(qc, kc.transpose(-1, -2))
    if plus_one:
        scores.add_(1)
    return scores.tril_()


def causal_linear(qf: Tensor, kf: Tensor, v: Tensor, *, chunk_size: int = 64, plus_one: bool = False) -> Tensor:
    """qf, kf [G, N, F], v [G, N, E] -> o [G, N, E], o_i = sum_{n <= i} (plus_one + qf_i . kf_n) v_n.

    Padded keys must arrive with kf and v already zeroed.
    """
    G, N, _ = qf.shape
    C = min(check_chunk_size(chunk_size), N)
    if C == N:
        return torch.bmm(masked_scores(qf, kf, plus_one), v)
    # zero rows at the end: they are keys with kf = v = 0 and queries nobody reads
    qc, kc, vc = chunks(C, qf, kf, v)
    out = masked_scores(qc, kc, plus_one) @ vc  # within the chunk
    states = exclusive_cumsum(kc.transpose(-1, -2) @ vc, 1)  # [G, M, F, E]: earlier chunks only
    out = out.add_(qc @ states)
    if plus_one:
        out = out.add_(exclusive_cumsum(vc.sum(2, keepdim=True), 1))  # the "1 x v" part of earlier chunks
    return out.reshape(G, -1, out.shape[-1])[:, :N]


def chunks(C: int, *tensors: Tensor) -> list[Tensor]:
    """[G, N, F] -> [G, M, C, F], zero rows appended to fill the last chunk."""
    pad = -tensors[0].shape[1] % C
    return [(F.pad(t, (0, 0, 0, pad)) if pad else t).reshape(t.shape[0], -1, C, t.shape[-1]) for t in tensors]


def causal_linear_grads(
    qf: Tensor, kf: Tensor, v: Tensor, grad: Tensor, *, chunk_size: int, plus_one: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """dL/dqf, dL/dkf, dL/dv of causal_linear(qf, kf, v) from dL/do = grad, chunk by chunk like the forward:

    dqf_i = sum_{n <= i} (g_i . v_n) kf_n,  dkf_n = sum_{i >= n} (v_n . g_i) qf_i,
    dv_n = sum_{i >= n} (plus_one + kf_n . qf_i) g_i.
    Inside a chunk through the masked C x C matrices g v^T and (plus_one + qf kf^T), each built once; across
    chunks through the states S = sum over earlier chunks of kf^T v and T = sum over later ones of qf^T g.
    """
    G, N, _ = qf.shape
    C = min(check_chunk_size(chunk_size), N)
    qc, kc, vc, gc = chunks(C, qf, kf, v, grad)
    grad_scores = torch.matmul(gc, vc.transpose(-1, -2)).tril_()  # [G, M, C, C]
    scores = masked_scores(qc, kc, plus_one)
    earlier = exclusive_cumsum(kc.transpose(-1, -2) @ vc, 1)  # [G, M, F, E]
    later = exclusive_cumsum(qc.transpose(-1, -2) @ gc, 1, reverse=True)  # [G, M, F, E]
    dqf = (grad_scores @ kc).add_(gc @ earlier.transpose(-1, -2))
    dkf = (grad_scores.transpose(-1, -2) @ qc).add_(vc @ later.transpose(-1, -2))
    dv = (scores.transpose(-1, -2) @ gc).add_(kc @ later)
    if plus_one:
        dv = dv.add_(exclusive_cumsum(gc.sum(2, keepdim=True), 1, reverse=True))  # the "1 x g" of later chunks
    return [t.reshape(G, -1, t.shape[-1])[:, :N] for t in (dqf, dkf, dv)]
