"""linear_affine_nodenom (Gerami, Madani, Duraiswami 2026, Eq. 7): o_i = sum_n (1 + q^_i.k^_n) / 2 v_n.

Everything of the op is in this folder: definition.py (its Op description: the features, whether it normalises; the
pointer to its tests), reference.py (the naive O(N^2) definition), torch.py (PyTorch, any device and dtype), cpu.py
+ nodenom_cpu.c (fused C kernel, non-causal fp32; the causal form in ../causal_cpu.c), triton.py (Triton kernels).
TABLE below is the one table of its implementations; the dispatcher (../dispatch.py) reads only it.
"""

from __future__ import annotations

from models.attention.ops import dispatch
from models.attention.ops.linear_affine_nodenom import cpu, reference
from models.attention.ops.linear_affine_nodenom import torch as torch_path
from models.attention.ops.linear_affine_nodenom.definition import OP

TABLE = dispatch.implementations(
    OP,
    reference=reference.reference,
    torch=torch_path.attend,
    cpu=cpu.attend,
    triton="models.attention.ops.linear_affine_nodenom.triton",
)

attend = dispatch.op_function(
    TABLE,
    """Gerami, Madani, Duraiswami 2026, Eq. 7: o_i = sum_n (1 + q^_i.k^_n) / 2 v_n, [B, H, N, D] x3 -> [B, H, N, D].

There is no denominator and no 1/N, so the output grows linearly with the number of keys
(about N/2 |v| for unrelated q, k); sums are accumulated in fp32 so bf16 inputs stay finite.
`impl` picks the implementation (ops/dispatch.py); `chunk_size` only changes how the causal form computes.
""",
)
