"""The fast paths of the linear attention ops, one folder per op holding everything of it.

    ops/<op>/definition.py  OP: its description (op.py: unit features or elu + 1, normalised or not), the pointer
                            to its tests
    ops/<op>/reference.py   reference(q, k, v, *, causal, key_mask): the naive O(N^2) definition every
                            implementation is tested against (on ../reference.py's helpers)
    ops/<op>/__init__.py    TABLE, the one table of its implementations (dispatch.implementations: reference,
                            torch, cpu, triton imported lazily), and attend(q, k, v, *, causal, key_mask,
                            chunk_size, impl), which dispatches through it (dispatch.py)
    ops/<op>/torch.py       PyTorch ops: any device and dtype, torch.compile
    ops/<op>/cpu.py         the fused C kernels (+ <name>_cpu.c for the non-causal form, where it has one)
    ops/<op>/triton.py      Triton kernels, forward and backward

for <op> in linear_affine_nodenom, linear_affine and linear_elu. Shared kernels take the op's Op, never its name:
common.py (flattening, masks, row norms), chunked.py (the causal O(N) product), causal.py (the causal forms with
their backward), normalised.py (the non-causal normalised ops), causal_cpu.py + .c (the causal forms' C kernel),
triton_common.py (the Triton kernels), cpu_build.py + linear_cpu.h (compiling the C kernels). Adding an op: copy a
folder, give it its Op, and register its layer in models/attention/linear.py.
"""
