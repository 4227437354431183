"""Hedgehog (Zhang, Bhatia, Kumbong, Ré 2024, ICLR, "The Hedgehog & the Porcupine: Expressive Linear Attentions with
Softmax Mimicry"): a linear attention whose feature map is learned, so that attention transfer (train/distill.py,
stage 1) can teach it to mimic its softmax layer.

    phi_q(x) = [softmax_j(x W_q), softmax_j(-x W_q)],   phi_k(x) = [softmax_j(x W_k), softmax_j(-x W_k)]
    o_i = sum_n (phi_q(q_i) . phi_k(k_n)) v_n / sum_n phi_q(q_i) . phi_k(k_n)

per head: W_q, W_k [D, F] learned (F = `feature_dim`, default the head width D), the softmax over the F features;
phi has 2F entries, all positive, so every similarity and denominator is > 0. Choices where the paper leaves room,
as LoLCATs (Zhang et al. 2024) makes them: one map for queries and one for keys, no bias, W initialised to the
identity (phi then starts as the softmax of q over its features, and of -q), a single linear layer.
Non-causal: phi_k^T V first (O(N F D)); causal: the chunked running sum of ops/chunked.py. Padded keys' phi and v
are zeroed. Reference: reference.hedgehog (the explicit N x N similarity).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.attention import reference
from models.attention.base import Attention
from models.attention.ops.chunked import causal_linear
from models.attention.ops.common import compute_dtype, key_weights, safe_divide
from models.attention.ops.recurrent import kernel_step
from models.attention.registry import register_attention


def feature_map(x: Tensor, weight: Tensor) -> Tensor:
    """x [B, H, N, D], weight [H, D, F] -> [B, H, N, 2F]: [softmax(x W), softmax(-x W)] over the F features."""
    z = torch.einsum("bhnd,hdf->bhnf", x, weight.to(x.dtype))
    return torch.cat([z.softmax(-1), (-z).softmax(-1)], -1)


@register_attention("hedgehog")
class HedgehogAttention(Attention):
    """Learnable feature maps phi_q, phi_k (module docstring); options `feature_dim` and `chunk_size` (causal)."""

    supports_recurrent = True

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        qkv_bias: bool = True,
        feature_dim: int | None = None,
        chunk_size: int = 64,
        **options,
    ):
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias)
        if options:
            raise ValueError(
                f"attention 'hedgehog': unknown options {', '.join(sorted(options))}; it takes feature_dim and "
                "chunk_size"
            )
        features = self.head_dim if feature_dim is None else feature_dim
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"attention 'hedgehog': feature_dim={feature_dim!r} must be a positive integer")
        self.chunk_size = chunk_size
        eye = torch.eye(self.head_dim, features).expand(num_heads, -1, -1)
        self.feature_q = nn.Parameter(eye.clone())
        self.feature_k = nn.Parameter(eye.clone())

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """[B, H, N, D] x3 -> [B, H, N, D], accumulated in fp32 (fp64 stays fp64)."""
        B, H, N, D = q.shape
        work = compute_dtype(q)
        phi_q = feature_map(q.to(work), self.feature_q).reshape(B * H, N, -1)
        phi_k = feature_map(k.to(work), self.feature_k).reshape(B * H, N, -1)
        vf = v.to(work).reshape(B * H, N, D)
        keep = key_weights(key_mask, q, work)
        if keep is not None:
            phi_k, vf = phi_k * keep, vf * keep
        if self.causal:
            ones = vf.new_ones(B * H, N, 1)
            num = causal_linear(phi_q, phi_k, vf, chunk_size=self.chunk_size)
            den = causal_linear(phi_q, phi_k, ones if keep is None else keep, chunk_size=self.chunk_size)
        else:
            num = phi_q @ (phi_k.transpose(1, 2) @ vf)  # [G, N, 2F] @ [G, 2F, D]
            den = phi_q @ phi_k.sum(1).unsqueeze(-1)  # [G, N, 1]
        return safe_divide(num, den).reshape(B, H, N, D).to(q.dtype)

    def state_shapes(self) -> list[tuple[int, ...]]:
        features = 2 * self.feature_q.shape[-1]
        return [(self.num_heads, features, self.head_dim), (self.num_heads, features)]

    def token_step(self, q: Tensor, k: Tensor, v: Tensor, state: tuple, table) -> tuple[Tensor, tuple]:
        """The normalised running sums of ops/recurrent.py on the learned features phi_q(q), phi_k(k) [B, H, 1, 2F]."""
        work = compute_dtype(q)
        phi_q, phi_k = feature_map(q.to(work), self.feature_q), feature_map(k.to(work), self.feature_k)
        return kernel_step(state, phi_q, phi_k, v, normalised=True)

    def attention_reference(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        return reference.hedgehog(q, k, v, self.feature_q, self.feature_k, causal=self.causal, key_mask=key_mask)
