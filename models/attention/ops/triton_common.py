"""Triton kernels of the three linear attentions, forward and backward, non-causal and causal.

One kernel family, two compile-time switches: UNIT features phi(x) = x / |x| with a = 1 in
sim = a + phi(q).phi(k) (linear_affine_nodenom, linear_affine), else phi = elu + 1 and a = 0 (linear_elu,
Katharopoulos et al. 2020); NORM divides by the sum of the similarities, else the weights are halved
(linear_affine_nodenom, Gerami et al. 2026, Eq. 7). Per head, phi(k_n) and v'_n = v_n - c zero for padded keys:

    o_i = c + num_i / den_i (NORM; 0 where den_i = 0)  or  num_i / 2,  with num_i = a s' + phi(q_i) S',
    den_i = a cnt + phi(q_i).z,  S' = sum_n phi(k_n) v'_n^T [D, D],  z = sum_n phi(k_n),  s' = sum_n v'_n,

sums over every real key (non-causal) or over n <= i (causal). Centring (normalised variants): the weights
sum to one, so any c gives the same o and dL/dc = 0 (c is a constant of the backward). c starts at the first
real key's v and follows the running mean of the real v (Chan et al. 1979: S'(c + d) = S'(c) - z d^T, s' = 0),
so the sums do not cancel: with v = 10 + 0.1 noise (N = 300, fp32) dL/dq of linear_elu is 8e-8 off, 2e-5
uncentred. Eq. 7 has no denominator and no centre (c = 0).

Kernels, each a 1-D grid of programs over (head, row range):
- non-causal forward: state_kernel sums partial states over row ranges, Plan.reduce adds them (deterministic,
  no atomics), query_kernel reads the head's state for every query.
- non-causal backward: query_kernel (GRAD) gives dq = phi'(S' gs_i - (gs_i.u_i) z) with gs = g / den,
  u = o - c, and partials A = sum_i phi(q_i) gs_i^T, w = sum_i dden_i phi(q_i) (dden_i = -gs_i.u_i),
  b = sum_i gs_i; key_kernel gives dk = phi'(A v'_n + w), dv = A^T phi(k_n) + a b.
- causal: one program per head walks chunks (key_kernel backwards), carrying the state and adding the exact
  masked chunk; the backward query sweep leaves 1/den, dden per row and the centre per chunk ([G, N] fp32).
Saved for the backward: q, k, v (in their dtype), the mask and, non-causal, the [D + 4, D] fp32 state.

Precision: fp32 inputs use exact FMA dots ("ieee"; TF32 would miss 1e-5), or six bf16 products per fp32 pair
("bf16x6", as exact) in the causal kernels at D = 128, where FMA dots spill 3-6 KB a thread; bf16/fp16 inputs
"bf16x3" (each fp32 operand as two bf16 parts on the tensor cores, about 16 mantissa bits): plain bf16 or TF32
operands lose 1e-2 in the normalised variants' sums. Sums and states are fp32.

Block sizes (fixed, no autotuning; the interpreter runs the same): 8 warps (16 for FMA dots at D = 128);
non-causal blocks of 64 rows (32 in the backward at D = 64 and everywhere at D = 128), causal chunks of 32
(D <= 32) or 16; 2 pipeline stages for 16-bit inputs, 1 for fp32. Chosen from compiles of every kernel for
sm_90 with triton 3.6 (ptxas, no GPU): the fp32 D x D state and the [rows, D] tiles take up to 255 registers;
spills are at most 64 bytes a thread at D <= 64, 0.2-0.7 KB in the D = 128 backward kernels (1.5 KB fp32
causal); shared memory at most 180 KB of 227. tests/models/test_triton_compile.py compiles every launch.
Head sizes pad to a power of two >= 16. Non-causal row ranges: about two programs per SM over all heads.

What the interpreter cannot check, guarded by construction: every load and store is masked to the N x D
block (numpy does not fault out of bounds); no atomics, so no races; offsets are int64 (n * stride_n at
N = 4e6 exceeds 2^31); a loop-carried name keeps its type (the compiler requires it; the compile test checks).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from models.attention.ops.op import Op

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # triton.jit decides this when the kernels are defined
# the interpreter computes every tl.dot exactly in numpy; mm() rounds as the GPU does for the bf16x3 products
EMULATE = tl.constexpr(INTERPRET)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128


@triton.jit
def load_rows(ptr, base, rows, cols, stride_n, N, D):
    """fp32 [R, BD] tile of rows `rows` of one head (`base` its int64 offset); zero outside N x D."""
    ok = (rows[:, None] < N) & (cols[None, :] < D)
    return tl.load(ptr + base + rows.to(tl.int64)[:, None] * stride_n + cols[None, :], mask=ok, other=0.0).to(
        tl.float32
    )


@triton.jit
def store_rows(ptr, base, rows, cols, stride_n, N, D, x):
    ok = (rows[:, None] < N) & (cols[None, :] < D)
    tl.store(ptr + base + rows.to(tl.int64)[:, None] * stride_n + cols[None, :], x.to(ptr.dtype.element_ty), mask=ok)


@triton.jit
def mm(a, b, acc, DOT: tl.constexpr):
    """a @ b (+ acc) of fp32 operands with fp32 accumulation at tl.dot's input precision DOT."""
    if EMULATE and DOT == "bf16x3":
        # a = hi + lo in bf16 each; lo hi + hi lo + hi hi, the GPU's bf16x3 up to summation order (numpy has no bf16)
        a_hi, b_hi = a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32)
        a_lo, b_lo = (a - a_hi).to(tl.bfloat16).to(tl.float32), (b - b_hi).to(tl.bfloat16).to(tl.float32)
        out = tl.dot(a_lo, b_hi, acc, input_precision="ieee")
        out = tl.dot(a_hi, b_lo, out, input_precision="ieee")
        out = tl.dot(a_hi, b_hi, out, input_precision="ieee")
    elif EMULATE:
        # the interpreter knows only tf32, tf32x3, ieee; bf16x6 is as exact as its fp32 matmul
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=DOT)
    return out


