"""retention_2d's two-sided grid on the fused C kernel (manhattan_cpu.c): o_i = sum_j gamma_h^(|r_i - r_j| + |c_i -
c_j|) (q_i . k_j) v_j over an R x W patch grid, row-major; CPU, fp32 (bf16 and fp16 upcast), D in 16/32/64/128.

O(N D^2) work and O(W D^2) memory per head: the kernel sweeps the rows down and up with one D x D state per column
and reads them with two running sums over the columns (its header says how). The decayed matrix is symmetric, so the
backward is the same forward three times, with the roles of q, k, v and dL/do exchanged: dL/dq = op(dO, v, k),
dL/dk = op(v, dO, q), dL/dv = op(k, q, dO); nothing but q, k, v is saved.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops import cpu_build
from models.attention.ops.causal_cpu import heads, run
from models.attention.ops.common import fresh


def grid(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor, width: int) -> Tensor:
    """op(q, k, v) on [..., N, D] fp32 contiguous tensors (read as [G, N, D]), N = R * width; gamma [H] fp32, head g
    takes gamma[g % H]."""
    G, N, D = heads(q)
    out = fresh(q, *q.shape)
    run("manhattan_forward", q.shape, q, k, v, gamma, gamma.numel(), G, N // width, width, D, out)
    return out


class Grid(torch.autograd.Function):
    """forward(q, k, v [..., N, D] fp32 contiguous, gamma [H], width) -> the module docstring's o, q's shape."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, gamma: Tensor, width: int) -> Tensor:
        ctx.save_for_backward(q, k, v, gamma)
        ctx.width = width
        return grid(q, k, v, gamma, width)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, gamma = ctx.saved_tensors
        grad, w = grad.contiguous(), ctx.width
        dq = grid(grad, v, k, gamma, w) if ctx.needs_input_grad[0] else None
        dk = grid(v, grad, q, gamma, w) if ctx.needs_input_grad[1] else None
        dv = grid(k, q, grad, gamma, w) if ctx.needs_input_grad[2] else None
        return dq, dk, dv, None, None


SHORTEST = 9  # the kernel takes grids of more than SHORTEST * D tokens (see takes)
MAX_WIDTH = 1024  # manhattan_cpu.c's: gamma^-(width - 1) stays far inside fp32


def takes(q: Tensor, rows: int, width: int) -> bool:
    """Whether the kernel computes a grid of rows x width tokens for q [B, H, N, D]: CPU, fp32 or lower, its head
    sizes, a compiler, at most MAX_WIDTH columns, and more than SHORTEST * D tokens. The sweeps cost about 52 D^2
    multiply-adds per token forward + backward, the decayed matrix about 6 N D: on a 2-core AVX2 EPYC (H = 6, D = 64)
    the matrix took 3.5 ms at 77 tokens against the kernel's 7.7, the two equal at 577 (41 ms), the kernel 70 ms
    against 121 at 1,025."""
    long_enough = SHORTEST * q.shape[-1] < rows * width
    return q.numel() > 0 and long_enough and width <= MAX_WIDTH and not cpu_build.why_not(q)


def two_sided(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, width: int) -> Tensor:
    """[B, H, R * width, D] x3 (q already scaled) -> the grid's o in fp32; log_gamma [H]."""
    qf, kf, vf = (t.float().contiguous() for t in (q, k, v))
    return Grid.apply(qf, kf, vf, log_gamma.float().exp().contiguous(), width)
