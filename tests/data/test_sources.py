"""Shard specs (braces, `::` sources, weights, pipe:, size files) and resampled mode."""

import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from data import DataConfig, build_train_data
from data.sources import expand_spec, read_sizes
from tests.data.shardmaker import batch_ids, ids_tokenizer, to_tensor, write_shards


def test_braces_and_sources_expand_in_order_with_weights_per_source():
    urls, weights = expand_spec("d/{00..02}.tar::pipe:cat e/{a,b}.tar", "1::3")
    assert urls == ["d/00.tar", "d/01.tar", "d/02.tar", "pipe:cat e/a.tar", "pipe:cat e/b.tar"]
    assert weights == [1.0, 1.0, 1.0, 3.0, 3.0]
    assert expand_spec("x.tar")[1] is None


def test_sizes_from_sizes_json_info_json_or_img2dataset_stats(tmp_path):
    spec = write_shards(tmp_path / "a", [3, 5])
    (tmp_path / "b").mkdir()
    info = {"shardlist": [{"url": "0.tar", "nsamples": 7}, {"url": "1.tar", "nsamples": 2}]}
    (tmp_path / "b" / "_info.json").write_text(json.dumps(info))
    assert read_sizes(expand_spec(spec)[0] + [str(tmp_path / "b" / "1.tar")]) == [3, 5, 2]
    (tmp_path / "b" / "9_stats.json").write_text(json.dumps({"count": 10, "successes": 8}))
    assert read_sizes([str(tmp_path / "b" / "9.tar")]) == [8]
    assert read_sizes([str(tmp_path / "b" / "8.tar")]) is None
    assert read_sizes(["pipe:cat x.tar"]) is None


def test_pipe_sources_joined_with_local_ones_are_read_once_each(tmp_path):
    local = write_shards(tmp_path / "a", [6, 6])
    piped = write_shards(tmp_path / "b", [6, 6], first_id=100, sizes_json=False)
    cfg = DataConfig(train_shards=f"{local}::pipe:cat {piped}", train_num_samples=24, batch_size=4, workers=2)
    data = build_train_data(cfg, to_tensor, ids_tokenizer)
    ids = sorted(i for batch in batch_ids(data.loader) for i in batch)
    assert ids == list(range(12)) + list(range(100, 112))


def resampled(spec, rank=0, world_size=1, **options):
    cfg = DataConfig(
        train_shards=spec,
        resampled=True,
        **{"train_num_samples": 64, "batch_size": 8, "workers": 2, "shuffle_buffer": 10} | options,
    )
    return build_train_data(cfg, to_tensor, ids_tokenizer, rank=rank, world_size=world_size)


def test_weighted_sources_are_drawn_in_proportion(tmp_path):
    spec_a = write_shards(tmp_path / "a", [4] * 4)
    spec_b = write_shards(tmp_path / "b", [4] * 4, first_id=1000)
    data = resampled(f"{spec_a}::{spec_b}", train_weights="1::3", train_num_samples=1200, batch_size=40)
    ids = [i for batch in batch_ids(data.loader) for i in batch]
    assert len(ids) == 1200
    assert 0.65 < sum(i >= 1000 for i in ids) / len(ids) < 0.85


def test_resampled_streams_are_seeded_per_rank_and_resume_reproducibly(tmp_path):
    spec = write_shards(tmp_path, [5, 7, 6, 9])
    first, again = batch_ids(resampled(spec).loader), batch_ids(resampled(spec).loader)
    assert first == again and len(first) == 8
    rank0, rank1 = (batch_ids(resampled(spec, r, 2).loader) for r in (0, 1))
    assert rank0 != rank1 and len(rank0) == len(rank1) == 8
    data = resampled(spec)
    for step, _ in enumerate(data.loader):
        if step == 2:
            break
    state = data.state_dict()
    tails = []
    for _ in range(2):
        resumed = resampled(spec)
        resumed.load_state_dict(state)
        tails.append(batch_ids(resumed.loader))
    assert tails[0] == tails[1] and len(tails[0]) == 5


def test_http_shards_are_read_through_curl(tmp_path):
    write_shards(tmp_path, [5, 7], sizes_json=False)
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = f"http://127.0.0.1:{server.server_port}/{{0000..0001}}.tar"
        cfg = DataConfig(train_shards=spec, train_num_samples=12, batch_size=4, workers=0)
        data = build_train_data(cfg, to_tensor, ids_tokenizer)
        assert sorted(i for batch in batch_ids(data.loader) for i in batch) == list(range(12))
    finally:
        server.shutdown()
