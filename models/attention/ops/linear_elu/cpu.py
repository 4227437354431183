"""linear_elu's causal form on the fused C kernel (../causal_cpu.c) up to causal.QUADRATIC_MAX tokens: fp32 (bf16 and
fp16 upcast to it), CPU, D in 16/32/64/128. The dispatcher sends no non-causal input here; longer or empty causal
inputs take torch.py."""

from __future__ import annotations

from torch import Tensor

from models.attention.ops import causal_cpu
from models.attention.ops.linear_elu import torch as torch_path
from models.attention.ops.linear_elu.definition import OP


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None, chunk_size: int = 64) -> Tensor:
    """[B, H, N, D] x3 -> [B, H, N, D]."""
    if causal and causal_cpu.takes(q):
        return causal_cpu.attend(q, k, v, key_mask, OP)
    return torch_path.attend(q, k, v, causal=causal, key_mask=key_mask, chunk_size=chunk_size)
