"""Linear attentions: a similarity sim(q, k) = phi(q).phi(k) (plus a constant) makes attention O(N D^2).

Non-causal: the D x D state sum_n phi(k_n) v_n^T is built first, then read by every query.
Causal: chunkwise (chunked.causal_linear), exact inside a chunk, a running state between chunks.
All variants compute in fp32 (fp64 stays fp64) and return the dtype of q. Padded keys (key_mask
False) leave every sum, normalisers included: their phi(k) and v are zeroed, not only v.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import reference
from .base import Attention
from .chunked import causal_linear
from .registry import register_attention


def flatten(q: Tensor, k: Tensor, v: Tensor) -> list[Tensor]:
    """[B, H, N, D] -> [B*H, N, D] in the compute dtype (fp32 for bf16, fp64 stays fp64)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    return [t.reshape(-1, *t.shape[-2:]).to(dtype) for t in (q, k, v)]


def key_weights(key_mask: Tensor | None, q: Tensor, dtype: torch.dtype) -> Tensor | None:
    """[B, N] bool -> [B*H, N, 1] in `dtype`: 1 for a real key, 0 for padding; None without a mask."""
    if key_mask is None:
        return None
    B, H, N, _ = q.shape
    if key_mask.shape != (B, N):
        raise ValueError(f"key_mask has shape {tuple(key_mask.shape)} but q has batch {B} and {N} tokens; pass a bool mask [B, N]")
    return key_mask[:, None, :, None].expand(B, H, N, 1).reshape(B * H, N, 1).to(dtype)


def inv_norm(x: Tensor) -> Tensor:
    """[G, N, D] -> [G, N, 1]: 1 / max(|x|, 1e-12), the same floor as F.normalize."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-12).reciprocal()


def rowdot(x: Tensor, y: Tensor) -> Tensor:
    """[G, N, D] x2 -> [G, N, 1]: x_i . y_i as N tiny matmuls, which skips the [G, N, D] product a mul-sum makes."""
    return torch.einsum("gnd,gnd->gn", x, y).unsqueeze(-1)


def unnormalise_grad(x_hat: Tensor, r: Tensor, grad_hat: Tensor) -> Tensor:
    """Gradient through x_hat = r x with r = 1/|x|: r (g - (x_hat.g) x_hat). Overwrites grad_hat [G, N, D]."""
    return grad_hat.addcmul_(x_hat, rowdot(x_hat, grad_hat), value=-1).mul_(r)


def safe_divide(num: Tensor, den: Tensor) -> Tensor:
    """num / den with 0 / 0 -> 0: a query without any real key (padding, never used) stays finite."""
    return num / den.clamp_min(torch.finfo(den.dtype).tiny)


def unit_pair(q: Tensor, k: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q^, k^ [G, N, D] and their scales 1/|q|, 1/|k| [G, N, 1]; k^ and its scale are zero for padded keys."""
    rq, rk = inv_norm(q), inv_norm(k)
    if keep is not None:
        rk = rk * keep
    return q * rq, k * rk, rq, rk


