import os
import sys
from pathlib import Path

import pytest
import torch

# The repo root is the import root (models/, data/, train/, eval/ are top-level packages).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
