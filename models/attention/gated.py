"""Data-dependent decay: Mamba-2's SSD (Dao & Gu 2024) and gated linear attention (Yang et al. 2024, GLA).

    ssd  o_i = sum_j (prod_{t=j+1..i} a_t) (q_i . k_j / sqrt(D)) v_j,         a_t in (0, 1), one per head and token
    gla  o_i = sum_j sum_d q_id k_jd (prod_{t=j+1..i} G_td) v_j / sqrt(D),  G_t in (0, 1)^D, one per key feature

over j <= i when causal; that is the recurrence S_t = diag(G_t) S_{t-1} + k_t v_t^T, o_t = q_t S_t / sqrt(D) (a_t
repeated over the D features for ssd). q is scaled by 1 / sqrt(D), as retention does here and fla's kernels do by
default. There is no normaliser and no output gate or norm (the block does pre-LN and out_proj straight after).
Two-sided (images): LION's construction (Afzal et al. 2025, LION-S), the causal pass plus the same pass on the
reversed tokens over j > i with decays prod_{t=i+1..j}, the diagonal counted once; the matrix is then
exp(-|L_i - L_j|) with L_t = sum_{s<=t} log a_s, which for a fixed a is retention's gamma^|i - j|.

Where the decays come from: the layer's interface hands the token mixing q, k, v [B, H, N, D] (base.Attention), so
each layer reads its decays from v, all heads' values of a token side by side ([C] = x_t W_v^T + b_v, a linear map
of x_t; q and k are left out because RoPE turns them first, which would put positions into the decay):

    ssd  log a_t = -softplus(v_t W_a + b_a)                    W_a [C, H] (`decay_proj`); Mamba-2's a = exp(-dt A)
                                                               with A = 1 and dt = softplus(.); b_a makes dt log-spaced
                                                               over the heads in [0.001, 0.1], Mamba-2's dt range
    gla  log G_t = logsigmoid(v_t W_1 W_2 + b) / temperature   W_1 [C, r], W_2 [r, C] (`gate_down`, `gate_up`), GLA's
                                                               low-rank gate, r = `gate_rank` = 16, temperature 16

Mamba-2's other parts (its own B, C per group, the dt scaling of x, the D skip, the convolution) are not here: q, k,
v are the block's projections as for every variant. Padded tokens (key_mask False) leave the sequence: their k and v
are zeroed and their decay is 1, so a padded input gives exactly the input without the padding.

Fast path (`chunk_scan`), O(N) in memory, never N x N: chunks of `chunk_size` tokens (ssd 64, gla 32; unset, a
sequence of up to decay.WHOLE = 128 tokens is one chunk, with no state: the text tower's 77 tokens); inside a
chunk the decayed [C, C] matrix from cumulative log decays b (b_i the log decay from the chunk's start through token
i); across chunks a D x D state carried in a loop, decayed by the chunk's total. ssd's matrix is exp(b_i - b_j)
masked before exp, every exponent <= 0. gla's per-feature decays factorise, (q_i e^(b_i)) . (k_j e^(-b_j)), one
matmul as GLA's chunk form (Yang et al. 2024, sec. 4.1), as long as no chunk decays by more than e^-LIMIT (LIMIT =
30) on any feature, so e^(-b_j) <= e^30 stays far inside fp32; when some chunk does, the call takes chunks of
`exact_chunk` = 8 tokens and the exact [C, C, D] decays, every exponent <= 0 (the same numbers, more elementwise
work). Memory: N C for the chunks' matrices (the exact form: N C D), N D^2 / C for the states.

Causal, one chunk, on the CPU in fp32 (the text tower's 77 tokens): the same factorisation for both families,
(q_i e^(b_i)) . (k_j e^(-b_j)) with b the cumulative log decay from the first token, on the fused C kernel of the
linear ops' causal forms (ops/causal_cpu.c's decayed_forward / decayed_backward). The layer hands it its gates as
its projection wrote them, [B, N, H E] (`gates`, `gate_kernel`): the kernel takes the log decays factor *
logsigmoid(sign * x) (ssd: sign -1, factor 1; gla: sign 1, factor 1 / temperature), their cumsum and e^b, the
1 / sqrt(D) of q and the key mask itself, does the lower triangle in register tiles and returns dL/dx: one kernel
call each way where the PyTorch form is a dozen small ops (the gates' transpose to heads and its copy, logsigmoid,
the factor, the cumsum and exponential, the scaling of q, each with its backward), whose fixed cost sets the time at
77 tokens. Only while the whole sequence decays by at most e^-LIMIT on every feature (`factorisable`; the kernel
checks it and writes nothing otherwise); else, and in fp64, on other devices, or with an explicit chunk_size below N,
`chunk_scan`.

On CUDA flash-linear-attention's chunk kernels replace `chunk_scan` in `gated_attention` (ops/fla_kernels.py, when fla
imports): gla `fla.ops.gla.chunk_gla(q, k, v, g=log G)`, ssd `fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=log a)`
(fla maps Mamba-2's SSD to simple_gla), on [B, N, H, D] with scale D^-0.5; two-sided as a second call on the reversed
tokens and shifted decays, less the diagonal (q_i . k_i) v_i / sqrt(D) that both calls count.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import reference
from models.attention.base import Attention, scale
from models.attention.decay import check_options, chunk_for, decayed_step, prepare, raw_kernel_takes
from models.attention.ops import causal_cpu, fla_kernels
from models.attention.ops.common import compute_dtype
from models.attention.registry import register_attention

LIMIT = 30.0  # the steepest decay inside a chunk (as -log) that gla's factorised form takes: e^30 is far from fp32's


def chunk_scan(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, chunk_size: int, strict: bool, exact_chunk: int = 8
) -> Tensor:
    """o_i = sum_{j <= i} (j < i when `strict`) sum_d q_id k_jd exp(L_id - L_jd) v_j, L the cumulative sum of
    log_decay over the tokens: q, k [B, H, N, D], v [B, H, N, E], log_decay [B, H, N, 1 or D] (<= 0) -> [B, H, N, E].
    Per-feature decays (gla) whose chunks decay by more than e^-LIMIT take chunks of `exact_chunk` tokens and the
    exact [C, C, D] decays."""
    N = q.shape[2]
    C = min(chunk_size, N)
    per_feature = log_decay.shape[-1] > 1
    exact = per_feature and not factorisable(log_decay, C)
    if exact:
        C = min(exact_chunk, N)
    chunks, pad = -(-N // C), -N % C
    q, k, v, g = (F.pad(t, (0, 0, 0, pad)).unflatten(2, (chunks, C)) for t in (q, k, v, log_decay))
    b = g.cumsum(3)  # [B, H, chunks, C, 1 or D]: log decay from the chunk's start through token i
    i = torch.arange(C, device=q.device)
    keep = (i[:, None] > i[None]) if strict else (i[:, None] >= i[None])
    if exact:  # exp(b_i - b_j) per feature, masked before exp so no exponent is positive
        decay = torch.where(keep[:, :, None], b[..., :, None, :] - b[..., None, :, :], float("-inf")).exp()
        scores = torch.einsum("...id,...jd,...ijd->...ij", q, k, decay)
    elif per_feature:  # q_i e^(b_i) . k_j e^(-b_j): e^(-b_j) <= e^LIMIT (factorisable)
        scores = torch.where(keep, (q * b.exp()) @ (k * (-b).exp()).transpose(-1, -2), 0)
    else:
        decay = torch.where(keep, b - b.transpose(-1, -2), float("-inf")).exp()  # [B, H, chunks, C, C]
        scores = (q @ k.transpose(-1, -2)) * decay
    out = scores @ v
    if chunks == 1:  # no earlier chunk: no state to carry
        return out.flatten(2, 3)[:, :, :N]
    # across chunks: each chunk's keys as one D x E state, decayed to the chunk's last token
    last = b[..., -1:, :]  # [B, H, chunks, 1, 1 or D]
    kv = (k * (last - b).exp()).transpose(-1, -2) @ v  # [B, H, chunks, D, E]
    state, states = torch.zeros_like(kv[:, :, 0]), []
    for kv_chunk, total in zip(kv.unbind(2), last.exp().transpose(-1, -2).unbind(2)):
        states.append(state)
        state = state * total + kv_chunk
    out = out + (q * b.exp()) @ torch.stack(states, 2)
    return out.flatten(2, 3)[:, :, :N]


def factorisable(log_decay: Tensor, C: int) -> bool:
    """Whether every chunk of C tokens decays by at most e^-LIMIT on every feature (log_decay [B, H, N, D], <= 0).
    Tensors without values (the meta device, where models.counts counts FLOPs) take the factorised form."""
    if log_decay.is_meta:
        return True
    N = log_decay.shape[2]
    if C >= N:  # one chunk: the sequence's total
        return bool(log_decay.detach().sum(2).min() >= -LIMIT)
    totals = F.pad(log_decay.detach(), (0, 0, 0, -N % C)).unflatten(2, (-(-N // C), C)).sum(3)
    return bool(totals.min() >= -LIMIT)


def kernel_takes(q: Tensor, log_decay: Tensor, chunk: int, causal: bool) -> bool:
    """Whether the causal one-chunk form goes to the C kernel (the module docstring says when)."""
    return causal and chunk >= q.shape[2] and raw_kernel_takes(q) and factorisable(log_decay, q.shape[2])


def gate_kernel(
    q: Tensor, k: Tensor, v: Tensor, x: Tensor, key_mask: Tensor | None, gates: causal_cpu.Gates
) -> Tensor | None:
    """The layer's causal one-chunk form on causal_cpu.c from its gates x [B, N, H E] as its projection wrote them
    (the kernel takes the log decays, q's scale and the key mask itself: causal_cpu.gated); None when some head
    decays by more than e^-LIMIT over the sequence (not factorisable), for the caller's chunked form."""
    return causal_cpu.gated(q, k, v, x, key_mask, gates, LIMIT)


def causal_kernel(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor) -> Tensor:
    """sum_{j <= i} (q_i e^(b_i)) . (k_j e^(-b_j)) v_j on causal_cpu.c, b = cumsum(log_decay) over the tokens (the
    kernel takes the cumsum and e^b itself: causal_cpu.decayed); q already scaled, padded keys' k, v zeroed (so no key
    mask), [B, H, N, D] -> [B, H, N, D] fp32."""
    return causal_cpu.decayed(q, k, v, log_decay)


def gated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    causal=False,
    key_mask: Tensor | None = None,
    chunk_size: int | None = None,
    exact_chunk=8,
) -> Tensor:
    """The module docstring's ssd (g = log a [B, H, N, 1]) or gla (g = log G [B, H, N, D]) on q, k, v [B, H, N, D]
    -> [B, H, N, D] in the dtype of q; two-sided unless `causal`. Padded tokens' k, v are zeroed, their decay is 1."""
    dtype, (q, k, v) = q.dtype, prepare(q, k, v, key_mask)
    g = g.to(q.dtype)
    if key_mask is not None:
        g = g.masked_fill(~key_mask[:, None, :, None], 0)
    if fla_kernels.use_fla(q):
        return fla_kernels.decayed(q, k, v, g, two_sided=not causal).to(dtype)
    chunk = chunk_for(q.shape[2], chunk_size, 64)
    if kernel_takes(q, g, chunk, causal):
        return causal_kernel(q, k, v, g).to(dtype)
    out = chunk_scan(q, k, v, g, chunk, strict=False, exact_chunk=exact_chunk)
    if not causal:
        # reversed tokens: token t' = N - 1 - t carries the decay of t + 1, so key j > i is decayed by a_{i+1..j}
        g_reversed = F.pad(g.flip(2)[:, :, :-1], (0, 0, 1, 0))
        reversed_tokens = (q.flip(2), k.flip(2), v.flip(2), g_reversed)
        out = out + chunk_scan(*reversed_tokens, chunk, strict=True, exact_chunk=exact_chunk).flip(2)
    return out.to(dtype)


