"""Pieces every linear op's PyTorch path shares: head flattening, key masks, row norms and their gradients.

Tensors are [G, N, D] with G = B * H. The paths keep their inputs in the dtype they came in (bf16 stays bf16,
so nothing saved for the backward is an fp32 copy) and compute in `compute_dtype` (fp32, fp64 for fp64).
"""

from __future__ import annotations

import ctypes
import sys

import torch
from torch import Tensor

SMALL = 1 << 16
MADV_HUGEPAGE, PAGE, HUGE_MIN_BYTES = 14, 4096, 32 << 20
LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None


def compute_dtype(x: Tensor) -> torch.dtype:
    """fp32 for bf16 / fp16 / fp32 inputs, fp64 for fp64."""
    return torch.promote_types(x.dtype, torch.float32)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def flatten(*tensors: Tensor) -> list[Tensor]:
    """[B, H, N, D] -> [G = B*H, N, D] views (copies only where the layout needs one), dtype unchanged."""
    return [t.reshape(-1, *t.shape[-2:]) for t in tensors]


def check_key_mask(key_mask: Tensor | None, q: Tensor) -> None:
    """A clear error for a key mask that does not fit q [B, H, N, D]."""
    B, _, N, _ = q.shape
    if key_mask is not None and tuple(key_mask.shape) != (B, N):
        raise ValueError(
            f"key_mask has shape {tuple(key_mask.shape)} but q has batch {B} and {N} tokens; pass a bool mask [B, N]"
        )


def key_weights(key_mask: Tensor | None, q: Tensor, dtype: torch.dtype) -> Tensor | None:
    """[B, N] bool -> [B*H, N, 1] in `dtype`: 1 for a real key, 0 for padding; None without a mask."""
    if key_mask is None:
        return None
    check_key_mask(key_mask, q)
    B, H, N, _ = q.shape
    return key_mask[:, None, :, None].expand(B, H, N, 1).reshape(B * H, N, 1).to(dtype)


def inv_norm(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """[G, N, D] -> [G, N, 1]: 1 / max(|x|, 1e-12) (the floor of F.normalize), accumulated in `dtype`."""
    dtype = None if dtype == x.dtype else dtype  # an explicit dtype costs a copy even when it is x's own
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=dtype).clamp_min_(1e-12).reciprocal_()


def rowdot(x: Tensor, y: Tensor) -> Tensor:
    """[G, N, D] x2 -> [G, N, 1]: x_i . y_i. At large N einsum, which skips the [G, N, D] product of a mul-sum (2-3x
    faster); below SMALL elements the mul-sum, whose fixed cost is a third of einsum's (8 vs 18 us measured)."""
    if x.numel() <= SMALL:
        return (x * y).sum(-1, keepdim=True)
    return torch.einsum("gnd,gnd->gn", x, y).unsqueeze(-1)


def safe_divide(num: Tensor, den: Tensor) -> Tensor:
    """num / den with 0 / 0 -> 0: a query without any real key (padding, never used) stays finite."""
    return num / den.clamp_min(torch.finfo(den.dtype).tiny)


def scaled_gram(x: Tensor, r: Tensor, y: Tensor, block: int = 4096) -> Tensor:
    """sum_n r_n x_n y_n^T: [G, N, D], [G, N, 1], [G, N, E] -> [G, D, E] in r's dtype (x, y upcast per block).

    Row blocks keep the scaled copy of x small: it is reused from the allocator's cache and stays
    in cache, where one [G, N, D] copy would cost fresh pages (page faults dominate at large N).
    """
    out = None
    for xs, rs, ys in zip(x.split(block, 1), r.split(block, 1), y.split(block, 1)):
        part, ys = (xs * rs).transpose(1, 2), ys.to(r.dtype)
        out = torch.bmm(part, ys) if out is None else out.baddbmm_(part, ys)
    return out


def unscale_grad(x: Tensor, r: Tensor, grad_hat: Tensor) -> Tensor:
    """Gradient through x^ = r x with r = 1/|x| from x itself: r (g - r^2 (x.g) x). Overwrites grad_hat."""
    return grad_hat.addcmul_(x, rowdot(x, grad_hat).mul_(r.square()), value=-1).mul_(r)


def remove_radial(grad_hat: Tensor, x_hat: Tensor, r: Tensor) -> Tensor:
    """dL/dx = r (g - (x^.g) x^) from g = dL/dx^ for x^ = r x, r = 1/|x|, in place on grad_hat [G, N, D]."""
    return grad_hat.addcmul_(x_hat, rowdot(x_hat, grad_hat), value=-1).mul_(r)


def elu_feature(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 (Katharopoulos et al. 2020) = exp(min(x, 0)) + max(x, 0): torch's elu goes through a
    scalar expm1 on the CPU (300 us for 30k floats, measured), exp is vectorised (40 us)."""
    return x.clamp(max=0).exp_().add_(x.clamp(min=0))


def elu_feature_grad(phi: Tensor, grad_phi: Tensor) -> Tensor:
    """dL/dx from dL/dphi (overwritten) and phi = elu(x) + 1: elu'(x) = min(phi, 1)."""
    return grad_phi.mul_(phi.clamp(max=1))


def fresh(like: Tensor, *shape: int) -> Tensor:
    """torch.empty that asks Linux for 2 MB pages (madvise, a hint) on large CPU tensors.

    Output and gradients are new every step; first touching 4 KB pages of a 100 MB tensor cost about
    22 ms (page faults, measured) against about 5 ms with 2 MB pages, as much as the writes themselves.
    This is what torch's THP_MEM_ALLOC_ENABLE=1 does for every allocation. Only from 32 MB, where glibc
    always gives a tensor its own mapping: hinting parts of the shared heap (N = 16384) was seen to stall
    for seconds.
    """
    x = like.new_empty(shape)
    nbytes = x.numel() * x.element_size()
    if LIBC is not None and x.device.type == "cpu" and nbytes >= HUGE_MIN_BYTES:
        start = -(-x.data_ptr() // PAGE) * PAGE
        end = (x.data_ptr() + nbytes) // PAGE * PAGE
        LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_int(MADV_HUGEPAGE))
    return x
