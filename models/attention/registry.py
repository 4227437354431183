"""The one attention registry: name -> class, filled by `@register_attention`.

Both CLIP towers take their attention from here by name. Every entry is built as
`build_attention(name, dim, num_heads, causal=..., **options)` and called as
`forward(x [B, N, C], key_mask [B, N] bool | None) -> [B, N, C]`; `key_mask` is True for real
tokens and False for padding. Parameter-free variants also expose their math as a pure function,
reachable as `attend(name, q, k, v, causal=...)` on `[B, H, N, D]` tensors (torch SDPA's layout).
"""

from __future__ import annotations

import difflib

from torch import Tensor, nn

ATTENTIONS: dict[str, type[nn.Module]] = {}


def register_attention(name: str):
    """Class decorator that adds a variant to the registry under `name`; duplicates are refused."""

    def wrap(cls):
        if name in ATTENTIONS:
            raise ValueError(
                f"attention {name!r} is registered twice ({ATTENTIONS[name].__module__} and {cls.__module__})"
            )
        cls.name = name
        ATTENTIONS[name] = cls
        return cls

    return wrap


def get_attention(name: str) -> type[nn.Module]:
    """The class registered under `name`; an unknown name raises with the sorted known names and the closest."""
    if name not in ATTENTIONS:
        close = difflib.get_close_matches(str(name), sorted(ATTENTIONS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown attention {name!r}; known attentions: {', '.join(sorted(ATTENTIONS))}{hint}")
    return ATTENTIONS[name]


def build_attention(name: str, dim: int, num_heads: int, *, causal: bool = False, **options) -> nn.Module:
    """An attention layer (qkv projection, heads, variant, output projection) by registry name."""
    return get_attention(name)(dim, num_heads, causal=causal, **options)


def attend(
    name: str, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """The math of a parameter-free variant on q, k, v [B, H, N, D] -> o [B, H, N, D]."""
    cls = get_attention(name)
    if cls.function is None:
        raise ValueError(
            f"attention {name!r} has learned parameters inside the attention; build it with build_attention"
        )
    cls.check_causal(causal)
    return cls.function(q, k, v, causal=causal, key_mask=key_mask, **options)
