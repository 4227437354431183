"""Rotary position embeddings (RoPE): positions as rotations of q and k, applied before every attention.

    model.text_pos_embed: rope    1-D RoPE over the caption's tokens (Su et al. 2021, RoFormer), base 10000
    model.image_pos_embed: rope   2-D axial RoPE on the patch grid (Heo et al. 2024, RoPE-ViT "RoPE-Axial"),
                                  base 100: the first half of each head's frequency pairs turn with the patch's
                                  column, the second half with its row; the class token is not rotated

A tower with RoPE has no position table: a model trained at one resolution or context runs at another as is.

Convention ("rotate half", as GPT-NeoX and RoPE-ViT's code): feature j of a head is paired with feature
j + D/2, and the pair turns by angle_j = position x base^(-j / (D/2)) (per axis: base^(-j / (D/4)) over that
axis's D/4 pairs). A rotation keeps |q| and |k|, so the affine kernels' q^.k^ stays in [-1, 1] and Eq. 7's
weights (1 + q^.k^)/2 in [0, 1]; every implementation (reference, torch, C, Triton) runs unchanged on the
rotated q and k. A feature map that must stay positive (elu + 1) cannot take rotated inputs and keep its
normaliser positive; for those, `rotated_linear` follows RoFormer sec. 3.4.4: the numerator uses the rotated
phi(q), phi(k), the denominator the unrotated ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from models.attention.ops.chunked import causal_linear
from models.attention.ops.common import compute_dtype, flatten, key_weights, safe_divide

TEXT_BASE, IMAGE_BASE = 10000.0, 100.0
KINDS = ("learnable", "rope")


def check(tower: str, kind: str, head_dim: int) -> None:
    """One line for a position kind we do not know or a head width RoPE cannot split into pairs (per axis)."""
    if kind not in KINDS:
        raise ValueError(f"model.{tower}_pos_embed={kind!r} is not known; use one of {', '.join(KINDS)}")
    need = 4 if tower == "image" else 2
    if kind == "rope" and head_dim % need:
        raise ValueError(
            f"model.{tower}_pos_embed=rope needs a head width divisible by {need} "
            f"({'two axes of ' if need == 4 else ''}feature pairs), but the {tower} tower's heads are {head_dim} wide; "
            "change its width or head count"
        )


def angles(positions: Tensor, pairs: int, base: float) -> Tensor:
    """[N] positions -> [N, pairs] rotation angles position x base^(-j / pairs)."""
    freqs = base ** (-torch.arange(pairs, dtype=torch.float64, device=positions.device) / pairs)
    return positions.to(torch.float64)[:, None] * freqs


def text_table(length: int, head_dim: int, device=None) -> tuple[Tensor, Tensor]:
    """(cos, sin) [N, D/2] for tokens 0 .. length - 1."""
    theta = angles(torch.arange(length, device=device), head_dim // 2, TEXT_BASE)
    return theta.cos().float(), theta.sin().float()


def image_table(rows: Tensor, cols: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """(cos, sin) [..., 1 + N, D/2] for the class token (angle 0) and patches at (rows, cols) [..., N]."""
    quarter = head_dim // 4
    theta = torch.cat(
        [angles(cols.reshape(-1), quarter, IMAGE_BASE), angles(rows.reshape(-1), quarter, IMAGE_BASE)], -1
    ).reshape(*rows.shape, 2 * quarter)
    theta = torch.cat([theta.new_zeros(*rows.shape[:-1], 1, 2 * quarter), theta], -2)
    return theta.cos().float(), theta.sin().float()


def grid_positions(height: int, width: int, device=None) -> tuple[Tensor, Tensor]:
    """Row and column of each patch, row-major as conv1's flatten orders them: two [H * W] tensors."""
    rows, cols = torch.meshgrid(torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij")
    return rows.reshape(-1), cols.reshape(-1)


def rotate(x: Tensor, table: tuple[Tensor, Tensor]) -> Tensor:
    """x [B, H, N, D] with each pair (j, j + D/2) turned by its angle; table (cos, sin) [N, D/2] or [B, N, D/2]."""
    cos, sin = (t.to(x.dtype) for t in table)
    if cos.dim() == 3:  # one table per image (patch dropout keeps other patches in each)
        cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def elu_plus_one(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 (Katharopoulos et al. 2020), out of place: autograd differentiates it here."""
    return F.elu(x) + 1


def rotated_linear(
    phi, q: Tensor, k: Tensor, v: Tensor, table, *, causal: bool, key_mask: Tensor | None, chunk_size: int = 64
) -> Tensor:
    """RoFormer's linear attention with RoPE for a positive feature map phi, [B, H, N, D] x3 -> [B, H, N, D]:
    o_i = sum_n (R_i phi(q_i)) . (R_n phi(k_n)) v_n / sum_n phi(q_i) . phi(k_n), over n <= i when causal."""
    dtype = q.dtype
    q, k, v = (t.to(compute_dtype(q)) for t in (q, k, v))
    fq, fk = phi(q), phi(k)
    rq, rk = rotate(fq, table), rotate(fk, table)
    fq, fk, rq, rk, vf = flatten(fq, fk, rq, rk, v)
    keep = key_weights(key_mask, q, vf.dtype)
    if keep is not None:
        fk, rk, vf = fk * keep, rk * keep, vf * keep
    if causal:
        num = causal_linear(rq, rk, vf, chunk_size=chunk_size)
        den = causal_linear(fq, fk, torch.ones_like(vf[..., :1]), chunk_size=chunk_size)
    else:
        num = rq @ (rk.transpose(1, 2) @ vf)
        den = fq @ fk.sum(1, keepdim=True).transpose(1, 2)
    return safe_divide(num, den).reshape(v.shape).to(dtype)
