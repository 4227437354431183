"""FSDP against DDP on a gloo CPU mesh; run by tests/train/test_distributed_fsdp.py under torchrun, 2 processes.

accelerate shards only across GPUs, so here the model is sharded by the project's own `train.dist.shard_model`
(what `python -m train` does before `accelerator.prepare` under train.distributed=fsdp) and trained with the
loop's own functions on fixed synthetic batches. In one process group, one after the other:

1. DDP (accelerate's wrapper), 3 steps;
2. FSDP, 3 steps, with a sharded checkpoint (accelerate's FSDP writers, as its save_state uses them) after step 2;
3. FSDP from scratch, loading that checkpoint, then step 3.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m tests.train.fsdp_worker OUT

OUT/<run>.json holds each run's losses and gradient norms, OUT/<run>.safetensors its full weights (rank 0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from models import ModelConfig, build_clip
from train.config import OptimConfig, TrainConfig
from train.dist import agree, fsdp_plugin, make_accelerator, shard_model
from train.loop import clip_gradients, compute_gradients, should_step
from train.loss import ClipLoss
from train.optim import build_optimizer, clamp_logit_scale

GLOBAL_BATCH, STEPS, SAVE_AT = 16, 3, 2
OPTIM = OptimConfig(lr=1e-4, warmup_steps=1, grad_clip_norm=1.0)
FSDP = TrainConfig(cpu=True, distributed="fsdp", fsdp_wrap=["Block"])


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (images [16, 3, 32, 32], tokens [16, 32]) on every rank for a step: random ids, EOT at 10."""
    g = torch.Generator().manual_seed(1000 + step)
    images = torch.randn(GLOBAL_BATCH, 3, 32, 32, generator=g)
    tokens = torch.zeros(GLOBAL_BATCH, 32, dtype=torch.long)
    tokens[:, :10] = torch.randint(1, 1000, (GLOBAL_BATCH, 10), generator=g)
    tokens[:, 10] = 49407  # end of text: the text tower pools here (the largest id)
    return images, tokens


def rank_batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    images, tokens = global_batch(step)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    return images[rows], tokens[rows]


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank and in the one-process reference
    return build_clip(ModelConfig(name="tiny-s"))


def train_steps(accelerator, model, optimizer, schedule, steps: range) -> dict:
    """The loop's step (gradients, norm, agreement, update, schedule, clamp) on the fixed batches."""
    losses, norms = [], []
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        batch = rank_batch(step, accelerator.process_index, accelerator.num_processes)
        loss = compute_gradients(accelerator, model, ClipLoss(), [batch])
        loss, norm, _ = agree(accelerator, loss, clip_gradients(accelerator, model, OPTIM.grad_clip_norm), False)
        assert should_step(accelerator, loss, norm)
        optimizer.step()
        schedule.step()
        clamp_logit_scale(accelerator.unwrap_model(model))
        losses.append(loss)
        norms.append(norm)
    return {"losses": losses, "grad_norms": norms}


def save(out: Path, name: str, record: dict, weights: dict, rank: int) -> None:
    if rank == 0:
        (out / f"{name}.json").write_text(json.dumps(record))
        save_file({k: v.contiguous() for k, v in weights.items()}, str(out / f"{name}.safetensors"))


def full_weights(model) -> dict:
    """The full state dict of a sharded model, gathered on every rank (a collective)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def sharded():
    model = shard_model(fresh_model(), FSDP, "cpu")
    optimizer, schedule = build_optimizer(model, OPTIM, STEPS)
    return model, optimizer, schedule


def main(out: Path) -> None:
    accelerator = make_accelerator(TrainConfig(cpu=True))
    rank, plugin = accelerator.process_index, fsdp_plugin(FSDP)
    model = fresh_model()
    optimizer, schedule = build_optimizer(model, OPTIM, STEPS)
    model, optimizer = accelerator.prepare(model, optimizer)
    record = train_steps(accelerator, model, optimizer, schedule, range(STEPS))
    save(out, "ddp", record, accelerator.unwrap_model(model).state_dict(), rank)

    model, optimizer, schedule = sharded()
    record = train_steps(accelerator, model, optimizer, schedule, range(SAVE_AT))
    local_shape = tuple(model.logit_scale.to_local().shape)  # [1] over 2 ranks: rank 0 holds it, rank 1 nothing
    save_fsdp_model(plugin, accelerator, model, str(out / "checkpoint"))
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, str(out / "checkpoint"))
    schedule_state = schedule.state_dict()
    more = train_steps(accelerator, model, optimizer, schedule, range(SAVE_AT, STEPS))
    record = {k: record[k] + more[k] for k in record} | {"logit_scale_local_shape": local_shape}
    save(out, "fsdp", record, full_weights(model), rank)

    model, optimizer, schedule = sharded()
    load_fsdp_model(plugin, accelerator, model, str(out / "checkpoint"))
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, str(out / "checkpoint"))
    schedule.load_state_dict(schedule_state)
    record = train_steps(accelerator, model, optimizer, schedule, range(SAVE_AT, STEPS))
    save(out, "resumed", record, full_weights(model), rank)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
