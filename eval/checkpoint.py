"""Rebuild a model for evaluation from a run directory, one of our checkpoint folders, or an open_clip checkpoint.

Our checkpoint folder (written by train/): `model.safetensors` (open_clip key names) and `meta.json`
{"step", "samples_seen", "config": {"model": {...}, ...}}; for a run directory the newest complete checkpoint is
used, the same one `train.resume=auto` would pick (models/run_folder.py owns the layout and the verification). The
model is rebuilt from the config stored with the weights, so nothing else is needed.
"""

import argparse
import difflib
import json
import logging
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import open_clip
import torch

import models
from eval.datasets import EvalInputError
from models import run_folder
from models.config import open_clip_with_sizes
from models.pretrained import match_scalars
from models.run_folder import CheckpointError


@dataclass
class LoadedModel:
    """A model in eval mode with its eval image transform, tokenizer and where it came from."""

    model: torch.nn.Module
    transform: Callable
    tokenizer: Callable
    info: dict = field(default_factory=dict)
    model_cfg: object = None
    notes: list[str] = field(default_factory=list)  # one line each: what evaluating at another size changed


def context_notes(model: torch.nn.Module, state: dict) -> list[str]:
    """The note a CLI prints when the checkpoint's text position table (`state`, as read) is resampled to the
    context length `model` was built with."""
    trained, built = state.get("positional_embedding"), model.state_dict().get("positional_embedding")
    if trained is None or built is None or trained.shape[0] == built.shape[0]:
        return []
    old, new = trained.shape[0], built.shape[0]
    return [f"note: text positions resampled from {old} to {new} (the model was trained with {old})"]


def closest_sibling(path: Path) -> str:
    """` (did you mean runs/tiny?)` naming the entry of `path`'s folder closest to its name, or ''."""
    try:
        names = [entry.name for entry in path.parent.iterdir()]
    except OSError:
        return ""
    match = difflib.get_close_matches(path.name, names, n=1)
    return f" (did you mean {path.parent / match[0]}?)" if match else ""


def missing_path_error(path, give: str) -> EvalInputError:
    """`PATH does not exist (did you mean ...?); give ...` for a model path that is not there at all."""
    return EvalInputError(f"{path} does not exist{closest_sibling(Path(path))}; give {give}")


def resolve_checkpoint_folder(path: Path) -> Path:
    """A checkpoint folder itself, or the newest complete one of a run directory; verified (models.run_folder)."""
    try:
        return run_folder.find_checkpoint(path)
    except CheckpointError as e:
        hint = "; for an open_clip file pass --open-clip-model NAME" if "is neither" in str(e) else ""
        raise EvalInputError(f"{e}{hint}") from None


def load_weights(model: torch.nn.Module, state: dict, source, model_name: str) -> None:
    """Load a state dict strictly, turning a size or key mismatch into one line that names the cause."""
    own = model.state_dict()
    state = match_scalars(state, own)  # our [1] logit scale into open_clip's 0-dim one, and back
    differ = [
        (k, tuple(v.shape), tuple(own[k].shape)) for k, v in state.items() if k in own and v.shape != own[k].shape
    ]
    if differ:
        key, theirs, ours = differ[0]
        raise EvalInputError(
            f"checkpoint {source} is from another model size than {model_name}: {len(differ)} "
            f"tensors differ, e.g. {key} is {list(theirs)} there but {list(ours)} here; "
            "evaluate it with the model it was trained with"
        )
    missing, unexpected = [k for k in own if k not in state], [k for k in state if k not in own]
    if missing or unexpected:
        example = (missing or unexpected)[0]
        raise EvalInputError(
            f"checkpoint {source} does not fit {model_name}: {len(missing)} missing and "
            f"{len(unexpected)} unexpected tensors (e.g. {example}); evaluate it with the model "
            "it was trained with"
        )
    model.load_state_dict(state)


