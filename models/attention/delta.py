"""The delta rule (Schlag et al. 2021; DeltaNet as parallelised by Yang et al. 2024): a fast-weight state that each
token corrects towards its own value instead of only adding to it.

    S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T        S [D_v, D_k], S_0 = 0
    o_t = S_t q_t

with q and k L2-normalised per head (so each correction is a projection of strength beta_t <= 1, which keeps the
state bounded) and beta_t = sigmoid(v_t W_b + b_b) in (0, 1), one per head and token, from the layer's own projection
of all heads' values of the token (as ssd and gla take their decays: models/attention/gated.py says why v). Causal
only: the state at t depends on the order of every earlier correction, and no sound two-sided form is known (a
forward plus a reversed pass would be two different recurrences, not one attention), so the registry refuses it in
the image tower in one line. Padded tokens (key_mask False) get k = 0: their correction is zero.

Reference (`recurrent`): the recurrence itself, token by token. Fast path (`chunked`): Yang et al.'s
chunkwise form. Within a chunk of C tokens, with S the state before it, the corrections u_t = beta_t (v_t - S_{t-1}
k_t) solve the unit lower-triangular system (I + diag(beta) StrictTril(K K^T)) U = diag(beta) (V - K S^T), so

    W = T K, U' = T V with T = (I + diag(beta) StrictTril(K K^T))^-1 diag(beta)   (all chunks at once)
    U = U' - W S^T,  O = Q S^T + (Q K^T masked to j <= i) U,  S <- S + U^T K        (a loop over chunks)

O(N) memory (the chunks' C x C matrices and a D x D state per chunk). One chunk (unset chunk_size, up to 128
tokens: the text tower) has no state before it, so W is not needed and O = (Q K^T masked) U.

`Whole`, that one chunk without a key mask (the text tower's call), is one autograd Function from the beta logits to
the output with its backward written out: at 77 tokens the work is a few [N, N] matrices per head and what costs is
the number of ops, each with its fixed dispatch and autograd cost; built from autograd ops (normalisation, beta, the
triangular system, the causal product, the layout changes) the form is about three dozen ops each way, as one
Function a dozen large ops forward and two dozen backward, none recorded (about 20% less time forward + backward at
77 tokens on 2 cores). Its backward: dU = tril(Q^ K^T)^T dO; G = (I + A)^-T dU is d(diag(beta) V) with A =
StrictTril(diag(beta) K^ K^T); dA = -StrictTril(G U^T), which reaches beta (dbeta_i = G_i . v_i + sum_j dA_ij k^_i .
k^_j) and K^ K^T; the normalisations' Jacobians last. On the CPU in fp32 (and bf16, upcast) the same one chunk runs
on the fused C kernel instead (ops/causal_cpu.py's `delta`, causal_cpu.c's delta_forward / delta_backward: beta =
sigmoid of the logits read where the projection wrote them, [B, N, H], the normalisations, the forward substitution
for U, the causal product, and the backward above with a back substitution for G and dL/dlogits, in register tiles of
4 rows, heads over threads): forward + backward at 77 tokens (B = 1, H = 6, D = 64) about 1.5 ms against Whole's
3.6 ms on a 2-core AVX2 EPYC. With a key mask the one chunk's O is a causal linear attention
on raw features, on the CPU in fp32 the fused C kernel (decay.raw_causal, ops/causal_cpu.c).
flash-linear-attention's `fla.ops.delta_rule.chunk_delta_rule` computes the same but refuses fp32, the compute dtype
here, so deltanet keeps these forms on CUDA too (its fp32 kernels match `recurrent` to 1e-6
under TRITON_INTERPRET=1, unchecked on a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention.base import Attention
from models.attention.decay import check_options, chunk_for, raw_causal, raw_kernel_takes
from models.attention.gated import linear, tokens
from models.attention.ops import causal_cpu
from models.attention.ops.common import check_key_mask, compute_dtype
from models.attention.registry import register_attention


def normalised(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, key_mask: Tensor | None):
    """q^, k^ (L2 per head), v, beta in the compute dtype; padded keys' k zeroed."""
    check_key_mask(key_mask, q)
    dtype = compute_dtype(q)
    q, k, v, beta = (F.normalize(q.to(dtype), dim=-1), F.normalize(k.to(dtype), dim=-1), v.to(dtype), beta.to(dtype))
    if key_mask is not None:
        k = k.masked_fill(~key_mask[:, None, :, None], 0)
    return q, k, v, beta


