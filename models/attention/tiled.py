"""Non-causal Eq. 7 of Gerami et al. 2026 (linear_affine_nodenom) computed block by block, forward and backward.

Every pass over the [G, N, D] tensors walks blocks of about `rows` rows (whole heads when N is short,
row ranges of one head when it is long). Inside a block the row scales 1/|x|, the skinny matmuls and
the corrections run on data still in the core's cache, and results are written straight into the
preallocated output and gradients. Untiled, each elementwise step (a row scaling, an add, a sum) was
its own pass over 100 MB tensors at N = 65536; tiled (on one thread, see block_rows), the only passes over
memory are the reads of q, k, v, g and the writes of o and the three gradients. Row scales go to the left
operand of a gram, with a column of ones (keep for keys) appended so the same matmul also gives sum_n v_n
or sum_n g_n.
"""

from __future__ import annotations

import ctypes
import sys

import torch
from torch import Tensor

ROWS = 2048
MADV_HUGEPAGE, PAGE, HUGE_MIN_BYTES = 14, 4096, 32 << 20
LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None


def fresh(like: Tensor, *shape: int) -> Tensor:
    """torch.empty that asks Linux for 2 MB pages (madvise, a hint) on large CPU tensors.

    Output and gradients are new every step; first touching 4 KB pages of a 100 MB tensor cost about
    22 ms (page faults, measured) against about 5 ms with 2 MB pages, as much as the writes themselves.
    This is what torch's THP_MEM_ALLOC_ENABLE=1 does for every allocation. Only from 32 MB, where glibc
    always gives a tensor its own mapping: hinting parts of the shared heap (N = 16384) was seen to stall
    for seconds.
    """
    x = like.new_empty(shape)
    nbytes = x.numel() * x.element_size()
    if LIBC is not None and x.device.type == "cpu" and nbytes >= HUGE_MIN_BYTES:
        start = -(-x.data_ptr() // PAGE) * PAGE
        end = (x.data_ptr() + nbytes) // PAGE * PAGE
        LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_int(MADV_HUGEPAGE))
    return x


def block_rows(x: Tensor) -> int:
    """Rows per block for x [G, N, D]: ROWS on one thread (a block of each operand fits in a 2 MB L2).

    On several threads every op is a parallel region that waits for all of them; on a shared,
    oversubscribed machine each wait can cost a scheduler time slice, so there each pass is one block
    (measured at 2 threads, load ~3.5 on 2 cores, N = 16384: 2048-row blocks 1.9 s, one block 0.31 s).
    """
    cpu_one_thread = x.device.type == "cpu" and torch.get_num_threads() == 1
    return ROWS if cpu_one_thread else x.shape[0] * x.shape[1]  # a GPU gets whole passes: its caches differ


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
    """A reusable [g, T, D + 1] block whose last column is 1: r x goes to [..., :D], the ones give plain sums."""
    G, N, D = x.shape
    T = min(N, rows)
    buf = x.new_empty(min(G, max(1, rows // T)), T, D + 1)
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
    """1 / max(|x|, 1e-12) of one block [g, t, D] into out [g, t, 1] (the floor of F.normalize)."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True, out=out).clamp_min_(1e-12).reciprocal_()


def remove_radial(grad_hat: Tensor, x_hat: Tensor, r: Tensor) -> Tensor:
    """dL/dx = r (g - (x^.g) x^) from g = dL/dx^ for x^ = r x, r = 1/|x|, in place on grad_hat [g, t, D]."""
    radial = (x_hat * grad_hat).sum(-1, keepdim=True)
    return grad_hat.addcmul_(x_hat, radial, value=-1).mul_(r)


def forward(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, rows: int | None = None) -> tuple[Tensor, ...]:
    """o = rq (q S) + s with S = sum_n rk_n k_n v_n^T / 2 and s = sum_n keep_n v_n / 2, [G, N, D] x3 -> o.

    Also returns what the backward needs: rq, rk [G, N, 1] (rk zero for padded keys) and [S; s] [G, D + 1, D].
    """
    (G, N, D), M = q.shape, k.shape[1]
    rows = rows or block_rows(k if M > N else q)
    rq, rk, buf = q.new_empty(G, N, 1), k.new_empty(G, M, 1), scale_buffer(k, rows)
    state = q.new_zeros(G, D + 1, D)  # [S; s] before the halving
    keeps = [None] * len(tiles(rk, rows, M)) if keep is None else tiles(keep, rows, M)
    for k_b, v_b, r_b, keep_b, state_b in zip(
        *(tiles(x, rows, M) for x in (k, v, rk)), keeps, per_tile(state, rows, M)
    ):
        r = block_inv_norm(k_b, r_b)
        if keep_b is not None:
            r.mul_(keep_b)
        state_b.baddbmm_(fill_scaled(buf, k_b, r, keep_b).transpose(1, 2), v_b)
    state.mul_(0.5)
    S, s = state[:, :D], state[:, D:]
    out, buf = fresh(q, G, N, D), scale_buffer(q, rows)
    for q_b, r_b, o_b, S_b, s_b in zip(
        *(tiles(x, rows, N) for x in (q, rq, out)), per_tile(S, rows, N), per_tile(s, rows, N)
    ):
        q_hat = fill_scaled(buf, q_b, block_inv_norm(q_b, r_b))[..., :D]
        torch.baddbmm(s_b, q_hat, S_b, out=o_b)
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
    """dL/dq, dL/dk, dL/dv [G, N, D] of forward() from dL/do = grad [G, N, D] (contiguous).

    With H = sum_n q^_n g_n^T / 2 (half of dL/dS) and h = sum_n g_n / 2:
    dL/dq^ = g S^T, dL/dk^ = v H^T, dL/dv = k^ H + keep h, each taken through x^ = x / |x|.
    """
    (G, N, D), M = q.shape, k.shape[1]
    rows = rows or block_rows(k if M > N else q)
    grad_q, half, buf = fresh(q, *q.shape), q.new_zeros(G, D + 1, D), scale_buffer(q, rows)
    St = state[:, :D].transpose(1, 2)
    for q_b, g_b, r_b, gq_b, half_b, St_b in zip(
        *(tiles(x, rows, N) for x in (q, grad, rq, grad_q)), per_tile(half, rows, N), per_tile(St, rows, N)
    ):
        q_hat = fill_scaled(buf, q_b, r_b)
        half_b.baddbmm_(q_hat.transpose(1, 2), g_b)
        remove_radial(torch.bmm(g_b, St_b, out=gq_b), q_hat[..., :D], r_b)
    half.mul_(0.5)
    H, h = half[:, :D], half[:, D:]
    grad_k, grad_v, buf = fresh(k, *k.shape), fresh(v, *v.shape), scale_buffer(k, rows)
    keeps = [None] * len(tiles(rk, rows, M)) if keep is None else tiles(keep, rows, M)
    blocks = zip(
        *(tiles(x, rows, M) for x in (k, v, rk, grad_k, grad_v)), keeps, per_tile(H, rows, M), per_tile(h, rows, M)
    )
    for k_b, v_b, r_b, gk_b, gv_b, keep_b, H_b, h_b in blocks:
        k_hat = fill_scaled(buf, k_b, r_b)[..., :D]
        torch.baddbmm(h_b if keep_b is None else keep_b * h_b, k_hat, H_b, out=gv_b)
        remove_radial(torch.bmm(v_b, H_b.transpose(1, 2), out=gk_b), k_hat, r_b)
    return grad_q, grad_k, grad_v
