"""flash-linear-attention's chunk kernels (fla-core; Yang et al. 2024) for retention, ssd and gla on CUDA.

    retention  fla.ops.retention.chunk_retention(q, k, v)              RetNet's gamma_h = 1 - 2^(-5 - h), as
                                                                       decay.log_gammas
    ssd        fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=log a)   g [B, N, H] (fla's form of Mamba-2's SSD)
    gla        fla.ops.gla.chunk_gla(q, k, v, g=log G)                 g [B, N, H, D]

on fla's layout [B, N, H, D] (ours is [B, H, N, D]) with scale 1: q comes scaled by 1 / sqrt(D) (decay.prepare).
Each call is causal; two-sided (LION, as gated.py) adds the call on the reversed tokens with the decays shifted by
one token (gated.py's g_reversed; retention's decay is the same both ways), less the diagonal (q_i . k_i) v_i that
both calls count. Inputs in the compute dtype (fp32 for fp32 and bf16 inputs); fla's fp32 dots run in TF32 on GPUs
that have it.

`use_fla(q)` decides: fla's kernels for fp32 CUDA tensors when fla imports, the chunked PyTorch forms otherwise. `FORCE`
overrides it (tests: True runs fla's kernels on CPU tensors under TRITON_INTERPRET=1, False the PyTorch forms).
deltanet stays on its chunked form: fla's chunk_delta_rule refuses fp32, the compute dtype here.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

FORCE: bool | None = None  # None: use_fla decides by device; True or False: always or never fla's kernels


@functools.cache
def importable() -> bool:
    """Whether fla's three kernels import; tried once, on the first CUDA call, and logged once."""
    try:
        import fla.ops.gla
        import fla.ops.retention
        import fla.ops.simple_gla  # noqa: F401
    except Exception as err:  # a missing package, or a Triton that cannot load its driver
        log.warning("flash-linear-attention not usable (%s): retention, ssd, gla run their chunked forms", err)
        return False
    log.info("retention, ssd and gla run flash-linear-attention's chunk kernels on CUDA")
    return True


def use_fla(q: Tensor) -> bool:
    """fla's kernels for fp32 q (the compute dtype) on CUDA when fla imports, unless FORCE says otherwise; fp64 (the
    references' dtype) keeps the PyTorch forms."""
    if FORCE is not None:
        return FORCE
    return q.is_cuda and q.dtype == torch.float32 and importable()


def causal(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None) -> Tensor:
    """One causal fla call on q (scaled), k, v [B, H, N, D] and log decays g [B, H, N, 1 or D] (None: retention)
    -> [B, H, N, D]."""
    from fla.ops.gla import chunk_gla
    from fla.ops.retention import chunk_retention
    from fla.ops.simple_gla import chunk_simple_gla

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if g is None:
        out, _ = chunk_retention(q, k, v, scale=1.0)
    elif g.shape[-1] == 1:
        out, _ = chunk_simple_gla(q, k, v, g=g[..., 0].transpose(1, 2), scale=1.0)
    else:
        out, _ = chunk_gla(q, k, v, g=g.transpose(1, 2), scale=1.0)
    return out.transpose(1, 2)


def decayed(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, *, two_sided: bool) -> Tensor:
    """o_i = sum_j exp(L_i - L_j) (q_i . k_j) v_j over j <= i (every j when `two_sided`, decays prod_{t=i+1..j} for
    j > i), L the cumulative log decays g [B, H, N, 1 or D] (None: retention's fixed gamma_h); [B, H, N, D]."""
    out = causal(q, k, v, g)
    if two_sided:
        g_reversed = None if g is None else F.pad(g.flip(2)[:, :, :-1], (0, 0, 1, 0))
        out = out + causal(q.flip(2), k.flip(2), v.flip(2), g_reversed).flip(2)
        out = out - (q * k).sum(-1, keepdim=True) * v
    return out