def load_ours(path: Path, device, image_size: int | None = None, context_length: int | None = None) -> LoadedModel:
    """Rebuild `ModelConfig(**meta["config"]["model"])` -> build_clip -> load model.safetensors."""
    folder = resolve_checkpoint_folder(path)
    meta = run_folder.read_meta(folder)
    try:
        # the weights come from model.safetensors, so no pretrained file named in the config is read again
        cfg = models.ModelConfig(**{**meta["config"]["model"], "pretrained": None})
        # evaluated at another size: the position tables are resampled as model.pretrained does
        cfg.image_size, cfg.context_length = image_size or cfg.image_size, context_length or cfg.context_length
    except (KeyError, TypeError) as e:
        raise EvalInputError(
            f"{folder / run_folder.META} has no usable config.model ({e}); it was not written by this project's trainer"
        ) from None
    try:
        model = models.build_clip(cfg)
    except ValueError as e:
        raise EvalInputError(str(e).replace("model.image_size", "--image-size")) from None
    # the same loader as model.pretrained (models/pretrained.py)
    state = models.read_state_dict(folder / run_folder.MODEL)
    notes = context_notes(model, state)
    state = models.resample_positions(model, state, cfg.text_pos_keep)
    load_weights(model, state, folder, cfg.name)
    _, transform = models.transforms(cfg)
    info = {
        "checkpoint": str(folder),
        "step": meta.get("step"),
        "samples_seen": meta.get("samples_seen"),
        "model": cfg.name,
    }
    return LoadedModel(model.to(device).eval(), transform, models.tokenizer(cfg), info, cfg, notes)


