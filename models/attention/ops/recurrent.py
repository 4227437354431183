"""The recurrent form of the causal linear ops: one token at a time from a state of fixed size, no KV cache.

With phi the Op's features written as one dot product, phi(q).phi(k) = sim(q, k) (ops/op.py): [1, x^] for unit
features (so phi(q).phi(k) = 1 + q^.k^, F = D + 1 features), elu(x) + 1 otherwise (F = D),

    S_t = S_{t-1} + phi(k_t) v_t^T     [F, D]
    z_t = z_{t-1} + phi(k_t)           [F]          (normalised ops only)
    o_t = phi(q_t) S_t / phi(q_t).z_t  normalised,  phi(q_t) S_t / 2 not (Gerami et al. 2026, Eq. 7)

which is the causal definition o_t = sum_{n <= t} sim_tn v_n (/ sum_{n <= t} sim_tn) at every t. For unit features
S holds sum_n v_n in its first row and sum_n k^_n v_n^T below it, z the count of tokens and sum_n k^_n. With RoPE on
a positive feature map (RoFormer, rope.rotated_linear) the numerator takes rotated features: S sums
R_n phi(k_n) v_n^T and o_t's numerator is (R_t phi(q_t)) S_t; the normaliser keeps the unrotated ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops.causal import features
from models.attention.ops.common import compute_dtype, safe_divide
from models.attention.ops.op import Op


def feature_count(op: Op, head_dim: int) -> int:
    """F, the number of features phi has for heads of `head_dim`."""
    return head_dim + 1 if op.unit else head_dim


def state_shapes(op: Op, heads: int, head_dim: int) -> list[tuple[int, ...]]:
    """S [H, F, D] and, normalised, z [H, F]: the state of one sequence."""
    count = feature_count(op, head_dim)
    return [(heads, count, head_dim), (heads, count)] if op.normalised else [(heads, count, head_dim)]


def phi(op: Op, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """phi(q), phi(k) [B, H, 1, F] in the compute dtype (causal.features, with a leading 1 for unit features)."""
    fq, fk = features(q, k, None, op)[:2]
    if op.unit:
        fq, fk = (torch.cat([torch.ones_like(f[..., :1]), f], -1) for f in (fq, fk))
    return fq.to(compute_dtype(q)), fk.to(compute_dtype(q))


def kernel_step(
    state: tuple, fq: Tensor, fk: Tensor, v: Tensor, *, normalised: bool, turn=None
) -> tuple[Tensor, tuple]:
    """The module docstring's step on features fq, fk [B, H, 1, F] and v [B, H, 1, D] -> (o [B, H, 1, D], state);
    `turn` rotates the numerator's features (RoPE on a positive feature map) or is None."""
    nq, nk = (fq, fk) if turn is None else (turn(fq), turn(fk))
    s = state[0] + nk.transpose(-1, -2) @ v.to(fq.dtype)  # [B, H, F, D]
    num = nq @ s
    if not normalised:
        return num / 2, (s,)
    z = state[1] + fk[:, :, 0]  # [B, H, F]
    return safe_divide(num, (fq * z[:, :, None]).sum(-1, keepdim=True)), (s, z)


def step(op: Op, q: Tensor, k: Tensor, v: Tensor, state: tuple, turn=None) -> tuple[Tensor, tuple]:
    """One token of op: q, k, v [B, H, 1, D] and the state -> (o [B, H, 1, D] in the compute dtype, state)."""
    fq, fk = phi(op, q, k)
    return kernel_step(state, fq, fk, v, normalised=op.normalised, turn=turn)
