"""Linear attentions: a similarity sim(q, k) = phi(q).phi(k) (plus a constant) makes attention O(N D^2).

The registered layers are thin: each op of the dispatch table (dispatch.linear_ops()) calls its folder ops/<name>/
(PyTorch, fused C and Triton paths behind one dispatcher, option `impl`); `efficient` is a few plain ops here.
All variants compute in fp32 (fp64 stays fp64) and return the dtype of q. Padded keys (key_mask False) leave every
sum, normalisers included: their phi(k) and v are zeroed, not only v.
"""

from __future__ import annotations

from torch import Tensor

from models.attention import reference, rope
from models.attention.base import Attention
from models.attention.ops import dispatch, linear_affine, linear_affine_nodenom, linear_elu, recurrent
from models.attention.ops.common import compute_dtype, flatten, key_weights
from models.attention.registry import register_attention


def efficient(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None) -> Tensor:
    """Shen et al. 2021, "Efficient attention": o = softmax_D(Q) (softmax_N(K)^T V), [B, H, N, D] x3 -> [B, H, N, D]."""
    if causal:
        raise ValueError(f"attention 'efficient' cannot be causal: {EfficientAttention.why_not_causal}")
    shape, dtype = q.shape, q.dtype
    qf, kf, vf = (t.to(compute_dtype(q)) for t in flatten(q, k, v))
    keep = key_weights(key_mask, q, qf.dtype)
    if keep is not None:
        # padded keys leave the softmax over tokens; a row without any real key keeps all (padding, never used)
        real = (keep > 0) | (keep == 0).all(1, keepdim=True)
        kf = kf.masked_fill(~real, float("-inf"))
    context = kf.softmax(1).transpose(1, 2) @ vf  # [G, D, D]
    return (qf.softmax(-1) @ context).reshape(shape).to(dtype)


class LinearAttention(Attention):
    """A parameter-free linear attention; the options it takes are `chunk_size` (causal only)."""

    time_power = 1


class DispatchedAttention(LinearAttention):
    """A linear attention whose op has several implementations: option `impl` (auto | reference | torch | cpu |
    triton, ops/dispatch.py) is checked here, when the layer is built, and resolved at its first forward. Causal, it
    also runs token by token (ops/recurrent.py)."""

    supports_recurrent = True

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, **options):
        super().__init__(dim, num_heads, causal=causal, **options)
        dispatch.check(self.name, options.get("impl", "auto"), causal)

    def state_shapes(self) -> list[tuple[int, ...]]:
        return recurrent.state_shapes(dispatch.TABLES[self.name].op, self.num_heads, self.head_dim)

    def token_step(self, q: Tensor, k: Tensor, v: Tensor, state: tuple, table) -> tuple[Tensor, tuple]:
        """ops/recurrent.py's step, whatever `impl` says; `table`: RoPE's (cos, sin) for a positive feature map."""
        turn = None if table is None else (lambda f: rope.rotate(f, table))
        return recurrent.step(dispatch.TABLES[self.name].op, q, k, v, state, turn)


@register_attention("linear_affine")
class LinearAffineAttention(DispatchedAttention):
    """sim = 1 + q^.k^ (cosine plus one), normalised by the sum of similarities."""

    function = staticmethod(linear_affine.attend)
    reference = staticmethod(linear_affine.reference)


@register_attention("linear_affine_nodenom")
class LinearAffineNoDenomAttention(DispatchedAttention):
    """Gerami, Madani, Duraiswami 2026, Eq. 7: weights (1 + q^.k^)/2, no denominator (output grows with N)."""

    function = staticmethod(linear_affine_nodenom.attend)
    reference = staticmethod(linear_affine_nodenom.reference)


@register_attention("linear_elu")
class LinearEluAttention(DispatchedAttention):
    """Katharopoulos et al. 2020, phi(x) = elu(x) + 1."""

    function = staticmethod(linear_elu.attend)
    reference = staticmethod(linear_elu.reference)
    rope_feature_map = staticmethod(rope.elu_plus_one)


@register_attention("efficient")
class EfficientAttention(LinearAttention):
    """Shen et al. 2021, softmax over D for q and over tokens for k."""

    supports_causal = False
    why_not_causal = "its softmax over all N tokens of K lets every query see future tokens"
    function = staticmethod(efficient)
    reference = staticmethod(reference.efficient)
