"""Naive O(N^2) fp32 definitions of the attention variants, written as the papers write them; the linear ops with
fast paths (dispatch.linear_ops()) keep theirs in their folders, `reference` in models/attention/ops/<op>/__init__.py,
on the helpers here.

Each builds the explicit N x N similarity. Tests compare the fast paths against these, forward and
backward; they are also the fallback a reader can trust. All take q, k, v [B, H, N, D] and return
[B, H, N, D] in the dtype of q. `key_mask` [B, N] is True for real tokens; padded keys leave every
sum, normalisers included.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def upcast(*ts: Tensor) -> list[Tensor]:
    """fp32 for low-precision inputs; fp64 inputs stay fp64 (tests use them for an exact baseline)."""
    return [t.to(torch.promote_types(t.dtype, torch.float32)) for t in ts]


def allowed(q: Tensor, k: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
    """Bool [B or 1, 1, Nq, Nk]: which key n each query i may use."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    ok = torch.ones(1, 1, n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        ok = ok.tril(n_k - n_q)
    if key_mask is not None:
        ok = ok & key_mask[:, None, None, :]
    return ok


def softmax(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None) -> Tensor:
    """o_i = sum_n exp(q_i.k_n / sqrt(D)) v_n / sum_n exp(q_i.k_n / sqrt(D))."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    ok = allowed(q, k, causal, key_mask)
    ok = ok | ~ok.any(-1, keepdim=True)  # a query with no key at all attends everywhere (padding, never used)
    a = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    a = a.masked_fill(~ok, float("-inf"))
    return (a.softmax(-1) @ v).to(dtype)


def kernel_attention(sim: Tensor, v: Tensor, ok: Tensor, normalise: bool) -> Tensor:
    """sum_n sim(i, n) v_n over the allowed keys, divided by sum_n sim(i, n) when `normalise`.

    The linear ops' references (models/attention/ops/<op>/__init__.py) build sim and call this; like every
    reference here they take **options (e.g. chunk_size) that change how, not what, is computed.

    A query with no allowed key gets 0 (padding, never used) instead of 0 / 0.
    """
    sim = sim.masked_fill(~ok, 0)
    out = sim @ v
    if normalise:
        den = sim.sum(-1, keepdim=True)
        out = out / torch.where(den == 0, torch.ones_like(den), den)
    return out


def efficient(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """Shen et al. 2021, "Efficient attention": o_i = sum_n (softmax_D(q_i) . softmax_N(K)_n) v_n, as an N x N matrix.

    The softmax over tokens runs over the real keys only; a batch row without any real key uses all keys.
    """
    if causal:
        raise ValueError(
            "attention 'efficient' cannot be causal: its softmax over all tokens of K looks at future tokens"
        )
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    ok = allowed(q, k, False, key_mask)[..., :1, :].transpose(-1, -2)  # [B or 1, 1, N, 1]
    ok = ok | ~ok.any(-2, keepdim=True)
    k_weights = k.masked_fill(~ok, float("-inf")).softmax(-2)  # softmax over the N tokens, per feature
    sim = q.softmax(-1) @ k_weights.transpose(-1, -2)  # [B, H, N, N]
    return (sim @ v).to(dtype)


def hedgehog(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    **options,
) -> Tensor:
    """Zhang et al. 2024 (Hedgehog): o_i = sum_n (phi_q(q_i).phi_k(k_n)) v_n / sum_n phi_q(q_i).phi_k(k_n), with
    phi(x) = [softmax(x W), softmax(-x W)] over the features, W [H, D, F] per head (w_q for queries, w_k for keys)."""
    dtype, (q, k, v, w_q, w_k) = q.dtype, upcast(q, k, v, w_q, w_k)

    def phi(x: Tensor, w: Tensor) -> Tensor:
        z = x @ w[None]  # [B, H, N, D] @ [1, H, D, F]
        return torch.cat([F.softmax(z, dim=-1), F.softmax(-z, dim=-1)], dim=-1)

    sim = phi(q, w_q) @ phi(k, w_k).transpose(-1, -2)
    return kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=True).to(dtype)


def join_real_tokens(
    k: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Real tokens first, in their order (padded ones after), and each query's last usable key T.

    k, v [B, H, N, D] -> the same, reordered; T [B or 1, 1, N, 1] counts the real tokens a query may
    use (keys 1..T after the start key 0), or None when every query uses all N.
    """
    n = k.shape[-2]
    if key_mask is None:
        ends = torch.arange(1, n + 1, device=k.device)[None, None, :, None] if causal else None
        return k, v, ends
    order = torch.argsort((~key_mask).to(torch.uint8), dim=-1, stable=True)[:, None, :, None]  # [B, 1, N, 1]
    k, v = k.gather(2, order.expand_as(k)), v.gather(2, order.expand_as(v))
    counts = key_mask.long().cumsum(-1) if causal else key_mask.long().sum(-1, keepdim=True).expand(-1, n)
    return k, v, counts[:, None, :, None]


