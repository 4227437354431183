"""The causal forms of the linear ops in PyTorch, with a hand-written backward that saves only the inputs.

On [G, N, D] tensors, with phi(q), phi(k) the features of the op's description (ops/op.py: q^ = q / |q| for unit
features, else elu + 1) and padded keys left out of every sum:
  not normalised (Gerami et al. 2026, Eq. 7):  o_i = sum_{n <= i} (1 + q^_i . k^_n) / 2 v_n
  normalised:                                  o_i = sum_{n <= i} sim_in v_n / sum_{n <= i} sim_in
with sim = 1 + q^.k^ (unit) or phi(q).phi(k). Two exact forms:
- quadratic, up to QUADRATIC_MAX tokens: the causal N x N weight matrix W built directly, o = W v; the backward
  needs dL/dW = g v^T once (minus g . o for the normalised ones). A dozen ops each way, where the chunked form
  takes dozens: at the text tower's 77 tokens their fixed cost, not the O(N^2 D) work, is what counts.
- chunked (chunked.causal_linear), O(N), beyond: the normalised ones centre v on the first token's value c
  (the weights sum to one, so o = c + sum_n w_in (v_n - c) exactly, in every prefix; it keeps the result exact
  when all v are equal) and get their normaliser from a column of ones appended to v; the gradients are three
  more O(N) products (chunked.causal_linear_grads).
Saved for the backward: q, k, v in their own dtype (for fp32 / fp64 inputs the features instead, the same
size), the row scales 1/|q|, 1/|k| [G, N, 1] and, normalised, the output in the compute dtype and
1 / normaliser [G, N, 1]: for bf16 inputs 3 bf16 [G, N, D] tensors, plus one fp32 one when normalised.
Low-precision inputs have their features recomputed in the backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops.chunked import causal_linear, causal_linear_grads
from models.attention.ops.common import (
    compute_dtype,
    elu_feature,
    elu_feature_grad,
    inv_norm,
    remove_radial,
    rowdot,
)
from models.attention.ops.op import Op

QUADRATIC_MAX = 256  # measured: quadratic 2x faster at N = 197, even at 256, slower from 384 (CPU, B=1, H=6, D=64)


def features(q: Tensor, k: Tensor, keep: Tensor | None, op: Op) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """phi(q), phi(k) [G, N, D] in the compute dtype (phi(k) zero for padded keys) and, for unit features, the
    scales 1/|q|, 1/|k| [G, N, 1] (1/|k| zero for padded keys)."""
    dtype = compute_dtype(q)
    if not op.unit:
        k_phi = elu_feature(k.to(dtype))
        return elu_feature(q.to(dtype)), k_phi if keep is None else k_phi.mul_(keep), None, None
    rq, rk = inv_norm(q, dtype), inv_norm(k, dtype)
    if keep is not None:
        rk = rk.mul_(keep)
    return q * rq, k * rk, rq, rk


def feature_grads(q_phi: Tensor, k_phi: Tensor, rq, rk, op: Op, grad_q: Tensor, grad_k: Tensor):
    """dL/dq, dL/dk from the features and dL/dphi(q), dL/dphi(k) (overwritten): through x^ = r x (remove the
    radial part, scale by r) for unit features, elu'(x) = min(phi, 1) for elu + 1 (zero for padded keys)."""
    if not op.unit:
        return elu_feature_grad(q_phi, grad_q), elu_feature_grad(k_phi, grad_k)
    return remove_radial(grad_q, q_phi, rq), remove_radial(grad_k, k_phi, rk)


def weights(q_phi: Tensor, k_phi: Tensor, keep: Tensor | None, op: Op, inv_den: Tensor | None = None) -> Tensor:
    """The causal weight matrix [G, N, N]: 1 + q^.k^ (unit) or phi(q).phi(k), halved when not normalised, zero for
    later and padded keys, times 1 / normaliser when given."""
    w = torch.bmm(q_phi, k_phi.transpose(1, 2))
    if op.unit:
        w.add_(1)
    w.tril_()
    if keep is not None and op.unit:  # elu's phi(k) is already zero there
        w.mul_(keep.transpose(1, 2))
    if not op.normalised:
        w.mul_(0.5)
    return w if inv_den is None else w.mul_(inv_den)


def quadratic_forward(q_phi, k_phi, v, keep, op: Op) -> tuple[Tensor, Tensor | None]:
    """(o, 1 / normaliser or None) from the weight matrix; v [G, N, D] in the compute dtype."""
    w = weights(q_phi, k_phi, keep, op)
    if not op.normalised:
        return torch.bmm(w, v), None
    den = w.sum(-1, keepdim=True)
    inv_den = torch.where(den > 0, den.reciprocal(), 0)  # no real key yet (padding, never used): o = 0
    return torch.bmm(w, v).mul_(inv_den), inv_den


