"""Epoch mode: exactly-once coverage over ranks x workers, equal steps, determinism, resume."""

import json
from collections import Counter

import pytest

from data import DataConfig, build_train_data
from tests.data.shardmaker import batch_ids, ids_tokenizer, sample_members, to_tensor, write_shards, write_tar


def build(spec, rank=0, world_size=1, **options):
    cfg = DataConfig(train_shards=spec, **{"batch_size": 8, "workers": 2, "shuffle_buffer": 5} | options)
    return build_train_data(cfg, to_tensor, ids_tokenizer, rank=rank, world_size=world_size)


def run_ranks(spec, world_size=2, **options):
    """Batches of every rank (ranks simulated one after another in this process)."""
    return [batch_ids(build(spec, r, world_size, **options).loader) for r in range(world_size)]


def test_every_sample_once_across_two_ranks_and_two_workers(tmp_path):
    spec = write_shards(tmp_path, [7, 13, 5, 11, 10])  # 46 samples, uneven shards
    per_rank = run_ranks(spec)
    seen = Counter(i for batches in per_rank for batch in batches for i in batch)
    assert sorted(seen) == list(range(46)) and set(seen.values()) == {1}
    assert len(per_rank[0]) == len(per_rank[1]) == 6  # 23 samples per rank in batches of 4
    assert [len(b) for b in per_rank[0]] == [len(b) for b in per_rank[1]] == [4] * 5 + [3]


def test_odd_total_leaves_out_fewer_than_world_size(tmp_path):
    spec = write_shards(tmp_path, [9, 3, 14, 5])  # 31 samples
    data = build(spec, 0, 2)
    assert data.num_samples == 30 and data.num_batches == 4
    seen = Counter(i for batches in run_ranks(spec) for batch in batches for i in batch)
    assert len(seen) == 30 and set(seen.values()) == {1}


def test_epoch_of_twice_the_data_shows_every_sample_twice(tmp_path):
    spec = write_shards(tmp_path, [7, 13, 5, 11, 10])
    seen = Counter(i for batches in run_ranks(spec, train_num_samples=92) for b in batches for i in b)
    assert sorted(seen) == list(range(46)) and set(seen.values()) == {2}


def test_without_sizes_every_rank_runs_the_same_steps(tmp_path):
    spec = write_shards(tmp_path, [3, 20, 6, 17], sizes_json=False)
    per_rank = run_ranks(spec, train_num_samples=40)
    assert len(per_rank[0]) == len(per_rank[1]) == 5
    assert all(len(b) == 4 for batches in per_rank for b in batches)


def test_drop_last_gives_only_full_batches(tmp_path):
    spec = write_shards(tmp_path, [7, 13, 5, 11, 10])
    data = build(spec, 0, 2, drop_last=True)
    batches = batch_ids(data.loader)
    assert data.num_batches == len(batches) == 5 and all(len(b) == 4 for b in batches)


def test_same_seed_same_order_other_seed_or_epoch_other_order(tmp_path):
    spec = write_shards(tmp_path, [10, 10, 10, 10])
    first, again, other = (batch_ids(build(spec, seed=s).loader) for s in (0, 0, 1))
    assert first == again and first != other
    data = build(spec)
    data.set_epoch(1)
    assert batch_ids(data.loader) != first


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_continues_with_the_next_batches(tmp_path, workers):
    spec = write_shards(tmp_path, [9, 14, 6, 11])
    full = batch_ids(build(spec, workers=workers).loader)
    data = build(spec, workers=workers)
    head = []
    for _, tokens in data.loader:
        head.append(tokens[:, 0].tolist())
        if len(head) == 3:
            break
    state = json.loads(json.dumps(data.state_dict()))
    resumed = build(spec, workers=workers)
    resumed.load_state_dict(state)
    assert len(resumed.loader) == len(full) - 3
    assert head + batch_ids(resumed.loader) == full
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["batch"] == 0


def test_resume_from_another_ranks_state_keeps_the_step_count(tmp_path):
    spec = write_shards(tmp_path, [9, 14, 6, 11])
    rank0 = build(spec, 0, 2)
    for step, _ in enumerate(rank0.loader):
        if step == 1:
            break
    rank1 = build(spec, 1, 2)
    rank1.load_state_dict(rank0.state_dict())
    assert len(batch_ids(rank1.loader)) == rank1.num_batches - 2


@pytest.mark.parametrize("stop", [4, 5, 6])
def test_resume_in_a_second_pass_over_the_pieces(tmp_path, stop):
    """An epoch of twice the data reads each worker's pieces twice; resumed at the end of the first pass (stop 4:
    the rest of that pass holds no sample) or inside the second, its own state repeats the unbroken batches, and a
    state by sample count (another layout: a new shuffle buffer; approximate by design) carries into the second pass
    with the step count kept, rather than stopping with 'no readable sample'."""
    spec = write_shards(tmp_path, [20])
    options = {"train_num_samples": 40, "batch_size": 5, "workers": 0}
    full = batch_ids(build(spec, **options).loader)
    data = build(spec, **options)
    head = []
    for _, tokens in data.loader:
        head.append(tokens[:, 0].tolist())
        if len(head) == stop:
            break
    state = json.loads(json.dumps(data.state_dict()))
    own = build(spec, **options)
    own.load_state_dict(state)
    assert len(full) == 8 and head + batch_ids(own.loader) == full
    other = build(spec, **options | {"shuffle_buffer": 4})
    other.load_state_dict(state)
    rest = batch_ids(other.loader)
    assert len(rest) == 8 - stop and all(len(b) == 5 and set(b) <= set(range(20)) for b in rest)  # approximate


def test_resume_where_only_corrupt_samples_are_left_in_the_pass(tmp_path):
    """15 good samples then 5 corrupt ones in a shard of 20: a worker short of its quota reads its pieces again; a
    checkpoint after the last good sample of the first pass resumes into the corrupt tail and on into the next pass
    (before: 'found no readable sample ... check the shards' on every requeue)."""
    members = sample_members(range(15)) + [(f"{i:06d}.jpg", b"not a jpeg") for i in range(15, 20)]
    members += [(f"{i:06d}.txt", f"sample {i}".encode()) for i in range(15, 20)]
    write_tar(tmp_path / "0000.tar", members)
    (tmp_path / "sizes.json").write_text(json.dumps({"0000.tar": 20}))
    spec = str(tmp_path / "{0000..0000}.tar")
    options = {"batch_size": 5, "workers": 0, "shuffle_buffer": 20}
    full = batch_ids(build(spec, **options).loader)
    data = build(spec, **options)
    head = [tokens[:, 0].tolist() for _, (_, tokens) in zip(range(3), data.loader, strict=False)]
    resumed = build(spec, **options)
    resumed.load_state_dict(json.loads(json.dumps(data.state_dict())))
    assert len(full) == 4 and head + batch_ids(resumed.loader) == full