CONTINUUM_STARTS = ("zero", "copy", "learn")


def continuum_start(k: Tensor, v: Tensor, start: str, start_kv: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """The virtual start token k_0, v_0 [B or 1, H, 1, D] of continuum softmax, given the joined real tokens k, v."""
    if start not in CONTINUUM_STARTS:
        raise ValueError(f"continuum_softmax: unknown start {start!r}; pick one of {', '.join(CONTINUUM_STARTS)}")
    if (start == "learn") != (start_kv is not None):
        raise ValueError(
            "continuum_softmax: start='learn' uses the layer's learned start token; "
            "build it with build_attention('continuum_softmax', ..., start='learn')"
        )
    if start == "zero":
        return torch.zeros_like(k[:, :, :1]), torch.zeros_like(v[:, :, :1])
    if start == "copy":
        return k[:, :, :1], v[:, :, :1]
    return (t.to(k.dtype)[None, :, None, :] for t in start_kv)


def phi2_series(x: Tensor, terms: int) -> Tensor:
    """sum_{j < terms} x^j / (j + 2)!, the Taylor series of phi2(x) = (e^x - 1 - x) / x^2 (Horner)."""
    out = torch.full_like(x, 1 / math.factorial(terms + 1))
    for j in reversed(range(terms - 1)):
        out = out * x + 1 / math.factorial(j + 2)
    return out


def segment_weights(e_near: Tensor, e_far: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """The weights segment [i, i + 1] gives v_i and v_{i+1}: int_0^1 (1 - u) e^{a(u)} du and int_0^1 u e^{a(u)} du.

    a(u) = a_i + u d, e_near = e^{a_i}, e_far = e^{a_{i+1}}. Integrating by parts gives
    (e_far - e_near (1 + d)) / d^2 = e_near phi2(d) and (e_near - e_far (1 - d)) / d^2 = e_far phi2(-d);
    those differences cancel for small |d|, where e_near, e_far times the Taylor series of phi2 are used.
    """
    small = d.abs() < 0.1
    d_big = torch.where(small, 1.0, d)
    inv_d2 = d_big.square().reciprocal()
    near = (e_far - e_near * (1 + d_big)) * inv_d2
    far = (e_near - e_far * (1 - d_big)) * inv_d2
    d_small = d[small]
    near = near.index_put((small,), e_near[small] * phi2_series(d_small, 12))
    far = far.index_put((small,), e_far[small] * phi2_series(-d_small, 12))
    return near, far


def continuum_softmax(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    start: str = "zero",
    start_kv: tuple[Tensor, Tensor] | None = None,
    **options,
) -> Tensor:
    """o_t = int_0^T e^{q_t.k_s / sqrt(D)} v_s ds / int_0^T e^{q_t.k_s / sqrt(D)} ds, k_s and v_s linear between tokens.

    Key 0 is the start token, keys 1..N the real tokens (padded ones left out, the rest joined in
    order); T = t + 1 for causal query t, else N. The integral is summed segment by segment in closed
    form (`segment_weight`), each segment j = [j, j + 1] giving weights to v_j and v_{j + 1}. A query
    with T = 0 (no real token yet) returns v_0, the value at s = 0. **options (query_chunk) change how,
    not what, the fast path computes.
    """
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    k, v, ends = join_real_tokens(k, v, causal, key_mask)
    k0, v0 = continuum_start(k, v, start, start_kv)
    keys, values = torch.cat([k0.expand_as(k[:, :, :1]), k], 2), torch.cat([v0.expand_as(v[:, :, :1]), v], 2)
    n = k.shape[-2]
    a = (q @ keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, N, N + 1]
    if ends is None:
        ends = torch.full((1, 1, 1, 1), n, device=q.device)
    key_ok = torch.arange(n + 1, device=q.device) <= ends
    a_ok = a.masked_fill(~key_ok, float("-inf"))
    e = (a_ok - a_ok.amax(-1, keepdim=True)).exp()  # 0 for keys past T, so nothing overflows
    d = a[..., 1:] - a[..., :-1]
    segment_ok = torch.arange(n, device=q.device) < ends  # segment j joins keys j and j + 1
    w_near, w_far = (torch.where(segment_ok, w, 0) for w in segment_weights(e[..., :-1], e[..., 1:], d))
    w = F.pad(w_near, (0, 1)) + F.pad(w_far, (1, 0))  # [B, H, N, N + 1]
    w = w + F.pad((ends == 0).to(w.dtype), (0, n))  # no segment at all: the value at s = 0
    return ((w @ values) / w.sum(-1, keepdim=True)).to(dtype)


def linformer(
    q: Tensor, k: Tensor, v: Tensor, proj_k: Tensor, proj_v: Tensor, *, key_mask: Tensor | None = None
) -> Tensor:
    """Wang et al. 2020, Eq. 7: softmax(q (E K)^T / sqrt(D)) (F V), (E K)_j = sum_n E[j, n] k_n over real tokens n.

    proj_k = E, proj_v = F [m, >= N]; the first N columns are used. -> [B, H, N, D].
    """
    dtype, (q, k, v, proj_k, proj_v) = q.dtype, upcast(q, k, v, proj_k, proj_v)
    n = k.shape[-2]
    real = (
        torch.ones(1, 1, 1, n, 1, dtype=k.dtype, device=k.device)
        if key_mask is None
        else key_mask[:, None, None, :, None].to(k.dtype)
    )
    k = torch.where(real > 0, k[:, :, None], 0)  # [B, H, 1, N, D]; padded tokens are 0, whatever they held
    v = torch.where(real > 0, v[:, :, None], 0)
    k_proj = (proj_k[:, :n, None] * k).sum(-2)  # [B, H, m, D]
    v_proj = (proj_v[:, :n, None] * v).sum(-2)
    return softmax(q, k_proj, v_proj).to(dtype)


def rope_matrices(theta: Tensor) -> Tensor:
    """Angles [N, D/2] -> rotation matrices [N, D, D] that turn each feature pair (j, j + D/2) by theta_j (RoPE,
    Su et al. 2021, in the "rotate half" pairing), written out as explicit 2 x 2 blocks."""
    n, half = theta.shape
    r = torch.zeros(n, 2 * half, 2 * half, dtype=theta.dtype, device=theta.device)
    j = torch.arange(half, device=theta.device)
    r[:, j, j], r[:, j, j + half] = theta.cos(), -theta.sin()
    r[:, j + half, j], r[:, j + half, j + half] = theta.sin(), theta.cos()
    return r


def rope(x: Tensor, theta: Tensor) -> Tensor:
    """x [B, H, N, D] with token n's features turned by rope_matrices(theta)[n]."""
    return torch.einsum("nde,bhne->bhnd", rope_matrices(theta).to(x.dtype), x)


def linear_elu_rope(
    q: Tensor, k: Tensor, v: Tensor, theta: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
) -> Tensor:
    """RoFormer (Su et al. 2021, sec. 3.4.4) linear attention with rotary positions, phi = elu + 1:
    o_i = sum_n (R_i phi(q_i)) . (R_n phi(k_n)) v_n / sum_n phi(q_i) . phi(k_n); theta [N, D/2] the angles."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    ok = allowed(q, k, causal, key_mask)
    num = kernel_attention(rope(fq, theta) @ rope(fk, theta).transpose(-1, -2), v, ok, normalise=False)
    den = kernel_attention(fq @ fk.transpose(-1, -2), torch.ones_like(v[..., :1]), ok, normalise=False)
    return (num / torch.where(den == 0, torch.ones_like(den), den)).to(dtype)


def patch_grid(n: int, width: int | None = None, prefix_tokens: int = 1) -> tuple[int, int]:
    """(rows, columns) of the patches among n tokens: those after the first `prefix_tokens`, row-major on `width`
    columns, by default ceil(sqrt(patches)) (models/vit.py's square grid of side^2 patches); a last row may be
    partial."""
    patches = max(n - prefix_tokens, 0)
    cols = width or (math.isqrt(patches - 1) + 1 if patches else 1)
    return -(-patches // cols), cols


def decayed(q: Tensor, k: Tensor, v: Tensor, distance: Tensor, ok: Tensor) -> Tensor:
    """o_i = sum_n gamma_h^distance(i, n) (q_i . k_n / sqrt(D)) v_n over the allowed keys, no normaliser, with
    RetNet's gamma_h = 1 - 2^(-5 - h) for head h; distance [N, N]."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    gamma = 1 - 2.0 ** (-5 - torch.arange(q.shape[1], dtype=q.dtype, device=q.device))
    sim = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) * gamma[:, None, None] ** distance.to(q.dtype)
    return kernel_attention(sim, v, ok, normalise=False).to(dtype)


def retention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """Sun et al. 2023 (RetNet), Eq. 5 without xPos: o_i = sum_n gamma_h^|i - n| (q_i . k_n / sqrt(D)) v_n, n <= i
    when causal."""
    i = torch.arange(q.shape[-2], device=q.device)
    return decayed(q, k, v, (i[:, None] - i[None]).abs(), allowed(q, k, causal, key_mask))


def retention_2d(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """Fan et al. 2024 (RMT), Manhattan self-attention: o_i = sum_n gamma_h^(|r_i - r_n| + |c_i - c_n|) (q_i . k_n /
    sqrt(D)) v_n, (r, c) a patch's place on `patch_grid` (options width, prefix_tokens); a prefix token (the class
    token) is at distance 0 from all."""
    if causal:
        raise ValueError("attention 'retention_2d' cannot be causal: its decay over the patch grid looks both ways")
    n, prefix = q.shape[-2], options.get("prefix_tokens", 1)
    _, cols = patch_grid(n, options.get("width"), prefix)
    p = torch.arange(n, device=q.device) - prefix
    r, c = p.div(cols, rounding_mode="floor"), p % cols
    distance = (r[:, None] - r[None]).abs() + (c[:, None] - c[None]).abs()
    distance = distance.masked_fill((p[:, None] < 0) | (p[None] < 0), 0)
    return decayed(q, k, v, distance, allowed(q, k, False, key_mask))


def gated(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
) -> Tensor:
    """Data-dependent decay (models/attention/gated.py): o_i = sum_n sum_d q_id k_nd M_ind v_n / sqrt(D) with
    M_ind = prod_{t=n+1..i} a_td for n <= i and prod_{t=i+1..n} a_td for n > i (LION's reversed pass), n <= i when
    causal; g = log a [B, H, N, 1] (ssd, Dao & Gu 2024) or [B, H, N, D] (gla, Yang et al. 2024). A padded token's
    decay is 1: it leaves the sequence."""
    dtype, (q, k, v, g) = q.dtype, upcast(q, k, v, g)
    ok = allowed(q, k, causal, key_mask)
    if key_mask is not None:
        g = g.masked_fill(~key_mask[:, None, :, None], 0)
    total = g.cumsum(2)  # [B, H, N, 1 or D]: log prod_{t <= i} a_t
    diff = total[:, :, :, None] - total[:, :, None, :]  # [B, H, N, N, 1 or D]: log prod_{t=n+1..i} a_t for n <= i
    n = q.shape[-2]
    lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()[..., None]
    decay = torch.where(lower, diff, -diff).exp()
    sim = torch.einsum("bhid,bhnd,bhind->bhin", q, k, decay.expand(*diff.shape[:-1], q.shape[-1]))
    return kernel_attention(sim / math.sqrt(q.shape[-1]), v, ok, normalise=False).to(dtype)
