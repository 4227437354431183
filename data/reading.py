"""Opening a shard URL for reading, with every read bounded by `data.shard_timeout_s`.

A local path is opened as a file. `pipe:CMD` runs CMD with `sh -c` (S3 is read this way, as in open_clip:
`pipe:aws s3 cp s3://bucket/x.tar -`); http(s):// runs curl, without curl's own retries (data.shard_retries
counts them). Each command runs in its own process group, killed with SIGKILL when the stream is closed, when a
read waits longer than the timeout, and when the process that started it dies (PR_SET_PDEATHSIG; see `shell`), so
no command outlives its stream. Two faults are told apart from a corrupt tar, so that they can be retried:

- StreamStalled: no byte arrived for `timeout_s` seconds (a stalled server, a hung command);
- StreamBroken: the command ended with a failure status (it died mid-shard, the connection dropped: curl exit
  18 or 56, a server error: curl exit 22).

Other schemes (gs://, hf://, ...) go through webdataset's gopen, whose reads are not bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess

from webdataset.gopen import gopen

PR_SET_PDEATHSIG = 1
OK_STATUS = (0, 141, -signal.SIGPIPE)  # 141: the shell's SIGPIPE status, when the reader stopped early
CHUNK = 1 << 20


class StreamFault(OSError):
    """A shard stream that stalled or broke off; `cause` is a data.errors.SKIP_CAUSES name. Its text stays the
    message given (webdataset's tar reader appends the stream's repr to an exception's args)."""

    cause = "broken_stream"

    def __init__(self, url: str, message: str):
        super().__init__(message)
        self.url, self.message = url, message

    def __str__(self) -> str:
        return f"{self.url}: {self.message}"


class StreamStalled(StreamFault):
    cause = "stalled_stream"


class StreamBroken(StreamFault):
    cause = "broken_stream"


def die_with_parent(sig: int):
    """A preexec_fn: the command gets `sig` when the process that started it dies (Linux; elsewhere nothing)."""

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)

    return preexec


def shell(command: str) -> list[str]:
    """`sh -c` of a pipe: command that, on SIGTERM (sent when the process that started it dies), kills its whole
    process group: a DataLoader worker ends without closing its streams, and the shell's own children (`aws s3 cp`,
    `curl`, ...) would otherwise live on. The command's exit status is the shell's."""
    return ["sh", "-c", f"trap 'kill -KILL 0' TERM\n(\n{command}\n) &\nwait $!"]


class TimedPipe:
    """A command's stdout as a read-only binary stream whose every read waits at most `timeout_s` for a byte."""

    def __init__(self, command: list[str], url: str, timeout_s: float | None, quiet: bool = False):
        self.url, self.timeout_s = url, timeout_s
        stderr = subprocess.DEVNULL if quiet else None
        ends = die_with_parent(signal.SIGKILL if quiet else signal.SIGTERM)  # quiet: curl, which starts no child
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True, preexec_fn=ends
        )
        self.fd = self.proc.stdout.fileno()
        self.closed = self.waited = False

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all of them when size < 0); fewer at the end of the stream, or when the wait for the
        next byte ran out (that read returns what came; the next raises StreamStalled unless a byte is there)."""
        parts, wanted = [], size if size >= 0 else float("inf")
        got = 0
        while got < wanted:
            ready, _, _ = select.select([self.fd], [], [], 0 if self.waited else self.timeout_s)
            if not ready:
                if got:
                    self.waited = True
                    break
                self.kill()
                raise StreamStalled(self.url, f"no data for data.shard_timeout_s={self.timeout_s:g} s")
            self.waited = False
            part = os.read(self.fd, int(min(wanted - got, CHUNK)))
            if not part:
                if not got:  # the bytes before the end go out first; the next read checks the exit
                    self.check_exit()
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def check_exit(self) -> None:
        """At the end of the stream: StreamBroken unless the command exited cleanly."""
        try:
            status = self.proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:  # closed its stdout but lingers
            self.kill()
            raise StreamStalled(self.url, "the command closed its output but did not exit") from None
        if status not in OK_STATUS:
            raise StreamBroken(self.url, f"the command ended with status {status} before the end of the shard")

    def kill(self) -> None:
        """SIGKILL to the command's process group (its children too), then reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.kill()
            self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_shard(url: str, timeout_s: float | None = None):
    """A binary stream of the shard at `url` (see the module docstring); timeout_s None: reads wait forever."""
    if url.startswith("pipe:"):
        return TimedPipe(shell(url.removeprefix("pipe:")), url, timeout_s)
    if url.startswith(("http://", "https://")):
        connect = ["--connect-timeout", f"{timeout_s:g}"] if timeout_s else []
        return TimedPipe(["curl", "--fail", "--silent", "--location", *connect, url], url, timeout_s, quiet=True)
    if "://" not in url:
        return open(url, "rb")
    return gopen(url)
