"""Shard streams that break or hang (data/reading.py, data.shard_timeout_s and data.shard_retries): a `pipe:`
command that dies mid-shard or stops sending bytes, a local HTTP server that stalls or drops the connection. Each is
read again up to data.shard_retries times, each sample given once, then skipped as its own cause with the URL; no
command outlives its stream. Faults are injected at a chosen byte; every wait is bounded."""

import http.server
import subprocess
import tarfile
import threading
import time

import pytest

from data import DataConfig, build_train_data
from data.stream import tar_samples
from tests.data.shardmaker import ids_tokenizer, sample_members, to_tensor, write_tar

TIMEOUT_S = 0.5  # local commands (head, cat) answer at once: a wait this long is the injected stall
HTTP_TIMEOUT_S = 1.0  # the server thread may wait for a core on a loaded machine


@pytest.fixture
def shard(tmp_path):
    """(path of a tar of samples 0..5, the byte inside sample 3's image where faults are injected)."""
    path = write_tar(tmp_path / "shard.tar", sample_members(range(6)))
    with tarfile.open(path) as tar:
        cut = tar.getmember("000003.jpg").offset_data + 10
    return path, cut


def ids(samples: list[dict]) -> list[int]:
    return [int(s["__key__"]) for s in samples if "__error__" not in s]


def errors(samples: list[dict]) -> list[str]:
    return [s["__error__"] for s in samples if "__error__" in s]


def left_behind(marker: str) -> list[str]:
    """Processes whose command line holds `marker` (a `sleep` of a chosen length)."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, timeout=10).stdout
    return out.split()


def test_a_command_that_dies_mid_shard_once_is_read_again_and_gives_each_sample_once(tmp_path, shard):
    path, cut = shard
    once = tmp_path / "failed-once"
    url = f"pipe:if [ -e {once} ]; then cat {path}; else touch {once}; head -c {cut} {path}; exit 3; fi"
    samples = list(tar_samples(url, TIMEOUT_S, retries=2))
    assert ids(samples) == [0, 1, 2, 3, 4, 5] and errors(samples) == []


def test_a_command_that_always_dies_is_skipped_as_broken_stream_after_the_retries(tmp_path, shard):
    path, cut = shard
    opened = tmp_path / "opened"
    url = f"pipe:echo x >> {opened}; head -c {cut} {path}; exit 3"
    samples = list(tar_samples(url, TIMEOUT_S, retries=2))
    assert ids(samples) == [0, 1, 2] and errors(samples) == ["broken_stream"]
    assert samples[-1]["__url__"] == url and "status 3" in samples[-1]["__detail__"]
    assert len(opened.read_text().split()) == 3  # the first try and 2 retries


def test_a_stalled_command_is_killed_read_again_then_skipped_as_stalled_stream(shard):
    path, cut = shard
    url = f"pipe:head -c {cut} {path}; sleep 1017.25"
    started = time.monotonic()
    samples = list(tar_samples(url, TIMEOUT_S, retries=1))
    assert ids(samples) == [0, 1, 2] and errors(samples) == ["stalled_stream"]
    assert "data.shard_timeout_s=0.5" in samples[-1]["__detail__"]
    assert time.monotonic() - started < 10
    assert left_behind("sleep 1017.25") == []


def test_a_stream_closed_early_leaves_no_command_behind(shard):
    path, _ = shard
    samples = tar_samples(f"pipe:cat {path}; sleep 1017.5", TIMEOUT_S)
    assert int(next(samples)["__key__"]) == 0
    samples.close()  # the worker needed no more of this shard
    assert left_behind("sleep 1017.5") == []


class Server:
    """A local HTTP server of one tar whose n-th request does plan[n]: "full", "drop" (the connection closes at the
    cut byte) or "stall" (no byte after the cut until the server stops)."""

    def __init__(self, data: bytes, cut: int, plan: list[str]):
        self.data, self.cut, self.plan, self.requests = data, cut, plan, 0
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                how = server.plan[min(server.requests, len(server.plan) - 1)]
                server.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.data)))
                self.end_headers()
                self.wfile.write(server.data if how == "full" else server.data[: server.cut])
                self.wfile.flush()
                if how == "stall":
                    server.stop.wait(30)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/shard.tar"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize(
    "plan, retries, expected_ids, expected_errors",
    [
        (["drop", "full"], 1, [0, 1, 2, 3, 4, 5], []),
        (["drop"], 1, [0, 1, 2], ["broken_stream"]),
        (["stall", "full"], 1, [0, 1, 2, 3, 4, 5], []),
        (["stall"], 1, [0, 1, 2], ["stalled_stream"]),
    ],
    ids=["dropped-then-whole", "dropped", "stalled-then-whole", "stalled"],
)
def test_an_http_server_that_drops_or_stalls(shard, plan, retries, expected_ids, expected_errors):
    path, cut = shard
    server = Server(path.read_bytes(), cut, plan)
    try:
        samples = list(tar_samples(server.url, HTTP_TIMEOUT_S, retries=retries))
    finally:
        server.close()
    assert ids(samples) == expected_ids and errors(samples) == expected_errors
    assert server.requests == retries + 1 if expected_errors else server.requests == 2
    if expected_errors:
        assert samples[-1]["__url__"] == server.url


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_skips_stalled_shards_and_counts_them(tmp_path, workers):
    """Two pipe: shards that each stall after 3 of their 6 samples, an epoch of 8 samples, no shuffling: each pass
    over a shard gives its 3 readable samples once and counts the shard once as stalled_stream; the second pass
    (bad input left the quota short) gives the rest. No command is left behind."""
    urls = []
    for shard in range(2):
        path = write_tar(tmp_path / f"{shard}.tar", sample_members(range(10 * shard, 10 * shard + 6)))
        with tarfile.open(path) as tar:
            cut = tar.getmember(f"{10 * shard + 3:06d}.jpg").offset_data + 10
        urls.append(f"pipe:head -c {cut} {path}; sleep 1018.{shard}")
    cfg = DataConfig(
        train_shards="::".join(urls),
        train_num_samples=8,
        batch_size=4,
        shuffle_buffer=1,
        workers=workers,
        shard_timeout_s=TIMEOUT_S,
        shard_retries=1,
    )
    data = build_train_data(cfg, to_tensor, ids_tokenizer)
    got = [i for _, tokens in data.loader for i in tokens[:, 0].tolist()]
    assert len(got) == 8 and set(got) == {0, 1, 2, 10, 11, 12}
    assert data.skipped()["stalled_stream"] == 2 and sum(data.skipped().values()) == 2
    assert left_behind("sleep 1018") == []
