"""linear_affine_nodenom (Gerami, Madani, Duraiswami 2026, Eq. 7): o_i = sum_n (1 + q^_i.k^_n) / 2 v_n, q^, k^
L2-normalised per head, no denominator; causal: n <= i.

Reference: reference.py in this folder. Tests: tests/models/test_attention.py (every variant
against its reference, forward and gradients), test_linear_attention.py (the PyTorch forms), test_cpu_kernel.py,
test_triton.py, test_attention_dispatch.py (each parametrised over the ops).
"""

from models.attention.ops.op import Op

OP = Op("linear_affine_nodenom", unit=True, normalised=False, cpu_noncausal=True)
