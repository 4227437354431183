"""linear_affine's non-causal form on its fused C kernels (affine_cpu.c): fp32, CPU, D in 16/32/64/128; the
dispatcher's cpu path (dispatch.cpu_path) upcasts to fp32, sends causal inputs to ../causal_cpu.c and empty ones to
PyTorch.

The same math as ops/normalised.py (o = c + q^ S / den, v centred on the mean real value), forward and
backward one OpenMP region each.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops import cpu_build
from models.attention.ops.common import fresh

P, I64, I32 = cpu_build.P, cpu_build.I64, cpu_build.I32
cpu_build.declare(
    affine_forward=[P, P, P, P, P, I64, I64, I64, I64, P, P, P, P, P, I32],
    affine_backward=[P, P, P, P, P, P, P, P, P, P, I64, I64, I64, I64, P, P, P, I32],
)


def pointers(*tensors: Tensor | None) -> list[int | None]:
    return [cpu_build.pointer(t) for t in tensors]


class AffineKernel(torch.autograd.Function):
    """forward(q, k, v [G, N, D] fp32, keep [G, N, 1] or None) -> o [G, N, D] through affine_cpu.c.

    Saved: q, k, v, keep, the real-key count per head [G], rq [G, N, 1], rk [G, M, 1], den [G, N, 1] and the state
    [G, D + 2, D] = [S; c; z].
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
        q, k, v = (t.contiguous() for t in (q, k, v))
        keep = None if keep is None else keep.contiguous()
        (G, N, D), M = q.shape, k.shape[1]
        count = q.new_full((G,), M) if keep is None else keep.sum((1, 2))  # real keys per head
        out, rq, den, rk = fresh(q, G, N, D), q.new_empty(G, N, 1), q.new_empty(G, N, 1), k.new_empty(G, M, 1)
        state = q.new_empty(G, D + 2, D)
        status = cpu_build.library().affine_forward(
            *pointers(q, k, v, keep, count), G, N, M, D, *pointers(out, rq, rk, den, state), torch.get_num_threads()
        )
        cpu_build.check(status, G, D)
        ctx.save_for_backward(q, k, v, keep, count, rq, rk, den, state)  # the C backward's order
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad, saved = grad.contiguous(), ctx.saved_tensors  # a name keeps the contiguous grad alive through the call
        (G, N, D), M = saved[0].shape, saved[1].shape[1]
        grads = [fresh(x, *x.shape) for x in saved[:3]]
        status = cpu_build.library().affine_backward(
            *pointers(grad, *saved), G, N, M, D, *pointers(*grads), torch.get_num_threads()
        )
        cpu_build.check(status, G, D)
        return *grads, None
