"""Stage 1 of linearising a softmax CLIP (train/distill.py): attention transfer to a frozen teacher."""

import json
from contextlib import nullcontext

import pytest
import torch
from safetensors.torch import load_file, save_file

import models
from models.run_folder import CheckpointError
from tests.train.common import save_teacher
from train.distill import (
    AttentionTransfer,
    Distillation,
    attention_layers,
    attention_parameters,
    freeze_all_but_attention,
    load_teacher,
)
from train.loss import ClipLoss


def batch(model):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(4, 3, 32, 32, generator=g)
    tokens = models.tokenizer("tiny-s")(["a red circle", "a blue square", "a green star", "a big yellow ring"])
    return images, tokens


def train_steps(objective, student, optimizer, steps: int) -> tuple[dict, dict]:
    """`steps` optimizer steps on objective(student, *batch(student)); its terms at the first step and after the
    last."""
    images, tokens = batch(student)
    first = None
    for _ in range(steps):
        optimizer.zero_grad()
        objective(student, images, tokens).backward()
        optimizer.step()
        first = first or dict(objective.terms)
    objective(student, images, tokens)
    return first, dict(objective.terms)


@pytest.fixture
def teacher_file(tmp_path):
    return save_teacher(tmp_path / "teacher.safetensors")


@pytest.fixture(scope="module")
def trained_teacher(tmp_path_factory):
    """A tiny-s softmax CLIP trained in the test: 30 AdamW steps of the contrastive loss on one batch."""
    torch.manual_seed(0)
    teacher = models.create_model("tiny-s")
    images, tokens = batch(teacher)
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=3e-3)
    for _ in range(30):
        optimizer.zero_grad()
        ClipLoss()(*teacher(images, tokens)[:3]).backward()
        optimizer.step()
    path = tmp_path_factory.mktemp("teacher") / "trained.safetensors"
    save_file({k: v.detach().contiguous() for k, v in teacher.state_dict().items()}, str(path))
    return path


def nodenom_student(teacher_file):
    attention = "linear_affine_nodenom"
    return models.create_model(
        "tiny-s", image_attention=attention, text_attention=attention, pretrained=str(teacher_file)
    )


def test_stage_one_lowers_every_layers_mse_and_leaves_the_teacher_bit_identical(trained_teacher):
    student = nodenom_student(trained_teacher)
    teacher = load_teacher(str(trained_teacher), student)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    freeze_all_but_attention(student)
    optimizer = torch.optim.Adam(attention_parameters(student), lr=3e-3)
    first, last = train_steps(AttentionTransfer(teacher, nullcontext), student, optimizer, 40)
    assert len(first) == 4 and all(first[k] > 0 for k in first)
    assert all(last[k] < 0.5 * first[k] for k in first), (first, last)  # each layer's MSE
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())


def test_stage_two_by_distillation_alone_moves_the_students_embeddings_to_the_teachers(trained_teacher):
    """Contrastive weight 0, distillation weights 1: the student's embeddings and its similarity distribution come
    closer to the teacher's, and the teacher does not change."""
    student = nodenom_student(trained_teacher)
    teacher = load_teacher(str(trained_teacher), student)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    objective = Distillation(teacher, nullcontext, ClipLoss(), (0.0, 1.0, 1.0))
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    first, last = train_steps(objective, student, optimizer, 30)
    assert first["distill/embedding"] > 0 and last["distill/embedding"] < 0.5 * first["distill/embedding"]
    assert last["distill/similarity"] < first["distill/similarity"]
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())


def test_missing_deeper_and_unknown_teachers_are_one_line(tmp_path, teacher_file):
    student = nodenom_student(teacher_file)
    with pytest.raises(CheckpointError, match="does not exist") as missing:
        load_teacher(str(tmp_path / "none.safetensors"), student)
    state = load_file(str(teacher_file))  # one more image layer than the student's size has
    prefix = "visual.transformer.resblocks."
    state |= {
        k.replace(f"{prefix}1.", f"{prefix}2."): v.clone() for k, v in state.items() if k.startswith(f"{prefix}1.")
    }
    save_file(state, str(tmp_path / "deeper.safetensors"))
    with pytest.raises(
        CheckpointError, match=rf"distill.teacher has {prefix}2\.\S+ \(.*\), which the student"
    ) as deeper:
        load_teacher(str(tmp_path / "deeper.safetensors"), student)
    with pytest.raises(CheckpointError, match="open_clip cannot build it") as unknown:
        load_teacher("open_clip:NoSuchModel-B-99:nothing", student)
    assert all("\n" not in str(e.value) for e in (missing, deeper, unknown))