class AffineNoDenom(torch.autograd.Function):
    """Non-causal Eq. 7 of Gerami et al. 2026 with a hand-written backward, on [G, N, D] tensors.

    o = q^ S + s with S = k^^T v / 2 (k^ zero for padding) and s = sum_n v_n / 2: the "1 +" and
    the 1/2 live in the small state, so the forward is two matmuls. The backward reuses S and the
    saved q^, k^ (kept instead of q, k) so it makes no [N, D] temporaries beyond its outputs.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
        q_hat, k_hat, rq, rk = unit_pair(q, k, keep)
        state = torch.bmm(k_hat.transpose(1, 2), v).mul_(0.5)  # [G, D, D]
        v_sum = v.sum(1, keepdim=True) if keep is None else torch.bmm(keep.transpose(1, 2), v)  # [G, 1, D]
        ctx.save_for_backward(q_hat, k_hat, v, keep, rq, rk, state)
        return torch.bmm(q_hat, state).add_(v_sum, alpha=0.5)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q_hat, k_hat, v, keep, rq, rk, state = ctx.saved_tensors
        # half of dL/dS for S = k^^T v, which enters o as q^ S / 2
        half_grad_state = torch.bmm(q_hat.transpose(1, 2), grad).mul_(0.5)  # [G, D, D]
        grad_q = unnormalise_grad(q_hat, rq, torch.bmm(grad, state.transpose(1, 2)))
        grad_k = unnormalise_grad(k_hat, rk, torch.bmm(v, half_grad_state.transpose(1, 2)))
        half_grad_sum = grad.sum(1, keepdim=True).mul_(0.5)  # [G, 1, D]
        grad_v = torch.bmm(k_hat, half_grad_state)
        grad_v = grad_v.add_(half_grad_sum) if keep is None else grad_v.addcmul_(keep, half_grad_sum)
        return grad_q, grad_k, grad_v, None


class AffineNormalised(torch.autograd.Function):
    """Non-causal linear_affine with a hand-written backward, on [G, N, D] tensors.

    o = c + q^ S / den with c the mean of the real v, S = k^^T (v - c) and den = count + q^ . z,
    z = sum_n k^_n: centring v on c (exact, the weights sum to one) makes the result exact when
    all v are equal; the backward reuses S, z, den and the saved q^, k^, v - c.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
        q_hat, k_hat, rq, rk = unit_pair(q, k, keep)
        count = v.new_full((1, 1, 1), v.shape[1]) if keep is None else keep.sum(1, keepdim=True)  # [G or 1, 1, 1]
        v_sum = v.sum(1, keepdim=True) if keep is None else torch.bmm(keep.transpose(1, 2), v)
        centre = safe_divide(v_sum, count)  # [G, 1, D]
        # padded rows of v - c meet k^ = 0 only, so they need no mask
        v_centred = v - centre
        k_sum = k_hat.sum(1, keepdim=True)  # [G, 1, D]
        state = torch.bmm(k_hat.transpose(1, 2), v_centred)  # [G, D, D]
        den = torch.bmm(q_hat, k_sum.transpose(1, 2)).add_(count).clamp_min_(torch.finfo(v.dtype).tiny)  # [G, N, 1]
        ctx.save_for_backward(q_hat, k_hat, v_centred, keep, rq, rk, state, k_sum, den, count)
        return torch.bmm(q_hat, state).div_(den).add_(centre)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q_hat, k_hat, v_centred, keep, rq, rk, state, k_sum, den, count = ctx.saved_tensors
        grad_scaled = grad / den
        grad_state = torch.bmm(q_hat.transpose(1, 2), grad_scaled)  # [G, D, D]
        grad_q_hat = torch.bmm(grad_scaled, state.transpose(1, 2))
        # o = c + q^ S / den: dL/dden = -(g . q^ S) / den^2 = -(q^ . (g / den) S^T) / den
        grad_den = rowdot(q_hat, grad_q_hat).div_(den).neg_()  # [G, N, 1]
        grad_q = unnormalise_grad(q_hat, rq, grad_q_hat.addcmul_(grad_den, k_sum))
        grad_k_sum = torch.bmm(grad_den.transpose(1, 2), q_hat)  # [G, 1, D]
        grad_k = unnormalise_grad(k_hat, rk, torch.bmm(v_centred, grad_state.transpose(1, 2)).add_(grad_k_sum))
        # c enters o directly and through S = k^^T (v - c); c = sum of real v / count
        grad_v_sum = (grad.sum(1, keepdim=True) - torch.bmm(k_sum, grad_state)).div_(count)  # [G, 1, D]
        grad_v = torch.bmm(k_hat, grad_state)
        grad_v = grad_v.add_(grad_v_sum) if keep is None else grad_v.addcmul_(keep, grad_v_sum)
        return grad_q, grad_k, grad_v, None


def with_ones(v: Tensor, keep: Tensor | None) -> Tensor:
    """[G, N, D] -> [G, N, D + 1]: v with a column of ones (zero for padding) whose output is the normaliser."""
    ones = torch.ones_like(v[..., :1]) if keep is None else keep
    return torch.cat([v, ones], -1)


def linear_affine_nodenom(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, chunk_size: int = 64) -> Tensor:
    """Gerami, Madani, Duraiswami 2026, Eq. 7: o_i = sum_n (1 + q^_i.k^_n) / 2 v_n, [B, H, N, D] x3 -> [B, H, N, D].

    There is no denominator and no 1/N, so the output grows linearly with the number of keys
    (about N/2 |v| for unrelated q, k); sums are accumulated in fp32 so bf16 inputs stay finite.
    """
    shape, dtype = q.shape, q.dtype
    qf, kf, vf = flatten(q, k, v)
    keep = key_weights(key_mask, q, qf.dtype)
    if causal:
        v_kept = vf if keep is None else vf * keep
        out = causal_linear(*unit_pair(qf, kf, keep)[:2], v_kept, chunk_size=chunk_size, plus_one=True) * 0.5
    else:
        out = AffineNoDenom.apply(qf, kf, vf, keep)
    return out.reshape(shape).to(dtype)


