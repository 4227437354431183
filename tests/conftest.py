import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Tiny models gain nothing from intra-op threads, and torch's pool busy-waits when the cores are
    shared (data workers, a second rank): one thread makes these tests many times faster. Reset for
    every test, so a test that changes it (a benchmark's --threads) leaks nothing."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