def test_a_softmax_student_equal_to_its_teacher_has_zero_loss(teacher_file):
    student = models.create_model("tiny-s", pretrained=str(teacher_file))
    teacher = load_teacher(str(teacher_file), student)
    transfer = AttentionTransfer(teacher, nullcontext)
    assert transfer(student, *batch(student)).item() == 0.0
    names = list(attention_layers(student))
    assert len(transfer.last) == len(names)  # every layer of both towers
    assert list(transfer.terms) == [f"transfer/mse/{n.removesuffix('.attn')}" for n in names]
    assert set(transfer.terms.values()) == {0.0}  # each layer's MSE, logged by name
    assert any(n.startswith("visual.") for n in names) and any(n.startswith("transformer.") for n in names)


@pytest.mark.parametrize("attention", ["linear_affine_nodenom", "linear_elu", "hedgehog"])
def test_attention_transfer_trains_only_the_attention_and_lowers_the_loss(teacher_file, attention):
    text = attention if attention != "efficient" else "softmax"
    student = models.create_model(
        "tiny-s", image_attention=attention, text_attention=text, pretrained=str(teacher_file)
    )
    teacher = load_teacher(str(teacher_file), student)
    freeze_all_but_attention(student)
    frozen = {k: v.clone() for k, v in student.state_dict().items() if ".attn." not in k}
    optimizer = torch.optim.Adam(attention_parameters(student), lr=3e-3)
    images, tokens = batch(student)
    first = None
    for _ in range(40):
        optimizer.zero_grad()
        loss = AttentionTransfer(teacher, nullcontext)(student, images, tokens)
        loss.backward()
        optimizer.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.5 * first, (first, loss.item())
    learned = [k for k in student.state_dict() if k.endswith(("feature_q", "feature_k"))]
    assert (attention == "hedgehog") == bool(learned)  # hedgehog's feature maps are trained with the projections
    for key in learned:
        assert not torch.equal(
            student.state_dict()[key],
            torch.eye(*student.state_dict()[key].shape[-2:]).expand_as(student.state_dict()[key]),
        ), key
    for key, value in student.state_dict().items():
        if key in frozen:
            torch.testing.assert_close(value, frozen[key], rtol=0, atol=0, msg=key)
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())


def test_a_teacher_of_another_size_is_refused_naming_the_first_tensor(tmp_path):
    other = models.create_model("tiny-m")
    path = tmp_path / "tiny-m.safetensors"
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(path))
    student = models.create_model("tiny-s", image_attention="linear_affine_nodenom")
    with pytest.raises(
        CheckpointError, match=r"distill.teacher: \S+ is \(.*\) in the teacher but \(.*\) in the student"
    ):
        load_teacher(str(path), student)


def test_training_with_a_teacher_fits_the_attention_only_and_saves_only_the_student(tmp_path, synthetic, teacher_file):
    """python -m train with distill.teacher: the student (Eq. 7) starts from the teacher, its attention-transfer
    loss falls, everything but the attention keeps the teacher's weights, the checkpoint holds the student alone."""
    from safetensors.torch import load_file

    from tests.train.common import checkpoints, metrics, run, tiny_config, train_records, weights

    config = tiny_config(tmp_path, synthetic, optim={"lr": 3e-3, "warmup_steps": 1}, train={"max_steps": 12})
    overrides = ["model.image_attention=linear_affine_nodenom", "model.text_attention=linear_affine_nodenom"]
    evals = [f"eval.dataset={synthetic['eval']}", "eval.every=6"]
    assert run(config, f"distill.teacher={teacher_file}", "distill.stage=transfer", *overrides, *evals) == 0
    losses = [r["loss"] for r in train_records(tmp_path / "run")]
    assert losses[-1] < 0.7 * losses[0], losses
    # the teacher's zero-shot result, computed once, is logged beside the student's at every evaluation
    evaluated = [r for r in metrics(tmp_path / "run") if "zeroshot/top1" in r]
    assert len(evaluated) == 2 and len({r["teacher/zeroshot/top1"] for r in evaluated}) == 1
    final = weights(checkpoints(tmp_path / "run")[-1])
    teacher = load_file(str(teacher_file))
    assert set(final) == set(teacher)  # no teacher copy, no extra keys
    for key, value in final.items():
        same = torch.equal(value, teacher[key].reshape(value.shape))
        assert same == (".attn." not in key), key  # attention trained, the rest frozen at the teacher's


