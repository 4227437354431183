"""The layer every attention variant shares: qkv projection, heads, the variant's math, output projection.

Parameter names follow open_clip's `nn.MultiheadAttention` (`in_proj_weight`, `in_proj_bias`,
`out_proj`), so a softmax state dict loads into any variant and back into open_clip unchanged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention.rope import rotate, rotated_linear


class Attention(nn.Module):
    """Multi-head attention whose token mixing is given by a subclass.

    A parameter-free subclass sets `function` (the fast pure function on q, k, v [B, H, N, D]) and
    `reference` (its naive O(N^2) fp32 definition). A subclass with learned parameters inside the
    attention overrides `attention` and `attention_reference` instead.
    """

    name: ClassVar[str] = ""
    supports_causal: ClassVar[bool] = True
    why_not_causal: ClassVar[str] = ""
    # a causal-only variant (the delta rule) refuses the image tower, which attends both ways
    supports_bidirectional: ClassVar[bool] = True
    why_not_bidirectional: ClassVar[str] = ""
    function: ClassVar[Callable | None] = None
    reference: ClassVar[Callable | None] = None
    # Under torch.autocast the token mixing runs with autocast off: the variants accumulate in fp32
    # themselves (autocast would recast their inner matmuls to bf16 and mix dtypes in hand-written
    # backward passes). Softmax sets True: SDPA is built for bf16 and accumulates in fp32.
    under_autocast: ClassVar[bool] = False
    # A positive feature map phi that RoPE must not rotate into negative values (elu + 1): with rotary positions
    # the layer runs RoFormer's form, the numerator rotated, the denominator not (rope.rotated_linear).
    rope_feature_map: ClassVar[Callable | None] = None
    # Recurrent inference (`init_state`, `step`): a causal form with a state of fixed size runs token by token with
    # no KV cache; a variant that sets True implements `state_shapes` and `token_step`.
    supports_recurrent: ClassVar[bool] = False
    why_not_recurrent: ClassVar[str] = "needs its KV cache: no recurrent state"
    # How its time grows with the tokens, O(N^time_power): 2 for softmax-like attention, 1 for the linear ones (the
    # attention benchmark extrapolates a point it does not measure with it)
    time_power: ClassVar[int] = 2

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, qkv_bias: bool = True, **options):
        super().__init__()
        if dim % num_heads:
            raise ValueError(
                f"attention {self.name!r}: width {dim} is not divisible by {num_heads} heads; "
                "pick a width that is a multiple of the head count"
            )
        self.check_causal(causal)
        self.dim, self.num_heads, self.head_dim, self.causal = dim, num_heads, dim // num_heads, causal
        self.options = options
        # model.qk_norm: a LayerNorm over each head's q and k (timm's q_norm / k_norm), before RoPE and any feature map
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim)) if qkv_bias else None
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def enable_qk_norm(self) -> None:
        """Normalise q and k per head (Dehghani et al. 2023, ViT-22B; timm's qk_norm) in every forward from now on."""
        self.q_norm, self.k_norm = nn.LayerNorm(self.head_dim), nn.LayerNorm(self.head_dim)

    @classmethod
    def check_causal(cls, causal: bool) -> None:
        if causal and not cls.supports_causal:
            raise ValueError(f"attention {cls.name!r} cannot be causal: {cls.why_not_causal}")
        if not causal and not cls.supports_bidirectional:
            raise ValueError(
                f"attention {cls.name!r} is causal only (text tower): {cls.why_not_bidirectional}; "
                "pick another image attention"
            )

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """[B, H, N, D] x3 -> [B, H, N, D]: the fast path."""
        return type(self).function(q, k, v, causal=self.causal, key_mask=key_mask, **self.options)

    def attention_reference(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """[B, H, N, D] x3 -> [B, H, N, D]: the naive fp32 definition the fast path is tested against."""
        return type(self).reference(q, k, v, causal=self.causal, key_mask=key_mask, **self.options)

    def forward(self, x: Tensor, key_mask: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """x [B, N, C] -> [B, N, C]; `rope`: the (cos, sin) table of rotary positions (models/attention/rope.py)
        that turns q and k before the attention, or None (positions came with the tokens)."""
        B, N, C = x.shape
        q, k, v = self.project(x)
        with autocast_off(x.device.type, not self.under_autocast):
            if rope is None:
                o = self.attention(q, k, v, key_mask)
            elif self.rope_feature_map is not None:
                chunk = self.options.get("chunk_size", 64)
                phi = type(self).rope_feature_map
                o = rotated_linear(phi, q, k, v, rope, causal=self.causal, key_mask=key_mask, chunk_size=chunk)
            else:
                o = self.attention(rotate(q, rope), rotate(k, rope), v, key_mask)
        return self.out_proj(o.transpose(1, 2).reshape(B, N, C))

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, C] -> q, k, v [B, H, N, D], q and k normalised per head under model.qk_norm."""
        B, N, _ = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)  # [B, N, 3C]
        q, k, v = qkv.view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x [B, H, N, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    @classmethod
    def check_recurrent(cls, causal: bool) -> None:
        """One line when this variant, or this layer's direction, has no recurrent step."""
        if not cls.supports_causal:
            raise ValueError(f"{cls.name} cannot be causal ({cls.why_not_causal}): no recurrent state")
        if not cls.supports_recurrent:
            raise ValueError(f"{cls.name} {cls.why_not_recurrent}")
        if not causal:
            raise ValueError(
                f"{cls.name} is two-sided here (image tower): only a causal layer runs token by token; "
                "build it with causal=True"
            )

    def state_shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the recurrent state's tensors, batch left out: fixed, whatever the number of tokens."""
        raise NotImplementedError

    def token_step(self, q: Tensor, k: Tensor, v: Tensor, state: tuple, rope) -> tuple[Tensor, tuple]:
        """One token's q, k, v [B, H, 1, D] and the state -> (o [B, H, 1, D] in the compute dtype, the new state);
        `rope` is the position's (cos, sin) only for a variant with a `rope_feature_map` (else q, k come turned)."""
        raise NotImplementedError

    def init_state(self, batch: int, device=None, dtype: torch.dtype = torch.float32) -> tuple[Tensor, ...]:
        """The state before the first token: zeros in the compute dtype of `dtype` (fp32, fp64 for fp64)."""
        self.check_recurrent(self.causal)
        work = torch.promote_types(dtype, torch.float32)
        return tuple(torch.zeros(batch, *shape, device=device, dtype=work) for shape in self.state_shapes())

    def step(self, x: Tensor, state: tuple, rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple]:
        """The causal forward at one position t from a state of fixed size (no KV cache): x [B, C], the token at t,
        -> (y [B, C], the state after t); `rope`: the (cos, sin) [1, D/2] of position t, or None."""
        self.check_recurrent(self.causal)
        q, k, v = self.project(x[:, None])  # [B, H, 1, D]
        with autocast_off(x.device.type, not self.under_autocast):
            if rope is not None and self.rope_feature_map is None:
                q, k, rope = rotate(q, rope), rotate(k, rope), None
            o, state = self.token_step(q, k, v, state, rope)
        return self.out_proj(o.to(q.dtype).reshape(x.shape[0], self.dim)), state


def autocast_off(device_type: str, wanted: bool):
    """A context that turns autocast off when it is on (and `wanted`); otherwise it does nothing."""
    if wanted and device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
