"""linear_elu (Katharopoulos et al. 2020): o_i = phi(q_i) S / phi(q_i).z, phi = elu + 1.

Its implementations side by side: torch.py (PyTorch, ops/normalised.py and ops/causal.py), cpu.py (the causal
form's C kernel, ../causal_cpu.c; causal only), triton.py (Triton kernels, where present); reference.linear_elu
defines it.
"""

from __future__ import annotations

from models.attention.ops import dispatch
from models.attention.ops.linear_elu import cpu
from models.attention.ops.linear_elu import torch as torch_path

OP = "linear_elu"
IMPLS = {"torch": torch_path.attend, "cpu": cpu.attend}


attend = dispatch.op_function(
    OP,
    IMPLS,
    """Katharopoulos et al. 2020: o_i = phi(q_i) S / phi(q_i).z, S = sum_n phi(k_n) v_n^T, z = sum_n phi(k_n),
phi = elu + 1; [B, H, N, D] x3 -> [B, H, N, D]. `impl` picks the implementation (ops/dispatch.py);
`chunk_size` only changes how the causal form computes.""",
)