def quadratic_backward(q_phi, k_phi, v, keep, op: Op, grad, inv_den, out) -> tuple[Tensor, Tensor, Tensor]:
    """dL/dphi(q), dL/dphi(k), dL/dv: with W = sim / den, dL/dsim_in = (g_i . v_n - g_i . o_i) / den_i (0 and 1
    when not normalised, whose 1/2 comes in with the mask), masked like W."""
    grad_w = torch.bmm(grad, v.transpose(1, 2))
    if op.normalised:
        grad_w.sub_(rowdot(grad, out)).mul_(inv_den)
    mask = None if keep is None else keep.transpose(1, 2)
    grad_w = grad_w.tril_() if mask is None else grad_w.tril_().mul_(mask)
    if not op.normalised:
        grad_w.mul_(0.5)
    grad_v = torch.bmm(weights(q_phi, k_phi, keep, op, inv_den).transpose(1, 2), grad)
    return torch.bmm(grad_w, k_phi), torch.bmm(grad_w.transpose(1, 2), q_phi), grad_v


def centred_values(v: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor]:
    """(c [G, 1, D], [v - c | 1] [G, N, D + 1] zero for padded keys) for the chunked normalised form."""
    centre = v[:, :1] if keep is None else v[:, :1] * keep[:, :1]
    ones = torch.ones_like(v[..., :1]) if keep is None else keep
    centred = (v - centre) if keep is None else (v - centre).mul_(keep)
    return centre, torch.cat([centred, ones], -1)


def chunked_forward(q_phi, k_phi, v, keep, op: Op, chunk_size) -> tuple[Tensor, Tensor | None]:
    """(o, 1 / normaliser or None) chunk by chunk; v [G, N, D] in the compute dtype."""
    if not op.normalised:
        summed = v if keep is None else v * keep
        return causal_linear(q_phi, k_phi, summed, chunk_size=chunk_size, plus_one=op.unit).mul_(0.5), None
    centre, summed = centred_values(v, keep)
    sums = causal_linear(q_phi, k_phi, summed, chunk_size=chunk_size, plus_one=op.unit)
    den = sums[..., -1:]
    inv_den = torch.where(den > 0, den.reciprocal(), 0)  # no real key yet (padding, never used): o = c
    return torch.addcmul(centre, sums[..., :-1], inv_den), inv_den


def chunked_backward(q_phi, k_phi, v, keep, op: Op, grad, inv_den, out, chunk_size) -> tuple[Tensor, Tensor, Tensor]:
    """dL/dphi(q), dL/dphi(k), dL/dv of chunked_forward."""
    if not op.normalised:
        summed = v if keep is None else v * keep
        grads = causal_linear_grads(q_phi, k_phi, summed, grad * 0.5, chunk_size=chunk_size, plus_one=op.unit)
        return grads[0], grads[1], grads[2] if keep is None else grads[2].mul_(keep)
    centre, summed = centred_values(v, keep)
    # o = c + num / den: dL/dnum = g / den, dL/dden = -(g . (o - c)) / den
    grad_den = rowdot(grad, out - centre).mul_(inv_den).neg_()
    grad_sums = torch.cat([grad * inv_den, grad_den], -1)
    grad_q, grad_k, grad_summed = causal_linear_grads(
        q_phi, k_phi, summed, grad_sums, chunk_size=chunk_size, plus_one=op.unit
    )
    grad_v = grad_summed[..., :-1] if keep is None else grad_summed[..., :-1] * keep
    # c enters o directly and through every v_n - c; c = keep_0 v_0
    grad_centre = grad.sum(1, keepdim=True) - grad_v.sum(1, keepdim=True)
    grad_v[:, :1] += grad_centre if keep is None else grad_centre * keep[:, :1]
    return grad_q, grad_k, grad_v


class CausalLinear(torch.autograd.Function):
    """forward(q, k, v [G, N, D], keep [G, N, 1] or None, op, chunk_size) -> o [G, N, D] in q's dtype."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, op: Op, chunk_size: int) -> Tensor:
        ctx.op, ctx.chunk_size, ctx.dtype = op, chunk_size, q.dtype
        ctx.quadratic = q.shape[1] <= QUADRATIC_MAX
        q_phi, k_phi, rq, rk = features(q, k, keep, op)
        v32 = v.to(q_phi.dtype)
        if ctx.quadratic:
            out, inv_den = quadratic_forward(q_phi, k_phi, v32, keep, op)
        else:
            out, inv_den = chunked_forward(q_phi, k_phi, v32, keep, op, chunk_size)
        # inputs in the compute dtype: keeping the features instead costs the same memory and spares recomputing them
        ctx.recompute = q.dtype != q_phi.dtype
        kept = (q, k, v) if ctx.recompute else (q_phi, k_phi, v32)
        ctx.save_for_backward(*kept, keep, rq, rk, *(() if inv_den is None else (inv_den, out)))
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q_phi, k_phi, v, keep, rq, rk, *normaliser = ctx.saved_tensors
        if ctx.recompute:
            q_phi, k_phi, _, _ = features(q_phi, k_phi, keep, ctx.op)
            v = v.to(q_phi.dtype)
        inv_den, out = normaliser if normaliser else (None, None)
        grad = grad.to(q_phi.dtype)
        if ctx.quadratic:
            grad_q, grad_k, grad_v = quadratic_backward(q_phi, k_phi, v, keep, ctx.op, grad, inv_den, out)
        else:
            grad_q, grad_k, grad_v = chunked_backward(q_phi, k_phi, v, keep, ctx.op, grad, inv_den, out, ctx.chunk_size)
        grad_q, grad_k = feature_grads(q_phi, k_phi, rq, rk, ctx.op, grad_q, grad_k)
        return grad_q.to(ctx.dtype), grad_k.to(ctx.dtype), grad_v.to(ctx.dtype), None, None, None
