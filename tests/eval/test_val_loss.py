"""The validation loss: fixed batches in shard order, the run's loss per batch, averaged; RNG untouched."""

import time
from io import BytesIO
from pathlib import Path

import pytest
import torch
from PIL import Image

from eval.val_loss import ValidationError, validation_loss
from models import create_model, tokenizer, transforms
from tests.data.shardmaker import jpeg, sample_members, write_shards, write_tar
from train.loss import build_loss


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("tiny-s").train()


def direct(model, spec_ids: list[list[int]], loss_fn) -> float:
    """The definition spelt out: each batch of sample ids through the model and the loss, then the mean."""
    _, transform = transforms("tiny-s")
    tok = tokenizer("tiny-s")
    losses = []
    model.eval()
    with torch.no_grad():
        for ids in spec_ids:
            images = torch.stack([transform(Image.open(BytesIO(jpeg(value=i % 256))).convert("RGB")) for i in ids])
            tokens = tok([f"sample {i}" for i in ids])
            losses.append(float(loss_fn(*model(images, tokens))))
    model.train()
    return sum(losses) / len(losses)


def val(model, spec, batch_size, loss="clip"):
    _, transform = transforms("tiny-s")
    return validation_loss(
        model,
        spec,
        build_loss(loss, gather=False),
        batch_size=batch_size,
        image_transform=transform,
        tokenizer=tokenizer("tiny-s"),
    )


def test_value_is_the_mean_of_fixed_batches_in_shard_order(tmp_path, model):
    spec = write_shards(tmp_path / "val", [7, 9, 6])  # 22 samples: batches 0-7, 8-15; 16-21 left out
    expected = direct(model, [list(range(0, 8)), list(range(8, 16))], build_loss("clip"))
    state = torch.get_rng_state()
    assert val(model, spec, 8) == pytest.approx(expected, rel=1e-6)
    assert torch.equal(torch.get_rng_state(), state) and model.training
    # Another batch size is another definition: 3 batches of 7.
    assert val(model, spec, 7) == pytest.approx(
        direct(model, [list(range(i, i + 7)) for i in (0, 7, 14)], build_loss("clip")), rel=1e-6
    )


def test_unreadable_samples_leave_their_batch(tmp_path, model):
    members = sample_members(range(8))
    members[2 * 3] = ("000003.jpg", b"not a jpeg")
    (tmp_path / "val").mkdir()
    write_tar(tmp_path / "val" / "0000.tar", members)
    expected = direct(model, [[0, 1, 2], [4, 5, 6, 7]], build_loss("clip"))
    assert val(model, str(tmp_path / "val" / "0000.tar"), 4) == pytest.approx(expected, rel=1e-6)


def test_too_few_samples_is_one_line(tmp_path, model):
    spec = write_shards(tmp_path / "val", [5])
    with pytest.raises(ValidationError, match=r"fewer than eval.batch_size=8 samples; add samples or lower"):
        val(model, spec, 8)


def two_rank_worker(rank: int, spec: str, store: str, out: str) -> None:
    """One of two gloo ranks computing the validation loss; writes what it ended with."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    try:
        val(create_model("tiny-s").train(), spec, 4)
        ended = "no error"
    except ValidationError as e:
        ended = str(e)
    finally:
        torch.distributed.destroy_process_group()
    Path(out, f"rank{rank}").write_text(ended)


@pytest.mark.trains
def test_an_unreadable_batch_of_one_rank_is_the_error_of_both(tmp_path):
    """Batch 1 (rank 1's) has no readable sample: rank 1 alone reads it, yet both ranks finish their forward passes
    and raise the same line (before: rank 1 raised and rank 0 waited in its all-reduce until the timeout)."""
    bad = [member for i in range(4, 8) for member in ((f"{i:06d}.jpg", b"not a jpeg"), (f"{i:06d}.txt", b"x"))]
    members = sample_members(range(4)) + bad + sample_members(range(8, 12))
    (tmp_path / "val").mkdir()
    spec = str(write_tar(tmp_path / "val" / "0000.tar", members))
    context = torch.multiprocessing.spawn(
        two_rank_worker, args=(spec, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=False
    )
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        assert time.monotonic() < deadline, "a rank is still waiting: the error was not shared"
    expected = f"validation batch 1 of {spec} has no readable sample; check the shards"
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == [expected, expected]
