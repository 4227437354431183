"""Pluggable attention: one registry, one file per family of variants, naive references beside them.

| name                   | file          | reference            |
| ---------------------- | ------------- | -------------------- |
| softmax                | softmax.py    | reference.softmax    |
"""
from . import softmax  # noqa: F401  (each family registers itself on import)
from .base import Attention
from .registry import ATTENTIONS, attend, build_attention, get_attention, register_attention

__all__ = ["ATTENTIONS", "Attention", "attend", "build_attention", "get_attention", "register_attention"]
