"""linear_affine_nodenom (Gerami, Madani, Duraiswami 2026, Eq. 7): o_i = sum_n (1 + q^_i.k^_n) / 2 v_n, q^, k^
L2-normalised per head, no denominator; causal: n <= i.

The op is its Op (the flags the shared kernels read: ../causal.py, ../causal_cpu.c, ../triton_common.py), its naive
reference and its own non-causal forms: torch.py (in PyTorch, block by block, with its backward) and cpu.py +
nodenom_cpu.c (the same passes in C). Tests: tests/models/, parametrised over dispatch.linear_ops().
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from models.attention.ops import dispatch
from models.attention.ops.linear_affine_nodenom import cpu
from models.attention.ops.linear_affine_nodenom import torch as torch_path
from models.attention.ops.op import Op
from models.attention.reference import allowed, kernel_attention, upcast

OP = Op("linear_affine_nodenom", unit=True, normalised=False)


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """The naive O(N^2) definition: o_i = sum_n (1 + q^_i.k^_n) / 2 v_n; no denominator, so o grows with N."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = (1 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)) / 2
    return kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=False).to(dtype)


TABLE = dispatch.implementations(OP, reference, torch_noncausal=torch_path.noncausal, cpu_noncausal=cpu.noncausal)
attend = dispatch.op_function(
    TABLE,
    """Gerami, Madani, Duraiswami 2026, Eq. 7: o_i = sum_n (1 + q^_i.k^_n) / 2 v_n, [B, H, N, D] x3 -> [B, H, N, D].

There is no denominator and no 1/N, so the output grows linearly with the number of keys
(about N/2 |v| for unrelated q, k); sums are accumulated in fp32 so bf16 inputs stay finite.
`impl` picks the implementation (ops/dispatch.py); `chunk_size` only changes how the causal form computes.
""",
)
