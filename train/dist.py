"""The distributed setup through accelerate, FSDP sharding, and the per-step agreement between ranks.

`Accelerator()` reads the world from the environment, so `torchrun`, `accelerate launch` and Slurm's
`srun` (one task per node running torchrun) all work unchanged; on machines without a GPU the backend
is gloo. Pre-emption (SIGTERM, or SIGUSR1 from Slurm's `--signal`) only raises a flag; the loop finishes
its step, and all ranks stop at the same step because the flag is all-reduced every step. A rank that hangs or
dies: the collectives of the training steps wait train.dist_timeout_s at most (start-up, checkpoint writes and
evaluations PATIENT_TIMEOUT_S), then the run stops with one line (`collective_failure`).

FSDP (`train.distributed=fsdp`): `shard_model` applies torch's `fully_shard` (FSDP2) itself, one unit per
transformer block and the root for the rest, before `accelerator.prepare`, which keeps a sharded model
as it is and handles the rest (sharded checkpoints, the full state dict for model.safetensors). accelerate treats
FSDP as GPU-only; the tests and the CPU rehearsal of scripts/gpu_train_check.py run this path on gloo CPU processes
through scripts/fsdp_on_cpu.py, which replaces the Accelerator built here in its own processes.
"""

from __future__ import annotations

import os
import random
import signal
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import torch
from accelerate import (
    Accelerator,
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    InitProcessGroupKwargs,
)
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from train.config import ConfigError, TrainConfig

PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# collectives of the start-up, checkpoint writes and evaluations: the other ranks wait at a barrier while rank 0 loads,
# writes, uploads or evaluates; the training steps wait train.dist_timeout_s at most (set_collective_timeout)
PATIENT_TIMEOUT_S = 3600.0


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank_from_env() -> int:
    """This process's rank as torchrun sets it (0 for a single process), known before the Accelerator is built."""
    return int(os.environ.get("RANK", "0"))


def make_accelerator(cfg: TrainConfig) -> Accelerator:
    """An Accelerator for DDP (default) or FSDP, with the configured mixed precision.

    accelerate keeps its state process-wide and refuses other settings (another precision) in a later call: one
    training run per process (the tests that run main() in-process reset that state between runs)."""
    if cfg.precision == "fp16" and (cfg.cpu or not torch.cuda.is_available()):
        raise ConfigError(
            "train.precision=fp16 needs a GPU (its gradient scaler is CUDA-only); use train.precision=bf16 on the CPU"
        )
    if cfg.deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; must be set before the first CUDA matmul
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(cfg.seed)
    fsdp = fsdp_plugin(cfg) if cfg.distributed == "fsdp" else None
    handlers = [
        InitProcessGroupKwargs(timeout=timedelta(seconds=PATIENT_TIMEOUT_S)),
        DistributedDataParallelKwargs(find_unused_parameters=False),
    ]
    accelerator = Accelerator(
        mixed_precision=PRECISION[cfg.precision],
        # accelerate treats a torchrun world as multi-process CPU (gloo) only when told it is on the CPU
        cpu=cfg.cpu or not torch.cuda.is_available(),
        fsdp_plugin=fsdp,
        kwargs_handlers=handlers,
        # the schedule counts optimizer steps; by default accelerate would step it once per process
        step_scheduler_with_optimizer=False,
    )
    if cfg.distributed == "fsdp" and accelerator.distributed_type.name != "FSDP":
        raise ConfigError(
            "train.distributed=fsdp needs several GPU processes (accelerate shards only across GPUs), "
            f"this is {accelerator.distributed_type.name} with {accelerator.num_processes} process(es); "
            "use train.distributed=ddp"
        )
    if accelerator.device.type == "cuda":
        set_tf32(cfg.tf32)
    return accelerator


def set_tf32(enabled: bool) -> None:
    """CUDA's fp32 matmuls and convolutions on tensor cores in TF32 (10-bit mantissa, about 8x the fp32 rate on
    A100/H100; the fp32 parts of a bf16 run too) or in full fp32."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def fsdp_plugin(cfg: TrainConfig) -> FullyShardedDataParallelPlugin:
    """accelerate's FSDP2 settings: sharded checkpoints (each rank writes its shards), the mixed precision of
    `shard_model`, and no wrapping of its own: `shard_model` has sharded the model before accelerate sees it
    (its blocks are then of class FSDPBlock, which accelerate's wrap policy would look for as Block in vain)."""
    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="no_wrap",
        state_dict_type="SHARDED_STATE_DICT",
        reshard_after_forward=True,
        mixed_precision_policy=fsdp_precision(cfg),
    )


def fsdp_precision(cfg: TrainConfig) -> MixedPrecisionPolicy:
    """FSDP2's mixed precision: parameters all-gathered and used in train.precision's dtype (fp32 master weights
    stay sharded); gradients reduce-scattered in fp32 with train.fsdp_reduce_fp32 (else in that dtype)."""
    dtype = DTYPES[cfg.precision]
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if cfg.fsdp_reduce_fp32 else dtype)


