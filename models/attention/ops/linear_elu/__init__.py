"""linear_elu (Katharopoulos et al. 2020): o_i = phi(q_i) S / phi(q_i).z, phi = elu + 1.

Everything of the op is in this folder: definition.py (its Op description: the features, whether it normalises; the
pointer to its tests), reference.py (the naive O(N^2) definition), torch.py (PyTorch, any device and dtype), cpu.py
(the causal form's C kernel, ../causal_cpu.c; causal only), triton.py (Triton kernels). TABLE below is the one table
of its implementations; the dispatcher (../dispatch.py) reads only it.
"""

from __future__ import annotations

from models.attention.ops import dispatch
from models.attention.ops.linear_elu import cpu, reference
from models.attention.ops.linear_elu import torch as torch_path
from models.attention.ops.linear_elu.definition import OP

TABLE = dispatch.implementations(
    OP,
    reference=reference.reference,
    torch=torch_path.attend,
    cpu=cpu.attend,
    triton="models.attention.ops.linear_elu.triton",
)

attend = dispatch.op_function(
    TABLE,
    """Katharopoulos et al. 2020: o_i = phi(q_i) S / phi(q_i).z, S = sum_n phi(k_n) v_n^T, z = sum_n phi(k_n),
phi = elu + 1; [B, H, N, D] x3 -> [B, H, N, D]. `impl` picks the implementation (ops/dispatch.py);
`chunk_size` only changes how the causal form computes.""",
)
