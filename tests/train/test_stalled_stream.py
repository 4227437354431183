"""A shard stream that stalls during training (data.shard_timeout_s): SIGUSR1 during the stall still ends in a
checkpoint and exit 75, with 0 and 2 DataLoader workers, and the stalled command does not outlive the run."""

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.train.common import checkpoints, cli, finish, tiny_config
from train.checkpoint import problem

pytestmark = pytest.mark.trains


@pytest.mark.parametrize("workers", [0, 2])
def test_sigusr1_during_a_stalled_shard_ends_in_a_checkpoint_and_exit_75(tmp_path, synthetic, workers):
    folder = Path(synthetic["train"]).parent
    stalled = tmp_path / "stalled"
    sleep = f"sleep 1019.{workers}"  # what the stalled shard's command runs: no process may keep running it
    # shard 0 sends 20,000 bytes, then nothing: data.shard_timeout_s ends each of its reads
    shards = f"pipe:head -c 20000 {folder}/00000.tar; touch {stalled}; {sleep}::{folder}/{{00001..00023}}.tar"
    data = {"train_shards": shards, "train_num_samples": 23 * 64, "workers": workers, "shard_timeout_s": 2}
    data["shard_retries"] = 1  # the retry's warning says at once that the read timed out
    proc = cli([str(tiny_config(tmp_path, synthetic, data=data, train={"max_steps": 1000}))])
    deadline = time.monotonic() + 120
    while not stalled.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the stalled shard was never read"
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    code, _, err = finish(proc, timeout=120)
    assert code == 75, err[-3000:]
    assert "received: checkpoint at step" in err
    assert problem(checkpoints(tmp_path / "run")[-1]) is None
    if workers == 0:  # the main process reads the stalled shard itself: it went on only once the read timed out
        assert "no data for data.shard_timeout_s=2 s" in err
    left = subprocess.run(["pgrep", "-f", sleep], capture_output=True, text=True, timeout=10).stdout.split()
    assert left == []
