"""Every launch of the Triton kernels through Triton's real compiler for an H200 (sm_90), without a GPU.

The interpreter runs a kernel as Python: it accepts code the compiler refuses (a loop-carried name whose
type changes, say) and knows nothing of shared memory. Here the host code's launches are recorded on meta
tensors, with the block sizes, warps and stages it would use on the GPU, and each is compiled to a cubin
with the ptxas that ships with triton. Runs in a subprocess, as the test process has TRITON_INTERPRET=1.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from models.attention.ops import dispatch

SHARED_MEMORY = 232448  # bytes one block may use on an H100 / H200 (227 KB)
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.uint8: "u8"}


def signature(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    """Types, constants and 16-divisibility hints of one launch, as triton.jit derives them."""
    types, constants, hints = {}, {}, {}
    for i, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if value is None:
            types[name], constants[name] = "constexpr", None
        elif isinstance(value, torch.Tensor):
            types[name], hints[(i,)] = "*" + TYPES[value.dtype], [["tt.divisibility", 16]]
        else:
            types[name] = "i32" if abs(value) < 2**31 else "i64"
            if value % 16 == 0:
                hints[(i,)] = [["tt.divisibility", 16]]
    for name in kernel.arg_names[len(args) :]:
        types[name], constants[name] = "constexpr", kwargs[name]
    return types, constants, hints


def launches(name: str, causal: bool, dtype: torch.dtype, head_dim: int) -> list:
    """(kernel, args, kwargs) of each launch of one forward and backward, recorded on meta tensors."""
    from models.attention.ops import dispatch
    from models.attention.ops import triton_common as tc

    recorded = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: recorded.append((self.kernel, args, kwargs))

    kernels = {k: getattr(tc, k) for k in ("state_kernel", "query_kernel", "key_kernel")}
    for k, kernel in kernels.items():
        setattr(tc, k, Recorder(kernel))
    try:
        q = torch.empty(2, 4, 1000, head_dim, device="meta", dtype=dtype)
        mask = torch.empty(2, 1000, device="meta", dtype=torch.uint8)
        plan = tc.Plan(q, causal, dispatch.TABLES[name].op, masked=True)
        _, state = tc.forward(plan, q, q, q, mask)
        tc.backward(plan, torch.empty_like(q), q, q, q, mask, state)
    finally:
        for k, kernel in kernels.items():
            setattr(tc, k, kernel)
    return recorded


def compile_all(cases: list) -> list[dict]:
    """Compiles every launch of each (name, dtype, head size), causal and not, for sm_90;
    -> one dict per launch: case, kernel, shared memory bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results = []
    for name, dtype, head_dim in cases:
        for causal in (False, True):
            for kernel, args, kwargs in launches(name, causal, getattr(torch, dtype), head_dim):
                options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages")}
                types, constants, hints = signature(kernel, args, kwargs)
                compiled = triton.compile(
                    ASTSource(kernel, types, constants, hints), target=GPUTarget("cuda", 90, 32), options=options
                )
                label = f"{kernel.__name__} causal={causal} GRAD={kwargs.get('GRAD', True)}"
                results.append({"case": [name, dtype, head_dim], "kernel": label, "shared": compiled.metadata.shared})
    return results


def ptxas_present() -> bool:
    import triton

    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


# every combination of the UNIT / NORM switches in bf16 at D = 64, and fp32 at the largest head size
CASES = [(name, "bfloat16", 64) for name in dispatch.linear_ops()] + [("linear_affine", "float32", 128)]


@pytest.mark.skipif(not ptxas_present(), reason="this triton has no NVIDIA backend with ptxas")
def test_every_launch_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json; from tests.models.test_triton_compile import CASES, compile_all; "
        "print(json.dumps(compile_all(CASES)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    # per case, forward: state, query; backward: query, key; causal forward: query; backward: query, key
    assert len(results) == 7 * len(CASES)
    for r in results:
        assert r["shared"] <= SHARED_MEMORY, r
