"""Triton kernels for linear_affine_nodenom (Gerami, Madani, Duraiswami 2026, Eq. 7), forward and backward.

o_i = sum_n (1 + q^_i.k^_n) / 2 v_n over the real keys (n <= i when causal), q^, k^ L2-normalised in
registers, no denominator; the kernels and their notes are in models/attention/ops/triton_common.py.
"""

from __future__ import annotations

from torch import Tensor

from models.attention.ops import triton_common
from models.attention.ops.linear_affine_nodenom.definition import OP


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None) -> Tensor:
    """q, k, v [B, H, N, D] (fp32, bf16, fp16; CUDA, or CPU under TRITON_INTERPRET=1) -> o [B, H, N, D] in q.dtype."""
    return triton_common.attend(q, k, v, causal=causal, key_mask=key_mask, op=OP)
