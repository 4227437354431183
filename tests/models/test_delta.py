"""The delta rule (deltanet, models/attention/delta.py): the chunkwise form equals the token-by-token recurrence,
forward and backward; a tiny CLIP trains with it in the text tower; the image tower refuses it in one line."""

import pytest
import torch

from models import ModelConfig, build_clip, tokenizer
from models.attention import build_attention
from models.attention.delta import Whole, chunked, recurrent
from models.attention.ops import causal_cpu
from train.config import ConfigError, build_config


def inputs(B, H, N, D, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=generator, dtype=dtype) for _ in range(3))
    beta = torch.rand(B, H, N, generator=generator, dtype=dtype)
    mask = torch.rand(B, N, generator=generator) > 0.25
    mask[:, 0] = True
    return q, k, v, beta, mask


@pytest.mark.parametrize(
    "B, H, N, D, chunk",
    [
        (1, 1, 1, 4, 64),
        (2, 3, 7, 8, 4),
        (2, 2, 33, 8, 8),
        (1, 2, 70, 16, 64),
        (1, 2, 77, 8, None),
        (1, 1, 129, 8, None),
    ],
)  # chunk None: the default, one whole chunk up to decay.WHOLE = 128 tokens, chunks of 64 beyond
def test_chunks_equal_the_recurrence(B, H, N, D, chunk):
    q, k, v, beta, mask = inputs(B, H, N, D)
    for key_mask in (None, mask):
        expected = recurrent(q, k, v, beta, key_mask=key_mask)
        assert (chunked(q, k, v, beta, key_mask=key_mask, chunk_size=chunk) - expected).abs().max() < 1e-10


def test_a_padded_key_changes_nothing_and_each_correction_is_a_projection():
    q, k, v, beta, _ = inputs(1, 1, 5, 4)
    mask = torch.tensor([[True, True, False, True, True]])
    keep = [0, 1, 3, 4]
    padded = recurrent(q, k, v, beta, key_mask=mask)[:, :, keep]
    dropped = recurrent(q[:, :, keep], k[:, :, keep], v[:, :, keep], beta[:, :, keep])
    assert torch.allclose(padded, dropped)
    one = recurrent(q[:, :, :1], k[:, :, :1], v[:, :, :1], torch.ones(1, 1, 1, dtype=torch.float64))
    unit = lambda t: t / t.norm(dim=-1, keepdim=True)  # noqa: E731
    # beta = 1 on the first token: S = v k^T, so o = v (k^ . q^)
    assert torch.allclose(one, v[:, :, :1] * (unit(k[:, :, :1]) * unit(q[:, :, :1])).sum(-1, keepdim=True))


def test_gradients_of_the_chunks_are_the_recurrences():
    q, k, v, beta, mask = inputs(1, 2, 11, 4)
    args = [t.requires_grad_() for t in (q, k, v, beta)]
    torch.autograd.gradcheck(lambda *a: chunked(*a, key_mask=mask, chunk_size=4), args)
    q32, k32, v32, b32 = (t.detach().float().requires_grad_() for t in args)
    out = chunked(q32, k32, v32, b32, key_mask=mask, chunk_size=4)
    grads = torch.autograd.grad(out.square().sum(), (q32, k32, v32, b32))
    reference = torch.autograd.grad(recurrent(*args, key_mask=mask).square().sum(), args)
    for got, want in zip(grads, reference):
        assert (got.double() - want).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.parametrize("N", [1, 5, 77])
def test_the_whole_sequence_function_is_the_recurrence_forward_and_backward(N):
    """delta.Whole (one chunk, no key mask: the text tower) from beta's logits, in fp64 gradcheck and against the
    token-by-token rule, gradients of the logits included."""
    q, k, v, _, _ = inputs(1, 2, N, 4, seed=N)
    logits = torch.randn(1, N, 2, dtype=torch.float64)
    want = recurrent(q, k, v, torch.sigmoid(logits).transpose(1, 2))
    assert (Whole.apply(q, k, v, logits) - want).abs().max() < 1e-10
    if N <= 5:
        args = [t.clone().requires_grad_() for t in (q, k, v, logits)]
        torch.autograd.gradcheck(Whole.apply, args)
    args = [t.clone().requires_grad_() for t in (q, k, v, logits)]
    grads = torch.autograd.grad(Whole.apply(*args).square().sum(), args)
    wanted = torch.autograd.grad(recurrent(*args[:3], torch.sigmoid(args[3]).transpose(1, 2)).square().sum(), args)
    for got, expected in zip(grads, wanted):
        assert (got - expected).abs().max() <= 1e-9 * expected.abs().max()