@triton.jit
def inv_norm(x):
    """1 / max(|x_r|, 1e-12) per row of x [R, BD], the floor of F.normalize."""
    return 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), 1e-12)


@triton.jit
def phi(x, cols, D, UNIT: tl.constexpr):
    """Features of x [R, BD]: x / |x| (UNIT) or elu(x) + 1, zero in the padded columns."""
    if UNIT:
        f = x * inv_norm(x)[:, None]
    else:
        f = tl.where(cols[None, :] < D, tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0))), 0.0)
    return f


@triton.jit
def phi_grad(x, grad, UNIT: tl.constexpr):
    """dL/dx from dL/dphi(x): r (g - (x^.g) x^) with r = 1/|x| (no radial part where |x| is floored), or elu'."""
    if UNIT:
        r = inv_norm(x)
        x_hat = x * r[:, None]
        radial = tl.where(r < 1e12, tl.sum(x_hat * grad, axis=1), 0.0)
        dx = (grad - radial[:, None] * x_hat) * r[:, None]
    else:
        dx = grad * tl.where(x > 0, 1.0, tl.exp(tl.minimum(x, 0.0)))
    return dx


@triton.jit
def key_rows(k_ptr, v_ptr, mask_ptr, base, mask_base, rows, cols, c, cnt, stride_n, N, D, UNIT, NORM, HAS_MASK):
    """k [R, BD], phi(k) and v' = v - c (both zero for padded keys), keep [R] (1.0 for a real key), and c.

    While no real key is absorbed (cnt = 0), the normalised variants take c = v of the first real key here:
    any c is exact, one near the values keeps the sums from cancelling, and no later key moves it (causal).
    """
    keep = rows < N
    if HAS_MASK:
        keep = keep & (tl.load(mask_ptr + mask_base + rows, mask=rows < N, other=0) != 0)
    keep = keep.to(tl.float32)
    k = load_rows(k_ptr, base, rows, cols, stride_n, N, D)
    v = load_rows(v_ptr, base, rows, cols, stride_n, N, D)
    if NORM:
        first = tl.min(tl.where(keep > 0, rows, N), axis=0)
        c = tl.where(cnt > 0, c, tl.sum(tl.where((rows == first)[:, None], v, 0.0), axis=0))
    return k, phi(k, cols, D, UNIT) * keep[:, None], (v - c[None, :]) * keep[:, None], keep, c


@triton.jit
def zero_state(BD: tl.constexpr):
    """S [BD, BD], z, s, c [BD] and cnt, all zero."""
    z = tl.zeros([BD], dtype=tl.float32)
    return tl.zeros([BD, BD], dtype=tl.float32), z, z, z, tl.sum(z, axis=0)


