"""Pluggable attention: one registry, one file per family of variants, naive references beside them.

| name                   | file          | reference            |
| ---------------------- | ------------- | -------------------- |
| softmax                | softmax.py    | reference.softmax    |
| continuum_softmax      | continuum.py  | reference.continuum_softmax |
| linformer              | linformer.py  | reference.linformer  |
| linear_affine          | linear.py     | reference.linear_affine |
| linear_affine_nodenom  | linear.py     | reference.linear_affine_nodenom |
| linear_elu             | linear.py     | reference.linear_elu |
| efficient              | linear.py     | reference.efficient  |
"""
from . import softmax  # noqa: F401  (each family registers itself on import)
from . import continuum, linformer  # noqa: F401
from . import linear  # noqa: F401
from .base import Attention
from .registry import ATTENTIONS, attend, build_attention, get_attention, register_attention

__all__ = ["ATTENTIONS", "Attention", "attend", "build_attention", "get_attention", "register_attention"]
