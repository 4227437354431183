import os
import sys
from pathlib import Path

import pytest
import torch

# The repo root is the import root (models/, data/, train/, eval/ are top-level packages).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("WANDB_MODE", "disabled")
# Tiny models gain nothing from intra-op threads, and torch's pool busy-waits when the cores are
# shared (data workers, a second rank): one thread makes these tests many times faster.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
