"""Pluggable attention: one registry, one file per family of variants, naive references beside them.

| name                   | file          | reference            |
| ---------------------- | ------------- | -------------------- |
| softmax                | softmax.py    | reference.softmax    |
| continuum_softmax      | continuum.py  | reference.continuum_softmax |
| linformer              | linformer.py  | reference.linformer  |
| linear_affine          | linear.py, ops/linear_affine/ | ops/linear_affine/__init__.py |
| linear_affine_nodenom  | linear.py, ops/linear_affine_nodenom/ | ops/linear_affine_nodenom/__init__.py |
| linear_elu             | linear.py, ops/linear_elu/ | ops/linear_elu/__init__.py |
| efficient              | linear.py     | reference.efficient  |
| hedgehog               | hedgehog.py   | reference.hedgehog   |
| retention              | decay.py      | reference.retention  |
| retention_2d           | decay.py      | reference.retention_2d |
| ssd                    | gated.py      | reference.gated      |
| gla                    | gated.py      | reference.gated      |
| fastmax_released       | fastmax.py    | fastmax.reference    |
| deltanet (causal only) | delta.py      | delta.recurrent      |

Rotary positions (model.*_pos_embed: rope) turn q and k before any of them: rope.py, reference.rope.
Recurrent inference (no KV cache): a causal layer whose class sets `supports_recurrent` runs token by token,
`init_state` / `step` (base.py); the steps are ops/recurrent.py (linear ops, hedgehog), decay.decayed_step (retention,
ssd, gla) and delta.delta_step; the rest refuse in one line (`check_recurrent`).
"""

from models.attention import (  # noqa: F401
    continuum,
    decay,
    delta,
    fastmax,
    gated,
    hedgehog,
    linear,
    linformer,
    softmax,
)
from models.attention.base import Attention
from models.attention.registry import ATTENTIONS, attend, build_attention, get_attention, register_attention

__all__ = ["ATTENTIONS", "Attention", "attend", "build_attention", "get_attention", "register_attention"]
