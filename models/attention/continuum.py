"""Continuum softmax: softmax attention over the continuous curve that linearly joins the tokens.

The tokens are samples at s = 1..N of a path k_s, v_s that is linear between them and starts at a
virtual token s = 0 (k_0, v_0: option `start`). Query t attends to the whole path up to T:

    o_t = int_0^T e^{a(s)} v_s ds / int_0^T e^{a(s)} ds,   a(s) = q_t.k_s / sqrt(D),

with T = t + 1 for causal query t (the t-th token, 0-based, is s = t + 1) and T = N otherwise.

Closed form. On segment [i, i + 1] write s = i + u, a(s) = a_i + u d with d = a_{i+1} - a_i
(q.k_s is linear in s because k_s is), and v_s = (1 - u) v_i + u v_{i+1}. Then

    int_0^1 e^{a_i + u d} (1 - u) du = e^{a_i} (e^d - 1 - d) / d^2 = e^{a_i} phi2(a_{i+1} - a_i)
    int_0^1 e^{a_i + u d} u du       = e^{a_i} (d e^d - e^d + 1) / d^2 = e^{a_{i+1}} phi2(a_i - a_{i+1}),

the first by integrating by parts, the second because it equals e^{a_i + d} times the first with
d -> -d (substitute u -> 1 - u). Summing the segments [0, 1], ..., [T - 1, T], v_i collects

    e^{a_i + b_i},  e^{b_i} = phi2(a_{i-1} - a_i) + phi2(a_{i+1} - a_i)   (0 < i < T),
    e^{b_0} = phi2(a_1 - a_0),  e^{b_T} = phi2(a_{T-1} - a_T)   (one neighbour at the ends),

and the denominator is the same sum with every v replaced by 1: o_t is softmax attention with the
additive bias b, over keys 0..T. Here each segment's two terms are kept as separate logits,
a_i + log phi2(a_{i+1} - a_i) and a_{i+1} + log phi2(a_i - a_{i+1}), and one softmax runs over all
2N of them: the same weights, with no log of a sum of exponentials to take.

Padding: padded tokens leave the path entirely; the remaining tokens are joined in order (a hole
in the middle of the mask is skipped, its two neighbours become adjacent), and for causal query t,
T = the number of real tokens at positions <= t. A query with T = 0 (no real token yet, padding
only) returns v_0, the value of the path at s = 0.

Start token (option `start`): "zero" (k_0 = v_0 = 0, the default), "copy" (k_0, v_0 = the first
real token, so [0, 1] is a constant segment and weights token 1 fully), "learn" (k_0, v_0 learned
per head, initialised to zero, so training starts from "zero").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from models.attention import reference
from models.attention.base import Attention, scale
from models.attention.reference import CONTINUUM_STARTS, continuum_start, join_real_tokens
from models.attention.registry import register_attention

SERIES_BOUND = 1.0  # |x| below this uses the Taylor series: the closed forms lose digits to cancellation there
MAX_CHUNK_ELEMENTS = 2**25  # query rows per chunk keep each [B, H, rows, N] temporary below this


def series_terms(dtype: torch.dtype) -> int:
    """Terms for the series at |x| <= 1 to reach the dtype's precision: 1 / (j + 2)! < eps."""
    return 18 if dtype == torch.float64 else 10


def even_odd(x: Tensor, coeffs: list[float]) -> tuple[Tensor, Tensor]:
    """sum_j c_j x^j split into even and odd parts (Horner in x^2, in place), so f(x) = e + o, f(-x) = e - o."""
    x2 = x * x
    parts = []
    for cs in (coeffs[0::2], coeffs[1::2]):
        out = torch.full_like(x, cs[-1])
        for c in reversed(cs[:-1]):
            out.mul_(x2).add_(c)
        parts.append(out)
    return parts[0], parts[1].mul_(x)


def log_phi2_pair_value(d: Tensor, with_slope: bool = False) -> tuple[Tensor, ...]:
    """(log phi2(d), log phi2(-d)), and with_slope their derivatives (d/dx log phi2 at d and at -d).

    No overflow or cancellation for any real d: |d| < 1 by the Taylor series (one series serves d and
    -d), |d| >= 1 by closed forms in y = |d| that factor out e^y. The slope phi2'/phi2 is 1/3 at 0 and
    tends to 1 at +inf and to 0 at -inf.
    """
    terms = series_terms(d.dtype)
    y = d.abs()
    small, pos = y < SERIES_BOUND, d > 0
    # each branch sees only arguments where it is finite: the series |x| <= 1, the closed forms y >= 1
    x = d.clamp(-SERIES_BOUND, SERIES_BOUND)
    y = y.clamp_min(SERIES_BOUND)
    ey = torch.exp(-y)
    even, odd = even_odd(x, [1 / math.factorial(j + 2) for j in range(terms)])  # phi2 = sum_j x^j / (j + 2)!
    log_y2 = 2 * torch.log(y)
    up = y + torch.log1p(-(1 + y) * ey) - log_y2  # log phi2(y): (e^y - 1 - y) / y^2 with e^y taken out
    down = torch.log(y - 1 + ey) - log_y2  # log phi2(-y) = log(e^-y - 1 + y) - 2 log y
    out = [
        torch.where(small, torch.log(even + odd), torch.where(pos, up, down)),
        torch.where(small, torch.log(even - odd), torch.where(pos, down, up)),
    ]
    if with_slope:
        deven, dodd = even_odd(x, [(j + 1) / math.factorial(j + 3) for j in range(terms)])  # phi2'
        # from log(e^x - 1 - x) - 2 log x, with x / expm1(x) = y e^-y / (1 - e^-y) at x = y (no inf / inf)
        up = 1 / (1 - y * ey / (1 - ey)) - 2 / y
        down = 1 / (1 - y / (1 - ey)) + 2 / y
        out += [
            torch.where(small, (deven + dodd) / (even + odd), torch.where(pos, up, down)),
            torch.where(small, (deven - dodd) / (even - odd), torch.where(pos, down, up)),
        ]
    return tuple(out)


