"""Fixtures of the training tests: one small synthetic data set per session, fresh accelerate state per test."""

import pytest
import torch

from data import make_synthetic
from tests.train.common import reset_accelerate


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> dict:
    """{"train": shard spec, "val": shard spec, "eval": ImageFolder path} of 1536 train samples in 24 shards, 128
    validation samples in 2 shards, 5 eval images per class."""
    out = tmp_path_factory.mktemp("synthetic")
    spec = make_synthetic(out, train_samples=1536, eval_per_class=5, shard_size=64, seed=0, val_samples=128)
    return {"train": spec, "val": str(out / "val" / "{00000..00001}.tar"), "eval": str(out / "eval")}


@pytest.fixture(autouse=True)
def fresh_accelerate():
    """main() creates an Accelerator; its process-wide state must not leak into the next test."""
    yield
    reset_accelerate()
    torch.use_deterministic_algorithms(False)
