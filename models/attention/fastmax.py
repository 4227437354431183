"""fastmax_released: the attention of the first author's released CLIP code, re-implemented (not copied) and set
against the paper's Eq. 7 (Gerami, Madani, Duraiswami 2026; our `linear_affine_nodenom`).

Read: github.com/armingerami/Fastmax, commit c73e1c2fc455be815f8f075aa5531dfca5e12393 (2026-03-12),
Simplefied/transformer.py, a copy of open_clip's src/open_clip/transformer.py with `fastmax_function` (lines 13-57)
added and called from `ResidualAttentionBlock` (lines 289-358), the default block of both towers (Transformer,
lines 516-636, batch_first=True, so x is [B, N, C] there). Its CLIP training uses this one PyTorch function (first
order, normalize=1, temperature=1, the defaults); the CUDA kernels in fastmax/ and the litgpt copy's
`fastmax_function` (p = 1 or 2, with a denominator) are not what it calls. armingerami/fastmax and
armingerami/reproducing_fastmax_results hold the earlier FAST code and no CLIP.

What the released block computes, step by step, against Eq. 7, o_i = sum_n ((1 + q^_i.k^_n) / 2) v_n:

1. q = k = v = ln_1(x) (lines 332-336, 356): `attention()` calls fastmax_function(q_x, q_x, q_x, n_head) on the
   LayerNorm output. The block's nn.MultiheadAttention (line 306) is built but never used on this path: no q, k, v
   projection and no output projection; the result goes straight to the residual (ls_1 is the identity unless
   ls_init_value is set). Eq. 7 sits in a block with W_q, W_k, W_v and W_o.
2. Heads without a transpose (lines 27-29): [B, N, C] is reshaped to [B, H, N, D] directly. Read in memory order,
   the tokens' D-wide slices (token t, slice j at row t H + j) are cut into H runs of N consecutive rows, and run h
   is "head" h. So a head holds about N / H consecutive tokens with all of their H slices, not slice h of every
   token: a token attends only to the tokens of its own run (and a token whose slices straddle two runs links
   them), and the query slice j of one token meets key slices j' != j of its neighbours. ViT-B/16 (N = 197,
   H = 12): runs of 197 slices, about 16 tokens; in every layer the class token sees patches 1-15 and 5 of the 12
   slices of patch 16. The output is reshaped back the same way (line 57), so each row returns to its token and
   slice.
3. Normalisation (lines 31-39): q_n / max_m |q_m|_2 with the L2 norm over the D features and the max over the N
   rows of the (regrouped) head, one scale per batch row and head; the same for k. Eq. 7 L2-normalises each row,
   so every q^_i has norm 1; here only the longest row does and the rest are shorter (|q~.k~| <= 1 still, weights
   in [0, 2]). No epsilon: a head of all-zero rows is 0 / 0 there; here the max is floored at 1e-12
   (F.normalize's floor), giving that head the plain sum of v.
4. Constant (lines 44-54): o_i = sum_n v_n + q~_i (sum_n k~_n^T v_n), i.e. o_i = sum_n (1 + q~_i.k~_n) v_n: a0 = 1,
   a1 = 1 / temperature = 1, no 1/2 (Eq. 7 halves the weights) and, as in Eq. 7, no denominator.
5. No mask: fastmax_function takes none, so open_clip's causal text mask (and any padding mask) is dropped; the
   released text tower attends both ways. This registry's text tower is causal, so fastmax_released goes in the
   image tower only (causal is refused, as for `efficient`).

Here: `fastmax_released(q, k, v)` on [B, H, N, D] in the usual split (the layout every registry entry receives)
first merges the heads back into [B, N, C] and regroups them as in step 2 (`released_heads`), then computes
steps 3-4 in O(N D^2), accumulated in fp32 (the released code runs in the autocast dtype). On the merged input it
equals the released fastmax_function(x_q, x_k, x_v, H). The layer's option `projections` says what feeds it:
True (default): q, k, v from the block's in_proj and out_proj after, like every registry entry (so the registry's
tests and the softmax checkpoint's projections apply); False: the released block, q = k = v = ln_1(x), no
projections, and the layer has no parameters. Additions for the registry's contract: a key mask (padded keys and
queries leave every sum and max, the regrouping runs over each row's real tokens in order, as if the padding were
cut off; padded queries get 0) and RoPE (q and k turned per token before the regrouping); the released code has
neither. `reference` is the same math as an explicit N x N matrix per regrouped head.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.base import Attention, autocast_off
from models.attention.ops.common import check_key_mask, compute_dtype
from models.attention.registry import register_attention
from models.attention.rope import rotate

WHY_NOT_CAUSAL = (
    "the released code drops the causal mask, and its scale (the longest q and k over all tokens) and its heads of "
    "consecutive tokens reach future tokens"
)


def released_heads(x: Tensor) -> Tensor:
    """[B, H, N, D] in the usual split (head h = features h D .. h D + D - 1 of every token) -> [B, H, N, D] as the
    released code forms heads: the heads merged to [B, N, C], then reshaped to [B, H, N, D] without a transpose."""
    B, H, N, D = x.shape
    return x.transpose(1, 2).reshape(B, H, N, D)


def usual_heads(x: Tensor) -> Tensor:
    """The inverse of `released_heads`: released [B, H, N, D] -> [B, N, C] as it lies in memory -> the usual split."""
    B, H, N, D = x.shape
    return x.reshape(B, N, H, D).transpose(1, 2)


def longest(x: Tensor) -> Tensor:
    """[B, H, N, D] -> [B, H, 1, 1]: max over the rows of the row's L2 norm, floored at 1e-12."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).amax(-2, keepdim=True).clamp_min(1e-12)


