"""linear_elu's naive O(N^2) definition: what every implementation of this folder is tested against."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from models.attention.reference import allowed, kernel_attention, upcast


def reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, **options
) -> Tensor:
    """Katharopoulos et al. 2020: o_i = sum_n (phi(q_i).phi(k_n)) v_n / sum_n phi(q_i).phi(k_n), phi = elu + 1."""
    dtype, (q, k, v) = q.dtype, upcast(q, k, v)
    sim = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)
    return kernel_attention(sim, v, allowed(q, k, causal, key_mask), normalise=True).to(dtype)
