"""Which implementation of a linear op runs: impl = auto | reference | torch | cpu | triton.

- reference: the naive O(N^2) definition (the op's `reference`); for checking, never fast.
- torch: PyTorch ops (`torch_path`): any device and dtype, fp64, torch.compile; causal through causal.py, non-causal
  through normalised.py or the op's own form.
- cpu: the fused C kernels (`cpu_path`): the causal form of every op (causal_cpu.c, up to causal.QUADRATIC_MAX
  tokens; longer ones take torch's O(N) chunked form) and the non-causal form of the ops with their own C kernel, on
  the CPU in fp32 (bf16 and fp16 inputs upcast to it), head sizes 16/32/64/128, a C compiler, CLIP_CPU_KERNEL not 0.
- triton: the Triton kernels (triton_common.py): CUDA tensors (or CPU ones under TRITON_INTERPRET=1) in fp32, bf16
  or fp16, and the triton package.
- auto: triton for CUDA inputs when it can run, else cpu where the C kernels apply (non-causal: only on CPUs with
  AVX-512F, cpu_build.wide_vectors, unless CLIP_CPU_KERNEL=1), else torch; under torch.compile always torch (the
  compiler traces and fuses it; it cannot trace the C call).

Each op's implementations are one table, built in its folder's __init__.py by `implementations` from its Op (the
flags the shared kernels read), its reference and its own non-causal forms where it has them, and registered here
under the op's name; everything below reads only `TABLES`, which is complete once models.attention.ops is imported
(its __init__ imports every op folder). A choice is resolved once per (op, impl, device, dtype, head size,
causality) and cached: a layer checks what it can when it is built (the impl's name, whether it exists at all:
`check`) and resolves at its first forward, where the device is known; later calls find the cached choice. Each
(op, impl, reason) is logged once at INFO on the "models.attention" logger. An explicit impl that cannot run on the
inputs raises a one-line ValueError naming what is missing.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from models.attention.ops import causal_cpu, cpu_build
from models.attention.ops.causal import CausalLinear
from models.attention.ops.chunked import check_chunk_size
from models.attention.ops.common import check_key_mask, compute_dtype, dtype_name, flatten, key_weights
from models.attention.ops.normalised import NormalisedLinear
from models.attention.ops.op import Op

IMPL_NAMES = ("auto", "reference", "torch", "cpu", "triton")
TRITON = "models.attention.ops.triton_common"  # the Triton kernels of every op, imported at their first use
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
log = logging.getLogger("models.attention")
choices: dict[tuple, str] = {}
announced: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Table:
    """An op, its naive definition reference(q, k, v, *, causal=False, key_mask=None), its implementations
    {impl: attend(q, k, v, *, causal, key_mask, chunk_size)} and whether its C kernels cover the non-causal form."""

    op: Op
    reference: Callable
    impls: dict[str, Callable]
    cpu_noncausal: bool


TABLES: dict[str, Table] = {}  # op name -> its table, filled as the op folders are imported


def linear_ops() -> list[str]:
    """The names of the linear ops, sorted: every op list of the scripts, benchmarks and tests comes from here."""
    return sorted(TABLES)


def known_ops(names, what: str = "linear ops") -> list[str]:
    """names as a list, after checking that each is a registered linear op (a hand-picked list fails loudly)."""
    unknown = sorted(set(names) - set(TABLES))
    if unknown:
        raise ValueError(f"{what} names {', '.join(unknown)}, not in the dispatch table ({', '.join(linear_ops())})")
    return list(names)


@functools.cache
def import_error(module: str) -> str:
    """Why `module` cannot be imported ("" when it can)."""
    if importlib.util.find_spec(module) is None:
        return f"{module.replace('.', '/')}.py is not in this checkout"
    try:
        importlib.import_module(module)
    except Exception as err:  # a missing triton, or a driver it cannot load: auto then takes torch and says why
        return f"importing its Triton kernels failed ({type(err).__name__}: {err})"
    return ""


class Lazy:
    """The Triton kernels of one op, imported at their first use (slow to import, and triton may be missing)."""

    def __init__(self, op: Op):
        self.op = op

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None, chunk_size: int):
        return importlib.import_module(TRITON).attend(q, k, v, causal=causal, key_mask=key_mask, op=self.op)


def torch_path(op: Op, noncausal: Callable) -> Callable:
    """The PyTorch implementation: causal through causal.py (chunked, O(N)), non-causal noncausal(q, k, v, keep)
    on [G, N, D] tensors with keep [G, N, 1] in the compute dtype or None."""

    def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None, chunk_size: int = 64):
        qf, kf, vf = flatten(q, k, v)
        keep = key_weights(key_mask, q, compute_dtype(q))
        out = CausalLinear.apply(qf, kf, vf, keep, op, chunk_size) if causal else noncausal(qf, kf, vf, keep)
        return out.reshape(q.shape)

    return attend


def cpu_path(op: Op, noncausal: Callable | None, fallback: Callable) -> Callable:
    """The C kernels: causal through causal_cpu.c up to causal.QUADRATIC_MAX tokens, non-causal noncausal(q, k, v,
    keep) on contiguous-able fp32 [G, N, D] tensors (None: the op has no C kernel of that form); what they do not
    take (longer causal inputs, empty ones) goes to fallback, the torch path."""

    def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None, chunk_size: int = 64):
        if causal and causal_cpu.takes(q):
            return causal_cpu.attend(q, k, v, key_mask, op)
        if causal or noncausal is None or q.numel() == 0 or k.numel() == 0:
            return fallback(q, k, v, causal=causal, key_mask=key_mask, chunk_size=chunk_size)
        qf, kf, vf = (t.float() for t in flatten(q, k, v))  # bf16 / fp16 upcast: the kernels compute in fp32
        return noncausal(qf, kf, vf, key_weights(key_mask, q, torch.float32)).reshape(q.shape).to(q.dtype)

    return attend


def implementations(
    op: Op, reference: Callable, *, torch_noncausal: Callable | None = None, cpu_noncausal: Callable | None = None
) -> Table:
    """The one table of an op's implementations, registered under its name: its naive reference(q, k, v, *, causal,
    key_mask), and the shared torch, cpu and triton paths; an op gives its own non-causal forms where it has them,
    f(q, k, v, keep) on [G, N, D] (a normalised op's PyTorch one defaults to normalised.py's)."""
    if op.name in TABLES:
        raise ValueError(f"linear op {op.name!r} is registered twice")
    if torch_noncausal is None:
        if not op.normalised:
            raise ValueError(f"linear op {op.name!r} is not normalised: give its non-causal PyTorch form")

        def torch_noncausal(q, k, v, keep):
            return NormalisedLinear.apply(q, k, v, keep, op)

    def naive(q, k, v, *, causal, key_mask, chunk_size):
        return reference(q, k, v, causal=causal, key_mask=key_mask)

    torch_attend = torch_path(op, torch_noncausal)
    impls = {"reference": naive, "torch": torch_attend, "cpu": cpu_path(op, cpu_noncausal, torch_attend)}
    TABLES[op.name] = Table(op, reference, {**impls, "triton": Lazy(op)}, cpu_noncausal is not None)
    return TABLES[op.name]


def check(op: str, impl: str, causal: bool) -> None:
    """What can be checked before any input is seen: a known impl that this op has and that exists here."""
    if impl not in IMPL_NAMES:
        raise ValueError(f"attention {op!r}: unknown impl {impl!r}; pick one of {', '.join(IMPL_NAMES)}")
    impls = TABLES[op].impls
    if impl != "auto" and impl not in impls:
        raise ValueError(f"attention {op!r} has no {impl} impl; pick one of auto, {', '.join(impls)}")
    why = {"cpu": cpu_mode_missing(op, causal), "triton": triton_missing(op)}.get(impl, "")
    if why:
        raise ValueError(f"attention {op!r} cannot use impl={impl}: {why}; use impl=auto or impl=torch")


def cpu_mode_missing(op: str, causal: bool) -> str:
    """Why the op's C kernel cannot compute this causality ("" when it can)."""
    return f"{op}'s C kernel is the causal form only" if not (TABLES[op].cpu_noncausal or causal) else ""


