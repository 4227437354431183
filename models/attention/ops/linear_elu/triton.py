"""Triton kernels for linear_elu (Katharopoulos et al. 2020), forward and backward.

o_i = phi(q_i) S / phi(q_i).z with phi = elu + 1, S = sum_n phi(k_n) v_n^T, z = sum_n phi(k_n) over the
real keys (n <= i when causal), v centred on the first real key; kernels and notes in ops/triton_common.py.
"""

from __future__ import annotations

from torch import Tensor

from models.attention.ops import triton_common
from models.attention.ops.linear_elu.definition import OP


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None) -> Tensor:
    """q, k, v [B, H, N, D] (fp32, bf16, fp16; CUDA, or CPU under TRITON_INTERPRET=1) -> o [B, H, N, D] in q.dtype."""
    return triton_common.attend(q, k, v, causal=causal, key_mask=key_mask, op=OP)
