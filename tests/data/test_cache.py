"""data.cache_mb: later epochs read no tar and decode no image, and the batches are the same bit for bit."""

import pytest
import torch
from torchvision import transforms as T

import data.cache
import data.stream
from data import DataConfig, build_train_data
from data.errors import DataError
from tests.data.shardmaker import ids_tokenizer, write_shards

# a random crop, so that equal batches also mean equal augmentations
CROP = T.Compose([T.RandomResizedCrop(6, scale=(0.3, 1.0)), T.PILToTensor()])


def run_epochs(spec: str, n: int, **options) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], dict]:
    """(the batches of each of n epochs, the skipped samples' counts by cause)."""
    cfg = DataConfig(train_shards=spec, **{"batch_size": 8, "workers": 0, "shuffle_buffer": 5} | options)
    train = build_train_data(cfg, CROP, ids_tokenizer)
    out = []
    for epoch in range(n):
        train.set_epoch(epoch)
        out.append(list(train.loader))
    return out, train.skipped()


def epochs(spec: str, n: int, **options) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    return run_epochs(spec, n, **options)[0]


def same(a, b) -> bool:
    return all(
        len(x) == len(y) and all(torch.equal(i, j) and torch.equal(s, t) for (i, s), (j, t) in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


@pytest.fixture
def counted(monkeypatch):
    """Counts of tars opened and images decoded."""
    counts = {"tars": 0, "decoded": 0}
    real_tar, real_decode = data.stream.tar_samples, data.stream.decode

    def tar_samples(url, **options):
        counts["tars"] += 1
        yield from real_tar(url, **options)

    def decode(sample, *limits):
        counts["decoded"] += 1
        return real_decode(sample, *limits)

    monkeypatch.setattr(data.stream, "tar_samples", tar_samples)
    monkeypatch.setattr(data.cache, "tar_samples", tar_samples)
    monkeypatch.setattr(data.stream, "decode", decode)
    return counts


def test_cached_epochs_equal_uncached_and_read_each_tar_once(tmp_path, counted):
    spec = write_shards(tmp_path, [7, 13, 5, 11])  # 36 samples
    plain = epochs(spec, 3)
    assert counted == {"tars": 12, "decoded": 108}
    counted.update(tars=0, decoded=0)
    cached = epochs(spec, 3, cache_mb=1)
    assert same(plain, cached)
    assert counted == {"tars": 4, "decoded": 36}  # the first epoch's only
    assert not same(plain[:1], plain[1:2])  # epochs differ (order, crops): the comparison could fail


def test_shards_that_do_not_fit_are_read_every_epoch(tmp_path, counted):
    spec = write_shards(tmp_path, [10, 10, 10])
    shard_bytes = (tmp_path / "0000.tar").stat().st_size
    plain = epochs(spec, 2)
    counted.update(tars=0, decoded=0)
    cached = epochs(spec, 2, cache_mb=1.5 * shard_bytes / 2**20)  # one shard fits, not two
    assert same(plain, cached)
    assert counted["tars"] == 1 + 2 * 2 and 30 < counted["decoded"] < 60


def test_resampled_mode_and_bad_input_are_unchanged(tmp_path):
    spec = write_shards(tmp_path, [6, 9])
    (tmp_path / "0001.tar").write_bytes((tmp_path / "0001.tar").read_bytes()[:3000])  # broken off mid-shard
    options = {"train_num_samples": 12, "resampled": True}
    plain, cached = epochs(spec, 3, **options), epochs(spec, 3, cache_mb=1, **options)
    assert same(plain, cached)


def test_cache_with_worker_processes_is_one_line_error(tmp_path):
    spec = write_shards(tmp_path, [4])
    with pytest.raises(DataError, match=r"data.cache_mb=64 needs data.workers=0 .*: set data.workers=0"):
        epochs(spec, 1, cache_mb=64, workers=2)


@pytest.fixture
def preloaded(monkeypatch):
    """data.cache's preloaded shards, emptied after the test."""
    monkeypatch.setattr(data.cache, "PRELOADED", {})
    monkeypatch.setattr(data.cache, "PRELOADED_LIMITS", {})
    return data.cache


def test_preloaded_shards_give_the_same_batches_and_counts_without_reading_a_tar(tmp_path, counted, preloaded):
    spec = write_shards(tmp_path, [7, 13, 5])
    (tmp_path / "0001.tar").write_bytes((tmp_path / "0001.tar").read_bytes()[:4000])  # broken off mid-shard
    plain, plain_skipped = run_epochs(spec, 2, cache_mb=1)
    assert plain_skipped["unreadable_tar"] > 0  # bad input is counted: the counts could differ
    urls = [str(tmp_path / f"000{k}.tar") for k in range(3)]
    defaults = DataConfig(train_shards=spec)
    assert preloaded.preload(urls, 1, defaults.max_image_pixels, defaults.max_caption_bytes) > 0
    counted.update(tars=0, decoded=0)
    again, again_skipped = run_epochs(spec, 2, cache_mb=1)
    assert same(plain, again) and again_skipped == plain_skipped
    assert counted == {"tars": 0, "decoded": plain_skipped["unreadable_tar"]}  # only the broken tar's marker


def test_preloaded_shards_decoded_under_other_limits_or_relative_paths_are_not_used(tmp_path, counted, preloaded):
    spec = write_shards(tmp_path, [6, 6])
    urls = [str(tmp_path / f"000{k}.tar") for k in range(2)]
    preloaded.preload(urls, 1, 10**6, 4)  # captions of at most 4 bytes: every sample refused
    assert preloaded.preload(["0000.tar"], 1, 10**6, 65_536) == 0  # relative: a fork may run elsewhere
    counted.update(tars=0, decoded=0)
    batches, skipped = run_epochs(spec, 1, cache_mb=1)
    assert sum(len(tokens) for _, tokens, *_ in batches[0]) == 12 and not any(skipped.values())
    assert counted == {"tars": 2, "decoded": 12}


def test_shards_preloaded_by_two_processes_give_the_same_batches_without_reading_a_tar(tmp_path, counted, preloaded):
    spec = write_shards(tmp_path, [7, 13, 5])
    plain = epochs(spec, 2, cache_mb=1)
    urls = [str(tmp_path / f"000{k}.tar") for k in range(3)]
    defaults = DataConfig(train_shards=spec)
    assert preloaded.preload(urls, 1, defaults.max_image_pixels, defaults.max_caption_bytes, workers=2) > 0
    assert [len(preloaded.PRELOADED[url]) for url in urls] == [7, 13, 5]  # in the order asked, from the processes
    counted.update(tars=0, decoded=0)
    assert same(plain, epochs(spec, 2, cache_mb=1))
    assert counted == {"tars": 0, "decoded": 0}  # decoded images came back with the samples
