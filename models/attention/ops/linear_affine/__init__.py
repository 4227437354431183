"""linear_affine: o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), q^, k^ L2-normalised per head.

Everything of the op is in this folder: definition.py (its Op description: the features, whether it normalises; the
pointer to its tests), reference.py (the naive O(N^2) definition), torch.py (PyTorch, any device and dtype), cpu.py
+ affine_cpu.c (fused C kernel, non-causal fp32; the causal form in ../causal_cpu.c), triton.py (Triton kernels).
TABLE below is the one table of its implementations; the dispatcher (../dispatch.py) reads only it.
"""

from __future__ import annotations

from models.attention.ops import dispatch
from models.attention.ops.linear_affine import cpu, reference
from models.attention.ops.linear_affine import torch as torch_path
from models.attention.ops.linear_affine.definition import OP

TABLE = dispatch.implementations(
    OP,
    reference=reference.reference,
    torch=torch_path.attend,
    cpu=cpu.attend,
    triton="models.attention.ops.linear_affine.triton",
)

attend = dispatch.op_function(
    TABLE,
    """o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), [B, H, N, D] x3 -> [B, H, N, D].

1 + cos >= 0, so o_i is a convex combination of the v_n. Non-causal it is two small matmuls:
numerator sum_n v_n + q^_i (K^T V), denominator N + q^_i . sum_n k^_n. `impl` picks the implementation
(ops/dispatch.py); `chunk_size` only changes how the causal form computes.
""",
)
