"""linear_elu (Katharopoulos et al. 2020): o_i = phi(q_i) S / phi(q_i).z, S = sum_n phi(k_n) v_n^T,
z = sum_n phi(k_n), phi = elu + 1; causal: n <= i. Its C kernel is the causal form's only.

Reference: reference.py in this folder. Tests: tests/models/test_attention.py (every variant against
its reference, forward and gradients), test_linear_attention.py (the PyTorch forms), test_cpu_kernel.py,
test_triton.py, test_attention_dispatch.py (each parametrised over the ops).
"""

from models.attention.ops.op import Op

OP = Op("linear_elu", unit=False, normalised=True, cpu_noncausal=False)
