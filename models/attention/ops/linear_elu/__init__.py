"""linear_elu (Katharopoulos et al. 2020): o_i = phi(q_i) S / phi(q_i).z, S = sum_n phi(k_n) v_n^T,
z = sum_n phi(k_n), phi = elu + 1; causal: n <= i.

The op is its Op (the flags the shared kernels read: ../causal.py, ../normalised.py, ../causal_cpu.c,
../triton_common.py) and its naive reference; it has no kernel of its own (its C kernel is the shared causal one, so
impl=cpu is causal only). Tests: tests/models/, parametrised over dispatch.linear_ops().
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from models.attention.ops import dispatch
from models.attention.ops.op import Op
from models.attention.reference import allowed, kernel_attention, upcast

OP = Op("linear_elu", unit=False, normalised=True)


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """The naive O(N^2) definition: o_i = sum_n (phi(q_i).phi(k_n)) v_n / sum_n phi(q_i).phi(k_n), phi = elu + 1."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)
    return kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=True).to(dtype)


TABLE = dispatch.implementations(OP, reference)
attend = dispatch.op_function(
    TABLE,
    """Katharopoulos et al. 2020: o_i = phi(q_i) S / phi(q_i).z, S = sum_n phi(k_n) v_n^T, z = sum_n phi(k_n),
phi = elu + 1; [B, H, N, D] x3 -> [B, H, N, D]. `impl` picks the implementation (ops/dispatch.py);
`chunk_size` only changes how the causal form computes.""",
)
