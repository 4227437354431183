"""data.max_skip_fraction: a run whose shards are mostly unreadable stops in one error line with the counts by cause;
one with a few bad samples trains on."""

import json

import pytest

from data.errors import SKIP_LIMIT_MIN_READ, skip_limit_problem
from tests.data.shardmaker import jpeg, write_tar
from tests.train.common import cli, finish, metrics, run, tiny_config

pytestmark = pytest.mark.trains


def shards_with_bad_images(folder, samples: int, bad_every: int | None, good_every: int | None = None) -> str:
    """Two shards of `samples` in all; an image is bytes that do not decode for every `bad_every`-th sample, or for
    all but every `good_every`-th. Returns the brace spec."""
    folder.mkdir()
    half = samples // 2
    for shard in range(2):
        members = []
        for i in range(shard * half, (shard + 1) * half):
            bad = (bad_every and i % bad_every == 0) or (good_every and i % good_every != 0)
            members += [(f"{i:06d}.jpg", b"not a jpeg" if bad else jpeg(value=i % 256)), (f"{i:06d}.txt", b"a cat")]
        write_tar(folder / f"{shard}.tar", members)
    (folder / "sizes.json").write_text(json.dumps({"0.tar": half, "1.tar": half}))
    return str(folder / "{0..1}.tar")


def test_mostly_unreadable_shards_stop_the_run_in_one_line(tmp_path, synthetic):
    """90% of the images corrupt: from 1000 samples read on, the run stops at a logging step, exit 1, one line."""
    spec = shards_with_bad_images(tmp_path / "shards", 1600, bad_every=None, good_every=10)
    path = tiny_config(tmp_path, synthetic, data={"train_shards": spec}, train={"max_steps": 10})
    code, _, err = finish(cli([str(path)]), timeout=120)
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    before, last = metrics(tmp_path / "run")[-2:]
    step, skipped = last["step"], last["skipped"]["corrupt_image"]
    read = skipped + 16 * step
    assert before["skipped"]["corrupt_image"] + 16 * (step - 1) < SKIP_LIMIT_MIN_READ <= read  # the first step past it
    assert errors[0] == (
        f"error: stopped at step {step}: data: {skipped} of {read} samples read were skipped "
        f"({100 * skipped / read:.1f}%, more than data.max_skip_fraction=0.1): corrupt_image {skipped}; "
        "repair or replace the shards, or raise data.max_skip_fraction (null: no limit)"
    )


def test_one_percent_unreadable_trains_on(tmp_path, synthetic, capsys):
    spec = shards_with_bad_images(tmp_path / "shards", 1200, bad_every=100)
    path = tiny_config(tmp_path, synthetic, data={"train_shards": spec, "batch_size": 64}, train={"max_steps": 18})
    assert run(path) == 0
    last = metrics(tmp_path / "run")[-1]
    assert last["end"] == "done" and last["samples_seen"] + last["skipped_total"] >= SKIP_LIMIT_MIN_READ
    assert last["skipped"]["corrupt_image"] == 12
    assert "error" not in capsys.readouterr().err


def test_mostly_unreadable_shards_train_on_without_a_limit(tmp_path, synthetic):
    spec = shards_with_bad_images(tmp_path / "shards", 1600, bad_every=None, good_every=10)
    data = {"train_shards": spec, "max_skip_fraction": None}
    assert run(tiny_config(tmp_path, synthetic, data=data, train={"max_steps": 8, "log_every": 4})) == 0


@pytest.mark.parametrize(
    "skipped, good, fraction, stops",
    [
        ({"corrupt_image": 999}, 0, 0.1, False),  # under the minimum read: one bad sample at the start never stops
        ({"corrupt_image": 100}, 900, 0.1, False),  # exactly the fraction
        ({"corrupt_image": 101}, 900, 0.1, True),
        ({"corrupt_image": 1}, 999, 0.0, True),
        ({"corrupt_image": 5000}, 1, None, False),
    ],
)
def test_the_limit(skipped, good, fraction, stops):
    assert (skip_limit_problem(skipped, good, fraction) is not None) == stops
