import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
# Without a GPU the Triton kernels run in Triton's interpreter; triton.jit reads this when a kernel is defined,
# so it must be set before anything imports models.attention.ops (tests/models/test_triton.py checks it took).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Tiny models gain nothing from intra-op threads, and torch's pool busy-waits when the cores are
    shared (data workers, a second rank): one thread makes these tests many times faster. Reset for
    every test, so a test that changes it (a benchmark's --threads) leaks nothing."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
