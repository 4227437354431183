"""Bad input is skipped and counted by cause; missing shards and empty specs fail at start-up."""

import io
import tarfile

import pytest
from PIL import Image

from data import DataConfig, DataError, build_train_data
from data.plan import shard_order
from tests.data.shardmaker import batch_ids, ids_tokenizer, jpeg, sample_members, to_tensor, write_tar


def png(side: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side)).save(buffer, format="PNG")
    return buffer.getvalue()


def zoo_members() -> list[tuple[str, bytes]]:
    """Good samples 100..104 with one sample of every kind of bad input between them."""
    good = sample_members
    return [
        *good([100]),
        ("000001.jpg", b"\xff\xd8\xff\xe0 not a jpeg"),
        ("000001.txt", b"sample 1"),
        ("000002.jpg", jpeg()[:60]),
        ("000002.txt", b"sample 2"),  # truncated image
        ("000003.jpg", jpeg()),
        ("000003.txt", b"  \n"),  # empty caption
        ("000004.jpg", jpeg()),  # missing caption
        ("000005.jpg", jpeg()),
        ("000005.txt", b"\xff\xfe sample 5"),  # not UTF-8
        ("000006.txt", b"sample 6"),  # missing image
        *good([101]),
        ("000007.png", png(64)),
        ("000007.txt", b"sample 7"),  # 4096 px > limit
        ("000008.jpg", jpeg()),
        ("000008.txt", b"sample 8"),
        ("000008.jpg", jpeg()),  # same file twice
        *good([102]),
        ("000100.jpg", jpeg()),
        ("000100.txt", b"sample 100"),  # key 100 again
        ("000009.jpg", jpeg()),
        ("000009.txt", b"word " * 30),  # 150 bytes > limit
        *good([103, 104]),
    ]


def truncated_tar(path) -> None:
    """Samples 200..205 in a tar cut off inside the image of sample 203: 200..202 are readable."""
    write_tar(path, sample_members(range(200, 206)))
    with tarfile.open(path) as tar:
        cut = tar.getmember("000203.jpg").offset_data + 10
    path.write_bytes(path.read_bytes()[:cut])


def test_every_kind_of_bad_input_is_skipped_and_counted(tmp_path):
    # Shards are read in the epoch's seeded order: put the truncated tar first, so the zoo shard's
    # last good sample is the last one needed and every bad sample is reached.
    names = ["a.tar", "b.tar"] if shard_order(2, seed=0, epoch=0)[0] == 0 else ["b.tar", "a.tar"]
    truncated_tar(tmp_path / names[0])
    write_tar(tmp_path / names[1], zoo_members())
    cfg = DataConfig(
        train_shards=str(tmp_path / "{a,b}.tar"),
        train_num_samples=8,
        batch_size=4,
        workers=0,
        shuffle_buffer=1,
        max_image_pixels=1000,
        max_caption_bytes=100,
    )
    data = build_train_data(cfg, to_tensor, ids_tokenizer)
    ids = sorted(i for batch in batch_ids(data.loader) for i in batch)
    assert ids == [100, 101, 102, 103, 104, 200, 201, 202]
    assert data.skipped() == {
        "unreadable_tar": 1,
        "stalled_stream": 0,  # tests/data/test_streams.py
        "broken_stream": 0,
        "duplicate_key": 2,
        "missing_image": 1,
        "corrupt_image": 2,
        "oversized_image": 1,
        "missing_caption": 1,
        "empty_caption": 1,
        "non_utf8_caption": 1,
        "oversized_caption": 1,
        "transform_error": 0,
    }


def test_counts_from_two_workers_reach_the_main_process(tmp_path):
    for name in ("a", "b"):
        write_tar(
            tmp_path / f"{name}.tar",
            [("000000.jpg", b"broken"), ("000000.txt", b"sample 0"), *sample_members(range(1, 5))],
        )
    cfg = DataConfig(train_shards=str(tmp_path / "{a,b}.tar"), train_num_samples=8, batch_size=2, workers=2)
    data = build_train_data(cfg, to_tensor, ids_tokenizer)
    steps = [data.skipped()["corrupt_image"] for _ in data.loader]
    assert len(steps) == 4 and steps[-1] == 2 and data.skipped()["corrupt_image"] == 2
    assert data.state_dict()["skipped"]["corrupt_image"] == 2


def test_a_shard_with_nothing_readable_is_an_error_not_a_hang(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"this is not a tar file" * 100)
    cfg = DataConfig(train_shards=str(tmp_path / "a.tar"), train_num_samples=4, batch_size=2, workers=0)
    data = build_train_data(cfg, to_tensor, ids_tokenizer)
    with pytest.raises(DataError, match="no readable sample"):
        batch_ids(data.loader)


@pytest.mark.parametrize(
    "spec, options, message",
    [
        ("", {}, "empty"),
        ("{dir}/a.tar::", {}, "empty"),
        ("{dir}/{{a,missing}}.tar", {}, "do not exist"),
        ("{dir}/a.tar", {"batch_size": 3}, "multiple of world_size"),
        ("{dir}/a.tar", {"train_weights": "1"}, "resampled"),
        ("{dir}/a.tar", {"train_weights": "1::2", "resampled": True}, "one weight per source"),
        ("pipe:cat {dir}/a.tar", {}, "number of samples"),
        ("{dir}/a.tar", {"max_caption_bytes": 0}, "data.max_caption_bytes"),
    ],
)
def test_bad_configs_fail_at_start_up_in_one_line(tmp_path, spec, options, message):
    write_tar(tmp_path / "a.tar", sample_members(range(4)))
    cfg = DataConfig(train_shards=spec.format(dir=tmp_path), **{"batch_size": 2} | options)
    with pytest.raises(DataError, match=message) as error:
        build_train_data(cfg, to_tensor, ids_tokenizer, rank=0, world_size=2)
    assert "\n" not in str(error.value)
