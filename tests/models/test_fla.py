"""flash-linear-attention's kernels for retention, ssd and gla (models/attention/ops/fla_kernels.py) against the
quadratic references, causal and two-sided, forward and every gradient (decays included), in fp32.

Without CUDA fla's Triton kernels run on CPU tensors under TRITON_INTERPRET=1 (tests/conftest.py), with `interpreted`
below, a test-only shim of two things the interpreter lacks for fla: its autotuner benchmarks every config through
the GPU driver (triton.runtime.driver: "0 active drivers"), so each kernel keeps its first config; and a for loop's
counter stays a Python int, on which fla calls .to(tl.int64), so the loop's first line makes it a tensor. fla's
bf16 kernels are wrong under the interpreter (1e10 off), so only fp32 is checked here; deltanet is not routed
(fla's chunk_delta_rule refuses fp32)."""

import ast

import pytest
import torch
from triton.runtime import autotuner, interpreter

from models.attention import reference
from models.attention.decay import retention
from models.attention.gated import gated_attention
from models.attention.ops import fla_kernels
from tests.models.test_attention import rel_err
from tests.models.test_decay import padded, qkv

pytest.importorskip("fla")
pytestmark = pytest.mark.filterwarnings("ignore:Triton is not supported on current platform")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KINDS = {"retention": 0, "ssd": 1, "gla": 16}  # decay features: none (fixed gamma_h), one per head, one per feature


class LoopCounters(interpreter.ASTTransformer):
    """The interpreter's rewrite of a kernel, plus `i = interpreter_semantic.to_tensor(i, False)` opening each for
    loop over a name `i`."""

    def visit_For(self, node):
        self.generic_visit(node)
        if isinstance(node.target, ast.Name):
            semantic = ast.Attribute(
                value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor", ctx=ast.Load()
            )
            to_tensor = ast.Call(
                func=semantic, args=[ast.Name(id=node.target.id, ctx=ast.Load()), ast.Constant(False)], keywords=[]
            )
            node.body.insert(0, ast.Assign(targets=[ast.Name(id=node.target.id, ctx=ast.Store())], value=to_tensor))
        return node


@pytest.fixture(scope="module", autouse=True)
def interpreted():
    """On the CPU: the module docstring's shim, for this module's tests only."""
    if DEVICE == "cuda":
        yield
        return
    prune = autotuner.Autotuner.prune_configs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotuner.Autotuner, "prune_configs", lambda self, kwargs: prune(self, kwargs)[:1])
        patch.setattr(interpreter.FunctionRewriter, "ast_transformer", LoopCounters())
        patch.setattr(interpreter.InterpretedFunction, "rewritten_fn", {})
        yield


def run(kind, causal, b, h, n, key_mask=None):
    """Our entry point (decay.retention or gated.gated_attention) in fp32 on DEVICE and the fp64 reference, both
    backpropagated with one random dL/do -> out, ref, [(grad, reference grad)] for q, k, v (and g)."""
    inputs = [*qkv(b, h, n, d=16)]
    if KINDS[kind]:
        inputs.append(-3 * torch.rand(b, h, n, KINDS[kind], dtype=torch.float64) ** 2)
    fast = [t.float().to(DEVICE).requires_grad_() for t in inputs]
    slow = [t.clone().requires_grad_() for t in inputs]
    mask = None if key_mask is None else key_mask.to(DEVICE)
    if kind == "retention":
        out = retention(*fast, causal=causal, key_mask=mask)
        ref = reference.retention(*slow, causal=causal, key_mask=key_mask)
    else:
        out = gated_attention(*fast, causal=causal, key_mask=mask)
        ref = reference.gated(*slow, causal=causal, key_mask=key_mask)
    grad = torch.randn_like(ref)
    out.backward(grad.to(out))
    ref.backward(grad)
    return out.double().cpu(), ref, [(a.grad.double().cpu(), r.grad) for a, r in zip(fast, slow)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True], ids=["two-sided", "causal"])
@pytest.mark.parametrize("b,h,n,masked", [(2, 2, 70, True), (1, 1, 1, False)], ids=["N70-padded", "N1"])
def test_fla_matches_reference(monkeypatch, kind, causal, b, h, n, masked):
    """fla's chunks of 64: N = 70 spans two, the last padded; padded keys as our forms drop them."""
    calls = []
    monkeypatch.setattr(fla_kernels, "FORCE", True)
    monkeypatch.setattr(fla_kernels, "causal", lambda *args, inner=fla_kernels.causal: calls.append(1) or inner(*args))
    out, ref, grads = run(kind, causal, b, h, n, padded(b, n) if masked else None)
    assert len(calls) == (1 if causal else 2), "fla's kernels ran, once per direction"
    assert rel_err(out, ref) <= 1e-4
    for name, (got, want) in zip("qkvg", grads):
        assert rel_err(got, want) <= 1e-4, f"grad of {name}"


@pytest.mark.parametrize("kind", KINDS)
def test_forced_off_runs_the_chunked_forms(monkeypatch, kind):
    """FORCE = False never touches fla, and gives what the chunked forms gave before."""
    monkeypatch.setattr(fla_kernels, "FORCE", False)
    monkeypatch.setattr(fla_kernels, "decayed", lambda *args, **kw: pytest.fail("fla's kernels ran"))
    out, ref, grads = run(kind, False, 2, 2, 20, padded(2, 20))
    assert rel_err(out, ref) <= 1e-5
    assert all(rel_err(got, want) <= 1e-5 for got, want in grads)


def test_use_fla_decides_by_device(monkeypatch):
    """Unforced: fla's kernels for fp32 CUDA tensors when fla imports, never for CPU or fp64 ones."""
    cpu = torch.zeros(1, 1, 2, 16)
    assert not fla_kernels.use_fla(cpu)
    assert not fla_kernels.use_fla(cpu.double())
    if DEVICE == "cuda":
        assert fla_kernels.use_fla(cpu.cuda()) and not fla_kernels.use_fla(cpu.cuda().double())
    monkeypatch.setattr(fla_kernels, "FORCE", True)
    assert fla_kernels.use_fla(cpu)
    monkeypatch.setattr(fla_kernels, "FORCE", False)
    monkeypatch.setattr(fla_kernels, "importable", lambda: True)
    assert not fla_kernels.use_fla(cpu)