class LogPhi2Pair(torch.autograd.Function):
    """(log phi2(d), log phi2(-d)) with an analytic backward; the slopes come from the forward's series."""

    @staticmethod
    def forward(ctx, d: Tensor) -> tuple[Tensor, Tensor]:
        out = log_phi2_pair_value(d, with_slope=ctx.needs_input_grad[0])
        ctx.save_for_backward(*out[2:])
        return out[0], out[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_pos: Tensor, grad_neg: Tensor) -> Tensor:
        slope_pos, slope_neg = ctx.saved_tensors
        return grad_pos * slope_pos - grad_neg * slope_neg


def log_phi2_pair(d: Tensor) -> tuple[Tensor, Tensor]:
    """(log phi2(d), log phi2(-d)) elementwise, phi2(x) = (e^x - 1 - x) / x^2, phi2(0) = 1/2; stable values and
    gradients."""
    return LogPhi2Pair.apply(d)


def log_phi2(x: Tensor) -> Tensor:
    """log phi2(x) elementwise."""
    return log_phi2_pair(x)[0]


def continuum_rows(q: Tensor, keys: Tensor, values: Tensor, ends: Tensor | None) -> Tensor:
    """Query rows q [B, H, n, D] against keys, values [B, H, N + 1, D] (start token first); ends [., ., n, 1] or
    None."""
    n_seg = keys.shape[-2] - 1
    a = (q @ keys.transpose(-1, -2)) * scale(q.shape[-1])  # [B, H, n, N + 1]
    near, far = a[..., :-1], a[..., 1:]  # the two ends of segment j = [j, j + 1]
    log_phi2_d, log_phi2_minus_d = log_phi2_pair(far - near)
    logits = torch.cat([near + log_phi2_d, far + log_phi2_minus_d], -1)  # [B, H, n, 2N]
    if ends is not None:
        seg = torch.arange(n_seg, device=q.device)
        ok = seg < ends
        # T = 0: keep only segment 0's near end, so the single weight falls on v_0
        logits = logits.masked_fill(~torch.cat([ok | ((seg == 0) & (ends == 0)), ok], -1), float("-inf"))
    p = logits.softmax(-1)
    return p[..., :n_seg] @ values[..., :-1, :] + p[..., n_seg:] @ values[..., 1:, :]


def continuum_softmax(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    start: str = "zero",
    start_kv: tuple[Tensor, Tensor] | None = None,
    query_chunk: int | None = None,
) -> Tensor:
    """[B, H, N, D] x3 -> [B, H, N, D]; O(N^2) like softmax. Computed in fp32 (fp64 stays fp64).

    start_kv: the learned (k_0, v_0) [H, D] when start == "learn". query_chunk: query rows per
    block (default: as many as keep a [B, H, rows, N] temporary under 2^25 elements).
    """
    dtype, (q, k, v) = q.dtype, reference.upcast(q, k, v)
    k, v, ends = join_real_tokens(k, v, causal, key_mask)
    k0, v0 = continuum_start(k, v, start, start_kv)
    keys = torch.cat([k0.expand_as(k[:, :, :1]), k], 2)
    values = torch.cat([v0.expand_as(v[:, :, :1]), v], 2)
    B, H, N, _ = q.shape
    rows = query_chunk or max(1, MAX_CHUNK_ELEMENTS // (B * H * N))
    out = [
        continuum_rows(q[:, :, i : i + rows], keys, values, None if ends is None else ends[:, :, i : i + rows])
        for i in range(0, N, rows)
    ]
    return torch.cat(out, 2).to(dtype)


@register_attention("continuum_softmax")
class ContinuumSoftmaxAttention(Attention):
    """Softmax attention integrated over the linear path through the tokens (see the module docstring).

    Options: start ("zero" | "copy" | "learn"), query_chunk. With start="learn" the layer owns
    start_k, start_v [H, D], so its math is only reachable through the layer, not `attend`.
    """

    function = staticmethod(continuum_softmax)
    reference = staticmethod(reference.continuum_softmax)

    def __init__(
        self, dim: int, num_heads: int, *, causal: bool = False, qkv_bias: bool = True, start: str = "zero", **options
    ):
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias, start=start, **options)
        if set(options) - {"query_chunk"}:
            raise ValueError(
                f"attention 'continuum_softmax': unknown options {', '.join(sorted(set(options) - {'query_chunk'}))}; "
                "it takes start and query_chunk"
            )
        if start not in CONTINUUM_STARTS:
            raise ValueError(
                f"attention 'continuum_softmax': unknown start {start!r}; pick one of {', '.join(CONTINUUM_STARTS)}"
            )
        if start == "learn":
            self.start_k = nn.Parameter(torch.zeros(num_heads, self.head_dim))
            self.start_v = nn.Parameter(torch.zeros(num_heads, self.head_dim))

    def start_kv(self) -> tuple[Tensor, Tensor] | None:
        return (self.start_k, self.start_v) if self.options["start"] == "learn" else None

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        return continuum_softmax(
            q, k, v, causal=self.causal, key_mask=key_mask, start_kv=self.start_kv(), **self.options
        )

    def attention_reference(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        return reference.continuum_softmax(
            q, k, v, causal=self.causal, key_mask=key_mask, start_kv=self.start_kv(), **self.options
        )
