"""`python -m train` on a gloo CPU mesh through accelerate's FSDP path, for the tests and the CPU rehearsal of
scripts/gpu_train_check.py.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m scripts.fsdp_on_cpu CONFIG.yaml [key=value ...]

is `python -m train` (under torchrun) with train.bench.fsdp_on_cpu's hook installed first (why: its docstring).
Production code never installs it.
"""

from __future__ import annotations

import sys

from train.bench import fsdp_on_cpu

if __name__ == "__main__":
    fsdp_on_cpu.install()
    from train.main import cli

    sys.exit(cli(sys.argv[1:]))
