"""linear_affine_nodenom's non-causal form in PyTorch ops (Eq. 7 of Gerami et al. 2026), block by block, forward and
backward; its causal form is the shared ops/causal.py.

Every pass over the [G, N, D] tensors walks blocks of about `rows` rows (whole heads when N is short,
row ranges of one head when it is long). Inside a block the row scales 1/|x|, the upcast to the compute
dtype, the skinny matmuls and the corrections run on data still in the core's cache (or, on a GPU, in a
block-sized temporary), and results are written straight into the preallocated output and gradients.
Untiled, each elementwise step (a row scaling, an add, a sum) was its own pass over 100 MB tensors at
N = 65536; tiled (on one thread, see block_rows), the only passes over memory are the reads of q, k, v, g
and the writes of o and the three gradients. Row scales go to the left operand of a gram, with a column of
ones (keep for keys) appended so the same matmul also gives sum_n v_n or sum_n g_n. Saved for the
backward: q, k, v in their own dtype, 1/|q|, 1/|k| [G, N, 1] and the [D + 1, D] state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops.common import compute_dtype, fresh, inv_norm, remove_radial

ROWS = 2048
GPU_ROWS = 1 << 20  # a GPU block's fp32 temporaries stay near 256 MB at D = 64; fewer blocks, fewer launches


def block_rows(x: Tensor) -> int:
    """Rows per block for x [G, N, D]: ROWS on one CPU thread (a block of each operand fits in a 2 MB L2).

    On several threads every op is a parallel region that waits for all of them; on a shared,
    oversubscribed machine each wait can cost a scheduler time slice, so there each pass is one block
    (measured at 2 threads, load ~3.5 on 2 cores, N = 16384: 2048-row blocks 1.9 s, one block 0.31 s).
    """
    if x.device.type != "cpu":
        return GPU_ROWS
    return ROWS if torch.get_num_threads() == 1 else x.shape[0] * x.shape[1]


def tiles(x: Tensor, rows: int, N: int) -> list[Tensor]:
    """Views [g, t, ...] of x [G, N, ...] in blocks of about `rows` rows: one head's row range, or whole heads when
    N < rows."""
    T = min(N, rows)
    return [part for group in x.split(max(1, rows // T)) for part in group.split(T, 1)]


def per_tile(x: Tensor, rows: int, N: int) -> list[Tensor]:
    """The head group of x [G, ...] (a per-head state) that matches each block of tiles(., rows, N)."""
    T = min(N, rows)
    return [group for group in x.split(max(1, rows // T)) for _ in range(-(-N // T))]


def scale_buffer(x: Tensor, rows: int) -> Tensor:
    """A reusable [g, T, D + 1] block in the compute dtype whose last column is 1: r x goes to [..., :D], the ones
    give plain sums."""
    G, N, D = x.shape
    T = min(N, rows)
    buf = x.new_empty(min(G, max(1, rows // T)), T, D + 1, dtype=compute_dtype(x))
    buf[..., D] = 1
    return buf


def fill_scaled(buf: Tensor, x: Tensor, r: Tensor, ones: Tensor | None = None) -> Tensor:
    """[r x | ones] of one block into buf: x [g, t, D], r [g, t, 1] -> a [g, t, D + 1] view of buf."""
    g, t, D = x.shape
    view = buf[:g, :t]
    torch.mul(x, r, out=view[..., :D])
    if ones is not None:
        view[..., D:].copy_(ones)
    return view


def block_inv_norm(x: Tensor, out: Tensor) -> Tensor:
    """1 / max(|x|, 1e-12) of one block [g, t, D] into out [g, t, 1] (the floor of F.normalize), in out's dtype."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=out.dtype, out=out).clamp_min_(1e-12).reciprocal_()


