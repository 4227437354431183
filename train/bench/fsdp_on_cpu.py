"""accelerate's FSDP path on a gloo CPU mesh, for the tests and the CPU rehearsal of scripts/gpu_train_check.py.

    fsdp_on_cpu.install()     # then train.dist.make_accelerator builds an FSDP Accelerator on the CPU too

scripts/fsdp_on_cpu.py is `python -m train` (under torchrun) with this hook installed first. accelerate treats FSDP
as GPU-only: on the CPU an `Accelerator(fsdp_plugin=...)` comes out MULTI_CPU, and train.dist.make_accelerator
refuses train.distributed=fsdp. `install()` replaces the Accelerator that train.dist builds, in this process only,
with one whose FSDP plugin accelerate keeps and whose distributed type is FSDP in both of accelerate's process-wide
states (AcceleratorState() copies PartialState's), so the same code path (train.dist.shard_model, accelerate's FSDP2
prepare, sharded save_state/load_state, no_sync) runs on the CPU. Production code never installs it.
"""

from __future__ import annotations

from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

import train.dist


def accelerator_on_cpu(*args, **kwargs) -> Accelerator:
    """accelerate's Accelerator; with an FSDP plugin on the CPU, switched to FSDP after it is built."""
    accelerator = Accelerator(*args, **kwargs)
    plugin = kwargs.get("fsdp_plugin")
    if plugin is not None and accelerator.device.type == "cpu":
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
        AcceleratorState._shared_state["fsdp_plugin"] = plugin
    return accelerator


def install() -> None:
    """From now on, train.dist.make_accelerator in this process builds its Accelerator through the hook."""
    train.dist.Accelerator = accelerator_on_cpu