def recurrent(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, key_mask: Tensor | None = None) -> Tensor:
    """The definition, token by token: q, k, v [B, H, N, D], beta [B, H, N] -> [B, H, N, D] in the dtype of q."""
    dtype, (q, k, v, beta) = q.dtype, normalised(q, k, v, beta, key_mask)
    B, H, N, D = q.shape
    state, out = q.new_zeros(B, H, v.shape[-1], D), []
    for t in range(N):
        o, state = delta_step(state, q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t])
        out.append(o)
    return torch.stack(out, 2).to(dtype)


def delta_step(state: Tensor, q: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the rule on normalised q, k and v [B, H, D], beta [B, H]: the state S [B, H, D_v, D_k] after
    the token's correction and o = S q [B, H, D_v]."""
    correction = beta[..., None] * (v - (state @ k[..., None])[..., 0])
    state = state + correction[..., None] * k[..., None, :]
    return (state @ q[..., None])[..., 0], state


def chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    *,
    key_mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """The module docstring's chunkwise form: q, k, v [B, H, N, D], beta [B, H, N] -> [B, H, N, D]; chunks of
    `chunk_size` tokens (unset: 64, or the whole sequence up to 128 tokens, decay.chunk_for)."""
    dtype, (q, k, v, beta) = q.dtype, normalised(q, k, v, beta, key_mask)
    N = q.shape[2]
    C = min(chunk_for(N, chunk_size, 64), N)
    chunks, pad = -(-N // C), -N % C
    q, k, v = (F.pad(t, (0, 0, 0, pad)).unflatten(2, (chunks, C)) for t in (q, k, v))
    beta = F.pad(beta, (0, pad)).unflatten(2, (chunks, C))[..., None]  # [B, H, chunks, C, 1]
    i = torch.arange(C, device=q.device)
    strict, inclusive = i[:, None] > i[None], i[:, None] >= i[None]
    system = torch.eye(C, dtype=q.dtype, device=q.device) + beta * (k @ k.transpose(-1, -2)) * strict
    u_v = torch.linalg.solve_triangular(system, beta * v, upper=False, unitriangular=True)  # T V
    if chunks == 1:  # no state before the chunk: U = T V, O = (Q K^T masked) U, W = T K not needed
        if raw_kernel_takes(q):
            return raw_causal(q[:, :, 0], k[:, :, 0], u_v[:, :, 0])[:, :, :N].to(dtype)
        return ((q @ k.transpose(-1, -2)) * inclusive @ u_v).flatten(2, 3)[:, :, :N].to(dtype)
    w = torch.linalg.solve_triangular(system, beta * k, upper=False, unitriangular=True)  # T K
    scores = (q @ k.transpose(-1, -2)) * inclusive  # [B, H, chunks, C, C]
    state, out = q.new_zeros(*q.shape[:2], v.shape[-1], q.shape[-1]), []
    for c in range(chunks):
        u = u_v[:, :, c] - w[:, :, c] @ state.transpose(-1, -2)  # [B, H, C, Dv]
        out.append(q[:, :, c] @ state.transpose(-1, -2) + scores[:, :, c] @ u)
        state = state + u.transpose(-1, -2) @ k[:, :, c]
    return torch.stack(out, 2).flatten(2, 3)[:, :, :N].to(dtype)


class Whole(torch.autograd.Function):
    """forward(q, k, v [B, H, N, D], x [B, N, H]) -> o [B, H, N, D]: the delta rule over the whole sequence
    in one chunk (the module docstring's `Whole`)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, x: Tensor):
        rq, rk = (1 / t.norm(dim=-1, keepdim=True).clamp_min_(1e-12) for t in (q, k))
        qn, kn = q * rq, k * rk
        beta = torch.sigmoid(x).transpose(1, 2)[..., None]  # [B, H, N, 1]
        sk = kn @ kn.transpose(-1, -2)
        a = (sk * beta).tril_(-1)  # the unit diagonal is implied (unitriangular)
        u = torch.linalg.solve_triangular(a, beta * v, upper=False, unitriangular=True)
        p = (qn @ kn.transpose(-1, -2)).tril_()
        ctx.save_for_backward(qn, kn, v, rq, rk, beta, sk, a, u, p)
        return p @ u

    @staticmethod
    def backward(ctx, grad: Tensor):
        qn, kn, v, rq, rk, beta, sk, a, u, p = ctx.saved_tensors
        du = p.transpose(-1, -2) @ grad
        dp = (grad @ u.transpose(-1, -2)).tril_()
        dqn, dkn = dp @ kn, dp.transpose(-1, -2) @ qn
        gv = torch.linalg.solve_triangular(a.transpose(-1, -2), du, upper=True, unitriangular=True)
        da = (gv @ u.transpose(-1, -2)).tril_(-1).neg_()  # dL/dA on its strict lower triangle
        dbeta = (gv * v).sum(-1, keepdim=True) + (da * sk).sum(-1, keepdim=True)
        dsk = da * beta
        dkn = dkn + (dsk + dsk.transpose(-1, -2)) @ kn
        dq = (dqn - qn * (dqn * qn).sum(-1, keepdim=True)) * rq
        dk = (dkn - kn * (dkn * kn).sum(-1, keepdim=True)) * rk
        dx = (dbeta * beta * (1 - beta))[..., 0].transpose(1, 2)
        return dq, dk, beta * gv, dx


@register_attention("deltanet")
class DeltaNetAttention(Attention):
    """Schlag et al. 2021 / Yang et al. 2024 (DeltaNet): the delta rule with beta_t = sigmoid(v_t W_b + b_b) per head
    and token; q, k L2-normalised; causal only; option chunk_size (64; unset, the whole sequence up to 128 tokens)."""

    time_power = 1

    supports_bidirectional = False
    supports_recurrent = True
    why_not_bidirectional = (
        "the delta rule's state depends on the order of every earlier correction; it has no two-sided form"
    )

    def __init__(self, dim: int, num_heads: int, *, causal: bool = True, qkv_bias: bool = True, **options):
        check_options(self.name, options, ("chunk_size",))
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias)
        self.chunk_size = options.get("chunk_size")
        self.beta_proj = nn.Linear(dim, num_heads)

    def beta(self, v: Tensor) -> Tensor:
        """v [B, H, N, D] -> beta [B, H, N] in (0, 1)."""
        return torch.sigmoid(linear(tokens(v), self.beta_proj)).transpose(1, 2)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        if key_mask is None and chunk_for(q.shape[2], self.chunk_size, 64) >= q.shape[2]:
            dtype = compute_dtype(q)  # one chunk: the whole sequence as one Function (Whole) or C kernel
            logits = linear(tokens(v), self.beta_proj)  # [B, N, H]
            if raw_kernel_takes(q):
                return causal_cpu.delta(q, k, v, logits).to(q.dtype)
            return Whole.apply(q.to(dtype), k.to(dtype), v.to(dtype), logits).to(q.dtype)
        return chunked(q, k, v, self.beta(v), key_mask=key_mask, chunk_size=self.chunk_size)

    def attention_reference(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        return recurrent(q, k, v, self.beta(v), key_mask=key_mask)

    def state_shapes(self) -> list[tuple[int, ...]]:
        return [(self.num_heads, self.head_dim, self.head_dim)]

    def token_step(self, q: Tensor, k: Tensor, v: Tensor, state: tuple, table) -> tuple[Tensor, tuple]:
        """beta from the token's own v, as the chunked forward reads it; q, k normalised as there."""
        q, k, v, beta = normalised(q, k, v, self.beta(v), None)
        o, s = delta_step(state[0], q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0])
        return o[:, :, None], (s,)