def test_the_layer_takes_the_whole_sequence_function_only_without_a_key_mask_in_one_chunk(monkeypatch):
    layer = build_attention("deltanet", 16, 2, causal=True).double()
    q, k, v, _, mask = inputs(2, 2, 9, 8)
    calls, original = [], Whole.apply
    monkeypatch.setattr(Whole, "apply", lambda *a: calls.append(1) or original(*a))
    for key_mask in (None, mask):
        got = layer.attention(q, k, v, key_mask)
        assert (got - layer.attention_reference(q, k, v, key_mask)).abs().max() < 1e-10
    layer.chunk_size = 4
    layer.attention(q, k, v, None)
    assert calls == [1]


@pytest.mark.parametrize("B,H,N,D", [(1, 1, 1, 16), (2, 3, 7, 32), (1, 2, 77, 64), (2, 1, 63, 128), (1, 2, 129, 16)])
def test_the_c_kernel_is_the_recurrence_forward_and_backward(B, H, N, D):
    """causal_cpu.delta (fp32, ops/causal_cpu.c: forward substitution, back substitution in the backward) against the
    fp64 token-by-token rule, gradients of q, k, v and beta's logits included; N = 1, N not a multiple of its
    4-row tiles, every head size."""
    q, k, v, _, _ = inputs(B, H, N, D, seed=N)
    logits = torch.randn(B, N, H, dtype=torch.float64)
    args = [t.clone().requires_grad_() for t in (q, k, v, logits)]
    want = recurrent(*args[:3], torch.sigmoid(args[3]).transpose(1, 2))
    grad = torch.randn_like(want)
    wanted = torch.autograd.grad(want, args, grad)
    args32 = [t.detach().float().requires_grad_() for t in args]
    got = causal_cpu.delta(*args32)
    assert got.dtype == torch.float32
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    for g, w in zip(torch.autograd.grad(got, args32, grad.float()), wanted):
        assert (g.double() - w).abs().max() <= 1e-4 * w.abs().max()


def test_the_layer_takes_the_c_kernel_in_fp32_on_the_cpu_without_a_key_mask(monkeypatch):
    layer = build_attention("deltanet", 32, 2, causal=True)
    q, k, v, _, mask = (t.float() if t.is_floating_point() else t for t in inputs(2, 2, 9, 16))
    calls, original = [], causal_cpu.delta
    monkeypatch.setattr(causal_cpu, "delta", lambda *a: calls.append(1) or original(*a))
    for key_mask in (None, mask):
        got = layer.attention(q, k, v, key_mask)
        assert (got - layer.attention_reference(q, k, v, key_mask)).abs().max() < 1e-5
    assert calls == [1]


def test_a_tiny_clip_trains_with_deltanet_in_the_text_tower_and_the_image_tower_refuses_it():
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="tiny-s", text_attention="deltanet"))
    text = tokenizer("tiny-s")(["a red circle", "two blue squares"])
    images = torch.randn(2, 3, 32, 32)
    image_features, text_features, scale = model(images, text)[:3]
    (scale * image_features @ text_features.T).logsumexp(1).sum().backward()
    assert model.transformer.resblocks[0].attn.beta_proj.weight.grad.abs().sum() > 0
    with pytest.raises(
        ConfigError, match=r"^model.image_attention: attention 'deltanet' is causal only \(text tower\)"
    ):
        build_config({"model": {"image_attention": "deltanet"}})
    with pytest.raises(ValueError, match="unknown options width; it takes chunk_size"):
        build_attention("deltanet", 32, 4, causal=True, width=3)
