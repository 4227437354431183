"""linear_affine in PyTorch ops: non-causal ops/normalised.py (unit features), causal ops/causal.py."""

from __future__ import annotations

from torch import Tensor

from models.attention.ops.linear_affine.definition import OP
from models.attention.ops.normalised import attend_normalised


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None, chunk_size: int = 64) -> Tensor:
    """[B, H, N, D] x3 -> [B, H, N, D] in q's dtype."""
    return attend_normalised(q, k, v, causal=causal, key_mask=key_mask, chunk_size=chunk_size, op=OP)
