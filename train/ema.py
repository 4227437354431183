"""An exponential moving average of the weights (train.ema), kept by timm's ModelEmaV3.

The EMA is made from the plain model before it is sharded (FSDP refuses to be deep-copied) and, under FSDP, sharded
the same way (train.dist.shard_model), so each rank averages its own shards: ModelEmaV3's update pairs the EMA's
state-dict tensors with the model's, sharded DTensors alike. Checkpoints hold the full EMA as models.run_folder.EMA
(gathered on rank 0, as model.safetensors); resume loads it back into the shards. Evaluation sees it as a plain CLIP
on the training device (`eval_net`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from timm.utils import ModelEmaV3
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from models import ModelConfig, build_clip, run_folder
from train.config import TrainConfig
from train.dist import shard_model

logger = logging.getLogger(__name__)


def sharded(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type.name == "FSDP"


def make_ema(model: nn.Module, cfg: TrainConfig, accelerator: Accelerator) -> ModelEmaV3 | None:
    """The EMA of `model` (the plain CLIP, before sharding), on train.ema.device; None when train.ema.decay is 0."""
    e = cfg.ema
    if not e.decay:
        return None
    device = torch.device("cpu") if e.device == "cpu" else accelerator.device
    ema = ModelEmaV3(model, decay=e.decay, use_warmup=e.warmup, warmup_power=e.warmup_power, device=device)
    # timm compares `device` with the model's now, on the CPU before accelerate moves it; foreach needs both together
    ema.foreach = device == accelerator.device
    if sharded(accelerator):
        shard_model(ema.module, cfg, accelerator.device.type)
    return ema


def update(ema: ModelEmaV3, model: nn.Module, step: int, every: int) -> None:
    """After optimizer step `step`: the (step // every)-th update when `every` divides it (the update count sets
    the decay, train.config.EmaConfig). `model`: unwrapped (under FSDP the sharded module)."""
    if step % every == 0:
        ema.update(model, step=step // every)


def state_dict(ema: ModelEmaV3, accelerator: Accelerator) -> dict[str, torch.Tensor]:
    """The full EMA state dict on rank 0, on the CPU ({} on the others); a collective under FSDP."""
    if sharded(accelerator):
        state = get_model_state_dict(ema.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = ema.module.state_dict() if accelerator.is_main_process else {}
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def resume(ema: ModelEmaV3 | None, model: nn.Module, folder: Path | None, accelerator: Accelerator) -> None:
    """Restore the EMA from the checkpoint `folder` the run resumed from (every rank reads the file; under FSDP each
    keeps its shards), or start it from the resumed weights (`model`, unwrapped) when the checkpoint has none, with
    one warning line. Nothing to do without an EMA or a checkpoint."""
    if ema is None or folder is None:
        return
    path = Path(folder) / run_folder.EMA
    if not path.is_file():
        ema.set(model)
        if accelerator.is_main_process:
            step = run_folder.read_meta(folder)["step"]
            logger.warning(
                "checkpoint %s holds no %s: the EMA starts from its weights at step %d", folder, path.name, step
            )
        return
    state = load_file(str(path))
    if sharded(accelerator):
        set_model_state_dict(ema.module, state, options=StateDictOptions(full_state_dict=True))
    else:
        ema.module.load_state_dict(state)


def eval_net(ema: ModelEmaV3, accelerator: Accelerator, model_cfg: ModelConfig) -> nn.Module:
    """The EMA as a plain CLIP on the training device, on every rank (all must call it): the EMA module itself, a
    copy of one kept on the CPU, or under FSDP a full copy gathered from the shards (logit bias included)."""
    if sharded(accelerator):
        state = get_model_state_dict(ema.module, options=StateDictOptions(full_state_dict=True))
        net = build_clip(dataclasses.replace(model_cfg, pretrained=None))
        if "logit_bias" in state:
            net.logit_bias = nn.Parameter(torch.empty_like(state["logit_bias"]))
        net.load_state_dict(state)
        return net.to(accelerator.device).eval()
    on_device = next(ema.module.parameters()).device == accelerator.device
    return ema.module if on_device else copy.deepcopy(ema.module).to(accelerator.device)
