"""Builds nodenom_cpu.c and affine_cpu.c (with linear_cpu.h) with the system C compiler on first use and calls them
through ctypes.

The fused kernels compute non-causal linear_affine_nodenom and linear_affine, forward and backward, in
one OpenMP region each (see the C files' headers); tiled.py and NormalisedLinear are the same math in
PyTorch ops, used where a kernel cannot be: no C compiler, a GPU, fp64, a head size other than
16/32/64/128, torch.compile, or CLIP_CPU_KERNEL=0.

The library is compiled with -march=native into a cache folder ($CLIP_KERNEL_CACHE, else
$XDG_CACHE_HOME/clip-attention, else ~/.cache/clip-attention) under a name that hashes the source,
the flags, the compiler and this CPU's identity, so nodes of a cluster that share a home folder but
differ in CPU each get their own build; a build is written to a temporary name and renamed, so ranks
that start together never load a half-written file. Compiling takes about a second.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

HERE = Path(__file__).parent
SOURCES = [HERE / "nodenom_cpu.c", HERE / "affine_cpu.c"]  # built into one library
HEADERS = [HERE / "linear_cpu.h"]
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
HEAD_DIMS = (16, 32, 64, 128)
DISABLE = "CLIP_CPU_KERNEL"
STREAM_BYTES = 32 << 20


def cpu_identity() -> str:
    """What -march=native depends on: the machine, and on Linux the CPU model and its flags."""
    parts = [platform.machine()]
    try:
        text = Path("/proc/cpuinfo").read_text()
        parts += sorted({line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))})
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def cache_dir() -> Path:
    if os.environ.get("CLIP_KERNEL_CACHE"):
        return Path(os.environ["CLIP_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clip-attention"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(cc: str) -> Path:
    """The compiled library's path, compiling it first when the cache has no build for this source, compiler and CPU."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    texts = [path.read_text() for path in SOURCES + HEADERS]
    key = hashlib.sha256("\0".join([*texts, " ".join(FLAGS), version, cpu_identity()]).encode()).hexdigest()
    folder = cache_dir()
    target = folder / f"nodenom_cpu-{key[:16]}.so"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        try:
            result = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(
                    result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "compiler failed"
                )
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None (with one warning saying why and how to fix it) when it cannot be built."""
    if os.environ.get(DISABLE, "1") == "0":
        return None
    cc = compiler()
    if cc is None:
        warnings.warn(
            "linear attention CPU kernels: no C compiler (cc/gcc) found, using the slower PyTorch path; "
            "install gcc or set CC",
            stacklevel=1,
        )
        return None
    try:
        lib = ctypes.CDLL(str(build(cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        warnings.warn(
            f"linear attention CPU kernels: building the fused CPU kernel failed ({err}); "
            f"using the slower PyTorch path; set {DISABLE}=0 to silence this, "
            "or CLIP_KERNEL_CACHE to a writable folder",
            stacklevel=1,
        )
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.nodenom_forward.argtypes = [p, p, p, p, i64, i64, i64, i64, p, p, p, p, i32, i32]
    lib.nodenom_backward.argtypes = [p, p, p, p, p, p, p, p, i64, i64, i64, i64, p, p, p, i32, i32]
    lib.affine_forward.argtypes = [p, p, p, p, p, i64, i64, i64, i64, p, p, p, p, p, i32]
    lib.affine_backward.argtypes = [p, p, p, p, p, p, p, p, p, p, i64, i64, i64, i64, p, p, p, i32]
    for entry in (lib.nodenom_forward, lib.nodenom_backward, lib.affine_forward, lib.affine_backward):
        entry.restype = i32
    return lib


def usable(*tensors: Tensor | None) -> bool:
    """True when the kernel can take these [G, N, D] tensors: fp32 on the CPU, none empty, a supported head size, and
    a build."""
    real = [t for t in tensors if t is not None]
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 and t.numel() > 0 for t in real)
        and real[0].shape[-1] in HEAD_DIMS
        and library() is not None
    )


def streams(out: Tensor) -> bool:
    """Non-temporal stores for outputs of at least STREAM_BYTES: larger than the caches, so keeping them there only
    costs reads."""
    return out.numel() * out.element_size() >= STREAM_BYTES


def pointer(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def forward(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Writes o into out [G, N, D]; returns rq [G, N, 1], rk [G, M, 1] (zero for padded keys) and the state
    [G, D + 1, D] = [S; s].

    Every tensor must be contiguous (AffineNoDenom makes them so and keeps them for the backward).
    """
    (G, N, D), M = q.shape, k.shape[1]
    rq, rk, state = q.new_empty(G, N, 1), k.new_empty(G, M, 1), q.new_empty(G, D + 1, D)
    status = library().nodenom_forward(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        pointer(keep),
        G,
        N,
        M,
        D,
        out.data_ptr(),
        rq.data_ptr(),
        rk.data_ptr(),
        state.data_ptr(),
        torch.get_num_threads(),
        streams(out),
    )
    if status != 0:
        out_of_memory(G, D)
    return rq, rk, state


def backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    rq: Tensor,
    rk: Tensor,
    state: Tensor,
    grad_q: Tensor,
    grad_k: Tensor,
    grad_v: Tensor,
) -> None:
    """Writes dL/dq, dL/dk, dL/dv [G, N or M, D] into grad_q, grad_k, grad_v from dL/do = grad and forward()'s
    results."""
    (G, N, D), M = q.shape, k.shape[1]
    grad = grad.contiguous()  # a name keeps it alive through the call
    status = library().nodenom_backward(
        grad.data_ptr(),
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        pointer(keep),
        rq.data_ptr(),
        rk.data_ptr(),
        state.data_ptr(),
        G,
        N,
        M,
        D,
        grad_q.data_ptr(),
        grad_k.data_ptr(),
        grad_v.data_ptr(),
        torch.get_num_threads(),
        streams(grad_q),
    )
    if status != 0:
        out_of_memory(G, D)


def affine_forward(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, count: Tensor, out: Tensor
) -> tuple[Tensor, ...]:
    """linear_affine: writes o into out [G, N, D]; returns rq, den [G, N, 1], rk [G, M, 1] and the state
    [G, D + 2, D] = [S; c; z].

    count [G] (float): the number of real keys per head. Every tensor must be contiguous.
    """
    (G, N, D), M = q.shape, k.shape[1]
    rq, den, rk, state = q.new_empty(G, N, 1), q.new_empty(G, N, 1), k.new_empty(G, M, 1), q.new_empty(G, D + 2, D)
    status = library().affine_forward(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        pointer(keep),
        count.data_ptr(),
        G,
        N,
        M,
        D,
        out.data_ptr(),
        rq.data_ptr(),
        rk.data_ptr(),
        den.data_ptr(),
        state.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:
        out_of_memory(G, D)
    return rq, den, rk, state


def affine_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    count: Tensor,
    rq: Tensor,
    den: Tensor,
    rk: Tensor,
    state: Tensor,
    grad_q: Tensor,
    grad_k: Tensor,
    grad_v: Tensor,
) -> None:
    """linear_affine: writes dL/dq, dL/dk, dL/dv into grad_q, grad_k, grad_v from dL/do = grad and affine_forward()'s
    results."""
    (G, N, D), M = q.shape, k.shape[1]
    grad = grad.contiguous()  # a name keeps it alive through the call
    status = library().affine_backward(
        grad.data_ptr(),
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        pointer(keep),
        count.data_ptr(),
        rq.data_ptr(),
        rk.data_ptr(),
        den.data_ptr(),
        state.data_ptr(),
        G,
        N,
        M,
        D,
        grad_q.data_ptr(),
        grad_k.data_ptr(),
        grad_v.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:
        out_of_memory(G, D)


def out_of_memory(G: int, D: int):
    raise MemoryError(f"the fused CPU attention kernel could not allocate its scratch (G={G}, D={D}); set {DISABLE}=0")