def test_a_teacher_with_checkpointing_is_refused(tmp_path, synthetic, teacher_file):
    from tests.train.common import run, tiny_config
    from train.config import ConfigError

    with pytest.raises(ConfigError, match=r"set model.grad_checkpointing=false"):
        run(
            tiny_config(tmp_path, synthetic),
            f"distill.teacher={teacher_file}",
            "distill.stage=transfer",
            "model.grad_checkpointing=true",
        )


def test_distillation_terms_vanish_for_a_student_equal_to_its_teacher(teacher_file):
    from train.distill import Distillation
    from train.loss import ClipLoss

    student = models.create_model("tiny-s", pretrained=str(teacher_file))
    teacher = load_teacher(str(teacher_file), student)
    objective = Distillation(teacher, nullcontext, ClipLoss(), (0.0, 1.0, 1.0))
    loss = objective(student, *batch(student))
    assert abs(loss.item()) < 1e-5 and abs(objective.terms["distill/embedding"]) < 1e-6
    assert objective.terms["distill/contrastive"] > 0  # logged although weighted 0


def test_stage_two_trains_the_whole_student_and_logs_each_term(tmp_path, synthetic, teacher_file):
    from tests.train.common import checkpoints, metrics, run, tiny_config, train_records, weights

    config = tiny_config(tmp_path, synthetic, optim={"lr": 3e-3, "warmup_steps": 1}, train={"max_steps": 6})
    overrides = ["model.image_attention=linear_affine_nodenom", "distill.stage=distill", "distill.embedding_weight=2"]
    assert run(config, f"distill.teacher={teacher_file}", *overrides) == 0
    records = train_records(tmp_path / "run")
    for r in records:
        terms = [r["distill/contrastive"], r["distill/embedding"], r["distill/similarity"]]
        assert all(t >= 0 for t in terms)
        assert r["loss"] == pytest.approx(terms[0] + 2 * terms[1] + terms[2], rel=1e-4)
    final = weights(checkpoints(tmp_path / "run")[-1])
    teacher = load_file(str(teacher_file))
    assert not torch.equal(final["visual.conv1.weight"], teacher["visual.conv1.weight"])  # not frozen here
    # the end-of-run summary, as any run's: the student's sizes and attentions, the closing metrics record
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["image_attention"] == "linear_affine_nodenom" and summary["text_attention"] == "softmax"
    end = metrics(tmp_path / "run")[-1]
    assert end.get("end") and end["step"] == 6 and end["skipped_total"] == 0


def test_stage_one_resumes_exactly_mid_stage(tmp_path, synthetic, teacher_file):
    """Attention transfer of a hedgehog student, 6 steps, and the same resumed from its step-3 checkpoint: the
    same losses at steps 4-6 and the same final student (the teacher is rebuilt from distill.teacher, never saved)."""
    from tests.train.common import checkpoints, max_difference, run, tiny_config, train_records, weights

    config = tiny_config(
        tmp_path, synthetic, optim={"lr": 3e-3, "warmup_steps": 1}, train={"max_steps": 6, "save_every": 3}
    )
    common = [f"distill.teacher={teacher_file}", "distill.stage=transfer", "model.image_attention=hedgehog"]
    common += ["model.text_attention=hedgehog"]
    full, resumed = tmp_path / "run", tmp_path / "resumed"
    assert run(config, *common, "train.keep_last=2") == 0
    middle = checkpoints(full)[0]
    assert middle.name.endswith("3")
    assert run(config, *common, f"train.run_dir={resumed}", f"train.resume={middle}") == 0
    after = {r["step"]: r["loss"] for r in train_records(full) if r["step"] > 3}
    again = {r["step"]: r["loss"] for r in train_records(resumed) if r["step"] > 3}
    assert sorted(again) == [4, 5, 6] and all(abs(after[s] - again[s]) < 1e-6 for s in again), (after, again)
    assert max_difference(weights(checkpoints(full)[-1]), weights(checkpoints(resumed)[-1])) < 1e-6
