"""Which implementation of a linear op runs: impl = auto | reference | torch | cpu | triton.

- reference: the naive O(N^2) definition (reference.py); for checking, never fast.
- torch: PyTorch ops (<op>/torch.py): any device and dtype, fp64, torch.compile.
- cpu: the fused C kernels (<op>/cpu.py): non-causal linear_affine_nodenom and linear_affine, and the causal form of
  all three (causal_cpu.c, up to causal.QUADRATIC_MAX tokens; longer ones take torch.py's O(N) chunked form), on the
  CPU in fp32 (bf16 and fp16 inputs upcast to it), head sizes 16/32/64/128, a C compiler, CLIP_CPU_KERNEL not 0.
- triton: the Triton kernels (<op>/triton.py, `attend(q, k, v, *, causal, key_mask)`): CUDA tensors (or CPU ones
  under TRITON_INTERPRET=1) in fp32, bf16 or fp16, and the triton package.
- auto: triton for CUDA inputs when it can run, else cpu where the C kernels apply, else torch; under
  torch.compile always torch (the compiler traces and fuses it; it cannot trace the C call).

Each op's implementations are one table, built in its folder's __init__.py by `implementations` (reference and the
lazily imported Triton kernels included) and registered here under the op's name; everything below reads only
`TABLES`. A choice is resolved once per (op, impl, device, dtype, head size, causality) and cached: a layer checks
what it can when it is built (the impl's name, whether it exists at all: `check`) and resolves at its first forward,
where the device is known; later calls find the cached choice. Each (op, impl, reason) is logged once at INFO on the
"models.attention" logger. An explicit impl that cannot run on the inputs raises a one-line ValueError naming what
is missing.
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

from models.attention.ops import cpu_build
from models.attention.ops.chunked import check_chunk_size
from models.attention.ops.common import check_key_mask, dtype_name
from models.attention.ops.op import Op

IMPL_NAMES = ("auto", "reference", "torch", "cpu", "triton")
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
log = logging.getLogger("models.attention")
choices: dict[tuple, str] = {}
announced: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Table:
    """An op, its naive definition reference(q, k, v, *, causal=False, key_mask=None) (its folder's reference.py)
    and its implementations: {impl: attend(q, k, v, *, causal, key_mask, chunk_size)}."""

    op: Op
    reference: Callable
    impls: dict[str, Callable]


TABLES: dict[str, Table] = {}  # op name -> its table, filled as the op folders are imported


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
    """An implementation in a module imported at its first use (Triton: slow to import, and it may be missing)."""

    def __init__(self, module: str):
        self.module = module

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None, chunk_size: int):
        return importlib.import_module(self.module).attend(q, k, v, causal=causal, key_mask=key_mask)


def implementations(op: Op, *, reference: Callable, torch: Callable, cpu: Callable, triton: str) -> Table:
    """The one table of an op's implementations, registered under its name: reference(q, k, v, *, causal, key_mask)
    (the op folder's reference.py), torch and cpu attend(q, k, v, *, causal, key_mask, chunk_size), and the module
    of its Triton kernels (imported at their first use)."""
    if op.name in TABLES:
        raise ValueError(f"linear op {op.name!r} is registered twice")

    def naive(q, k, v, *, causal, key_mask, chunk_size):
        return reference(q, k, v, causal=causal, key_mask=key_mask)

    TABLES[op.name] = Table(op, reference, {"reference": naive, "torch": torch, "cpu": cpu, "triton": Lazy(triton)})
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
    return f"{op}'s C kernel is the causal form only" if not (TABLES[op].op.cpu_noncausal or causal) else ""


def triton_missing(op: str) -> str:
    """Why this op's Triton kernels cannot be imported ("" when they can)."""
    return import_error(TABLES[op].impls["triton"].module)


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
    """The public function of an op: attend(q, k, v, *, causal, key_mask, chunk_size, impl) -> o, all [B, H, N, D]."""
    op = table.op.name

    def attend(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        causal: bool = False,
        key_mask: Tensor | None = None,
        chunk_size: int = 64,
        impl: str = "auto",
    ) -> Tensor:
        return run(op, impl, q, k, v, causal=causal, key_mask=key_mask, chunk_size=chunk_size)

    attend.__doc__, attend.__qualname__ = doc, f"{op}.attend"
    return attend