def target(block: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The block itself as an out= target when it has the compute dtype, else None (the result is copied in)."""
    return block if block.dtype == dtype else None


def store(block: Tensor, value: Tensor) -> None:
    """Writes a result computed in the compute dtype into its block of a low-precision output (no-op if in place)."""
    if value.data_ptr() != block.data_ptr():
        block.copy_(value)


def forward(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, rows: int | None = None) -> tuple[Tensor, ...]:
    """o = rq (q S) + s with S = sum_n rk_n k_n v_n^T / 2 and s = sum_n keep_n v_n / 2, [G, N, D] x3 -> o (q's dtype).

    Also returns what the backward needs: rq, rk [G, N, 1] (rk zero for padded keys) and [S; s] [G, D + 1, D],
    in the compute dtype.
    """
    (G, N, D), M, dtype = q.shape, k.shape[1], compute_dtype(q)
    rows = rows or block_rows(k if M > N else q)
    rq, rk, buf = q.new_empty(G, N, 1, dtype=dtype), k.new_empty(G, M, 1, dtype=dtype), scale_buffer(k, rows)
    state = q.new_zeros(G, D + 1, D, dtype=dtype)  # [S; s] before the halving
    keeps = [None] * len(tiles(rk, rows, M)) if keep is None else tiles(keep, rows, M)
    for k_b, v_b, r_b, keep_b, state_b in zip(
        *(tiles(x, rows, M) for x in (k, v, rk)), keeps, per_tile(state, rows, M)
    ):
        r = block_inv_norm(k_b, r_b)
        if keep_b is not None:
            r.mul_(keep_b)
        state_b.baddbmm_(fill_scaled(buf, k_b, r, keep_b).transpose(1, 2), v_b.to(dtype))
    state.mul_(0.5)
    S, s = state[:, :D], state[:, D:]
    out, buf = fresh(q, G, N, D), scale_buffer(q, rows)
    for q_b, r_b, o_b, S_b, s_b in zip(
        *(tiles(x, rows, N) for x in (q, rq, out)), per_tile(S, rows, N), per_tile(s, rows, N)
    ):
        q_hat = fill_scaled(buf, q_b, block_inv_norm(q_b, r_b))[..., :D]
        store(o_b, torch.baddbmm(s_b, q_hat, S_b, out=target(o_b, dtype)))
    return out, rq, rk, state


def backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    rq: Tensor,
    rk: Tensor,
    state: Tensor,
    rows: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dL/dq, dL/dk, dL/dv [G, N, D] (the inputs' dtypes) of forward() from dL/do = grad [G, N, D] (contiguous).

    With H = sum_n q^_n g_n^T / 2 (half of dL/dS) and h = sum_n g_n / 2:
    dL/dq^ = g S^T, dL/dk^ = v H^T, dL/dv = k^ H + keep h, each taken through x^ = x / |x|.
    """
    (G, N, D), M, dtype = q.shape, k.shape[1], state.dtype
    rows = rows or block_rows(k if M > N else q)
    grad_q, half, buf = fresh(q, *q.shape), state.new_zeros(G, D + 1, D), scale_buffer(q, rows)
    St = state[:, :D].transpose(1, 2)
    for q_b, g_b, r_b, gq_b, half_b, St_b in zip(
        *(tiles(x, rows, N) for x in (q, grad, rq, grad_q)), per_tile(half, rows, N), per_tile(St, rows, N)
    ):
        q_hat, g_b = fill_scaled(buf, q_b, r_b), g_b.to(dtype)
        half_b.baddbmm_(q_hat.transpose(1, 2), g_b)
        store(gq_b, remove_radial(torch.bmm(g_b, St_b, out=target(gq_b, dtype)), q_hat[..., :D], r_b))
    half.mul_(0.5)
    H, h = half[:, :D], half[:, D:]
    grad_k, grad_v, buf = fresh(k, *k.shape), fresh(v, *v.shape), scale_buffer(k, rows)
    keeps = [None] * len(tiles(rk, rows, M)) if keep is None else tiles(keep, rows, M)
    blocks = zip(
        *(tiles(x, rows, M) for x in (k, v, rk, grad_k, grad_v)), keeps, per_tile(H, rows, M), per_tile(h, rows, M)
    )
    for k_b, v_b, r_b, gk_b, gv_b, keep_b, H_b, h_b in blocks:
        k_hat = fill_scaled(buf, k_b, r_b)[..., :D]
        store(gv_b, torch.baddbmm(h_b if keep_b is None else keep_b * h_b, k_hat, H_b, out=target(gv_b, dtype)))
        grad_hat = torch.bmm(v_b.to(dtype), H_b.transpose(1, 2), out=target(gk_b, dtype))
        store(gk_b, remove_radial(grad_hat, k_hat, r_b))
    return grad_q, grad_k, grad_v


def plain_forward(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> tuple[Tensor, ...]:
    """forward() in whole-tensor ops with no out= and no blocks: what torch.compile traces and fuses."""
    D, dtype = q.shape[-1], compute_dtype(q)
    rq, rk = inv_norm(q, dtype), inv_norm(k, dtype)
    rk = rk if keep is None else rk * keep
    ones = torch.ones_like(rk) if keep is None else keep
    state = torch.cat([k.to(dtype) * rk, ones], -1).transpose(1, 2) @ v.to(dtype) * 0.5  # [S; s]
    return torch.baddbmm(state[:, D:], q.to(dtype) * rq, state[:, :D]).to(q.dtype), rq, rk, state


def plain_backward(grad, q, k, v, keep, rq, rk, state) -> tuple[Tensor, Tensor, Tensor]:
    """backward() in whole-tensor ops with no out= and no blocks: what torch.compile traces and fuses."""
    D, dtype = q.shape[-1], state.dtype
    grad, q_hat, k_hat = grad.to(dtype), q.to(dtype) * rq, k.to(dtype) * rk
    half = torch.cat([q_hat, torch.ones_like(rq)], -1).transpose(1, 2) @ grad * 0.5  # [H; h]
    grad_q = remove_radial(grad @ state[:, :D].transpose(1, 2), q_hat, rq)
    grad_v = torch.baddbmm(half[:, D:] if keep is None else keep * half[:, D:], k_hat, half[:, :D])
    grad_k = remove_radial(v.to(dtype) @ half[:, :D].transpose(1, 2), k_hat, rk)
    return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype)


class NoDenom(torch.autograd.Function):
    """Non-causal Eq. 7 of Gerami et al. 2026 with a hand-written backward, on [G, N, D] tensors.

    o = rq (q S) + s with S = k^^T v / 2 (k^ zero for padding), s = sum_n v_n / 2 and rq = 1/|q|:
    the "1 +" and the 1/2 live in the small state, q^ and k^ are never stored, so forward + backward
    allocate no [N, D] tensor beyond o and the three gradients. `passes` = (forward, backward) on
    contiguous tensors: this file's blocks, or the fused C kernel's (cpu.py).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, passes) -> Tensor:
        q, k, v = (t.contiguous() for t in (q, k, v))
        keep = None if keep is None else keep.contiguous()
        out, *saved = passes[0](q, k, v, keep)
        ctx.backward_pass = passes[1]
        ctx.save_for_backward(q, k, v, keep, *saved)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        # e.g. the zero-stride gradient of a .sum() would send bmm down a slow path
        return *ctx.backward_pass(grad.contiguous(), *ctx.saved_tensors), None, None


def noncausal(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
    """o [G, N, D] in q's dtype from q, k, v [G, N, D] and keep [G, N, 1] (compute dtype) or None: NoDenom's blocks,
    or under torch.compile its whole-tensor passes (the compiler cannot trace the blocks' out= views)."""
    compiling = torch.compiler.is_compiling()
    return NoDenom.apply(q, k, v, keep, (plain_forward, plain_backward) if compiling else (forward, backward))
