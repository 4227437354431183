"""The causal forms of the linear ops on the fused C kernel (causal_cpu.c): CPU, fp32 (bf16 and fp16 upcast
to it), D in 16/32/64/128, up to causal.QUADRATIC_MAX tokens; and deltanet's one chunk (`delta`, DeltaKernel).

At the text tower's 77 tokens the PyTorch quadratic form (ops/causal.py) is a dozen small ops each way whose fixed
cost, not the O(N^2 D) work, sets the time; the kernel does the lower triangle in register tiles, heads over threads.
Longer sequences take the op's torch.py (causal.py's chunked O(N) form), as do empty inputs. Saved for the
backward: q, k, v (fp32), 1/|q|, 1/|k| and 1 / normaliser [G, N] and, normalised, the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from models.attention.ops import causal, cpu_build
from models.attention.ops.common import check_key_mask, elu_feature, elu_feature_grad, fresh, key_weights
from models.attention.ops.op import Op

STEEP = 4  # the decayed kernel's status when the log decays fall below -limit (Steep)


def run(kernel: str, shape: torch.Size, *args, steep: bool = False) -> int:
    """causal_cpu.c's `kernel` on args (tensors as their data pointers, None as NULL, numbers as they are) with
    torch's thread count; one error naming q's heads G and head size D (q [..., N, D]) when it could not allocate its
    scratch. Returns the status: 0, or STEEP where `steep` allows it."""
    pointers = [a.data_ptr() if isinstance(a, Tensor) else a for a in args]  # None: NULL
    status = getattr(cpu_build.library(), kernel)(*pointers, torch.get_num_threads())
    if status and not (steep and status == STEEP):
        cpu_build.check(status, shape.numel() // shape[-1] // shape[-2], shape[-1])
    return status


class CausalKernel(torch.autograd.Function):
    """forward(q, k, v [..., N, D] fp32 contiguous (read as [G, N, D]), keep [G, N, 1] or None, e [G, N, 1 or D] or
    None, op) -> o, q's shape. Without unit features phi = elu + 1 and its derivative are applied here (PyTorch's exp
    is vectorised), the kernel works on the features; raw features (op.raw) are q e and k / e, scaled by the kernel,
    which returns dL/de."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, e: Tensor | None, op: Op) -> Tensor:
        G, N, D = heads(q)
        if not op.unit and not op.raw:  # the kernel takes phi(q), phi(k) and returns dL/dphi
            q, k = elu_feature(q), elu_feature(k)
        out = fresh(q, *q.shape)
        rq, rk, inv_den = (q.new_empty(G, N) for _ in range(3))
        flags = int(op.unit), int(op.normalised)
        run("causal_forward", q.shape, q, k, v, keep, e, width(e), G, N, D, *flags, out, rq, rk, inv_den)
        ctx.op = op
        ctx.save_for_backward(q, k, v, keep, e, rq, rk, inv_den, out if op.normalised else None)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, keep, e, rq, rk, inv_den, out = ctx.saved_tensors
        G, N, D = heads(q)
        grad = grad.contiguous()
        grads = [fresh(x, *x.shape) for x in (q, k, v)]
        grad_e = None if e is None else torch.empty_like(e)
        flags = int(ctx.op.unit), int(ctx.op.normalised)
        saved = rq, rk, inv_den, out
        run("causal_backward", q.shape, grad, q, k, v, keep, e, width(e), *saved, G, N, D, *flags, *grads, grad_e)
        if not ctx.op.unit and not ctx.op.raw:  # q, k are phi(q), phi(k) here
            grads[0], grads[1] = elu_feature_grad(q, grads[0]), elu_feature_grad(k, grads[1])
        return *grads, None, grad_e, None


def heads(q: Tensor) -> tuple[int, int, int]:
    """(G, N, D) of q [..., N, D], G the heads of the whole batch: the kernels read q as [G, N, D] in memory."""
    *_, N, D = q.shape
    return q.numel() // max(N * D, 1), N, D


def width(e: Tensor | None) -> int:
    """E of e [G, N, E]: 1 (a factor per token) or D (per token and feature); 1 without e."""
    return 1 if e is None else e.shape[-1]


def takes(q: Tensor) -> bool:
    """Whether the kernel computes these inputs: non-empty, at most causal.QUADRATIC_MAX tokens (longer ones take the
    op's torch.py, whose chunked form is O(N))."""
    return q.numel() > 0 and q.shape[-2] <= causal.QUADRATIC_MAX


def attend(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, op: Op, e: Tensor | None = None) -> Tensor:
    """[B, H, N, D] x3 -> [B, H, N, D] causal in q's dtype for the op (ops/op.py); see takes(). Raw ops only: e
    [B or 1, H, N, 1 or D] (e^b, b the cumulative log decay), the features q e and k / e; None for q and k as given."""
    qf, kf, vf = (t.float().contiguous() for t in (q, k, v))
    keep = key_weights(key_mask, q, torch.float32)
    if e is not None:
        e = e.float().expand(*q.shape[:3], e.shape[-1]).reshape(-1, q.shape[2], e.shape[-1]).contiguous()
    return CausalKernel.apply(qf, kf, vf, keep, e, op).to(q.dtype)


