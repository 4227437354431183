"""linear_affine_nodenom's non-causal form on its fused C kernels (nodenom_cpu.c): fp32, CPU, D in 16/32/64/128;
the dispatcher's cpu path (dispatch.cpu_path) upcasts to fp32, sends causal inputs to ../causal_cpu.c and empty ones
to PyTorch.

The dispatcher only sends what the kernel takes (ops/cpu_build.py: why_not); forward and backward are one
OpenMP region each, the passes of torch.py's NoDenom.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops import cpu_build
from models.attention.ops.common import fresh
from models.attention.ops.linear_affine_nodenom.torch import NoDenom

P, I64, I32 = cpu_build.P, cpu_build.I64, cpu_build.I32
cpu_build.declare(
    nodenom_forward=[P, P, P, P, I64, I64, I64, I64, P, P, P, P, I32, I32],
    nodenom_backward=[P, P, P, P, P, P, P, P, I64, I64, I64, I64, P, P, P, I32, I32],
)


def forward(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """o [G, N, D], then rq [G, N, 1], rk [G, M, 1] (zero for padded keys) and the state [G, D + 1, D] = [S; s].

    Every tensor must be contiguous (NoDenom makes them so and keeps them for the backward).
    """
    (G, N, D), M = q.shape, k.shape[1]
    out = fresh(q, G, N, D)
    rq, rk, state = q.new_empty(G, N, 1), k.new_empty(G, M, 1), q.new_empty(G, D + 1, D)
    pointers = [t.data_ptr() for t in (q, k, v)] + [cpu_build.pointer(keep)]
    results = [t.data_ptr() for t in (out, rq, rk, state)]
    status = cpu_build.library().nodenom_forward(
        *pointers, G, N, M, D, *results, torch.get_num_threads(), cpu_build.streams(out)
    )
    cpu_build.check(status, G, D)
    return out, rq, rk, state


def backward(grad, q, k, v, keep, rq, rk, state) -> tuple[Tensor, Tensor, Tensor]:
    """dL/dq, dL/dk, dL/dv [G, N or M, D] from dL/do = grad (contiguous) and forward()'s results."""
    (G, N, D), M = q.shape, k.shape[1]
    grads = [fresh(x, *x.shape) for x in (q, k, v)]
    inputs = [grad.data_ptr()] + [t.data_ptr() for t in (q, k, v)] + [cpu_build.pointer(keep)]
    inputs += [t.data_ptr() for t in (rq, rk, state)]
    status = cpu_build.library().nodenom_backward(
        *inputs, G, N, M, D, *(t.data_ptr() for t in grads), torch.get_num_threads(), cpu_build.streams(grads[0])
    )
    cpu_build.check(status, G, D)
    return tuple(grads)


def noncausal(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
    """o [G, N, D] from q, k, v [G, N, D] fp32 and keep [G, N, 1] or None, through the C kernels."""
    return NoDenom.apply(q, k, v, keep, (forward, backward))
