"""Linearising a pretrained softmax CLIP (issue 24), stage 1: attention transfer to a frozen teacher.

Every student attention layer is trained to reproduce its teacher layer's output on the teacher's own hidden
states (LoLCATs, Zhang et al. 2024, arXiv 2410.10254, sec. 3.1; ViT-AdaLA's per-block alignment): one teacher
forward pass records, for each layer l of both towers, the input x_l of its attention (after ln_1) and its
output y_l; the student's layer l maps the same x_l, and the loss is

    L = sum over layers l of mean((student_attn_l(x_l) - y_l)^2)

so the layers learn side by side, none waiting for the one below it. Only attention parameters train
(`attention_parameters`: the q/k/v and output projections, and any parameters of the attention itself, e.g.
Linformer's projections).

    teacher = load_teacher("runs/softmax-w64", student)      # a run or checkpoint folder, a weights file,
    teacher = load_teacher("open_clip:ViT-B-16:laion400m_e32", student)   # or open_clip NAME:TAG (offline)
    loss = AttentionTransfer(teacher, contextlib.nullcontext)(student, images, tokens)

In training (`distill.teacher` set, train/config.py's DistillConfig) the loss is `AttentionTransfer`: the
teacher runs once per micro-batch; then the student runs its ordinary forward (through DDP or FSDP, so their
gradient sync holds), each attention layer's input replaced by a forward pre-hook with its teacher layer's,
and the MSE of each layer's output is summed. The student's other parameters are frozen; the teacher is kept
out of the module tree, so it is never in the optimizer, never wrapped or sharded (under DDP and FSDP alike a
full fp32 copy on every rank, run under the training's autocast: its matmuls in bf16 with train.precision=bf16,
its norms and softmax in fp32, as when it was evaluated; replicated, not sharded, since a ViT-B-16 teacher is 0.6
GB and a ViT-L-16 1.7 GB against the 80+ GB of a training GPU) and never written into a checkpoint.

Stage 2 (`distill.stage: distill`, `Distillation`): the whole student trains on a weighted sum of the
contrastive loss on the data and a distillation loss to the frozen teacher (its image and text embeddings,
and its image-text similarity distribution over the global batch as soft targets), each term logged. The whole
student, not low-rank adapters: at the sizes this project trains on one node the full model fits, and
ViT-AdaLA fine-tunes it whole; LoRA (for a teacher and student too big for that) is not here.

`distill.stage: both` runs stage 1 and then stage 2 from one config, each as a run of its own (train/stages.py).

The teacher's zero-shot results are logged beside the student's (train/main.py, make_evaluator).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule

from models import ModelConfig, build_clip, run_folder
from models.attention import Attention
from models.config import open_clip_with_sizes
from models.pretrained import load_pretrained, match_scalars, read_state_dict
from models.run_folder import CheckpointError
from models.text import TextTower
from train.loss import build_loss, gather_with_grad

SHARED = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")  # open_clip's, in every variant


def attention_layers(model: nn.Module) -> dict[str, Attention]:
    """name -> attention module, in module order (the text tower's layers first, as CLIP registers them)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Attention)}


def attention_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of every attention layer (projections included): what stage 1 trains."""
    return [p for m in attention_layers(model).values() for p in m.parameters()]


def freeze_all_but_attention(model: nn.Module) -> None:
    trainable = {id(p) for p in attention_parameters(model)}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)


def check_same_architecture(student: nn.Module, theirs: dict[str, Tensor]) -> None:
    """The student's shared tensors (all but its attentions' own extras) exist in the teacher's state `theirs` with
    the same shapes; the first that does not is one CheckpointError line naming it and both shapes."""
    extras = {
        f"{name}.{key}" for name, m in attention_layers(student).items() for key in m.state_dict() if key not in SHARED
    }
    for key, value in student.state_dict().items():
        if key in extras:
            continue
        if key not in theirs:
            raise CheckpointError(
                f"distill.teacher has no {key} (the student's is {tuple(value.shape)}); use a teacher of the "
                "student's size"
            )
        if theirs[key].shape != value.shape:
            raise CheckpointError(
                f"distill.teacher: {key} is {tuple(theirs[key].shape)} in the teacher but {tuple(value.shape)} in "
                "the student; use a teacher of the student's size"
            )


def load_teacher(source: str, student: nn.Module) -> nn.Module:
    """The frozen teacher (eval mode, no gradients): one of our run or checkpoint folders (built from the model
    config saved with it), a safetensors / torch file (the student's size with softmax attention), or
    `open_clip:NAME:TAG` (open_clip.create_model, offline from a local file or the Hugging Face cache)."""
    cfg = dataclasses.replace(student.config, image_attention="softmax", text_attention="softmax")
    if source.startswith("open_clip:"):
        open_clip = open_clip_with_sizes()  # with the tiny sizes of configs/models/

        name, _, tag = source.removeprefix("open_clip:").partition(":")
        try:
            state = open_clip.create_model(name, pretrained=tag or None).state_dict()
        except Exception as e:  # an unknown name or tag, weights not in the local cache (offline)
            raise CheckpointError(
                f"distill.teacher {source}: open_clip cannot build it ({run_folder.first_line(e)}); give a name of "
                "open_clip.list_models() and a tag whose weights are in the local cache, or a weights file"
            ) from None
    else:
        state = read_state_dict(source)
        if Path(source).is_dir():
            saved = run_folder.read_meta(run_folder.find_checkpoint(Path(source)))["config"]["model"]
            cfg = ModelConfig(**{**dataclasses.asdict(ModelConfig()), **saved})
    cfg = dataclasses.replace(cfg, pretrained=None, grad_checkpointing=False, patch_dropout=0.0)
    teacher = build_clip(cfg)
    state = match_scalars(state, teacher.state_dict())
    check_same_architecture(student, state)
    extra = next((key for key in state if key not in student.state_dict()), None)
    if extra is not None:  # e.g. a deeper teacher: layers the student's size does not have
        raise CheckpointError(
            f"distill.teacher has {extra} {tuple(state[extra].shape)}, which the student's size has not; use a "
            "teacher of the student's size"
        )
    teacher.load_state_dict(state)
    return teacher.eval().requires_grad_(False)


class AttentionTransfer:
    """objective(model, images, tokens) -> the summed per-layer MSE, the student run through `model` itself
    (module docstring). `last` holds the last batch's per-layer MSEs, `terms` the same by layer name
    (`transfer/mse/<layer>`, logged every train.log_every steps)."""

    def __init__(self, teacher: nn.Module, autocast):
        self.teacher, self.autocast, self.last, self.terms = teacher, autocast, {}, {}
        self.names = [f"transfer/mse/{name.removesuffix('.attn')}" for name in attention_layers(teacher)]

    def __call__(self, model: nn.Module, images: Tensor, tokens: Tensor) -> Tensor:
        keep_padding(self.teacher, model)
        records = teacher_records(self.teacher, images, tokens, self.autocast)
        layers = list(attention_layers(model).values())  # module order, the teacher's, whatever wraps the student
        outputs: list = [None] * len(layers)

        def replace(i):
            return lambda module, args, kwargs: records[i][:2]

        def keep(i):
            return lambda module, args, kwargs, out: outputs.__setitem__(i, out)

        hooks = [m.register_forward_pre_hook(replace(i), with_kwargs=True) for i, m in enumerate(layers)]
        hooks += [m.register_forward_hook(keep(i), with_kwargs=True) for i, m in enumerate(layers)]
        try:
            with self.autocast():
                features = model(images, tokens)[:2]
        finally:
            for h in hooks:
                h.remove()
        losses = [(out.float() - rec[2].float()).square().mean() for out, rec in zip(outputs, records)]
        self.last = {i: loss.detach() for i, loss in enumerate(losses)}
        self.terms = {name: float(loss) for name, loss in zip(self.names, self.last.values(), strict=True)}
        loss = torch.stack(losses).sum()
        if isinstance(model, FSDPModule):
            # FSDP2 gathers a unit's weights for the backward, and reduce-scatters its gradients after it, from hooks
            # on the unit's outputs and inputs, which the layers' MSEs alone never reach (the inputs are the
            # teacher's): a zero multiple of the features takes the backward through every unit
            loss = loss + 0 * sum(f.float().sum() for f in features)
        return loss


def keep_padding(*models: nn.Module) -> None:
    """The text towers encode every position, the padding's too (models/text.py trims it on the CPU): the transfer's
    MSE is over every position, so its loss is then the same with any split of the batch into micro-batches."""
    for model in models:
        for module in model.modules():
            if isinstance(module, TextTower):
                module.trim_padding = False


def teacher_records(teacher: nn.Module, images: Tensor, tokens: Tensor, autocast) -> list[tuple]:
    """[(args, kwargs, output)] of every teacher attention layer in module order (attention_layers), from one
    no-grad pass."""
    layers = list(attention_layers(teacher).values())
    records: list = [None] * len(layers)

    def keep(i):
        return lambda module, args, kwargs, out: records.__setitem__(i, (args, kwargs, out))

    hooks = [m.register_forward_hook(keep(i), with_kwargs=True) for i, m in enumerate(layers)]
    try:
        with torch.no_grad(), autocast():
            teacher(images, tokens)
    finally:
        for h in hooks:
            h.remove()
    return records


class Distillation:
    """Stage 2: objective(model, images, tokens) -> contrastive_weight x the contrastive loss (the run's own,
    over the global batch) + embedding_weight x mean(1 - cos(student, teacher)) of the image and of the text
    embeddings + similarity_weight x KL(teacher || student) of the softmax over the batch of each image's
    similarities to the texts and each text's to the images (each model at its own logit scale; like the
    contrastive loss, over the global batch). `terms` holds the last call's three terms (this rank's)."""

    def __init__(self, teacher: nn.Module, autocast, contrastive, weights: tuple[float, float, float]):
        self.teacher, self.autocast, self.contrastive, self.weights = teacher, autocast, contrastive, weights
        self.terms: dict[str, float] = {}

    def __call__(self, model: nn.Module, images: Tensor, tokens: Tensor) -> Tensor:
        with torch.no_grad(), self.autocast():
            t_image, t_text, t_scale = self.teacher(images, tokens)[:3]
        with self.autocast():
            image, text, scale = model(images, tokens)[:3]
        image, text, t_image, t_text = (x.float() for x in (image, text, t_image, t_text))
        bias = getattr(getattr(model, "module", model), "logit_bias", None)  # SigLIP's (DDP wraps the model)
        contrastive = self.contrastive(image, text, scale, bias)
        embedding = (2 - (image * t_image).sum(-1) - (text * t_text).sum(-1)).mean() / 2
        # this rank's rows against the global batch's columns (train/loss.py's local-loss form): with the ranks'
        # gradients averaged, that of the KL over the global batch, whatever the number of ranks
        pairs = (
            (scale * image @ gather_with_grad(text).T, t_scale * t_image @ gather_with_grad(t_text).T),
            (scale * text @ gather_with_grad(image).T, t_scale * t_text @ gather_with_grad(t_image).T),
        )
        similarity = (
            sum(
                F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="batchmean") for s, t in pairs
            )
            / 2
        )
        parts = {"distill/contrastive": contrastive, "distill/embedding": embedding, "distill/similarity": similarity}
        self.terms = {k: float(v.detach()) for k, v in parts.items()}
        return sum(w * v for w, v in zip(self.weights, parts.values()))


def objective(cfg, model: nn.Module, accelerator) -> AttentionTransfer | Distillation:
    """The training objective of a config's `distill:` section: the teacher loaded and checked, the student
    started from its weights (unless model.pretrained); for transfer everything but the attention frozen."""
    d = cfg.distill
    teacher = load_teacher(d.teacher, model).to(accelerator.device)
    if not cfg.model.pretrained:
        load_pretrained(model, teacher.state_dict())
    if d.stage == "transfer":
        freeze_all_but_attention(model)
        return AttentionTransfer(teacher, accelerator.autocast)
    weights = (d.contrastive_weight, d.embedding_weight, d.similarity_weight)
    contrastive = build_loss(cfg.train.loss, siglip_exchange=cfg.train.siglip_exchange)
    return Distillation(teacher, accelerator.autocast, contrastive, weights)