class RandomInitWarning(logging.Filter):
    """Drops open_clip's "No pretrained weights loaded ... initialized randomly", for models whose weights follow."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Model initialized randomly" not in record.getMessage()


@contextmanager
def weights_follow():
    """open_clip.create_model* without its random-init warning (it logs through the root logger)."""
    quiet = RandomInitWarning()
    logging.getLogger().addFilter(quiet)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(quiet)


def load_open_clip(
    name: str, checkpoint: str | None, device, image_size: int | None = None, context_length: int | None = None
) -> LoadedModel:
    """An open_clip architecture by name, random init or with weights from a file (.safetensors, .pt, .bin).

    This project's tiny sizes (configs/models/*.json) are registered with open_clip first (models.config).
    """
    open_clip_with_sizes()
    if name not in open_clip.list_models():
        raise EvalInputError(f"unknown open_clip model {name!r}; see open_clip.list_models() or register a config")
    if checkpoint and not Path(checkpoint).exists():
        raise missing_path_error(checkpoint, "an open_clip weights file (.safetensors, .pt, .bin)")
    if checkpoint and not Path(checkpoint).is_file():
        raise EvalInputError(f"checkpoint {checkpoint} is not a file; give an open_clip weights file")
    # with a checkpoint the random init is overwritten below, so open_clip's warning would say the opposite
    with weights_follow() if checkpoint else nullcontext():
        model, _, transform = open_clip.create_model_and_transforms(
            name, force_image_size=image_size, force_context_length=context_length
        )
    notes = []
    if checkpoint:
        state = models.read_state_dict(checkpoint)
        notes = context_notes(model, state)
        check_built_size(model, state, checkpoint, image_size, context_length)
        state = models.resample_positions(model, state, text_keep=0)
        load_weights(model, state, checkpoint, name)
    info = {"checkpoint": checkpoint, "step": None, "samples_seen": None, "model": name}
    tokenizer = open_clip.get_tokenizer(name, context_length=context_length)
    return LoadedModel(model.to(device).eval(), transform, tokenizer, info, notes=notes)


def check_built_size(model, state: dict, checkpoint: str, image_size: int | None, context_length: int | None) -> None:
    """A checkpoint built for another resolution or context length than the architecture's is evaluated at one only
    when a flag says which: its own size, or the architecture's (then its positions are resampled)."""
    for key, flag, given in (
        ("visual.positional_embedding", "--image-size", image_size),
        ("positional_embedding", "--context-length", context_length),
    ):
        ours, theirs = model.state_dict().get(key), state.get(key)
        if given is None and ours is not None and theirs is not None and ours.shape != theirs.shape:
            if ours.shape[1:] != theirs.shape[1:]:
                continue  # another width: another model size, refused by load_weights
            raise EvalInputError(
                f"checkpoint {checkpoint} was built for another size: its {key} is {tuple(theirs.shape)}, the "
                f"architecture's {tuple(ours.shape)}; pass {flag} (its own size, or the architecture's to resample it)"
            )


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_workers() -> int:
    """DataLoader workers of an evaluation CLI: min(4, CPUs this process may use - 1), at least 0, so that a small
    machine keeps a CPU for the main process (torch warns about more workers than CPUs)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(4, cpus - 1))


def add_workers_argument(parser: argparse.ArgumentParser) -> None:
    workers = default_workers()
    parser.add_argument(
        "--workers",
        type=int,
        default=workers,
        help=f"data-loading worker processes (default: min(4, usable CPUs - 1), {workers} on this machine)",
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--batch-size, --workers and --out of an evaluation of one data set (eval.zeroshot, eval.retrieval)."""
    parser.add_argument("--batch-size", type=int, default=64)
    add_workers_argument(parser)
    parser.add_argument("--out", help="write the result JSON here")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", help="run directory or checkpoint folder written by the trainer")
    parser.add_argument("--checkpoint", help="checkpoint folder, or a weights file for --open-clip-model")
    parser.add_argument(
        "--open-clip-model",
        help="open_clip architecture name (e.g. ViT-B-16) for an open_clip "
        "checkpoint; random init without --checkpoint",
    )
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--image-size", type=int, help="evaluate at this resolution (position table resampled)")
    parser.add_argument("--context-length", type=int, help="evaluate at this text length (positions stretched)")


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    if args.open_clip_model:
        return load_open_clip(
            args.open_clip_model, args.checkpoint or args.path, args.device, args.image_size, args.context_length
        )
    path = args.path or args.checkpoint
    if not path:
        raise EvalInputError(
            "no model given: pass a run directory or checkpoint folder, or --open-clip-model NAME [--checkpoint FILE]"
        )
    if not Path(path).exists():
        raise missing_path_error(
            path, "a run folder, a checkpoint folder, or an open_clip weights file with --open-clip-model NAME"
        )
    if not Path(path).is_dir():
        raise EvalInputError(f"{path} is not a folder; for an open_clip weights file add --open-clip-model NAME")
    return load_ours(Path(path), args.device, args.image_size, args.context_length)


@contextmanager
def one_line_errors():
    """Report bad input as `error: ...` on one line and exit 2 instead of a traceback."""
    try:
        yield
    except (EvalInputError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def evaluate_from_args(args: argparse.Namespace, evaluate: Callable[..., dict], options: tuple[str, ...] = ()) -> dict:
    """CLI body: load the model the arguments name, run `evaluate(model, dataset=..., **options)` with each name in
    `options` an argument passed on as the keyword of that name, add where the model came from and its size
    (models.summary), print the result JSON and write it to `args.out`."""
    with one_line_errors():
        if not Path(args.dataset).exists():
            raise EvalInputError(
                f"dataset {args.dataset} does not exist; pass an ImageFolder tree, a webdataset "
                "folder or (retrieval) a .csv/.tsv file"
            )
        loaded = load_from_args(args)
        for note in loaded.notes:
            print(note, file=sys.stderr)
        result = evaluate(
            loaded.model,
            dataset=args.dataset,
            tokenizer=loaded.tokenizer,
            transform=loaded.transform,
            batch_size=args.batch_size,
            device=args.device,
            workers=args.workers,
            split=args.split,
            progress=True,
            **{name: getattr(args, name) for name in options},
        )
        result.update(loaded.info, **models.summary(loaded.model))
    write_result(result, args.out)
    return result


def write_result(result: dict, out: str | None) -> None:
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
