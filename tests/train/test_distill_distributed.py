"""Linearising a softmax CLIP (train/distill.py) on 2 gloo ranks, under FSDP (scripts.fsdp_on_cpu, see
test_distributed_fsdp.py) and DDP, against one process with the same global batch: the logged loss and each
distillation term, the final student, and checkpoints that hold the student alone (the teacher is a replicated
copy outside the module tree, never sharded, never saved)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from tests.train.common import (
    checkpoints,
    max_difference,
    run,
    save_teacher,
    tiny_config,
    torchrun,
    train_records,
    weights,
)

# one optimizer step = one epoch of 16 samples, so every run sees the same samples at every step
COMMON = ["train.max_steps=3", "optim.lr=1e-3", "data.train_num_samples=16", "optim.grad_clip_norm=1.0"]
LINEAR = ["model.image_attention=linear_affine_nodenom", "model.text_attention=linear_affine_nodenom"]
STAGES = {
    "distill": ["distill.stage=distill", "distill.embedding_weight=2", "distill.similarity_weight=0.5"],
    "transfer": ["distill.stage=transfer"],
}
TERMS = ("distill/contrastive", "distill/embedding", "distill/similarity")
# (stage, launch): global micro-batch and accum_freq (DDP, the simpler wrapper, is left to the training tests: a
# third 2-rank launch costs ~25 s of the suite); stage 2's contrastive and similarity terms are over each
# micro-batch, so its runs take the whole step in one; stage 1's MSE is per sample, so FSDP's also tries no_sync
RUNS = {
    ("distill", "one"): (16, 1),
    ("distill", "fsdp"): (16, 1),
    ("transfer", "one"): (16, 1),
    ("transfer", "fsdp"): (8, 2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synthetic):
    """{(stage, launch): run dir} of 3 steps each, and the teacher's file under "teacher"."""
    tmp = tmp_path_factory.mktemp("distill-dist")
    teacher = save_teacher(tmp / "teacher.safetensors")
    config = tiny_config(tmp, synthetic)
    dirs = {"teacher": teacher}
    for (stage, launch), (batch, accum) in RUNS.items():
        run_dir = dirs[stage, launch] = tmp / f"{stage}-{launch}"
        args = [f"train.run_dir={run_dir}", f"distill.teacher={teacher}", *COMMON, *LINEAR, *STAGES[stage]]
        args += [f"data.batch_size={batch}", f"train.accum_freq={accum}"]
        if launch == "one":
            assert run(config, *args) == 0
            continue
        module = "train" if launch == "ddp" else "scripts.fsdp_on_cpu"
        fsdp = ["train.distributed=fsdp"] if launch == "fsdp" else []
        torchrun([str(config), *args, *fsdp], module=module, timeout=300)
    yield dirs
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("stage, launch", [("distill", "fsdp"), ("transfer", "fsdp")])
def test_two_ranks_equal_one_process(runs, stage, launch):
    one, two = train_records(runs[stage, "one"]), train_records(runs[stage, launch])
    assert [r["samples_seen"] for r in two] == [r["samples_seen"] for r in one] == [16, 32, 48]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["loss"], b["loss"])
        for term in TERMS if stage == "distill" else ():
            assert abs(a[term] - b[term]) < 1e-5, (term, a[term], b[term])
            # the logged terms are the step's, over all ranks: the loss is their weighted sum
            assert b["loss"] == pytest.approx(b[TERMS[0]] + 2 * b[TERMS[1]] + b[TERMS[2]] / 2, rel=1e-5)
    final = weights(checkpoints(runs[stage, launch])[-1])
    assert max_difference(weights(checkpoints(runs[stage, "one"])[-1]), final) < 1e-5
    key = "transformer.resblocks.0.attn.in_proj_weight"
    assert not torch.equal(final[key], load_file(str(runs["teacher"]))[key])  # the student trained


@pytest.mark.parametrize("stage, launch", [("distill", "fsdp"), ("transfer", "fsdp")])
def test_checkpoints_hold_the_student_alone(runs, stage, launch):
    """Every weights file of the checkpoint (model.safetensors, accelerate's state) and FSDP's sharded model hold
    the student's tensors and nothing else: no copy of the teacher."""
    folder = checkpoints(runs[stage, launch])[-1]
    student = set(load_file(str(runs["teacher"])))  # linear_affine_nodenom adds no tensor to the teacher's
    files = list(folder.rglob("*.safetensors"))
    assert files and all(set(load_file(str(f))) == student for f in files), files
    if launch == "fsdp":
        sharded = set(
            FileSystemReader(str(folder / "state" / "pytorch_model_fsdp_0")).read_metadata().state_dict_metadata
        )
        assert {key.removeprefix("model.") for key in sharded} == student, sorted(sharded)[:5]
