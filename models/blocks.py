"""Pre-LN transformer blocks whose attention comes from the registry, named as open_clip names them.

Keys: `resblocks.{i}.ln_1`, `.attn.in_proj_weight`, `.attn.in_proj_bias`, `.attn.out_proj`, `.ln_2`,
`.mlp.c_fc`, `.mlp.c_proj`, and with layer scale `.ls_1.gamma`, `.ls_2.gamma` -- the same as open_clip's
`ResidualAttentionBlock`, so state dicts move between the two unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from models.attention import build_attention


@dataclass(frozen=True)
class BlockOptions:
    """What every block of a tower shares besides its attention: the MLP's width ratio, QuickGELU instead of GELU,
    LayerScale's init (None: no layer scale) and a LayerNorm on each head's q and k (models.ModelConfig)."""

    mlp_ratio: float = 4.0
    quick_gelu: bool = False
    layer_scale: float | None = None
    qk_norm: bool = False


PLAIN = BlockOptions()  # open_clip's default block


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP weights were trained with (`quick_gelu` configs)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class LayerScale(nn.Module):
    """x * gamma, gamma [C] initialised to `init` (Touvron et al. 2021, CaiT; open_clip's ls_init_value)."""

    def __init__(self, width: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(init * torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Block(nn.Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)); [B, N, C] -> [B, N, C] (Radford et al. 2021, CLIP)."""

    def __init__(
        self,
        width: int,
        heads: int,
        attention: str,
        *,
        causal: bool,
        options: dict,
        block: BlockOptions = PLAIN,
    ):
        super().__init__()
        hidden, layer_scale = int(width * block.mlp_ratio), block.layer_scale
        self.ln_1 = nn.LayerNorm(width)
        self.attn = build_attention(attention, width, heads, causal=causal, **options)
        if block.qk_norm:
            self.attn.enable_qk_norm()
        self.ls_1 = LayerScale(width, layer_scale) if layer_scale is not None else nn.Identity()
        self.ls_2 = LayerScale(width, layer_scale) if layer_scale is not None else nn.Identity()
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(
                [
                    ("c_fc", nn.Linear(width, hidden)),
                    ("gelu", QuickGELU() if block.quick_gelu else nn.GELU()),
                    ("c_proj", nn.Linear(hidden, width)),
                ]
            )
        )

    def forward(self, x: Tensor, key_mask: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        x = x + self.ls_1(self.attn(self.ln_1(x), key_mask, rope))
        return x + self.ls_2(self.mlp(self.ln_2(x)))

    def step(self, x: Tensor, state: tuple, rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple]:
        """The causal forward at one position from the attention's recurrent state: x [B, C] -> (y [B, C], state)."""
        y, state = self.attn.step(self.ln_1(x), state, rope)
        x = x + self.ls_1(y)
        return x + self.ls_2(self.mlp(self.ln_2(x))), state


class Transformer(nn.Module):
    """A stack of `Block`s, one registry attention name (and options dict) per layer."""

    def __init__(
        self,
        width: int,
        heads: int,
        attentions: list[str],
        options: list[dict],
        *,
        causal: bool,
        block: BlockOptions = PLAIN,
    ):
        super().__init__()
        self.width, self.layers = width, len(attentions)
        self.grad_checkpointing = False
        self.resblocks = nn.ModuleList(
            [
                Block(width, heads, name, causal=causal, options=opts, block=block)
                for name, opts in zip(attentions, options)
            ]
        )

    def forward(self, x: Tensor, key_mask: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """[B, N, C] -> [B, N, C]; with grad_checkpointing, each block's activations are recomputed in backward.
        `rope`: rotary positions for every layer's q and k (models/attention/rope.py), or None."""
        for block in self.resblocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, key_mask, rope, use_reentrant=False)
            else:
                x = block(x, key_mask, rope)
        return x

    def init_state(self, batch: int, device=None, dtype: torch.dtype = torch.float32) -> list[tuple]:
        """Every layer's recurrent state before the first token; one line naming the first layer without one."""
        for i, block in enumerate(self.resblocks):
            try:
                block.attn.check_recurrent(block.attn.causal)
            except ValueError as err:
                raise ValueError(f"layer {i}: {err}") from None
        return [block.attn.init_state(batch, device, dtype) for block in self.resblocks]

    def step(self, x: Tensor, states: list[tuple], rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, list]:
        """One token through every layer: x [B, C] at position t -> (y [B, C], the states after t)."""
        states = list(states)
        for i, block in enumerate(self.resblocks):
            x, states[i] = block.step(x, states[i], rope)
        return x, states