def shard_model(model: nn.Module, cfg: TrainConfig, device_type: str) -> nn.Module:
    """FSDP2 over all ranks, in place: every module whose class is named in train.fsdp_wrap (the transformer blocks)
    becomes one unit gathered just for its own forward and backward; the root holds the rest (embeddings, norms,
    projections, the [1]-shaped logit scale). `device_type` is the mesh's ("cuda", or "cpu" with gloo in tests)."""
    from torch.distributed.device_mesh import init_device_mesh

    units = [m for m in model.modules() if type(m).__name__ in cfg.fsdp_wrap]
    if not units:
        raise ConfigError(
            f"train.fsdp_wrap={list(cfg.fsdp_wrap)} names no module class of the model; "
            "use its block class, e.g. [Block]"
        )
    mesh = init_device_mesh(device_type, (torch.distributed.get_world_size(),))
    policy = fsdp_precision(cfg)
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    # the root stays gathered after its forward: its parameters are needed again at once by the backward
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def seed_everything(seed: int) -> None:
    """The same seed on every rank, so every rank builds the same initial model."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - seeds numpy's global RNG on purpose, for user code that draws from it
    torch.manual_seed(seed)


class StopFlag:
    """Set by SIGTERM/SIGUSR1; read once per step. Installs its handlers for the life of the object."""

    def __init__(self):
        self.signal: int | None = None
        self.previous = {}
        for sig in PREEMPT_SIGNALS:
            self.previous[sig] = signal.signal(sig, self.handle)

    def handle(self, signum, frame) -> None:
        self.signal = signum

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    @property
    def requested(self) -> bool:
        return self.signal is not None


def set_collective_timeout(accelerator: Accelerator, seconds: float) -> None:
    """How long every later collective of the default process group waits for the other ranks: gloo raises a
    RuntimeError (turned into one line by `collective_failure`), NCCL's watchdog aborts the process."""
    if accelerator.num_processes > 1:
        torch.distributed.set_timeout(timedelta(seconds=seconds))


@contextmanager
def patient_collectives(accelerator: Accelerator, then_s: float):
    """Collectives inside wait up to PATIENT_TIMEOUT_S (a checkpoint write, an evaluation), then `then_s` again."""
    set_collective_timeout(accelerator, PATIENT_TIMEOUT_S)
    try:
        yield
    finally:
        set_collective_timeout(accelerator, then_s)


def collective_failure(error: RuntimeError, timeout_s: float) -> str | None:
    """One line for a collective that timed out or lost its peer (gloo's errors; NCCL's watchdog aborts instead),
    naming this rank, the other rank when there are two, and the fix; None for any other error."""
    text = str(error)
    # a timeout in a send or receive, or in work that runs asynchronously (DDP's gradient all-reduce in the backward)
    timed_out = "Timed out" in text or "timed out" in text or "Application timeout caused pair closure" in text
    if not (timed_out or "Connection closed by peer" in text or "Connection reset by peer" in text):
        return None
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if initialized else (0, 1)
    other = f"rank {1 - rank}" if world == 2 else "another rank"
    if timed_out:
        return (
            f"rank {rank}: a collective waited more than train.dist_timeout_s={timeout_s:g} s for {other}, which "
            "stopped answering (hung, stopped, or its node lost); the job stops instead of holding its GPUs. See "
            "that rank's log; raise train.dist_timeout_s if a training step can legitimately take that long"
        )
    return (
        f"rank {rank}: {other} closed its connection during a collective (it crashed or was killed: see its log); "
        "the job stops; with train.max_restarts the Slurm job is requeued and resumes from the last checkpoint"
    )


def agree(
    accelerator: Accelerator, loss: torch.Tensor, grad_norm: torch.Tensor, stop: bool
) -> tuple[float, float, bool]:
    """(loss averaged over ranks, gradient norm, whether any rank must stop) from one small all-reduce: the one
    host synchronisation of a training step.

    A non-finite loss on any rank makes the average non-finite, so every rank skips the same step. The gradient
    norm is already global (computed after DDP's all-reduce or over FSDP's shards): the mean keeps it.
    """
    norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a replicated DTensor
    flags = torch.tensor(float(stop), device=loss.device)
    t = torch.stack([loss.detach().float().reshape(()), norm.detach().float().reshape(()).to(loss.device), flags])
    if accelerator.num_processes > 1:
        torch.distributed.all_reduce(t)
    loss_sum, norm_sum, stops = t.tolist()
    return loss_sum / accelerator.num_processes, norm_sum / accelerator.num_processes, stops > 0


def sum_over_ranks(accelerator: Accelerator, counts: dict[str, int]) -> dict[str, int]:
    """Counters (e.g. skipped samples by cause) summed over all ranks; every rank must call it."""
    return {k: int(v) for k, v in reduce_over_ranks(accelerator, counts).items()}


def mean_over_ranks(accelerator: Accelerator, values: dict[str, float]) -> dict[str, float]:
    """Values (e.g. the terms of a composite loss) averaged over all ranks; every rank must call it."""
    return {k: v / accelerator.num_processes for k, v in reduce_over_ranks(accelerator, values).items()}


def reduce_over_ranks(accelerator: Accelerator, values: dict) -> dict:
    """Values summed over all ranks in one float64 all-reduce; every rank must call it."""
    if accelerator.num_processes == 1 or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=accelerator.device)
    torch.distributed.all_reduce(t)
    return dict(zip(keys, t.tolist()))