class DeltaKernel(torch.autograd.Function):
    """forward(q, k, v [..., N, D] fp32 contiguous (read as [G, N, D]), x [B, N, H] fp32 contiguous: the beta logits as
    the layer's projection wrote them) -> o, q's shape: deltanet's one chunk (delta.py's Whole) on causal_cpu.c, which
    takes beta = sigmoid(x) and normalises q and k itself and returns dL/dx; saved for the backward: q, k, v, x,
    1/|q|, 1/|k| and the corrections u."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, x: Tensor) -> Tensor:
        G, N, D = heads(q)
        out, u = fresh(q, *q.shape), torch.empty_like(q)
        rq, rk = q.new_empty(G, N), q.new_empty(G, N)
        run("delta_forward", q.shape, q, k, v, x, x.shape[-1], G, N, D, out, u, rq, rk)
        ctx.save_for_backward(q, k, v, x, rq, rk, u)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, x, rq, rk, u = ctx.saved_tensors
        G, N, D = heads(q)
        grads = [fresh(t, *t.shape) for t in (q, k, v)]
        grad_x = torch.empty_like(x)
        run("delta_backward", q.shape, grad.contiguous(), q, k, v, x, rq, rk, u, x.shape[-1], G, N, D, *grads, grad_x)
        return *grads, grad_x


def delta(q: Tensor, k: Tensor, v: Tensor, logits: Tensor) -> Tensor:
    """Deltanet's one chunk without a key mask on the kernel: q, k, v [B, H, N, D], logits [B, N, H] (beta =
    sigmoid(logits)) -> [B, H, N, D] fp32; see takes()."""
    qf, kf, vf = (t.float().contiguous() for t in (q, k, v))
    return DeltaKernel.apply(qf, kf, vf, logits.float().contiguous())


@dataclass(frozen=True)
class Gates:
    """How causal_cpu.c's decayed kernel reads a layer's log decays g from its gates x [B, N, H E] (per token, the H
    heads' E values side by side, as the layer's projection wrote them): g = x (sign 0) or factor * logsigmoid(sign
    x); the queries are scaled by `scale`."""

    heads: int
    sign: int = 0
    factor: float = 1.0
    scale: float = 1.0


class Steep(Exception):
    """Some head's sequence decays by more than e^-limit on a feature: the factorised form (q e^b, k e^-b) would need
    e^-b beyond what fp32 carries well, so the caller takes its chunked form."""


class DecayedKernel(torch.autograd.Function):
    """forward(q, k, v [..., N, D] fp32 contiguous (read as [G, N, D]), x [B, N, H E] fp32 contiguous the gates, keep
    [B, N] fp32 or None, gates, limit) -> sum_{j <= i} e^(b_i - b_j) (q_i . k_j) keep_j v_j * gates.scale with b =
    cumsum(keep g) over the tokens, g the log decays that `gates` reads from x; causal_cpu.c takes g, the cumsum and
    the exponential itself and returns dL/dx. Saved for the backward: q, k, v, keep, e^b [G, N, E] and dg/dx (x's
    shape), which the forward writes where a backward will run. Raises Steep (nothing computed) when b falls below
    -limit."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, x: Tensor, keep: Tensor | None, gates: Gates, limit: float):
        G, N, D = heads(q)
        out, E = fresh(q, *q.shape), x.shape[-1] // gates.heads
        backward = any(ctx.needs_input_grad[:4])
        e, dg = (q.new_empty(G, N, E), torch.empty_like(x)) if backward else (None, None)
        read = E, gates.heads, gates.sign, gates.factor, gates.scale
        status = run("decayed_forward", q.shape, q, k, v, x, keep, *read, limit, G, N, D, out, e, dg, steep=True)
        if status == STEEP:
            raise Steep(f"the log decays fall below -{limit:g} over {N} tokens")
        ctx.gates = gates
        ctx.save_for_backward(q, k, v, keep, e, dg)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, keep, e, dg = ctx.saved_tensors
        (G, N, D), gates = heads(q), ctx.gates
        grads = [fresh(t, *t.shape) for t in (q, k, v)]
        grad_x = torch.empty_like(dg)
        read = e.shape[-1], gates.heads, gates.scale
        run("decayed_backward", q.shape, grad.contiguous(), q, k, v, e, dg, keep, *read, G, N, D, *grads, grad_x)
        return *grads, grad_x, None, None, None


def decayed(q: Tensor, k: Tensor, v: Tensor, g: Tensor) -> Tensor:
    """sum_{j <= i} e^(b_i - b_j) (q_i . k_j) v_j, b = cumsum(g) over the tokens: q, k, v [B, H, N, D], g [B or 1,
    H, N, 1 or D] (<= 0, the whole sequence's sum >= -gated.LIMIT) -> [B, H, N, D] fp32; see takes()."""
    qf, kf, vf = (t.float().contiguous() for t in (q, k, v))
    g = g.float().expand(*q.shape[:3], g.shape[-1]).contiguous()  # [B, H, N, E]: read as [G, N, E]
    return DecayedKernel.apply(qf, kf, vf, g, None, Gates(heads=1), math.inf)


def gated(
    q: Tensor, k: Tensor, v: Tensor, x: Tensor, key_mask: Tensor | None, gates: Gates, limit: float
) -> Tensor | None:
    """The decayed sum of `decayed` with the log decays read from the gates x [B, N, H E] as `gates` says, q scaled
    by gates.scale and padded tokens (key_mask False) neither keys nor decays: q, k, v [B, H, N, D] -> [B, H, N, D]
    fp32; None when the sequence decays below e^-limit (Steep). See takes()."""
    check_key_mask(key_mask, q)
    qf, kf, vf = (t.float().contiguous() for t in (q, k, v))
    keep = None if key_mask is None else key_mask.float().contiguous()
    try:
        return DecayedKernel.apply(qf, kf, vf, x.float().contiguous(), keep, gates, limit)
    except Steep:
        return None