def normalised(q_phi: Tensor, k_phi: Tensor, v: Tensor, keep: Tensor | None, *, causal: bool, chunk_size: int, plus_one: bool) -> Tensor:
    """o_i = sum_n sim(i, n) v_n / sum_n sim(i, n) with sim = plus_one + q_phi_i.k_phi_n; [G, N, F], [G, N, F], [G, N, E].

    k_phi must already be zero at padded keys. The weights sum to one, so o_i = c + sum_n w_in (v_n - c)
    for any c; centring v (on its mean, or causally on the first token) makes the result exact
    when all v are equal, e.g. the gradient of k is exactly 0 for a single token.
    """
    if causal:
        centre = v[:, :1] if keep is None else v[:, :1] * keep[:, :1]  # [G, 1, E], the first token is in every prefix
        v_centred = v - centre if keep is None else (v - centre) * keep
        out = causal_linear(q_phi, k_phi, with_ones(v_centred, keep), chunk_size=chunk_size, plus_one=plus_one)
        return centre + safe_divide(out[..., :-1], out[..., -1:])
    count = v.new_full((1, 1, 1), v.shape[-2]) if keep is None else keep.sum(1, keepdim=True)  # [G or 1, 1, 1]
    v_sum = v.sum(1, keepdim=True) if keep is None else keep.transpose(1, 2) @ v  # [G, 1, E]
    centre = safe_divide(v_sum, count)
    k_sum = k_phi.sum(1, keepdim=True)  # [G, 1, F]
    # sum_n k_n (v_n - centre)^T; the constant term sum_n (v_n - centre) is exactly zero
    state = k_phi.transpose(1, 2) @ v - k_sum.transpose(1, 2) @ centre  # [G, F, E]
    den = q_phi @ k_sum.transpose(1, 2)  # [G, N, 1]
    if plus_one:
        den = den + count
    return centre + safe_divide(q_phi @ state, den)


def linear_affine(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, chunk_size: int = 64) -> Tensor:
    """o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), [B, H, N, D] x3 -> [B, H, N, D].

    1 + cos >= 0, so o_i is a convex combination of the v_n. Non-causal it is two small matmuls:
    numerator sum_n v_n + q^_i (K^T V), denominator N + q^_i . sum_n k^_n.
    """
    shape, dtype = q.shape, q.dtype
    qf, kf, vf = flatten(q, k, v)
    keep = key_weights(key_mask, q, qf.dtype)
    if causal:
        out = normalised(*unit_pair(qf, kf, keep)[:2], vf, keep, causal=True, chunk_size=chunk_size, plus_one=True)
    else:
        out = AffineNormalised.apply(qf, kf, vf, keep)
    return out.reshape(shape).to(dtype)


def elu_feature(x: Tensor) -> Tensor:
    return F.elu(x) + 1


def linear_elu(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, chunk_size: int = 64) -> Tensor:
    """Katharopoulos et al. 2020: o_i = phi(q_i) S / phi(q_i).z, S = sum_n phi(k_n) v_n^T, z = sum_n phi(k_n), phi = elu + 1."""
    shape, dtype = q.shape, q.dtype
    qf, kf, vf = flatten(q, k, v)
    keep = key_weights(key_mask, q, qf.dtype)
    k_phi = elu_feature(kf) if keep is None else elu_feature(kf) * keep
    out = normalised(elu_feature(qf), k_phi, vf, keep, causal=causal, chunk_size=chunk_size, plus_one=False)
    return out.reshape(shape).to(dtype)


def efficient(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None) -> Tensor:
    """Shen et al. 2021, "Efficient attention": o = softmax_D(Q) (softmax_N(K)^T V), [B, H, N, D] x3 -> [B, H, N, D]."""
    if causal:
        raise ValueError(f"attention 'efficient' cannot be causal: {EfficientAttention.why_not_causal}")
    shape, dtype = q.shape, q.dtype
    qf, kf, vf = flatten(q, k, v)
    keep = key_weights(key_mask, q, qf.dtype)
    if keep is not None:
        # padded keys leave the softmax over tokens; a row without any real key keeps all (padding, never used)
        real = (keep > 0) | (keep == 0).all(1, keepdim=True)
        kf = kf.masked_fill(~real, float("-inf"))
    context = kf.softmax(1).transpose(1, 2) @ vf  # [G, D, D]
    return (qf.softmax(-1) @ context).reshape(shape).to(dtype)


class LinearAttention(Attention):
    """A parameter-free linear attention; the options it takes are `chunk_size` (causal only)."""


@register_attention("linear_affine")
class LinearAffineAttention(LinearAttention):
    """sim = 1 + q^.k^ (cosine plus one), normalised by the sum of similarities."""

    function = staticmethod(linear_affine)
    reference = staticmethod(reference.linear_affine)


@register_attention("linear_affine_nodenom")
class LinearAffineNoDenomAttention(LinearAttention):
    """Gerami, Madani, Duraiswami 2026, Eq. 7: weights (1 + q^.k^)/2, no denominator (output grows with N)."""

    function = staticmethod(linear_affine_nodenom)
    reference = staticmethod(reference.linear_affine_nodenom)


@register_attention("linear_elu")
class LinearEluAttention(LinearAttention):
    """Katharopoulos et al. 2020, phi(x) = elu(x) + 1."""

    function = staticmethod(linear_elu)
    reference = staticmethod(reference.linear_elu)


@register_attention("efficient")
class EfficientAttention(LinearAttention):
    """Shen et al. 2021, softmax over D for q and over tokens for k."""

    supports_causal = False
    why_not_causal = "its softmax over all N tokens of K lets every query see future tokens"
    function = staticmethod(efficient)
    reference = staticmethod(reference.efficient)
