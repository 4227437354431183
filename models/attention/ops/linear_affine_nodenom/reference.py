"""linear_affine_nodenom's (Eq. 7's) naive O(N^2) definition: what every implementation of this folder is tested
against."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from models.attention.reference import allowed, kernel_attention, upcast


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """Gerami, Madani, Duraiswami 2026, Eq. 7: o_i = sum_n (1 + q^_i.k^_n) / 2 v_n; no denominator, so o grows with
    N."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = (1 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)) / 2
    return kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=False).to(dtype)