def unmasked(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Steps 2-4 of the module docstring on all N tokens, O(N D^2): [B, H, N, D] x3 -> [B, H, N, D] in fp32/fp64."""
    q, k, v = (released_heads(t.to(compute_dtype(q))) for t in (q, k, v))
    q, k = q / longest(q), k / longest(k)
    return usual_heads(q @ (k.transpose(-1, -2) @ v) + v.sum(-2, keepdim=True))


def on_real_tokens(fn, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor) -> Tensor:
    """`fn` on each batch row's real tokens in their order, as if the padding were cut off (rows with the same count
    of real tokens run together); padded queries get 0."""
    B, H, N, D = q.shape
    order = torch.argsort((~key_mask).to(torch.uint8), dim=-1, stable=True)[:, None, :, None].expand(B, H, N, D)
    q, k, v = (t.gather(2, order) for t in (q, k, v))
    counts = key_mask.sum(-1)
    out = torch.zeros(B, H, N, D, dtype=compute_dtype(q), device=q.device)
    for count in counts.unique().tolist():
        if count:
            rows = (counts == count).nonzero()[:, 0]
            part = fn(q[rows, :, :count], k[rows, :, :count], v[rows, :, :count])
            out = out.index_copy(0, rows, torch.nn.functional.pad(part, (0, 0, 0, N - count)))
    return torch.zeros_like(out).scatter(2, order, out)


def fastmax_released(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
) -> Tensor:
    """The released code's attention (module docstring): o = sum_n (1 + q~_i.k~_n) v_n per released head, q~, k~
    scaled by the longest row of their head; [B, H, N, D] x3 in the usual split -> [B, H, N, D] in the dtype of q."""
    if causal:
        raise ValueError(f"attention 'fastmax_released' cannot be causal: {WHY_NOT_CAUSAL}")
    check_key_mask(key_mask, q)
    out = unmasked(q, k, v) if key_mask is None else on_real_tokens(unmasked, q, k, v, key_mask)
    return out.to(q.dtype)


def quadratic(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The explicit [N, N] weights 1 + q_i.k_n / (max_m |q_m| max_m |k_m|) per released head, times v."""
    q, k, v = (released_heads(t) for t in (q, k, v))
    weights = 1 + (q @ k.transpose(-1, -2)) / (longest(q) * longest(k))  # [B, H, N, N]
    return usual_heads(weights @ v)


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """The naive O(N^2) definition in fp32 (fp64 stays fp64), one batch row at a time over its real tokens."""
    if causal:
        raise ValueError(f"attention 'fastmax_released' cannot be causal: {WHY_NOT_CAUSAL}")
    dtype = q.dtype
    q, k, v = (t.to(compute_dtype(q)) for t in (q, k, v))
    if key_mask is None:
        return quadratic(q, k, v).to(dtype)
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        real = key_mask[b].nonzero()[:, 0]
        if len(real):
            out[b, :, real] = quadratic(q[b : b + 1, :, real], k[b : b + 1, :, real], v[b : b + 1, :, real])[0]
    return out.to(dtype)


@register_attention("fastmax_released")
class FastmaxReleasedAttention(Attention):
    """The first author's released CLIP attention (module docstring); option `projections` (default True): False is
    the released block, q = k = v = the block's LayerNorm output and no in/out projection (no parameters)."""

    supports_causal = False
    why_not_causal = WHY_NOT_CAUSAL
    function = staticmethod(fastmax_released)
    reference = staticmethod(reference)

    def __init__(self, dim: int, num_heads: int, *, causal=False, qkv_bias=True, projections: bool = True, **options):
        if options:
            raise ValueError(
                f"attention 'fastmax_released': unknown options {', '.join(sorted(options))}; it takes projections"
            )
        if not isinstance(projections, bool):
            raise ValueError(f"attention 'fastmax_released': option projections={projections!r} must be true or false")
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias)
        self.projections = projections
        if not projections:
            del self.in_proj_weight, self.in_proj_bias, self.out_proj

    def enable_qk_norm(self) -> None:
        if not self.projections:
            raise ValueError(
                "attention 'fastmax_released' with projections=false has no q and k to normalise: drop model.qk_norm"
            )
        super().enable_qk_norm()

    def forward(self, x: Tensor, key_mask: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """x [B, N, C] -> [B, N, C]; without projections x itself is q, k and v (RoPE turns q and k)."""
        if self.projections:
            return super().forward(x, key_mask, rope)
        B, N, C = x.shape
        heads = x.view(B, N, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, N, D]
        qk = heads if rope is None else rotate(heads, rope)
        with autocast_off(x.device.type, True):
            o = self.attention(qk, qk, heads, key_mask)
        return o.transpose(1, 2).reshape(B, N, C)
