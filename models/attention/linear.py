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

from models.attention import cpu_kernel, reference, tiled
from models.attention.base import Attention
from models.attention.chunked import causal_linear
from models.attention.registry import register_attention


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
        raise ValueError(
            f"key_mask has shape {tuple(key_mask.shape)} but q has batch {B} and {N} tokens; pass a bool mask [B, N]"
        )
    return key_mask[:, None, :, None].expand(B, H, N, 1).reshape(B * H, N, 1).to(dtype)


def inv_norm(x: Tensor) -> Tensor:
    """[G, N, D] -> [G, N, 1]: 1 / max(|x|, 1e-12), the same floor as F.normalize."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-12).reciprocal()


def rowdot(x: Tensor, y: Tensor) -> Tensor:
    """[G, N, D] x2 -> [G, N, 1]: x_i . y_i; einsum skips the [G, N, D] product of a mul-sum (2-3x faster at large
    N)."""
    return torch.einsum("gnd,gnd->gn", x, y).unsqueeze(-1)


def safe_divide(num: Tensor, den: Tensor) -> Tensor:
    """num / den with 0 / 0 -> 0: a query without any real key (padding, never used) stays finite."""
    return num / den.clamp_min(torch.finfo(den.dtype).tiny)


def unit_pair(q: Tensor, k: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q^, k^ [G, N, D] and their scales 1/|q|, 1/|k| [G, N, 1]; k^ and its scale are zero for padded keys."""
    rq, rk = inv_norm(q), inv_norm(k)
    if keep is not None:
        rk = rk * keep
    return q * rq, k * rk, rq, rk


def scaled_gram(x: Tensor, r: Tensor, y: Tensor, block: int = 4096) -> Tensor:
    """sum_n r_n x_n y_n^T: [G, N, D], [G, N, 1], [G, N, E] -> [G, D, E].

    Row blocks keep the scaled copy of x small: it is reused from the allocator's cache and stays
    in cache, where one [G, N, D] copy would cost fresh pages (page faults dominate at large N).
    """
    out = None
    for xs, rs, ys in zip(x.split(block, 1), r.split(block, 1), y.split(block, 1)):
        part = (xs * rs).transpose(1, 2)
        out = torch.bmm(part, ys) if out is None else out.baddbmm_(part, ys)
    return out


def unscale_grad(x: Tensor, r: Tensor, grad_hat: Tensor) -> Tensor:
    """Gradient through x^ = r x with r = 1/|x| from x itself: r (g - r^2 (x.g) x). Overwrites grad_hat."""
    return grad_hat.addcmul_(x, rowdot(x, grad_hat).mul_(r.square()), value=-1).mul_(r)


class AffineNoDenom(torch.autograd.Function):
    """Non-causal Eq. 7 of Gerami et al. 2026 with a hand-written backward, on [G, N, D] tensors.

    o = rq (q S) + s with S = k^^T v / 2 (k^ zero for padding), s = sum_n v_n / 2 and rq = 1/|q|:
    the "1 +" and the 1/2 live in the small state, q^ and k^ are never stored, so forward + backward
    allocate no [N, D] tensor beyond o and the three gradients. On the CPU in fp32 the fused C kernel
    (cpu_kernel.py, nodenom_cpu.c) does each pass; elsewhere the same math runs block by block in
    PyTorch ops (tiled.py).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
        q, k, v = (t.contiguous() for t in (q, k, v))
        keep = None if keep is None else keep.contiguous()
        ctx.kernel = cpu_kernel.usable(q, k, v, keep)
        if ctx.kernel:
            out = tiled.fresh(q, *q.shape)
            rq, rk, state = cpu_kernel.forward(q, k, v, keep, out)
        else:
            out, rq, rk, state = tiled.forward(q, k, v, keep)
        ctx.save_for_backward(q, k, v, keep, rq, rk, state)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        # e.g. the zero-stride gradient of a .sum() would send bmm down a slow path
        grad, saved = grad.contiguous(), ctx.saved_tensors
        if ctx.kernel:
            grads = [tiled.fresh(x, *x.shape) for x in saved[:3]]
            cpu_kernel.backward(grad, *saved, *grads)
        else:
            grads = tiled.backward(grad, *saved)
        return *grads, None


def elu_feature(x: Tensor) -> Tensor:
    return F.elu(x) + 1


def features(
    q: Tensor, k: Tensor, keep: Tensor | None, unit: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """phi(q), phi(k) [G, N, D] (phi(k) zero for padded keys) and, for unit features, the scales 1/|q|, 1/|k|."""
    if unit:
        return unit_pair(q, k, keep)
    k_phi = elu_feature(k) if keep is None else elu_feature(k).mul_(keep)
    return elu_feature(q), k_phi, None, None


def scales(
    q: Tensor, k: Tensor, keep: Tensor | None, unit: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """The stored features and their row scales: q, k with 1/|q|, 1/|k| (phi = r x, applied lazily) for unit
    features, else elu(q) + 1, elu(k) + 1 with no scale. phi(k) is zero for padded keys either way."""
    if not unit:
        return features(q, k, keep, unit=False)
    rk = inv_norm(k) if keep is None else inv_norm(k) * keep
    return q, k, inv_norm(q), rk


def scaled(x: Tensor, r: Tensor | None) -> Tensor:
    """x [G, N, E] times the row scales r [G, N, 1] in place, or x when r is None."""
    return x if r is None else x.mul_(r)


def feature_grad(x: Tensor, r: Tensor | None, grad_phi: Tensor) -> Tensor:
    """dL/dx from dL/dphi(x) (overwritten): through r x with r = 1/|x| for unit features, else
    elu'(x) = min(elu(x) + 1, 1)."""
    return unscale_grad(x, r, grad_phi) if r is not None else grad_phi.mul_(x.clamp(max=1))


