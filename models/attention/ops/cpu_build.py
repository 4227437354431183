"""Builds the fused CPU kernels (causal_cpu.c and every op folder's *.c, with linear_cpu.h) into one library with the
system C compiler on first use and loads it through ctypes; each op's cpu.py declares the signatures of its own
kernels (`declare`) and calls them.

The kernels compute the non-causal form of the ops that have one in C and the causal forms of every op up to
causal.QUADRATIC_MAX tokens, forward and backward, in one OpenMP region each (see the C files' headers); each op's
torch.py is the same math in PyTorch ops, which the dispatcher (dispatch.py) takes where a kernel cannot run: no C
compiler, a GPU, fp64, a head size other than 16/32/64/128, a non-causal form without a C kernel, torch.compile, or
CLIP_CPU_KERNEL=0. bf16 and fp16 inputs are upcast to
fp32 for the kernels (one pass, far cheaper on the CPU than the many small ops of the PyTorch path).

The library is compiled with -march=native into a cache folder ($CLIP_KERNEL_CACHE, else
$XDG_CACHE_HOME/clip-attention, else ~/.cache/clip-attention) under a name that hashes the source,
the flags, the compiler and this CPU's identity, so nodes of a cluster that share a home folder but
differ in CPU each get their own build; a build is written to a temporary name and renamed, so ranks
that start together never load a half-written file. Compiling takes about 20 s on one core (causal_cpu.c, specialised
per head size).
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

from models.attention.ops.common import dtype_name

HERE = Path(__file__).parent
SOURCES = [
    HERE / "causal_cpu.c",
    HERE / "manhattan_cpu.c",
    *sorted(HERE.glob("*/*.c")),
]  # one library: the shared kernels and each op's own
HEADERS = [HERE / "linear_cpu.h"]
P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
SIGNATURES: dict[str, list] = {}  # kernel name -> argument types (declare)
# 256-bit vectors for the simd loops: GCC 12 tunes the AMD EPYCs that virtual machines report as family 23 model 1 as
# znver1 and keeps them to 128 bits; on a 2-core one (AVX2) 256 bits took causal_cpu.c's forward + backward at N = 77
# from 0.86 to 0.67 ms and the non-causal kernels' from 10.6 to 6.2 ms (B = 64, N = 17, D = 16). AVX-512 tunings
# already prefer 256. x86 only (other compilers' targets have no such flag).
X86_FLAGS = ["-mprefer-vector-width=256"] if platform.machine().lower() in ("x86_64", "amd64") else []
# -fno-trapping-math: no code here reads floating-point exceptions, and without it GCC keeps a select such as
# x < -87 ? -87 : x out of vectorised loops (causal_cpu.c's exp_neg ran one element at a time)
FLAGS = [
    *["-O3", "-march=native", *X86_FLAGS, "-fno-math-errno", "-fno-trapping-math", "-fopenmp"],
    *["-shared", "-fPIC", "-std=gnu11"],
]
HEAD_DIMS = (16, 32, 64, 128)
DISABLE = "CLIP_CPU_KERNEL"
STREAM_BYTES = 32 << 20
LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)  # what the kernels take; they compute in fp32


def cpu_identity() -> str:
    """What -march=native depends on: the machine, and on Linux the CPU model and its flags."""
    parts = [platform.machine()]
    try:
        text = Path("/proc/cpuinfo").read_text()
        parts += sorted({line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))})
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def cpu_flags() -> set[str]:
    """This CPU's feature flags (the words of cpu_identity): what wide_vectors reads, apart from the build's key."""
    return set(cpu_identity().split())


@functools.cache
def wide_vectors() -> bool:
    """Whether this CPU has the 16-float vectors (AVX-512F) that the non-causal kernels' vf type is written for
    (linear_cpu.h), or CLIP_CPU_KERNEL=1 asks for the kernels anyway. Without them GCC splits every vector op and
    lane shuffle and PyTorch's ops are faster: on a 2-core AVX2-only AMD EPYC the kernels took 1.4-2.5x PyTorch's
    time at the main job's 17 image tokens and 2.2-3.5x at 197-1,025 tokens (forward + backward), and with 256-bit
    vectors (X86_FLAGS) still 1.6x and 2.9-3.1x (Eq. 7); causal_cpu.c, written with plain simd loops, stayed
    1.4-1.7x faster than PyTorch there."""
    return os.environ.get(DISABLE) == "1" or "avx512f" in cpu_flags()


NARROW = (
    "this CPU has no AVX-512F, whose 16-float vectors the non-causal C kernels are written for, and PyTorch's ops are "
    f"faster without them ({DISABLE}=1 uses the kernels anyway)"
)


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
    target = folder / f"linear_cpu-{key[:16]}.so"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        try:
            command = [cc, *FLAGS, f"-I{HERE}", *map(str, SOURCES), "-o", tmp, "-lm"]
            result = subprocess.run(command, capture_output=True, text=True)
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
def load() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded kernels, "") or (None, why not); a missing or failing compiler also warns once, naming the fix."""
    if os.environ.get(DISABLE, "1") == "0":
        return None, f"{DISABLE}=0 turns the C kernels off"
    cc = compiler()
    if cc is None:
        warnings.warn(
            "linear attention CPU kernels: no C compiler (cc/gcc) found, using the slower PyTorch path; "
            "install gcc or set CC",
            stacklevel=1,
        )
        return None, "no C compiler (cc/gcc) was found; install gcc or set CC"
    try:
        lib = ctypes.CDLL(str(build(cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        warnings.warn(
            f"linear attention CPU kernels: building the fused CPU kernel failed ({err}); "
            f"using the slower PyTorch path; set {DISABLE}=0 to silence this, "
            "or CLIP_KERNEL_CACHE to a writable folder",
            stacklevel=1,
        )
        return None, f"building the C kernels failed ({err}); set CLIP_KERNEL_CACHE to a writable folder"
    for name, argtypes in SIGNATURES.items():
        entry = getattr(lib, name)
        entry.argtypes, entry.restype = argtypes, I32
    return lib, ""


def declare(**signatures: list) -> None:
    """The argument types of kernels of the library (P, I64, I32, F32), by function name; every kernel returns a
    status."""
    SIGNATURES.update(signatures)


# the causal forms' kernel, shared by every op: unit and normalised are the op's description (ops/op.py)
declare(
    causal_forward=[P, P, P, P, P, I64, I64, I64, I64, I32, I32, P, P, P, P, I32],
    causal_backward=[P, P, P, P, P, P, I64, P, P, P, P, I64, I64, I64, I32, I32, P, P, P, P, I32],
    delta_forward=[P, P, P, P, I64, I64, I64, I64, P, P, P, P, I32],
    delta_backward=[P, P, P, P, P, P, P, P, I64, I64, I64, I64, P, P, P, P, I32],
    decayed_forward=[P, P, P, P, P, I64, I64, I32, F32, F32, F32, I64, I64, I64, P, P, P, I32],
    decayed_backward=[P, P, P, P, P, P, P, I64, I64, F32, I64, I64, I64, P, P, P, P, I32],
    manhattan_forward=[P, P, P, P, I64, I64, I64, I64, I64, P, I32],  # retention_2d's grid (ops/manhattan.py)
)


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (see load() for why)."""
    return load()[0]


def why_not(q: Tensor) -> str:
    """Why the C kernels cannot take q [..., N, D] ("" when they can): device, dtype, head size, build."""
    if q.device.type != "cpu":
        return f"the C kernels run on the CPU, the inputs are on {q.device.type}"
    if q.dtype not in LOW_PRECISION:
        return f"the C kernels take float32 (bf16 and fp16 upcast to it), the inputs are {dtype_name(q.dtype)}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"the C kernels take head sizes {', '.join(map(str, HEAD_DIMS))}, not {q.shape[-1]}"
    if torch.compiler.is_compiling():
        return "torch.compile cannot trace the C kernels' ctypes call"
    return load()[1]


def streams(out: Tensor) -> bool:
    """Non-temporal stores for outputs of at least STREAM_BYTES: larger than the caches, so keeping them there only
    costs reads."""
    return out.numel() * out.element_size() >= STREAM_BYTES


def pointer(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def check(status: int, G: int, D: int) -> None:
    """A kernel's return status: non-zero when it could not allocate its scratch."""
    if status != 0:
        raise MemoryError(
            f"the fused CPU attention kernel could not allocate its scratch (G={G}, D={D}); set {DISABLE}=0"
        )
