"""Two gloo processes under torchrun against one process with the same global batch."""

import pytest

from tests.train.common import (
    TORCHRUN,
    checkpoints,
    cli,
    finish,
    max_difference,
    run,
    tiny_config,
    train_records,
    weights,
)


@pytest.mark.parametrize(
    "accum_freq, loss, exchange",
    [(1, "clip", "gather"), (2, "clip", "gather"), (1, "siglip", "gather"), (2, "siglip", "bidir")],
)
def test_two_processes_equal_one_with_the_global_batch(tmp_path, synthetic, accum_freq, loss, exchange):
    """Per-rank batch b on 2 ranks (x accum_freq micro-batches) = batch 2b*accum_freq on 1 process: losses and weights.
    SigLIP's texts reach the other rank by train.siglip_exchange (one process has no other rank to exchange with).

    data.train_num_samples = one optimizer step, so every epoch is one step and both runs see the same
    samples each step (each rank reads its own contiguous half of the epoch)."""
    step_batch = 16
    common = [
        "train.max_steps=3",
        "train.save_every=0",
        "optim.lr=1e-4",
        f"data.train_num_samples={step_batch}",
        f"train.loss={loss}",
        f"train.siglip_exchange={exchange}",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    proc = cli(
        [
            str(tiny_config(tmp_path, synthetic)),
            f"train.run_dir={two}",
            f"data.batch_size={step_batch // accum_freq}",
            f"train.accum_freq={accum_freq}",
            *common,
        ],
        launcher=TORCHRUN,
    )
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]
    assert run(tiny_config(tmp_path, synthetic), f"train.run_dir={one}", f"data.batch_size={step_batch}", *common) == 0
    ones, twos = train_records(one), train_records(two)
    assert [r["step"] for r in twos] == [1, 2, 3]  # rank 0 alone writes metrics
    assert [r["samples_seen"] for r in twos] == [r["samples_seen"] for r in ones] == [16, 32, 48]
    for a, b in zip(ones, twos):
        assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * a["grad_norm"]
    assert max_difference(weights(checkpoints(one)[-1]), weights(checkpoints(two)[-1])) < 1e-5
    assert sorted(p.name for p in checkpoints(two)[-1].iterdir()) == [
        "data_state_0.json",
        "data_state_1.json",
        "manifest.json",
        "meta.json",
        "model.safetensors",
        "state",
    ]
