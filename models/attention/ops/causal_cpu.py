"""The causal forms of the linear ops on the fused C kernel (causal_cpu.c): CPU, fp32 (bf16 and fp16 upcast
to it), D in 16/32/64/128, up to causal.QUADRATIC_MAX tokens; and deltanet's one chunk (`delta`, DeltaKernel).

At the text tower's 77 tokens the PyTorch quadratic form (ops/causal.py) is a dozen small ops each way whose fixed
cost, not the O(N^2 D) work, sets the time; the kernel does the lower triangle in register tiles, heads over threads.
Longer sequences take the op's torch.py (causal.py's chunked O(N) form), as do empty inputs. Saved for the
backward: q, k, v (fp32), 1/|q|, 1/|k| and 1 / normaliser [G, N] and, normalised, the output.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention.ops import causal, cpu_build
from models.attention.ops.common import elu_feature, elu_feature_grad, flatten, fresh, key_weights
from models.attention.ops.op import Op


def run(kernel: str, shape: torch.Size, *args) -> None:
    """causal_cpu.c's `kernel` on args (tensors as their data pointers, None as NULL, integers as they are) with
    torch's thread count; one error naming q's shape [G, N, D] when it could not allocate its scratch."""
    pointers = (cpu_build.pointer(a) if a is None or isinstance(a, Tensor) else a for a in args)
    status = getattr(cpu_build.library(), kernel)(*pointers, torch.get_num_threads())
    cpu_build.check(status, shape[0], shape[-1])


class CausalKernel(torch.autograd.Function):
    """forward(q, k, v [G, N, D] fp32 contiguous, keep [G, N, 1] or None, e [G, N, 1 or D] or None, op) -> o [G, N, D].
    Without unit features phi = elu + 1 and its derivative are applied here (PyTorch's exp is vectorised), the kernel
    works on the features; raw features (op.raw) are q e and k / e, scaled by the kernel, which returns dL/de."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, e: Tensor | None, op: Op) -> Tensor:
        G, N, D = q.shape
        if not op.unit and not op.raw:  # the kernel takes phi(q), phi(k) and returns dL/dphi
            q, k = elu_feature(q), elu_feature(k)
        out = fresh(q, G, N, D)
        rq, rk, inv_den = (q.new_empty(G, N) for _ in range(3))
        flags = int(op.unit), int(op.normalised)
        run("causal_forward", q.shape, q, k, v, keep, e, width(e), G, N, D, *flags, out, rq, rk, inv_den)
        ctx.op = op
        ctx.save_for_backward(q, k, v, keep, e, rq, rk, inv_den, out if op.normalised else None)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, keep, e, rq, rk, inv_den, out = ctx.saved_tensors
        G, N, D = q.shape
        grad = grad.contiguous()
        grads = [fresh(x, G, N, D) for x in (q, k, v)]
        grad_e = None if e is None else torch.empty_like(e)
        flags = int(ctx.op.unit), int(ctx.op.normalised)
        saved = rq, rk, inv_den, out
        run("causal_backward", q.shape, grad, q, k, v, keep, e, width(e), *saved, G, N, D, *flags, *grads, grad_e)
        if not ctx.op.unit and not ctx.op.raw:  # q, k are phi(q), phi(k) here
            grads[0], grads[1] = elu_feature_grad(q, grads[0]), elu_feature_grad(k, grads[1])
        return *grads, None, grad_e, None


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
    qf, kf, vf = (t.float().contiguous() for t in flatten(q, k, v))
    keep = key_weights(key_mask, q, torch.float32)
    if e is not None:
        e = e.float().expand(*q.shape[:3], e.shape[-1]).reshape(-1, q.shape[2], e.shape[-1]).contiguous()
    return CausalKernel.apply(qf, kf, vf, keep, e, op).reshape(q.shape).to(q.dtype)


class DeltaKernel(torch.autograd.Function):
    """forward(q, k, v [G, N, D] fp32 contiguous, beta [G, N]) -> o [G, N, D]: deltanet's one chunk (delta.py's
    Whole) on causal_cpu.c, q and k normalised by the kernel; saved for the backward: q, k, v, beta, 1/|q|, 1/|k| and
    the corrections u."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
        G, N, D = q.shape
        out, u = fresh(q, G, N, D), torch.empty_like(q)
        rq, rk = q.new_empty(G, N), q.new_empty(G, N)
        run("delta_forward", q.shape, q, k, v, beta, G, N, D, out, u, rq, rk)
        ctx.save_for_backward(q, k, v, beta, rq, rk, u)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, beta, rq, rk, u = ctx.saved_tensors
        G, N, D = q.shape
        grads = [fresh(x, G, N, D) for x in (q, k, v)]
        grad_beta = torch.empty_like(beta)
        run("delta_backward", q.shape, grad.contiguous(), q, k, v, beta, rq, rk, u, G, N, D, *grads, grad_beta)
        return *grads, grad_beta


def delta(q: Tensor, k: Tensor, v: Tensor, logits: Tensor) -> Tensor:
    """Deltanet's one chunk without a key mask on the kernel: q, k, v [B, H, N, D], logits [B, N, H] (beta =
    sigmoid(logits)) -> [B, H, N, D] fp32; see takes()."""
    B, H, N, D = q.shape
    beta = torch.sigmoid(logits.float()).transpose(1, 2).reshape(B * H, N).contiguous()
    qf, kf, vf = (t.float().contiguous() for t in flatten(q, k, v))
    return DeltaKernel.apply(qf, kf, vf, beta).reshape(B, H, N, D)


class DecayedKernel(torch.autograd.Function):
    """forward(q, k, v [G, N, D] fp32 contiguous, g [G, N, E] the log decays, E = 1 or D) -> sum_{j <= i}
    e^(b_i - b_j) (q_i . k_j) v_j with b = cumsum(g) over the tokens, on causal_cpu.c (which takes the cumsum and the
    exponential itself); returns dL/dg."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, g: Tensor) -> Tensor:
        G, N, D = q.shape
        out = fresh(q, G, N, D)
        run("decayed_forward", q.shape, q, k, v, g, g.shape[-1], G, N, D, out)
        ctx.save_for_backward(q, k, v, g)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, g = ctx.saved_tensors
        G, N, D = q.shape
        grads = [fresh(x, G, N, D) for x in (q, k, v)]
        grad_g = torch.empty_like(g)
        run("decayed_backward", q.shape, grad.contiguous(), q, k, v, g, g.shape[-1], G, N, D, *grads, grad_g)
        return *grads, grad_g


def decayed(q: Tensor, k: Tensor, v: Tensor, g: Tensor) -> Tensor:
    """sum_{j <= i} e^(b_i - b_j) (q_i . k_j) v_j, b = cumsum(g) over the tokens: q, k, v [B, H, N, D], g [B or 1,
    H, N, 1 or D] (<= 0, the whole sequence's sum >= -gated.LIMIT) -> [B, H, N, D] fp32; see takes()."""
    qf, kf, vf = (t.float().contiguous() for t in flatten(q, k, v))
    g = g.float().expand(*q.shape[:3], g.shape[-1]).reshape(-1, q.shape[2], g.shape[-1]).contiguous()
    return DecayedKernel.apply(qf, kf, vf, g).reshape(q.shape)
