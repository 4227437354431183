"""linear_affine: o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), q^, k^ L2-normalised per head;
causal: n <= i.

The op is its Op (the flags the shared kernels read: ../causal.py, ../normalised.py, ../causal_cpu.c,
../triton_common.py), its naive reference and its own kernel: cpu.py + affine_cpu.c, the fused non-causal form in C.
Tests: tests/models/, parametrised over dispatch.linear_ops().
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from models.attention.ops import dispatch
from models.attention.ops.linear_affine import cpu
from models.attention.ops.op import Op
from models.attention.reference import allowed, kernel_attention, upcast

OP = Op("linear_affine", unit=True, normalised=True)


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """The naive O(N^2) definition: o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n)."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = 1 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
    return kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=True).to(dtype)


TABLE = dispatch.implementations(OP, reference, cpu_noncausal=cpu.AffineKernel.apply)
attend = dispatch.op_function(
    TABLE,
    """o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), [B, H, N, D] x3 -> [B, H, N, D].

1 + cos >= 0, so o_i is a convex combination of the v_n. Non-causal it is two small matmuls:
numerator sum_n v_n + q^_i (K^T V), denominator N + q^_i . sum_n k^_n. `impl` picks the implementation
(ops/dispatch.py); `chunk_size` only changes how the causal form computes.
""",
)