@triton.jit
def absorb(S, z, s, c, cnt, fk, vv, keep, NORM: tl.constexpr, PREC: tl.constexpr):
    """Adds keys (phi(k), v' = v - c, keep) to the state. Normalised: c moves to the running mean of the real v
    (Chan et al. 1979), S' = sum phi(k) (v - c)^T with it (S'(c + d) = S'(c) - z d^T), and s' stays 0."""
    S = mm(tl.trans(fk), vv, S, PREC)
    z += tl.sum(fk, axis=0)
    cnt += tl.sum(keep, axis=0)
    if NORM:
        c_next = c + tl.sum(vv, axis=0) / tl.maximum(cnt, 1.0)
        # the step as stored, not as computed: with v = 10 + noise, c + step rounds by 1e-6 (Sterbenz: exact)
        S -= z[:, None] * (c_next - c)[None, :]
        c = c_next
    else:
        s += tl.sum(vv, axis=0)
    return S, z, s, c, cnt


@triton.jit
def chunk_scores(fq, fk, keep, rows, UNIT: tl.constexpr, PREC: tl.constexpr):
    """sim(i, n) = a keep_n + phi(q_i).phi(k_n) for keys n <= i of the same chunk, else 0: [C, C] fp32."""
    sim = mm(fq, tl.trans(fk), None, PREC)
    if UNIT:
        sim += keep[None, :]
    return tl.where(rows[:, None] >= rows[None, :], sim, 0.0)


@triton.jit
def divide(num, den, NORM: tl.constexpr):
    """1 / den_i (0 where den_i = 0; 1/2 for Eq. 7) and u_i = o_i - c = num_i / den_i."""
    if NORM:
        inv = tl.where(den > 0, 1.0 / tl.where(den > 0, den, 1.0), 0.0)
    else:
        inv = den * 0.0 + 0.5
    return inv, num * inv[:, None]


@triton.jit
def load_state(ptr, slot, cols, BD: tl.constexpr):
    """[S; z; s; c; cnt] of one head, stored as [BD + 4, BD] fp32 at `slot` (int64)."""
    base = ptr + slot * (BD + 4) * BD
    S = tl.load(base + tl.arange(0, BD)[:, None] * BD + cols[None, :])
    z, s, c = tl.load(base + BD * BD + cols), tl.load(base + (BD + 1) * BD + cols), tl.load(base + (BD + 2) * BD + cols)
    return S, z, s, c, tl.load(base + (BD + 3) * BD)


@triton.jit
def start_state(ptr, slot, cols, BD: tl.constexpr, CAUSAL: tl.constexpr):
    """The state a program starts from: zero when causal (the program runs it over the chunks), else load_state."""
    if CAUSAL:
        return zero_state(BD)
    else:
        return load_state(ptr, slot, cols, BD)


@triton.jit
def store_state(ptr, slot, cols, S, z, s, c, cnt, BD: tl.constexpr):
    base = ptr + slot * (BD + 4) * BD
    tl.store(base + tl.arange(0, BD)[:, None] * BD + cols[None, :], S)
    tl.store(base + BD * BD + cols, z)
    tl.store(base + (BD + 1) * BD + cols, s)
    tl.store(base + (BD + 2) * BD + cols, c)
    tl.store(base + (BD + 3) * BD + cols, cnt + z * 0.0)