def triton_missing(op: str) -> str:
    """Why this op's Triton kernels cannot be imported ("" when they can)."""
    return import_error(TRITON)


def triton_why_not(op: str, q: Tensor) -> str:
    """Why the Triton kernels cannot take q ("" when they can)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if q.device.type != "cuda" and not (q.device.type == "cpu" and interpreted):
        return f"the Triton kernels run on CUDA (or on the CPU under TRITON_INTERPRET=1), the inputs are on {q.device}"
    if q.dtype not in TRITON_DTYPES:
        return f"the Triton kernels take float32, bfloat16 or float16, the inputs are {dtype_name(q.dtype)}"
    missing = triton_missing(op)
    if missing:
        return missing
    from models.attention.ops.triton_common import MAX_HEAD_DIM

    if q.shape[-1] > MAX_HEAD_DIM:
        return f"the Triton kernels take head sizes up to {MAX_HEAD_DIM}, the inputs have {q.shape[-1]}"
    return ""


def why_not(op: str, impl: str, q: Tensor, causal: bool) -> str:
    """Why `impl` cannot run this op on q ("" when it can)."""
    if impl == "cpu":
        return cpu_mode_missing(op, causal) or cpu_build.why_not(q)
    if impl == "triton":
        return triton_why_not(op, q)
    return ""


def choose(op: str, q: Tensor, causal: bool) -> tuple[str, str]:
    """(impl, reason) for impl=auto."""
    impls = TABLES[op].impls
    if "triton" in impls and q.device.type == "cuda":
        why = triton_why_not(op, q)
        if not why:
            return "triton", "CUDA inputs"
        return "torch", why
    if "cpu" in impls:
        why = cpu_mode_missing(op, causal) or cpu_build.why_not(q)
        if not why and not causal and not cpu_build.wide_vectors():
            why = cpu_build.NARROW
        return ("cpu", "on the CPU: the fused C kernel") if not why else ("torch", why)
    return "torch", f"{op} has no C kernel" if q.device.type == "cpu" else f"inputs on {q.device.type}"


def resolve(op: str, impl: str, q: Tensor, causal: bool) -> str:
    """The impl that runs op on inputs like q [..., N, D]: cached per kind of input, logged once per reason."""
    if torch.compiler.is_compiling():
        if impl == "cpu":
            raise ValueError(
                f"attention {op!r} cannot use impl=cpu under torch.compile (it cannot trace the C kernels' ctypes "
                "call); use impl=auto or impl=torch"
            )
        return "torch" if impl == "auto" else impl
    key = (op, impl, q.device.type, q.dtype, q.shape[-1], causal)
    if key not in choices:
        if impl == "auto":
            chosen, reason = choose(op, q, causal)
            reason = f"auto: {reason}"
        else:
            check(op, impl, causal)
            why = why_not(op, impl, q, causal)
            if why:
                raise ValueError(f"attention {op!r} cannot use impl={impl} here: {why}; use impl=auto or impl=torch")
            chosen, reason = impl, "asked for"
        choices[key] = chosen
        if (op, chosen, reason) not in announced:
            announced.add((op, chosen, reason))
            log.info("attention %s: impl %s (%s)", op, chosen, reason)
    return choices[key]


def forget() -> None:
    """Drops every cached choice and the C kernels' load result (tests that change the environment call it)."""
    choices.clear()
    announced.clear()
    import_error.cache_clear()
    cpu_build.load.cache_clear()


def run(op: str, impl: str, q: Tensor, k: Tensor, v: Tensor, *, causal, key_mask, chunk_size) -> Tensor:
    """Checks the arguments, resolves the impl and calls the op's table's entry."""
    check_chunk_size(chunk_size)
    check_key_mask(key_mask, q)
    chosen = resolve(op, impl, q, causal)
    return TABLES[op].impls[chosen](q, k, v, causal=causal, key_mask=key_mask, chunk_size=chunk_size)


def op_function(table: Table, doc: str):
    """The public function of an op: attend(q, k, v, *, causal, key_mask, chunk_size, impl) -> o, all [B, H, N, D];
    key_mask [B, N] bool (True = real token) or None, impl one of IMPL_NAMES."""
    op = table.op.name

    def attend(q: Tensor, k: Tensor, v: Tensor, *, causal=False, key_mask=None, chunk_size=64, impl="auto") -> Tensor:
        return run(op, impl, q, k, v, causal=causal, key_mask=key_mask, chunk_size=chunk_size)

    attend.__doc__, attend.__qualname__ = doc, f"{op}.attend"
    return attend