class NormalisedLinear(torch.autograd.Function):
    """Non-causal normalised linear attention with a hand-written backward, on [G, N, D] tensors.

    sim = 1 + q^.k^ (unit, linear_affine) or phi(q).phi(k) with phi = elu + 1 (linear_elu).
    o = c + phi(q) S / den with c the mean of the real v, S = phi(k)^T (v - c), den = [count +] phi(q) . z
    and z = sum_n phi(k_n): centring v on c (exact, the weights sum to one) makes the result exact
    when all v are equal. Unit features are never stored: q, k are kept with their 1/|x| row scales.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, unit: bool) -> Tensor:
        # linear_affine on the CPU in fp32: the fused C kernel (affine_cpu.c), same math; not traceable by torch.compile
        ctx.kernel = unit and not torch.compiler.is_compiling() and cpu_kernel.usable(q, k, v, keep)
        if ctx.kernel:
            q, k, v = (t.contiguous() for t in (q, k, v))
            keep = None if keep is None else keep.contiguous()
            count = q.new_full((q.shape[0],), k.shape[1]) if keep is None else keep.sum((1, 2))  # real keys per head
            out = tiled.fresh(q, *q.shape)
            ctx.save_for_backward(q, k, v, keep, count, *cpu_kernel.affine_forward(q, k, v, keep, count, out))
            return out
        q_f, k_f, rq, rk = scales(q, k, keep, unit)
        count = v.new_full((1, 1, 1), v.shape[1]) if keep is None else keep.sum(1, keepdim=True)  # [G or 1, 1, 1]
        v_sum = v.sum(1, keepdim=True) if keep is None else torch.bmm(keep.transpose(1, 2), v)
        centre = safe_divide(v_sum, count)  # [G, 1, D]
        # padded rows of v - c meet phi(k) = 0 only, so they need no mask
        v_centred = v - centre
        k_sum = k_f.sum(1, keepdim=True) if rk is None else torch.bmm(rk.transpose(1, 2), k_f)  # [G, 1, D]
        state = (
            torch.bmm(k_f.transpose(1, 2), v_centred) if rk is None else scaled_gram(k_f, rk, v_centred)
        )  # [G, D, D]
        den = scaled(torch.bmm(q_f, k_sum.transpose(1, 2)), rq)  # [G, N, 1]
        den = (den.add_(count) if unit else den).clamp_min_(torch.finfo(v.dtype).tiny)
        ctx.save_for_backward(q_f, k_f, v_centred, keep, rq, rk, state, k_sum, den, count)
        return scaled(torch.bmm(q_f, state), rq).div_(den).add_(centre)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.kernel:
            saved = ctx.saved_tensors
            grads = [tiled.fresh(x, *x.shape) for x in saved[:3]]
            cpu_kernel.affine_backward(grad, *saved, *grads)
            return *grads, None, None
        q_f, k_f, v_centred, keep, rq, rk, state, k_sum, den, count = ctx.saved_tensors
        grad = grad.contiguous()
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
        return grad_q, grad_k, grad_v, None, None


def with_ones(v: Tensor, keep: Tensor | None) -> Tensor:
    """[G, N, D] -> [G, N, D + 1]: v with a column of ones (zero for padding) whose output is the normaliser."""
    ones = torch.ones_like(v[..., :1]) if keep is None else keep
    return torch.cat([v, ones], -1)


def linear_affine_nodenom(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, chunk_size: int = 64
) -> Tensor:
    """Gerami, Madani, Duraiswami 2026, Eq. 7: o_i = sum_n (1 + q^_i.k^_n) / 2 v_n, [B, H, N, D] x3 -> [B, H, N, D].

    There is no denominator and no 1/N, so the output grows linearly with the number of keys
    (about N/2 |v| for unrelated q, k); sums are accumulated in fp32 so bf16 inputs stay finite.
    """
    shape, dtype = q.shape, q.dtype
    qf, kf, vf = flatten(q, k, v)
    keep = key_weights(key_mask, q, qf.dtype)
    v_kept = vf if keep is None else vf * keep
    if causal:
        out = causal_linear(*unit_pair(qf, kf, keep)[:2], v_kept, chunk_size=chunk_size, plus_one=True) * 0.5
    elif torch.compiler.is_compiling():
        # the compiler cannot trace the C kernel's ctypes call nor tiled.py's out= views; it fuses these plain ops
        # itself
        q_hat, k_hat, _, _ = unit_pair(qf, kf, keep)
        out = torch.baddbmm(v_kept.sum(1, keepdim=True), q_hat, k_hat.transpose(1, 2) @ vf) * 0.5
    else:
        out = AffineNoDenom.apply(qf, kf, vf, keep)
    return out.reshape(shape).to(dtype)


def causal_normalised(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, *, unit: bool, chunk_size: int) -> Tensor:
    """Causal o_i = sum_{n <= i} sim(i, n) v_n / sum_{n <= i} sim(i, n), [G, N, D] x3 -> [G, N, D].

    The weights sum to one, so o_i = c + sum_n w_in (v_n - c) for any c; centring v on the first
    token (in every prefix, so causality holds) makes the result exact when all v are equal, e.g.
    the gradient of k is exactly 0 for a single token. The normaliser is the output of a ones column.
    """
    q_phi, k_phi, _, _ = features(q, k, keep, unit)
    centre = v[:, :1] if keep is None else v[:, :1] * keep[:, :1]  # [G, 1, D]
    v_centred = v - centre if keep is None else (v - centre) * keep
    out = causal_linear(q_phi, k_phi, with_ones(v_centred, keep), chunk_size=chunk_size, plus_one=unit)
    return centre + safe_divide(out[..., :-1], out[..., -1:])


def normalised_attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None, chunk_size: int, unit: bool
) -> Tensor:
    """[B, H, N, D] x3 -> [B, H, N, D] for linear_affine (unit) and linear_elu."""
    shape, dtype = q.shape, q.dtype
    qf, kf, vf = flatten(q, k, v)
    keep = key_weights(key_mask, q, qf.dtype)
    if causal:
        out = causal_normalised(qf, kf, vf, keep, unit=unit, chunk_size=chunk_size)
    else:
        out = NormalisedLinear.apply(qf, kf, vf, keep, unit)
    return out.reshape(shape).to(dtype)


def linear_affine(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, chunk_size: int = 64
) -> Tensor:
    """o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), [B, H, N, D] x3 -> [B, H, N, D].

    1 + cos >= 0, so o_i is a convex combination of the v_n. Non-causal it is two small matmuls:
    numerator sum_n v_n + q^_i (K^T V), denominator N + q^_i . sum_n k^_n.
    """
    return normalised_attention(q, k, v, causal, key_mask, chunk_size, unit=True)


def linear_elu(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, chunk_size: int = 64
) -> Tensor:
    """Katharopoulos et al. 2020: o_i = phi(q_i) S / phi(q_i).z, S = sum_n phi(k_n) v_n^T, z = sum_n phi(k_n),
    phi = elu + 1."""
    return normalised_attention(q, k, v, causal, key_mask, chunk_size, unit=False)


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
