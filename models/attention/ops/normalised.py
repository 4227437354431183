"""Non-causal normalised linear attention in PyTorch (linear_affine, linear_elu), with a hand-written backward.

sim = 1 + q^.k^ (unit features, linear_affine) or phi(q).phi(k) with phi = elu + 1 (linear_elu, Katharopoulos
et al. 2020). o = c + phi(q) S / den with c the mean of the real v, S = phi(k)^T (v - c),
den = [count +] phi(q) . z and z = sum_n phi(k_n): centring v on c (exact, the weights sum to one) makes the
result exact when all v are equal. Unit features are never stored: q^ = rq q with the row scale rq = 1/|q|.
Saved for the backward: q, k, v in their own dtype (bf16 stays bf16), the row scales and normaliser
[G, N, 1] and the small per-head states; features and v - c are recomputed in the compute dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops.common import (
    compute_dtype,
    elu_feature,
    elu_feature_grad,
    inv_norm,
    rowdot,
    safe_divide,
    scaled_gram,
    unscale_grad,
)
from models.attention.ops.op import Op


def features(q: Tensor, k: Tensor, keep: Tensor | None, op: Op):
    """The features in the compute dtype: q, k with their row scales 1/|q|, 1/|k| (phi = r x, applied lazily;
    1/|k| zero for padded keys) for unit features, else elu(q) + 1, elu(k) + 1 (zero for padded keys), no scale."""
    dtype = compute_dtype(q)
    q, k = q.to(dtype), k.to(dtype)
    if not op.unit:
        k_phi = elu_feature(k)
        return elu_feature(q), k_phi if keep is None else k_phi.mul_(keep), None, None
    rk = inv_norm(k) if keep is None else inv_norm(k).mul_(keep)
    return q, k, inv_norm(q), rk


def scaled(x: Tensor, r: Tensor | None) -> Tensor:
    """x [G, N, E] times the row scales r [G, N, 1] in place, or x when r is None."""
    return x if r is None else x.mul_(r)


def feature_grad(x: Tensor, r: Tensor | None, grad_phi: Tensor) -> Tensor:
    """dL/dx from dL/dphi(x) (overwritten), x the stored feature: through r x for unit features, else elu'."""
    return unscale_grad(x, r, grad_phi) if r is not None else elu_feature_grad(x, grad_phi)


def row_sums(x: Tensor, r: Tensor | None) -> Tensor:
    """sum_n r_n x_n (or sum_n x_n): [G, N, D] -> [G, 1, D]."""
    return x.sum(1, keepdim=True) if r is None else torch.bmm(r.transpose(1, 2), x)


class NormalisedLinear(torch.autograd.Function):
    """forward(q, k, v [G, N, D], keep [G, N, 1] or None, op) -> o [G, N, D] in q's dtype; op normalised."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, op: Op) -> Tensor:
        q_f, k_f, rq, rk = features(q, k, keep, op)
        v32 = v.to(q_f.dtype)
        count = v32.new_full((1, 1, 1), v.shape[1]) if keep is None else keep.sum(1, keepdim=True)  # [G or 1, 1, 1]
        centre = safe_divide(row_sums(v32, keep), count)  # [G, 1, D]
        # padded rows of v - c meet phi(k) = 0 only, so they need no mask
        v_centred = v32 - centre
        k_sum = row_sums(k_f, rk)  # [G, 1, D]
        state = torch.bmm(k_f.transpose(1, 2), v_centred) if rk is None else scaled_gram(k_f, rk, v_centred)
        den = scaled(torch.bmm(q_f, k_sum.transpose(1, 2)), rq)  # [G, N, 1]
        den = (den.add_(count) if op.unit else den).clamp_min_(torch.finfo(den.dtype).tiny)
        ctx.op = op
        ctx.save_for_backward(q, k, v, keep, rq, rk, state, k_sum, den, count, centre)
        return scaled(torch.bmm(q_f, state), rq).div_(den).add_(centre).to(q.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, keep, rq, rk, state, k_sum, den, count, centre = ctx.saved_tensors
        q_f, k_f, _, _ = features(q, k, keep, ctx.op)
        v_centred = v.to(q_f.dtype) - centre
        grad = grad.to(q_f.dtype)
        grad_scaled = grad / den
        grad_state = torch.bmm(q_f.transpose(1, 2), grad_scaled) if rq is None else scaled_gram(q_f, rq, grad_scaled)
        grad_q_phi = torch.bmm(grad_scaled, state.transpose(1, 2))
        # o = c + phi(q) S / den: dL/dden = -(g . phi(q) S) / den^2 = -(phi(q) . (g / den) S^T) / den
        grad_den = scaled(rowdot(q_f, grad_q_phi), rq).div_(den).neg_()  # [G, N, 1]
        grad_q = feature_grad(q_f, rq, grad_q_phi.addcmul_(grad_den, k_sum))
        grad_k_sum = torch.bmm((grad_den if rq is None else grad_den * rq).transpose(1, 2), q_f)  # [G, 1, D]
        grad_k = feature_grad(k_f, rk, torch.bmm(v_centred, grad_state.transpose(1, 2)).add_(grad_k_sum))
        # c enters o directly and through S = phi(k)^T (v - c); c = sum of real v / count
        grad_v_sum = (grad.sum(1, keepdim=True) - torch.bmm(k_sum, grad_state)).div_(count)  # [G, 1, D]
        grad_v = scaled(torch.bmm(k_f, grad_state), rk)
        grad_v = grad_v.add_(grad_v_sum) if keep is None else grad_v.addcmul_(keep, grad_v_sum)
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None
