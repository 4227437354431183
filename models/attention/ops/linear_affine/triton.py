"""Triton kernels for linear_affine, forward and backward.

o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n) over the real keys (n <= i when causal), q^, k^
L2-normalised in registers, v centred on the first real key; kernels and notes in ops/triton_common.py.
"""

from __future__ import annotations

from torch import Tensor

from models.attention.ops import triton_common
from models.attention.ops.linear_affine.definition import OP


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None) -> Tensor:
    """q, k, v [B, H, N, D] (fp32, bf16, fp16; CUDA, or CPU under TRITON_INTERPRET=1) -> o [B, H, N, D] in q.dtype."""
    return triton_common.attend(q, k, v, causal=causal, key_mask=key_mask, op=OP)
