"""Checks that need a CUDA GPU (run on the device machine; every test skips cleanly without one).

Every registered attention on CUDA against its fp64 reference (fp32 and bf16, fused SDPA kernels), every
implementation of the linear ops that can run on CUDA (auto, torch, triton where present) likewise,
linear_affine_nodenom in bf16 at N = 65536, and train.main on the GPU: bf16, fp16 (gradient scaler)
and FSDP over two GPUs under torchrun.
"""

import copy

import pytest
import torch
from safetensors.torch import load_file
from torch.nn.attention import SDPBackend, sdpa_kernel

from models import ModelConfig, build_clip
from models.attention import attend
from models.attention.ops import dispatch
from tests.models.test_attention import DIM, MODES, ids, layer, qkv_pair, rel_err
from tests.train.common import TORCHRUN, checkpoints, cli, finish, run, tiny_config, train_records
from tests.train.conftest import fresh_accelerate, synthetic  # noqa: F401  (fixtures, used by name)
from train.checkpoint import read_meta

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP needs at least 2 CUDA GPUs")
FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def options(name: str) -> dict:
    return {"max_length": 1024} if name == "linformer" else {}


@pytest.fixture
def exact_fp32():
    """fp32 matmuls and convolutions in full precision: TF32 (10-bit mantissa) alone would exceed 1e-5."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def on_cuda(tensors, dtype):
    """CPU tensors -> CUDA leaves of `dtype` that record their gradients."""
    return [t.detach().to("cuda", dtype).requires_grad_() for t in tensors]


def cuda_and_reference(mode, n: int, dtype, key_mask):
    """Fast path on CUDA in `dtype` and the fp64 reference on the CPU (the same weights and q, k, v), both
    backpropagated with the same random output gradient. -> (out, ref, [(name, cuda grad, reference grad)])."""
    m = layer(*mode, **options(mode[0]))
    m64 = copy.deepcopy(m).double()
    (q, k, v), (q64, k64, v64) = qkv_pair(2, n)
    q, k, v = on_cuda((q, k, v), dtype)
    out = m.to("cuda", dtype).attention(q, k, v, None if key_mask is None else key_mask.cuda())
    ref = m64.attention_reference(q64, k64, v64, key_mask)
    grad = torch.randn_like(ref)
    out.backward(grad.to("cuda", dtype))
    ref.backward(grad)
    return out, ref, [(name, a.grad.cpu(), r.grad) for name, a, r in (("q", q, q64), ("k", k, k64), ("v", v, v64))]


@needs_gpu
@pytest.mark.parametrize("mode", MODES, ids=ids)
@pytest.mark.parametrize("n", [63, 1000])
def test_cuda_fp32_equals_reference(mode, n, exact_fp32):
    key_mask = torch.ones(2, n, dtype=torch.bool)
    key_mask[-1, -(n // 3) :] = False
    out, ref, grads = cuda_and_reference(mode, n, torch.float32, key_mask)
    assert out.dtype == torch.float32 and out.device.type == "cuda"
    assert rel_err(out.cpu(), ref) <= 1e-5
    for name, a, r in grads:
        assert rel_err(a, r) <= 1e-5, f"grad of {name}"


@needs_gpu
@pytest.mark.parametrize("mode", MODES, ids=ids)
@pytest.mark.parametrize("n", [63, 1000])
def test_cuda_bf16_agrees_with_reference_on_fused_kernels(mode, n):
    """bf16 without a key mask; SDPA may use only its flash / memory-efficient kernels (it raises otherwise)."""
    with sdpa_kernel(FUSED):
        out, ref, grads = cuda_and_reference(mode, n, torch.bfloat16, None)
    assert out.dtype == torch.bfloat16
    assert rel_err(out.float().cpu(), ref) <= 2e-2
    for name, a, r in grads:
        assert rel_err(a.float(), r) <= 2e-2, f"grad of {name}"


@needs_gpu
@pytest.mark.parametrize("mode", MODES, ids=ids)
def test_layer_under_bf16_autocast(mode, exact_fp32):
    """The path of train.precision=bf16: fp32 weights, forward under autocast, backward outside it."""
    m = layer(*mode).cuda()
    x = torch.randn(2, 100, DIM, device="cuda")
    with torch.no_grad():
        exact = m(x)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(x)
    y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and rel_err(y.float(), exact) <= 2e-2
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@needs_gpu
def test_nodenom_bf16_at_65536_tokens(exact_fp32):
    """B=1, H=6, D=64 in bf16: finite output and gradients, within 1e-2 of the fp32 fast path on the same inputs;
    the causal output of the last token (which sees every key) equals the non-causal one."""
    q, k, v = torch.randn(3, 1, 6, 65536, 64, device="cuda").bfloat16().unbind(0)
    last = {}
    for causal in (False, True):
        leaves = on_cuda((q, k, v), torch.bfloat16)
        out = attend("linear_affine_nodenom", *leaves, causal=causal)
        out.backward(torch.randn_like(out))
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        assert all(torch.isfinite(t.grad).all() for t in leaves)
        with torch.no_grad():
            exact = attend("linear_affine_nodenom", q.float(), k.float(), v.float(), causal=causal)
        assert rel_err(out, exact) <= 1e-2
        last[causal] = exact[:, :, -1]
    assert rel_err(last[True], last[False]) <= 1e-5


@needs_gpu
@pytest.mark.parametrize("op", sorted(dispatch.TABLES))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_every_cuda_impl_of_the_linear_ops_equals_reference(op, causal, dtype, tolerance, exact_fp32):
    """Outputs and all three gradients, with padding, at N = 300 (causal: beyond the quadratic form's 256)."""
    base = [torch.randn(2, 3, 300, 64, dtype=torch.float64) for _ in range(3)]
    key_mask = torch.ones(2, 300, dtype=torch.bool)
    key_mask[-1, 250:] = False
    exact = [t.clone().requires_grad_() for t in base]
    ref = dispatch.TABLES[op].reference(*exact, causal=causal, key_mask=key_mask)
    grad = torch.randn_like(ref)
    ref.backward(grad)
    probe = base[0].to("cuda", dtype)
    impls = ["auto"] + [i for i in ("torch", "triton") if not dispatch.why_not(op, i, probe, causal)]
    assert dispatch.resolve(op, "auto", probe, causal) == ("triton" if "triton" in impls else "torch")
    for impl in impls:
        leaves = on_cuda(base, dtype)
        out = attend(op, *leaves, causal=causal, key_mask=key_mask.cuda(), impl=impl)
        out.backward(grad.to("cuda", dtype))
        assert out.dtype == dtype and rel_err(out.float().cpu(), ref) <= tolerance, impl
        for name, a, r in zip("qkv", leaves, exact):
            assert rel_err(a.grad.float().cpu(), r.grad) <= tolerance, f"{impl}: grad of {name}"


@needs_gpu
def test_explicit_cpu_impl_on_cuda_says_why():
    q = torch.randn(1, 2, 9, 64, device="cuda")
    with pytest.raises(ValueError, match="the C kernels run on the CPU, the inputs are on cuda"):
        attend("linear_affine_nodenom", q, q, q, impl="cpu")


def finite_checkpoint(run_dir):
    """The last checkpoint folder of a run; its model.safetensors must be all finite."""
    folder = checkpoints(run_dir)[-1]
    assert all(torch.isfinite(t).all() for t in load_file(str(folder / "model.safetensors")).values())
    return folder


@needs_gpu
@pytest.mark.parametrize("precision, attention", [("bf16", "softmax"), ("fp16", "softmax"), ("bf16", "linear_affine")])
def test_train_main_on_the_gpu(tmp_path, synthetic, precision, attention):  # noqa: F811
    run_dir = tmp_path / "run"
    path = tiny_config(
        tmp_path,
        synthetic,
        eval={"dataset": synthetic["eval"]},
        model={"image_attention": attention, "text_attention": attention},
    )
    assert (
        run(path, "train.max_steps=3", f"train.run_dir={run_dir}", f"train.precision={precision}", "train.cpu=false")
        == 0
    )
    steps = train_records(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3] and all(r["loss"] is not None for r in steps)
    folder = finite_checkpoint(run_dir)
    assert read_meta(folder)["step"] == 3
    scaler = folder / "state" / "scaler.pt"
    assert scaler.is_file() == (precision == "fp16")  # accelerate saves a GradScaler only for fp16
    if precision == "fp16":
        assert torch.load(scaler, weights_only=True)["scale"] > 0


@needs_gpu
@needs_two_gpus
def test_fsdp_on_two_gpus(tmp_path, synthetic):  # noqa: F811
    run_dir = tmp_path / "run"
    path = tiny_config(tmp_path, synthetic, eval={"dataset": synthetic["eval"]})
    proc = cli(
        [
            str(path),
            f"train.run_dir={run_dir}",
            "train.distributed=fsdp",
            "train.precision=bf16",
            "train.max_steps=3",
            "train.cpu=false",
        ],
        launcher=TORCHRUN,
    )
    code, _, err = finish(proc, timeout=400)
    assert code == 0, err[-3000:]
    assert [r["step"] for r in train_records(run_dir)] == [1, 2, 3]
    folder = finite_checkpoint(run_dir)
    meta = read_meta(folder)
    assert meta["step"] == 3
    model = build_clip(ModelConfig(**meta["config"]["model"]))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))  # strict: every key, every shape
