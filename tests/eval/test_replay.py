"""eval.replay: an evaluation set decoded once per run gives the numbers of reading it every time."""

import pytest
import torch

from eval import datasets, val_loss, zeroshot
from eval.replay import Replay
from models import create_model, tokenizer, transforms
from tests.data.shardmaker import write_shards
from tests.eval import evalsets
from train.loss import build_loss


def test_replays_a_complete_pass_that_fits():
    calls = []

    def batches():
        calls.append(1)
        yield from (torch.full((2, 3), float(i)) for i in range(4))

    replay = Replay(max_mb=1)
    first, second = list(replay(batches)), list(replay(batches))
    assert len(calls) == 1 and replay.ready
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_too_big_broken_off_or_off_is_read_again():
    def batches():
        yield from (torch.zeros(2**18) for _ in range(4))  # 1 MiB each

    big = Replay(max_mb=3)
    assert len(list(big(batches))) == 4 and not big.ready
    broken = Replay(max_mb=100)
    for _ in zip(range(2), broken(batches), strict=False):
        pass
    assert not broken.ready  # a pass that stopped early is not the whole set
    off = Replay(max_mb=0)
    list(off(batches))
    assert not off.ready


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("tiny-s")


def test_zeroshot_replayed_equals_read(tmp_path, model, monkeypatch):
    folder = evalsets.synthetic_eval(tmp_path / "set", per_class=2)
    _, transform = transforms("tiny-s")
    opened = []
    load_image = datasets.load_image
    monkeypatch.setattr(datasets, "load_image", lambda *a: opened.append(1) or load_image(*a))

    def run(replay=None):
        out = zeroshot.evaluate(
            model, dataset=str(folder), tokenizer=tokenizer("tiny-s"), transform=transform, batch_size=16, replay=replay
        )
        return {k: out[k] for k in ("top1", "top5", "mean_per_class_recall", "num_images")}

    plain = run()
    assert len(opened) == 48
    replay = Replay(max_mb=64)
    assert run(replay) == plain and run(replay) == plain
    assert len(opened) == 2 * 48  # the replayed pass decoded nothing


def test_val_loss_replayed_equals_read(tmp_path, model, monkeypatch):
    spec = write_shards(tmp_path / "val", [7, 9, 6])
    _, transform = transforms("tiny-s")
    decoded = []
    to_tensors = val_loss.to_tensors
    monkeypatch.setattr(val_loss, "to_tensors", lambda *a: decoded.append(1) or to_tensors(*a))

    def run(replay=None):
        return val_loss.validation_loss(
            model,
            spec,
            build_loss("clip", gather=False),
            batch_size=8,
            image_transform=transform,
            tokenizer=tokenizer("tiny-s"),
            replay=replay,
        )

    plain = run()
    replay = Replay(max_mb=64)
    assert run(replay) == plain and run(replay) == plain
    assert len(decoded) == 2 * 2  # two batches of 8, decoded by the plain pass and the first replayed one
