"""Moving weights between our CLIP and open_clip: load any softmax checkpoint, export ours.

Linearising a pretrained CLIP: build the model with any attention, then `load_pretrained` copies every
weight whose name and shape match (qkv and output projections, MLPs, norms, embeddings); parameters only
the new attention has keep their fresh initialisation and are listed in the log.

Loading at another size (model.image_size, model.context_length): the image position table is resampled to
the model's grid by open_clip's `resize_pos_embed` (bicubic, class token kept: its `force_image_size`), the
text table stretched to the model's context keeping its first `text_keep` positions and interpolating the
rest linearly (Long-CLIP's knowledge-preserved stretching, Zhang et al. 2024); text_keep = 0 is open_clip's
`resize_text_pos_embed` (its `force_context_length`).
"""

from __future__ import annotations

import logging
from fnmatch import fnmatchcase
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from models import run_folder
from models.attention import Attention
from models.run_folder import CheckpointError

log = logging.getLogger(__name__)
# open_clip holds these as 0-dim tensors; our CLIP holds them as [1] (FSDP cannot shard 0-dim parameters)
OPEN_CLIP_SCALARS = ("logit_scale", "logit_bias")


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """A plain state dict from a safetensors or torch file (weights_only=True), or from our checkpoint folder or
    run directory (its newest complete checkpoint's model.safetensors, verified by models.run_folder).

    Accepts open_clip's checkpoints ({"state_dict": ...} or a bare dict, "module." prefixes from DDP,
    "_orig_mod." from torch.compile) and training checkpoints that hold the weights under "model".
    A file that is missing or does not load is a CheckpointError naming it and the reason.
    """
    path = Path(path)
    if path.is_dir():
        path = run_folder.find_checkpoint(path) / run_folder.MODEL
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist; give a .safetensors or torch file path")
    try:
        sd = load_weights_file(path)
    except Exception as e:  # a damaged file, or a pickle that weights_only refuses to run
        kind = "safetensors" if path.suffix == ".safetensors" else "torch (weights_only=True)"
        raise CheckpointError(
            f"checkpoint {path} does not load as a {kind} file ({run_folder.first_line(e)}); "
            "give a safetensors file or a torch file of plain tensors"
        ) from None
    for key in ("state_dict", "model"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise CheckpointError(f"checkpoint {path} holds no state dict of tensors; give a model's weights file")
    return {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in sd.items()}


def load_weights_file(path: Path):
    if path.suffix == ".safetensors":
        return load_file(str(path), device="cpu")
    return torch.load(path, map_location="cpu", weights_only=True)


def match_scalars(state: dict[str, Tensor], own: dict[str, Tensor]) -> dict[str, Tensor]:
    """`state` with every one-element tensor reshaped to the shape `own` has under the same key: open_clip's
    0-dim logit scale (and bias) and our [1] ones load into each other."""
    return {
        k: v.reshape(own[k].shape) if k in own and v.numel() == own[k].numel() == 1 and v.shape != own[k].shape else v
        for k, v in state.items()
    }


def resample_positions(model: nn.Module, sd: dict[str, Tensor], text_keep: int = 20) -> dict[str, Tensor]:
    """`sd` with its position tables resampled to `model`'s image grid and context length (module docstring)."""
    from open_clip.model import resize_pos_embed, resize_text_pos_embed

    sd, own = dict(sd), model.state_dict()
    key = "visual.positional_embedding"
    if key in sd and key in own and sd[key].shape != own[key].shape:
        before = tuple(sd[key].shape)
        resize_pos_embed(sd, model)
        log.info(
            "pretrained: %s resampled from %s to %s (bicubic, class token kept)", key, before, tuple(sd[key].shape)
        )
    key = "positional_embedding"
    if key in sd and key in own and sd[key].shape[0] != own[key].shape[0]:
        old, length = sd[key], own[key].shape[0]
        keep = min(text_keep, old.shape[0] - 1, length - 1)
        if keep <= 0:
            resize_text_pos_embed(sd, model)
        else:
            tail = F.interpolate(old[keep:].T[None].float(), size=length - keep, mode="linear", align_corners=False)
            sd[key] = torch.cat([old[:keep], tail[0].T.to(old.dtype)])
        log.info(
            "pretrained: text positions stretched from %d to %d (first %d kept, the rest interpolated)",
            old.shape[0],
            length,
            max(keep, 0),
        )
    return sd


def load_pretrained(
    model: nn.Module, source: str | Path | dict[str, Tensor], text_keep: int = 20, fresh: list[str] | tuple = ()
) -> tuple[list[str], list[str], list[str]]:
    """Copy every weight of `source` whose name and shape match `model`'s, position tables resampled first.

    A tensor both hold with shapes that no resampling reconciles (a patch embedding of another patch size, a
    narrower MLP) is a CheckpointError naming it and both shapes, unless one of the `fresh` glob patterns
    (model.pretrained_fresh, e.g. "visual.conv1.*") matches its name: then it keeps its initialisation.
    Returns (loaded, missing, unexpected): names loaded; model names left at their initialisation
    (absent from the source, or allowed fresh); source names the model has no slot for (or another shape).
    Missing and unexpected names are logged.
    """
    sd = read_state_dict(source) if isinstance(source, (str, Path)) else source
    own = model.state_dict()
    sd = match_scalars(resample_positions(model, sd, text_keep), own)
    check_shapes(sd, own, fresh, source)
    loaded = [k for k, v in sd.items() if k in own and own[k].shape == v.shape]
    missing = [k for k in own if k not in set(loaded)]
    unexpected = [k for k in sd if k not in set(loaded)]
    model.load_state_dict({k: sd[k] for k in loaded}, strict=False)
    log.info("pretrained: loaded %d tensors", len(loaded))
    if missing:
        log.warning(
            "pretrained: %d tensors keep their initialisation (not in the checkpoint or other shape): %s",
            len(missing),
            ", ".join(missing),
        )
    if unexpected:
        log.warning(
            "pretrained: %d checkpoint tensors unused (no such name or other shape): %s",
            len(unexpected),
            ", ".join(unexpected),
        )
    return loaded, missing, unexpected


def check_shapes(sd: dict[str, Tensor], own: dict[str, Tensor], fresh, source) -> None:
    """Refuse the first tensor that both hold with different shapes, unless a `fresh` pattern allows it."""
    for key, value in sd.items():
        if key in own and own[key].shape != value.shape and not any(fnmatchcase(key, p) for p in fresh):
            where = f" {source}" if isinstance(source, (str, Path)) else ""
            raise CheckpointError(
                f"pretrained{where}: {key} is {tuple(value.shape)} in the checkpoint but {tuple(own[key].shape)} in "
                "the model and cannot be resampled; build the checkpoint's architecture, or let it start fresh "
                f"with model.pretrained_fresh=[{key}]"
            )


def attention_names(model: nn.Module) -> set[str]:
    return {m.name for m in model.modules() if isinstance(m, Attention)}


def export_open_clip(model: nn.Module, path: str | Path) -> Path:
    """Write `model`'s weights as a plain state dict that `open_clip.create_model(name, pretrained=path)` loads.

    `.safetensors` paths are written with safetensors, anything else with torch.save. A model with any
    non-softmax layer is refused: open_clip has only softmax attention, so such weights would load
    (when their names match) but compute something else.
    """
    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper saves its inner module's keys
    names = attention_names(model)
    if names != {"softmax"}:
        raise ValueError(
            f"export_open_clip: open_clip only has softmax attention but this model uses {', '.join(sorted(names))}; "
            "export a softmax model"
        )
    path = Path(path)
    sd = {
        k: (v.reshape(()) if k in OPEN_CLIP_SCALARS else v).detach().cpu().contiguous()
        for k, v in model.state_dict().items()
    }
    if path.suffix == ".safetensors":
        save_file(sd, str(path))
    else:
        torch.save(sd, path)
    return path
