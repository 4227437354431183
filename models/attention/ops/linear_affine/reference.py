"""linear_affine's naive O(N^2) definition: what every implementation of this folder is tested against."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from models.attention.reference import allowed, kernel_attention, upcast


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n), with q^, k^ L2-normalised over D."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = 1 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
    return kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=True).to(dtype)
