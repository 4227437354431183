"""The fast paths of the linear attention ops, one folder per op with its implementations side by side.

    ops/<op>/__init__.py   attend(q, k, v, *, causal, key_mask, chunk_size, impl): dispatches (dispatch.py)
    ops/<op>/torch.py      PyTorch ops: any device and dtype, torch.compile
    ops/<op>/cpu.py        the fused C kernel (+ <name>_cpu.c), non-causal fp32 on the CPU
    ops/<op>/triton.py     Triton kernels, forward and backward

for <op> in linear_affine_nodenom, linear_affine (both with C kernels) and linear_elu (no C kernel). Shared:
common.py (flattening, masks, row norms), chunked.py (the causal O(N) product), causal.py (the causal forms
with their backward), normalised.py (non-causal linear_affine and linear_elu), cpu_build.py + linear_cpu.h
(compiling the C kernels). reference.py beside this folder defines every op; tests compare each path with it.
"""
