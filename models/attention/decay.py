"""Fixed-decay attentions: retention (Sun et al. 2023, RetNet) and its 2-D Manhattan form (Fan et al. 2024, RMT).

    retention     o_i = sum_j gamma_h^|i - j| (q_i . k_j / sqrt(D)) v_j        (j <= i when causal)
    retention_2d  o_i = sum_j gamma_h^(|r_i - r_j| + |c_i - c_j|) (q_i . k_j / sqrt(D)) v_j   (never causal)

with RetNet's decay gamma_h = 1 - 2^(-5 - h) for head h (0-based). There is no normaliser, as in RetNet: the output
grows with the number of tokens within reach of the decay (about 2 / (1 - gamma_h)). RetNet follows retention with a
GroupNorm per head and a swish gate; the block here does neither (pre-LN, out_proj straight after), so nothing but
the decay bounds the sum. With model.*_pos_embed=rope the layer rotates q and k first: RetNet's e^{i n theta}.

Grid of retention_2d (models/vit.py's layout): the first `prefix_tokens` tokens (default 1, the class token) are
no patch and sit at distance 0 from every token; the rest are patches in row-major order on a grid of `width`
columns, by default ceil(sqrt(patches)): vit.py's square grid of N - 1 = side^2 patches, and for any other count
a grid whose last row is partial. Patch dropout hands the layer a random subset of patches in random order, so
their decays follow that order, not the image. Padded keys (key_mask False) keep their places and add nothing.

Fast path (`scan`), O(N) in memory, never N x N: the sequence or grid is cut into blocks of whole rows (1-D: a row
is one token); inside a block the decayed [block, block] matrix, across blocks a d x d state per column carried
down the rows with decay gamma per row and mixed over the W columns by gamma^|c - c'| at readout (two scans over
the columns). The two-sided forms are LION's construction (Afzal et al. 2025) across blocks: the downward pass's
states carry the earlier blocks' keys, the same pass on the reversed tokens the later blocks', and each block's own
keys go through its whole two-sided decayed [block, block] matrix once (the two passes' triangles would each build
it); the sequence is padded to whole blocks, so reversing keeps them. A sequence that fits one block takes its whole
decayed matrix alone (`one_block`; causal, the one block's masked matrix). Reversing all tokens maps row r to
R - 1 - r and column c to W - 1 - c, which keeps every |c - c'|.
Options: chunk_size (tokens per block: retention 64, or unset the whole sequence up to WHOLE = 128 tokens, so the
text tower's 77 take one block and no states; retention_2d 1,024, as max(1, 1024 // W) whole rows), and for
retention_2d width and prefix_tokens. Memory: N x block for the matrices and N D^2 / (rows per block) for the
states, all blocks at once (1-D: N D^2 / 64); retention_2d's larger blocks keep its per-column states, and their
traffic, down (1,024 tokens: a quarter of the states of 256-token blocks, half the N x block matrices of 2,048).
Causal in one block on the CPU in fp32 (the text tower): gamma^(i - j) = e^(b_i) e^(-b_j) with b_i = i log gamma
(|b| <= 4.1 up to WHOLE tokens), so the masked matrix is a causal linear attention on q e^b, k e^-b, computed by the
fused C kernel of the linear ops (`raw_causal`, ops/causal_cpu.c, given e^b; also ssd's, gla's and deltanet's one
chunk).
retention_2d on the CPU in fp32, for grids of more than 9 D tokens (576 at D = 64; shorter ones cost less as the
matrix): the fused C kernel of ops/manhattan_cpu.c (`manhattan.two_sided`), which sweeps the rows down and up with
one d x d state per column and reads them with two running sums over the columns, O(N D^2) and no blocks; its
backward is the same kernel three times (the decayed matrix is symmetric).
On CUDA retention runs flash-linear-attention's chunk_retention instead, causal and two-sided (ops/fla_kernels.py,
when fla imports).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from models.attention import reference
from models.attention.base import Attention, scale
from models.attention.linear import LinearAttention
from models.attention.ops import causal_cpu, cpu_build, fla_kernels, manhattan
from models.attention.ops.common import check_key_mask, compute_dtype
from models.attention.ops.op import Op
from models.attention.registry import register_attention

WHY_NOT_CAUSAL_2D = "its decay over the patch grid reaches the rows below and the columns right of every patch"
WHOLE = 128  # unset chunk_size: sequences up to this many tokens are one chunk (the decayed matrix, no states)
RAW = Op("decayed", unit=False, normalised=False, raw=True)  # causal_cpu.c's sum_{j <= i} (q_i . k_j) v_j


def chunk_for(n: int, chunk_size: int | None, default: int) -> int:
    """The chunk of a 1-D decayed form (retention, ssd, gla, deltanet): `chunk_size` when given; unset, the whole
    sequence up to WHOLE tokens, where one [n, n] matrix costs fewer and larger ops than chunks and their states
    (the text tower's 77 tokens), else `default`."""
    if chunk_size is not None:
        return chunk_size
    return n if n <= WHOLE else default


def log_gammas(num_heads: int, like: Tensor) -> Tensor:
    """[H]: log gamma_h = log(1 - 2^(-5 - h)), RetNet's decay per head, in the dtype and device of `like`."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(num_heads, dtype=like.dtype, device=like.device))))


def prepare(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """q / sqrt(D), k, v in the compute dtype (fp32, fp64 for fp64), padded keys' k and v zeroed."""
    check_key_mask(key_mask, q)
    dtype = compute_dtype(q)
    q, k, v = q.to(dtype) * scale(q.shape[-1]), k.to(dtype), v.to(dtype)
    if key_mask is not None:
        padded = ~key_mask[:, None, :, None]
        k, v = k.masked_fill(padded, 0), v.masked_fill(padded, 0)
    return q, k, v


def decayed_step(state: tuple, q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor) -> tuple[Tensor, tuple]:
    """One token of a causal decayed sum (retention, ssd, gla): S_t = diag(exp g_t) S_{t-1} + k_t^T v_t [B, H, D, D],
    o_t = q_t S_t; q (scaled by 1 / sqrt(D)), k, v [B, H, 1, D], g_t = log_decay [B or 1, H, 1, 1 or D] (<= 0)."""
    s = log_decay.exp().transpose(-1, -2) * state[0] + k.transpose(-1, -2) @ v
    return q @ s, (s,)


def scan(
    q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, width: int, rows: int, strict: bool, within: bool = True
) -> Tensor:
    """o at (r, c) = sum over keys at (r', c') with r' <= r (r' < r when `strict`) of gamma^(r - r' + |c - c'|)
    (q . k) v: q, k, v [B, H, N, D] with N = R * width tokens row-major, log_gamma [H], `rows` rows per block;
    without `within`, only the keys of earlier blocks (two_sided does each block's own keys once for both passes)."""
    B, H, N, D = q.shape
    P, blocks = rows * width, -(-N // (rows * width))
    q, k, v = (F.pad(t, (0, 0, 0, blocks * P - N)).view(B, H, blocks, rows, width, D) for t in (q, k, v))
    lg = log_gamma[:, None, None]
    row, col = torch.arange(rows, device=q.device), torch.arange(width, device=q.device)
    out = within_blocks(q, k, v, lg, row, col, strict) if within else 0
    # across blocks: each block's keys as one d x d state per column, decayed to the block's last row
    to_end = (lg * (rows - 1 - row)).exp()[..., None, None]  # [H, 1, rows, 1, 1]
    by_column = (0, 1, 2, 4, 3, 5)  # [B, H, blocks, rows, W, D] <-> [B, H, blocks, W, rows, D]
    kv = (k * to_end).permute(by_column).transpose(-1, -2) @ v.permute(by_column)  # [B, H, blocks, W, D, D]
    block_decay = (log_gamma * rows).exp()[:, None, None, None]
    state, states = torch.zeros_like(kv[:, :, 0]), []
    for kv_block in kv.unbind(2):  # unbind: one backward for all blocks (indexing would zero-fill one per block)
        states.append(state)
        state = state * block_decay + kv_block
    # the states mixed over the columns by gamma^|c - c'|, then read by the block's rows, gamma^(rows below)
    mixed = two_sided_columns(torch.stack(states, 2), log_gamma)
    from_start = (lg * (row + 1)).exp()[..., None, None]  # [H, 1, rows, 1, 1]
    out = out + ((q * from_start).permute(by_column) @ mixed).permute(by_column)
    return out.reshape(B, H, blocks * P, D)[:, :, :N]


def within_blocks(q: Tensor, k: Tensor, v: Tensor, lg: Tensor, row: Tensor, col: Tensor, strict: bool) -> Tensor:
    """scan's keys of the query's own block: the decayed [P, P] matrix over rows r' <= r (r' < r when strict), q, k,
    v [B, H, blocks, rows, W, D] -> the same shape; lg [H, 1, 1] the log decays."""
    B, H, blocks, rows, width, D = q.shape
    dr, dc = row[:, None] - row[None], (col[:, None] - col[None]).abs()
    decay_rows = torch.where(dr > 0 if strict else dr >= 0, (lg * dr).exp(), 0)  # [H, rows, rows]
    decay_cols = (lg * dc).exp()  # [H, width, width]
    intra = (decay_rows[:, :, None, :, None] * decay_cols[:, None, :, None, :]).reshape(H, 1, rows * width, -1)
    qb, kb, vb = (t.reshape(B, H, blocks, rows * width, D) for t in (q, k, v))
    return (((qb @ kb.transpose(-1, -2)) * intra) @ vb).view(B, H, blocks, rows, width, D)


def two_sided_columns(states: Tensor, log_gamma: Tensor) -> Tensor:
    """sum_c' gamma^|c - c'| states[..., c', :, :] for every column c: [B, H, blocks, W, D, D], as two scans over the
    W columns (O(W D^2) per block, where the [W, W] matrix would cost O(W^2 D^2))."""
    gamma = log_gamma.exp()[:, None, None, None]  # [H, 1, 1, 1]
    columns = states.unbind(3)
    left, right = [columns[0]], [torch.zeros_like(columns[0])]
    for column in columns[1:]:
        left.append(left[-1] * gamma + column)
    for column in reversed(columns[1:]):
        right.append((right[-1] + column) * gamma)
    return torch.stack(left, 3) + torch.stack(right[::-1], 3)


def two_sided(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, width: int, rows: int) -> Tensor:
    """Every key once, decayed both ways: each block's own keys through its whole decayed [P, P] matrix (once, for
    both directions), the earlier blocks' keys by `scan`'s states and the later blocks' by the same on the reversed
    tokens (LION), the sequence padded to whole blocks so that reversing keeps them. A sequence that fits one block
    (N <= rows * width) takes its decayed [N, N] matrix once (one_block)."""
    N = q.shape[2]
    P = rows * width
    if N <= P:
        return one_block(q, k, v, log_gamma, width)
    q, k, v = (F.pad(t, (0, 0, 0, -N % P)) for t in (q, k, v))
    decay = decay_matrix(P, width, log_gamma)[:, None]  # [H, 1, P, P]
    qb, kb, vb = (t.unflatten(2, (-1, P)) for t in (q, k, v))
    own = (((qb @ kb.transpose(-1, -2)) * decay) @ vb).flatten(2, 3)
    down = scan(q, k, v, log_gamma, width, rows, strict=False, within=False)
    up = scan(q.flip(2), k.flip(2), v.flip(2), log_gamma, width, rows, strict=True, within=False)
    return (own + down + up.flip(2))[:, :, :N]


def decay_matrix(n: int, width: int, log_gamma: Tensor) -> Tensor:
    """[H, n, n]: gamma_h^(|r - r'| + |c - c'|) between n tokens row-major on `width` columns (1-D: width 1)."""
    i = torch.arange(n, device=log_gamma.device)
    distance = (i[:, None] // width - i[None] // width).abs() + (i[:, None] % width - i[None] % width).abs()
    return (log_gamma[:, None, None] * distance).exp()


def one_block(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, width: int, causal: bool = False) -> Tensor:
    """((q k^T) * gamma^(|r - r'| + |c - c'|)) v with the whole matrix at once, tokens row-major on `width` columns
    (1-D: width 1): the sum of two_sided's two passes in one, for a sequence no longer than a block; `causal` (1-D
    only) keeps keys j <= i, what `scan` computes in one block."""
    decay = decay_matrix(q.shape[2], width, log_gamma)
    return ((q @ k.transpose(-1, -2)) * (decay.tril() if causal else decay)) @ v


def raw_kernel_takes(q: Tensor) -> bool:
    """Whether causal_cpu.c computes raw_causal on q [B, H, N, D]: CPU, fp32 (or lower), its head sizes, its lengths."""
    return causal_cpu.takes(q) and not cpu_build.why_not(q)


def raw_causal(q: Tensor, k: Tensor, v: Tensor, e: Tensor | None = None) -> Tensor:
    """sum_{j <= i} ((q_i e_i) . (k_j / e_j)) v_j on causal_cpu.c: [B, H, N, D] -> fp32; e [B or 1, H, N, 1 or D] or
    None (1), the kernel scales q and k itself."""
    return causal_cpu.attend(q, k, v, None, RAW, e)


def decayed_causal(q: Tensor, k: Tensor, v: Tensor, b: Tensor) -> Tensor:
    """sum_{j <= i} e^(b_i - b_j) (q_i . k_j) v_j as raw_causal on q e^b, k e^-b; b [B or 1, H, N, 1 or D], the
    cumulative log decay, bounded by the caller (e^-b must stay far inside fp32)."""
    return raw_causal(q, k, v, b.exp())


def retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Sun et al. 2023, Eq. 5 without xPos: o_i = sum_j gamma_h^|i - j| (q_i . k_j / sqrt(D)) v_j (j <= i when causal),
    [B, H, N, D] x3 -> [B, H, N, D] in the dtype of q; chunks of `chunk_size` tokens (unset: chunk_for's choice)."""
    dtype, (q, k, v) = q.dtype, prepare(q, k, v, key_mask)
    if fla_kernels.use_fla(q):
        return fla_kernels.decayed(q, k, v, None, two_sided=not causal).to(dtype)
    log_gamma, chunk = log_gammas(q.shape[1], q), chunk_for(q.shape[2], chunk_size, 64)
    if causal and q.shape[2] <= chunk and q.shape[2] <= WHOLE and raw_kernel_takes(q):
        b = log_gamma[:, None, None] * torch.arange(q.shape[2], device=q.device, dtype=q.dtype)[:, None]
        return decayed_causal(q, k, v, b).to(dtype)  # gamma^(i - j) = e^(b_i - b_j), b >= -4.1
    if causal and q.shape[2] <= chunk:
        return one_block(q, k, v, log_gamma, 1, causal=True).to(dtype)
    if causal:
        return scan(q, k, v, log_gamma, 1, chunk, strict=False).to(dtype)
    return two_sided(q, k, v, log_gamma, 1, chunk).to(dtype)


def retention_2d(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    width: int | None = None,
    prefix_tokens: int = 1,
    chunk_size: int = 1024,
) -> Tensor:
    """Fan et al. 2024 (RMT), Manhattan self-attention, exact: o_i = sum_j gamma_h^(|r_i - r_j| + |c_i - c_j|)
    (q_i . k_j / sqrt(D)) v_j over the patch grid, prefix tokens at distance 0; [B, H, N, D] x3 -> [B, H, N, D]."""
    if causal:
        raise ValueError(f"attention 'retention_2d' cannot be causal: {WHY_NOT_CAUSAL_2D}")
    dtype, (q, k, v) = q.dtype, prepare(q, k, v, key_mask)
    n, n_pre = q.shape[-2], min(prefix_tokens, q.shape[-2])
    rows, cols = reference.patch_grid(n, width, prefix_tokens)
    (q0, q1), (k0, k1), (v0, v1) = (t.split([n_pre, n - n_pre], 2) for t in (q, k, v))
    # prefix tokens are at distance 0 from all: plain linear attention, their queries read every key undecayed
    out_pre = q0 @ (k.transpose(-1, -2) @ v)
    out = q1 @ (k0.transpose(-1, -2) @ v0)
    if n > n_pre:
        grid = [F.pad(t, (0, 0, 0, rows * cols - (n - n_pre))) for t in (q1, k1, v1)]
        if manhattan.takes(q, rows, cols):  # CPU, fp32, longer grids: the C kernel's sweeps, O(N D^2)
            decayed = manhattan.two_sided(*grid, log_gammas(q.shape[1], q), cols)
        else:
            decayed = two_sided(*grid, log_gammas(q.shape[1], q), cols, max(1, chunk_size // cols))
        out = out + decayed[:, :, : n - n_pre]
    return torch.cat([out_pre, out], 2).to(dtype)


def check_options(name: str, options: dict, known: tuple[str, ...]) -> None:
    """One line for an option the variant does not take or a value out of range (integers >= 1, prefix_tokens >= 0,
    width None for a square grid)."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"attention {name!r}: unknown options {', '.join(unknown)}; it takes {', '.join(known)}")
    for key, value in options.items():
        least = 0 if key == "prefix_tokens" else 1
        if key == "width" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"attention {name!r}: option {key}={value!r} must be an integer >= {least}")


@register_attention("retention")
class RetentionAttention(LinearAttention):
    """Sun et al. 2023 (RetNet), retention with decay gamma_h = 1 - 2^(-5 - h), no normaliser; option chunk_size."""

    function = staticmethod(retention)
    reference = staticmethod(reference.retention)
    supports_recurrent = True

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, qkv_bias: bool = True, **options):
        check_options(self.name, options, ("chunk_size",))
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias, **options)

    def state_shapes(self) -> list[tuple[int, ...]]:
        return [(self.num_heads, self.head_dim, self.head_dim)]

    def token_step(self, q: Tensor, k: Tensor, v: Tensor, state: tuple, table) -> tuple[Tensor, tuple]:
        q, k, v = prepare(q, k, v, None)
        return decayed_step(state, q, k, v, log_gammas(self.num_heads, q)[:, None, None])


@register_attention("retention_2d")
class Retention2dAttention(Attention):
    """Fan et al. 2024 (RMT), Manhattan-distance retention over the patch grid, exact; options width, prefix_tokens,
    chunk_size. Linear in N: time O(N D^2 + N block D), memory O(N D^2 / rows per block + N block).
    Not a LinearAttention: the attention benchmark's long sizes would keep N D^2 / rows of states."""

    time_power = 1

    supports_causal = False
    why_not_causal = WHY_NOT_CAUSAL_2D
    function = staticmethod(retention_2d)
    reference = staticmethod(reference.retention_2d)

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, qkv_bias: bool = True, **options):
        check_options(self.name, options, ("chunk_size", "prefix_tokens", "width"))
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias, **options)
