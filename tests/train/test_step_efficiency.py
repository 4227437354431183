"""What GPU users expect of the loop, checked on the CPU: one host sync per step outside logging steps, speed
figures (samples/s per GPU, model TFLOP/s) in metrics.jsonl, TF32 and fused AdamW switches, data workers that
live for the epoch with their prefetch."""

import copy
import math
import sys
from collections import Counter

import pytest
import torch

import data.shards
import train.loop
from models import ModelConfig, build_clip, gmacs_per_sample
from tests.train.common import run, tiny_config, train_records
from train.config import OptimConfig
from train.dist import set_tf32
from train.metrics import train_tflops
from train.optim import build_optimizer

# every way Python code makes the host wait for a device tensor's value
SYNCS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


@pytest.fixture
def count_syncs(monkeypatch):
    """{step: host reads of tensor values during that optimizer step}, filled while train.loop.Trainer.step runs."""
    counts, current = Counter(), {"step": None}
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            # the DataLoader draws its workers' seed from a host tensor once per epoch, and the text tower reads its
            # batch's length to trim the padding on the CPU only (models/text.py): no device involved in either
            caller = sys._getframe(1).f_code
            host_only = "torch/utils/data/" in caller.co_filename or caller.co_name == "encode_text_features"
            if current["step"] is not None and not host_only:
                counts[current["step"]] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    step = train.loop.Trainer.step

    def counted_step(self, stop):
        current["step"] = self.progress.step + 1
        try:
            return step(self, stop)
        finally:
            current["step"] = None

    monkeypatch.setattr(train.loop.Trainer, "step", counted_step)
    return counts


def test_one_host_sync_per_step_outside_logging_steps(tmp_path, synthetic, count_syncs):
    """Steps 1, 2, 4, 5 read exactly one tensor value (the agreed loss, norm and stop flag); logging steps
    (3, 6 and the last) read more. As on GPUs: the data loader in a worker process, the fused AdamW (torch's
    default foreach AdamW reads its step counts, host tensors there, once per parameter)."""
    path = tiny_config(
        tmp_path,
        synthetic,
        data={"workers": 1},
        train={"max_steps": 7, "log_every": 3},
        optim={"grad_clip_norm": 1.0, "fused": True},
    )
    assert run(path) == 0
    assert [r["step"] for r in train_records(tmp_path / "run")] == [3, 6, 7]
    assert {s: count_syncs[s] for s in (1, 2, 4, 5)} == {1: 1, 2: 1, 4: 1, 5: 1}, count_syncs
    assert all(count_syncs[s] > 1 for s in (3, 6, 7))  # the counter sees the reads it should


def test_speed_figures_in_metrics(tmp_path, synthetic):
    assert run(tiny_config(tmp_path, synthetic, train={"max_steps": 3})) == 0
    gmacs = gmacs_per_sample(build_clip(ModelConfig(name="tiny-s")))["gmacs_per_sample"]
    for r in train_records(tmp_path / "run"):
        assert r["samples_per_s"] > 0 and r["samples_per_s_per_gpu"] == r["samples_per_s"]  # one process
        assert r["tflops_per_gpu"] == pytest.approx(6 * gmacs * r["samples_per_s_per_gpu"] / 1e3)
        assert "max_memory_gb" not in r  # a CUDA figure
    assert train_tflops(20.0, 1000.0) == pytest.approx(120.0)  # 6 x 20 GMACs x 1000 samples/s


def test_tf32_switch():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for enabled in (True, False):
            set_tf32(enabled)
            assert torch.backends.cuda.matmul.allow_tf32 is enabled and torch.backends.cudnn.allow_tf32 is enabled
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_fused_adamw_takes_the_same_steps():
    """optim.fused=null picks the fused kernel (CPU and CUDA); its updates equal torch's default loop's for the same
    gradients; optim.fused=false gives the default."""
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="tiny-s"))
    images, tokens = torch.randn(4, 3, 32, 32), torch.randint(1, 49407, (4, 32))
    image_features, text_features, scale = model(images, tokens)
    (scale * image_features @ text_features.T).logsumexp(-1).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    weights = []
    for fused in (False, None):
        twin = copy.deepcopy(model)
        optimizer, _ = build_optimizer(twin, OptimConfig(lr=1e-3, warmup_steps=1, fused=fused), 10)
        assert optimizer.defaults["fused"] is (None if fused is False else True)
        for _ in range(3):
            for name, p in twin.named_parameters():
                p.grad = grads[name].clone()
            optimizer.step()
        weights.append(twin.state_dict())
    for k in weights[0]:  # a few ulp apart at most: the two kernels round differently (2^-23 = 1.2e-7 seen near 1)
        torch.testing.assert_close(weights[0][k], weights[1][k], rtol=1e-6, atol=1e-8, msg=k)
    assert build_optimizer(model, OptimConfig(fused=False), 10)[0].defaults["fused"] is None
    assert build_optimizer(model, OptimConfig(), 10)[0].defaults["fused"] is True


def test_data_workers_live_for_the_epoch(tmp_path, synthetic, monkeypatch):
    """Checkpoints and evaluations inside an epoch keep the loader and its workers; prefetch is configurable."""
    made = []
    loader = data.shards.DataLoader

    def recording(*args, **kwargs):
        made.append(kwargs)
        return loader(*args, **kwargs)

    monkeypatch.setattr(data.shards, "DataLoader", recording)
    path = tiny_config(
        tmp_path,
        synthetic,
        data={"workers": 1, "prefetch_factor": 3},
        train={"max_steps": 4, "save_every": 2},
        eval={"dataset": synthetic["eval"], "every": 2},
    )
    assert run(path) == 0
    assert len(made) == 1 and made[0]["num_workers"] == 1 and made[0]["prefetch_factor"] == 3
    assert all(math.isfinite(r["loss"]) for r in train_records(tmp_path / "run"))