def tokens(v: Tensor) -> Tensor:
    """v [B, H, N, D] -> [B, N, H * D] in the compute dtype: every head's values of a token side by side."""
    B, H, N, D = v.shape
    return v.to(compute_dtype(v)).transpose(1, 2).reshape(B, N, H * D)


def linear(x: Tensor, layer: nn.Linear) -> Tensor:
    bias = None if layer.bias is None else layer.bias.to(x.dtype)
    return F.linear(x, layer.weight.to(x.dtype), bias)


class GatedAttention(Attention):
    """A layer whose decays come from its own projection of v: log decays factor * logsigmoid(sign * gates(v)); it
    takes the options in `known`."""

    time_power = 1

    known: tuple[str, ...] = ("chunk_size",)
    default_chunk = 64
    supports_recurrent = True

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, qkv_bias: bool = True, **options):
        check_options(self.name, options, self.known)
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias)
        self.chunk_size = options.get("chunk_size")  # unset: decay.chunk_for's choice, default_chunk beyond WHOLE
        self.exact_chunk = options.get("exact_chunk", 8)

    sign = 1  # log decay = factor * logsigmoid(sign * gates)
    factor = 1.0

    def gates(self, v: Tensor) -> Tensor:
        """v [B, H, N, D] -> the gates [B, N, H E] (E = 1 or D) in the compute dtype, as the projection writes them."""
        raise NotImplementedError

    def log_decay(self, v: Tensor) -> Tensor:
        """v [B, H, N, D] -> log decays [B, H, N, 1 or D], <= 0, in the compute dtype."""
        x = self.gates(v)
        g = F.logsigmoid(x if self.sign > 0 else -x)
        return (g if self.factor == 1 else g * self.factor).unflatten(2, (self.num_heads, -1)).transpose(1, 2)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        chunk = chunk_for(q.shape[2], self.chunk_size, self.default_chunk)
        if self.causal and chunk >= q.shape[2] and raw_kernel_takes(q):
            read = causal_cpu.Gates(self.num_heads, self.sign, self.factor, scale(q.shape[-1]))
            out = gate_kernel(q, k, v, self.gates(v), key_mask, read)
            if out is not None:
                return out.to(q.dtype)
        g = self.log_decay(v)
        chunks = {"chunk_size": chunk, "exact_chunk": self.exact_chunk}
        return gated_attention(q, k, v, g, causal=self.causal, key_mask=key_mask, **chunks)

    def attention_reference(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        return reference.gated(q, k, v, self.log_decay(v), causal=self.causal, key_mask=key_mask)

    def state_shapes(self) -> list[tuple[int, ...]]:
        return [(self.num_heads, self.head_dim, self.head_dim)]

    def token_step(self, q: Tensor, k: Tensor, v: Tensor, state: tuple, table) -> tuple[Tensor, tuple]:
        """The decays from the token's own v, as the chunked forward reads them (decay.decayed_step)."""
        g = self.log_decay(v)
        q, k, v = prepare(q, k, v, None)
        return decayed_step(state, q, k, v, g.to(q.dtype))


@register_attention("ssd")
class SsdAttention(GatedAttention):
    """Dao & Gu 2024 (Mamba-2, SSD): a scalar decay a_t = exp(-softplus(v_t W_a + b_a)) per head and token; option
    chunk_size (64; unset, the whole sequence up to 128 tokens)."""

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, qkv_bias: bool = True, **options):
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias, **options)
        self.decay_proj = nn.Linear(dim, num_heads)
        dt = torch.logspace(math.log10(0.1), math.log10(0.001), num_heads) if num_heads > 1 else torch.tensor([0.01])
        with torch.no_grad():
            self.decay_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt), as Mamba-2's dt_bias

    sign = -1  # log a = -softplus(x) = logsigmoid(-x)

    def gates(self, v: Tensor) -> Tensor:
        return linear(tokens(v), self.decay_proj)  # [B, N, H]


@register_attention("gla")
class GlaAttention(GatedAttention):
    """Yang et al. 2024 (GLA): gates G_t = sigmoid(v_t W_1 W_2 + b)^(1 / temperature) per key feature; options
    chunk_size (32; unset, the whole sequence up to 128 tokens), exact_chunk (8: the chunks when some chunk of 32
    decays by more than e^-LIMIT), gate_rank (16), gate_temperature (16)."""

    known = ("chunk_size", "exact_chunk", "gate_rank", "gate_temperature")
    default_chunk = 32

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, qkv_bias: bool = True, **options):
        super().__init__(dim, num_heads, causal=causal, qkv_bias=qkv_bias, **options)
        self.temperature = options.get("gate_temperature", 16)
        self.factor = 1 / self.temperature
        self.gate_down = nn.Linear(dim, options.get("gate_rank", 16), bias=False)
        self.gate_up = nn.Linear(self.gate_down.out_features, dim)

    def gates(self, v: Tensor) -> Tensor:
        return linear(linear(tokens(v), self.gate_down), self.gate_up)  # [B, N, H * D]