@triton.jit
def program_rows(H, N, P, rows_per_prog, sb, sh, gb, gh, ob, oh):
    """This program's head (b * H + h); int64 offsets of its head in q, k, v, in dL/do, in the outputs and in the
    mask; its first row and row count."""
    pid = tl.program_id(0)
    head, part = pid // P, pid % P
    b, h = (head // H).to(tl.int64), (head % H).to(tl.int64)
    start = part * rows_per_prog
    return head, b * sb + h * sh, b * gb + h * gh, b * ob + h * oh, b * N, start, tl.minimum(rows_per_prog, N - start)


@triton.jit
def state_kernel(
    k_ptr, v_ptr, mask_ptr, part_ptr, H, N, D, sb, sh, sn, rows_per_prog, P,
    UNIT: tl.constexpr, NORM: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Non-causal forward, pass 1: partial [S'; z; s'; c; cnt] over this program's keys into part_ptr[pid]."""
    # not "_": the loop below assigns "_" a tile, and the compiler keeps one type per loop-carried name
    _head, base, _g_base, _out_base, mask_base, start, count = program_rows(H, N, P, rows_per_prog, sb, sh, 0, 0, 0, 0)
    cols = tl.arange(0, BD)
    S, z, s, c, cnt = zero_state(BD)
    for off in range(0, count, BLOCK):
        rows = start + off + tl.arange(0, BLOCK)
        _, fk, vv, keep, c = key_rows(
            k_ptr, v_ptr, mask_ptr, base, mask_base, rows, cols, c, cnt, sn, N, D, UNIT, NORM, HAS_MASK
        )
        S, z, s, c, cnt = absorb(S, z, s, c, cnt, fk, vv, keep, NORM, PREC)
    store_state(part_ptr, tl.program_id(0).to(tl.int64), cols, S, z, s, c, cnt, BD)


@triton.jit
def output(u, den, c, NORM: tl.constexpr):
    """o_i: u_i for Eq. 7; c + u_i for the normalised variants (0 where den_i = 0)."""
    if NORM:
        u = tl.where((den > 0)[:, None], c[None, :] + u, 0.0)
    return u


@triton.jit
def store_chunk_terms(
    inv_ptr, dden_ptr, centre_ptr, head, N, off, rows, cols, inv, dden, c, NORM: tl.constexpr, BLOCK: tl.constexpr,
    BD: tl.constexpr,
):  # fmt: skip
    """Causal backward of the normalised variants: 1/den and dden per row and the chunk's centre, for key_kernel."""
    if NORM:
        tl.store(inv_ptr + head * N + rows, inv, mask=rows < N)
        tl.store(dden_ptr + head * N + rows, dden, mask=rows < N)
        tl.store(centre_ptr + (head * tl.cdiv(N, BLOCK) + off // BLOCK) * BD + cols, c)


@triton.jit
def query_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, state_ptr, g_ptr, out_ptr, part_ptr, inv_ptr, dden_ptr, centre_ptr,
    H, N, D, sb, sh, sn, gb, gh, gn, ob, oh, on, rows_per_prog, P,
    UNIT: tl.constexpr, NORM: tl.constexpr, CAUSAL: tl.constexpr, GRAD: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Walks this program's query rows: o (forward) or dq (GRAD) into out_ptr. Non-causal: the head's reduced state
    from state_ptr; GRAD also writes partial [A; w; b] to part_ptr[pid]. Causal (one program per head): the state
    runs over the chunks, with the masked chunk added; GRAD also writes store_chunk_terms for key_kernel."""
    head, base, g_base, out_base, mask_base, start, count = program_rows(H, N, P, rows_per_prog, sb, sh, gb, gh, ob, oh)
    cols = tl.arange(0, BD)
    S, z, s, c, cnt = start_state(state_ptr, head, cols, BD, CAUSAL)
    A, w, g_sum, _c, _n = zero_state(BD)
    for off in range(0, count, BLOCK):
        rows = start + off + tl.arange(0, BLOCK)
        q = load_rows(q_ptr, base, rows, cols, sn, N, D)
        fq = phi(q, cols, D, UNIT) * (rows < N).to(tl.float32)[:, None]
        num = mm(fq, S, None, PREC)
        den = tl.sum(fq * z[None, :], axis=1)
        if UNIT:
            num += s[None, :]
            den += cnt
        if CAUSAL:
            _, fk, vv, keep, c = key_rows(
                k_ptr, v_ptr, mask_ptr, base, mask_base, rows, cols, c, cnt, sn, N, D, UNIT, NORM, HAS_MASK
            )
            sim = chunk_scores(fq, fk, keep, rows, UNIT, PREC)
            num = mm(sim, vv, num, PREC)
            den += tl.sum(sim, axis=1)
        inv, u = divide(num, den, NORM)
        if GRAD:
            gs = load_rows(g_ptr, g_base, rows, cols, gn, N, D) * inv[:, None]
            dfq = mm(gs, tl.trans(S), None, PREC)
            dden = inv * 0.0
            if NORM:
                dden = -tl.sum(gs * u, axis=1)
                dfq += dden[:, None] * z[None, :]
            if CAUSAL:
                # dL/dsim(i, n) = gs_i . v'_n + dden_i for the keys n <= i of this chunk
                m = mm(gs, tl.trans(vv), None, PREC) + dden[:, None]
                dfq = mm(tl.where(rows[:, None] >= rows[None, :], m, 0.0), fk, dfq, PREC)
                store_chunk_terms(
                    inv_ptr, dden_ptr, centre_ptr, head, N, off, rows, cols, inv, dden, c, NORM, BLOCK, BD
                )
            else:
                A = mm(tl.trans(fq), gs, A, PREC)
                w += tl.sum(dden[:, None] * fq, axis=0)
                g_sum += tl.sum(gs, axis=0)
            store_rows(out_ptr, out_base, rows, cols, on, N, D, phi_grad(q, dfq, UNIT))
        else:
            store_rows(out_ptr, out_base, rows, cols, on, N, D, output(u, den, c, NORM))
        if CAUSAL:
            S, z, s, c, cnt = absorb(S, z, s, c, cnt, fk, vv, keep, NORM, PREC)
    if GRAD and not CAUSAL:
        store_state(part_ptr, tl.program_id(0).to(tl.int64), cols, A, w, g_sum, c, cnt, BD)


@triton.jit
def key_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, state_ptr, g_ptr, dk_ptr, dv_ptr, grads_ptr, inv_ptr, dden_ptr, centre_ptr,
    H, N, D, sb, sh, sn, gb, gh, gn, ob, oh, on, rows_per_prog, P,
    UNIT: tl.constexpr, NORM: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dk, dv over this program's keys: from the reduced [A; w; b] (grads_ptr) and the forward centre (state_ptr),
    non-causal; causal, from the chunks after this one (walked last to first) plus the masked chunk itself."""
    head, base, g_base, out_base, mask_base, start, count = program_rows(H, N, P, rows_per_prog, sb, sh, gb, gh, ob, oh)
    cols = tl.arange(0, BD)
    A, w, g_sum, c, _n = start_state(grads_ptr, head, cols, BD, CAUSAL)
    if not CAUSAL:  # the forward's centre
        _, _, _, c, _ = load_state(state_ptr, head, cols, BD)
    blocks = tl.cdiv(count, BLOCK)
    for i in range(0, blocks):
        blk = blocks - 1 - i if CAUSAL else i
        rows = start + blk * BLOCK + tl.arange(0, BLOCK)
        if CAUSAL and NORM:
            # w = sum_i phi(q_i) (dden_i + gs_i . (c - c_i)) follows the centre c: w(c') = w(c) + A (c' - c)
            c_next = tl.load(centre_ptr + (head * tl.cdiv(N, BLOCK) + blk) * BD + cols)
            w += tl.sum(A * (c_next - c)[None, :], axis=1)
            c = c_next
        k, fk, vv, keep, c = key_rows(
            k_ptr, v_ptr, mask_ptr, base, mask_base, rows, cols, c, 1.0, sn, N, D, UNIT, NORM, HAS_MASK
        )
        dfk = mm(vv, tl.trans(A), None, PREC) + w[None, :]
        dv = mm(fk, A, None, PREC)
        if UNIT:
            dv += keep[:, None] * g_sum[None, :]
        if CAUSAL:
            fq = phi(load_rows(q_ptr, base, rows, cols, sn, N, D), cols, D, UNIT) * (rows < N).to(tl.float32)[:, None]
            if NORM:
                inv = tl.load(inv_ptr + head * N + rows, mask=rows < N, other=0.0)
                dden = tl.load(dden_ptr + head * N + rows, mask=rows < N, other=0.0)
            else:
                inv = (rows < N).to(tl.float32) * 0.5
                dden = inv * 0.0
            gs = load_rows(g_ptr, g_base, rows, cols, gn, N, D) * inv[:, None]
            m = mm(gs, tl.trans(vv), None, PREC) + dden[:, None]  # [query i, key n]
            dfk = mm(tl.trans(tl.where(rows[:, None] >= rows[None, :], m, 0.0)), fq, dfk, PREC)
            dv = mm(tl.trans(chunk_scores(fq, fk, keep, rows, UNIT, PREC)), gs, dv, PREC)
            A = mm(tl.trans(fq), gs, A, PREC)
            w += tl.sum(dden[:, None] * fq, axis=0)
            g_sum += tl.sum(gs, axis=0)
        store_rows(dk_ptr, out_base, rows, cols, on, N, D, phi_grad(k, dfk, UNIT) * keep[:, None])
        store_rows(dv_ptr, out_base, rows, cols, on, N, D, dv * keep[:, None])


def unsupported(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> str | None:
    """Why these kernels cannot take q, k, v [B, H, N, D] and key_mask [B, N] (with the fix), or None."""
    if q.dim() != 4 or not q.shape == k.shape == v.shape:
        return f"q, k, v must share one shape [B, H, N, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    if q.dtype not in DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"q, k, v must be one of fp32, bf16, fp16 alike, got {q.dtype}, {k.dtype}, {v.dtype}; use impl=torch"
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"head size {q.shape[-1]} is above the kernels' {MAX_HEAD_DIM}; use impl=torch"
    if not q.device == k.device == v.device or q.device.type != ("cpu" if INTERPRET else "cuda"):
        return (
            f"q, k, v are on {q.device}, {k.device}, {v.device}; the kernels need CUDA tensors "
            "(CPU tensors only with TRITON_INTERPRET=1 set before the kernels are imported)"
        )
    B, _, N, _ = q.shape
    if key_mask is not None and (key_mask.shape != (B, N) or key_mask.dtype != torch.bool):
        return f"key_mask must be bool [B, N] = [{B}, {N}], got {key_mask.dtype} {tuple(key_mask.shape)}"
    if key_mask is not None and key_mask.device != q.device:
        return f"key_mask is on {key_mask.device} but q, k, v on {q.device}; move it with key_mask.to(q.device)"
    return None


@functools.cache
def target_programs(device: torch.device) -> int:
    """About two programs per SM fill the GPU; the interpreter gets 8, so the tests split N into ranges."""
    if device.type != "cuda":
        return 8
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


class Plan:
    """Block sizes, grid and strides of one call: q, k, v [B, H, N, D] (strides shared), outputs [B, N, H, D]."""

    def __init__(self, q: Tensor, causal: bool, op: Op, masked: bool):
        B, H, N, D = q.shape
        self.shape, self.causal, self.dtype = (B, H, N, D), causal, q.dtype
        self.BD = max(16, triton.next_power_of_2(D))
        self.flags = dict(UNIT=op.unit, NORM=op.normalised, HAS_MASK=masked)  # the op's description (ops/op.py)
        # see "Precision" in the module docstring
        self.prec = "ieee" if q.dtype == torch.float32 else "bf16x3"
        if q.dtype == torch.float32 and causal and self.BD == 128:
            self.prec = "bf16x6"
        # non-causal programs take whole row ranges, a multiple of every block size; causal ones a whole head
        blocks = triton.cdiv(N, 64)
        parts = 1 if causal else max(1, min(blocks, triton.cdiv(target_programs(q.device), B * H)))
        self.rows = N if causal else triton.cdiv(blocks, parts) * 64
        self.parts = triton.cdiv(N, self.rows)
        self.strides = (*q.stride()[:3], *self.new(q).stride()[:3])

    def new(self, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """An output or gradient [B, H, N, D] stored as [B, N, H, D]: o.transpose(1, 2).reshape(B, N, C) is free."""
        B, H, N, D = self.shape
        return like.new_empty(B, N, H, D, dtype=dtype).transpose(1, 2)

    def chunk(self) -> int:
        return 32 if self.BD <= 32 else 16

    def options(self, kernel: str) -> dict:
        """Launch options of "state", "query" (the forward's) or "grad" (both backward kernels); see the docstring."""
        if self.causal:
            block = self.chunk()
        else:
            block = 64 if self.BD <= 32 or (self.BD == 64 and kernel != "grad") else 32
        fp32 = self.dtype == torch.float32
        warps = 16 if self.prec == "ieee" and self.BD == 128 else 8
        return dict(BLOCK=block, BD=self.BD, PREC=self.prec, num_warps=warps, num_stages=1 if fp32 else 2)

    def sizes(self) -> tuple:
        _, H, N, D = self.shape
        sb, sh, sn = self.strides[:3]
        return H, N, D, sb, sh, sn

    def grid(self) -> tuple[int]:
        return (self.shape[0] * self.shape[1] * self.parts,)

    def partials(self, like: Tensor) -> Tensor:
        return like.new_empty(self.grid()[0], self.BD + 4, self.BD, dtype=torch.float32)

    def reduce(self, part: Tensor, centred: bool = False) -> Tensor:
        """[G * P, BD + 4, BD] partial sums -> [G, BD + 4, BD]: the split-N reduction, deterministic.

        `centred` states [S'; z; s'; c; cnt] each hold S' about their own mean c_p: they move to the overall
        mean c first, S'(c) = S'_p(c_p) + z_p (c_p - c)^T (Chan et al. 1979).
        """
        BD, part = self.BD, part.view(-1, self.parts, self.BD + 4, self.BD)
        if self.parts == 1:
            return part[:, 0]
        total = part.sum(1)
        if centred:
            z, c, cnt = part[:, :, BD], part[:, :, BD + 2], part[:, :, BD + 3, :1]
            total[:, BD + 2] = (cnt * c).sum(1) / cnt.sum(1).clamp_min(1)
            total[:, :BD] += z.transpose(1, 2) @ (c - total[:, None, BD + 2])
        return total


def forward(plan: Plan, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None):
    """o [B, H, N, D] in q.dtype and, non-causal, the reduced state [G, BD + 4, BD] (else None)."""
    out, state, causal = plan.new(q), None, plan.causal
    if not causal:
        part = plan.partials(q)
        state_kernel[plan.grid()](
            k, v, mask, part, *plan.sizes(), plan.rows, plan.parts, **plan.flags, **plan.options("state")
        )
        state = plan.reduce(part, centred=plan.flags["NORM"])
    query_kernel[plan.grid()](
        q, k, v, mask, state, None, out, None, None, None, None, *plan.sizes(), 0, 0, 0, *plan.strides[3:],
        plan.rows, plan.parts, CAUSAL=causal, GRAD=False, **plan.flags, **plan.options("query"),
    )  # fmt: skip
    return out, state


def backward(plan: Plan, grad: Tensor, q, k, v, mask, state) -> tuple[Tensor, Tensor, Tensor]:
    """dL/dq, dL/dk, dL/dv [B, H, N, D] in the inputs' dtype from dL/do = grad [B, H, N, D]."""
    B, H, N, _ = plan.shape
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    dq, dk, dv, causal = plan.new(q), plan.new(k), plan.new(v), plan.causal
    inv = dden = centres = part = None
    if causal and plan.flags["NORM"]:
        inv, dden = q.new_empty(2, B * H, N, dtype=torch.float32).unbind(0)
        centres = q.new_empty(B * H, triton.cdiv(N, plan.chunk()), plan.BD, dtype=torch.float32)
    if not causal:
        part = plan.partials(q)
    common = (*plan.sizes(), *grad.stride()[:3], *plan.strides[3:], plan.rows, plan.parts)
    options = dict(CAUSAL=causal, **plan.flags, **plan.options("grad"))
    query_kernel[plan.grid()](q, k, v, mask, state, grad, dq, part, inv, dden, centres, *common, GRAD=True, **options)
    grads = None if causal else plan.reduce(part)
    key_kernel[plan.grid()](q, k, v, mask, state, grad, dk, dv, grads, inv, dden, centres, *common, **options)
    return dq, dk, dv


def one_layout(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as they are when they share strides with a unit last stride (views of one qkv), else contiguous."""
    if q.stride() == k.stride() == v.stride() and q.stride(-1) == 1:
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()


class LinearAttention(torch.autograd.Function):
    """The kernels above as one differentiable op on q, k, v [B, H, N, D]; saves only q, k, v, the mask and the
    non-causal [D + 4, D] state."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, causal: bool, op: Op):
        q, k, v = one_layout(q, k, v)
        mask = None if key_mask is None else key_mask.contiguous().view(torch.uint8)
        ctx.plan = Plan(q, causal, op, mask is not None)
        out, state = forward(ctx.plan, q, k, v, mask)
        ctx.save_for_backward(q, k, v, mask, state)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return *backward(ctx.plan, grad, *ctx.saved_tensors), None, None, None


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None, op: Op) -> Tensor:
    """o [B, H, N, D] in q.dtype from q, k, v [B, H, N, D] and key_mask [B, N] bool (True = real) or None, for the
    op's description (ops/op.py)."""
    reason = unsupported(q, k, v, key_mask)
    if reason is not None:
        raise ValueError(f"triton linear attention: {reason}")
    if q.numel() == 0:
        return torch.zeros_like(q)
    return LinearAttention.apply(q, k, v, key_mask, causal, op)
