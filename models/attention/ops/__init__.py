"""The linear attention ops: one folder per op, shared kernels beside them that read each op's description.

    ops/<op>/__init__.py    the op: OP, its description (op.py: unit features or elu + 1, normalised or not), which
                            the shared kernels read; reference(q, k, v, *, causal, key_mask), the naive O(N^2)
                            definition every implementation is tested against; TABLE, the one table of its
                            implementations (dispatch.implementations); attend(q, k, v, *, causal, key_mask,
                            chunk_size, impl), which dispatches through it
    ops/<op>/*.py, *.c      the op's own kernels, where it has them (a non-causal form the shared ones do not
                            cover: linear_affine's C kernel, linear_affine_nodenom's PyTorch blocks and C kernel)

Shared kernels take the op's Op, never its name: common.py (flattening, masks, row norms), chunked.py (the causal
O(N) product), causal.py (the causal forms with their backward), normalised.py (the non-causal normalised ops),
causal_cpu.py + .c (the causal forms' C kernel), triton_common.py (the Triton kernels, causal and not),
cpu_build.py + linear_cpu.h (compiling the C kernels). Adding an op: copy a folder, give it its Op and reference,
and register its layer in models/attention/linear.py; importing this package imports every op folder, so its table
is in dispatch.TABLES and in every list made from dispatch.linear_ops().
"""

import importlib
import pkgutil

for _folder in pkgutil.iter_modules(__path__):
    if _folder.ispkg:
        importlib.import_module(f"{__name__}.{_folder.name}")
