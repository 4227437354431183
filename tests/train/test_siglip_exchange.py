"""train.siglip_exchange on gloo meshes of 4 and 2 processes (tests/train/siglip_worker.py) against one process
with the global batch.

Convention: rank r's loss is its own rows' sum over b, and DDP averages the gradients over the W ranks, so the
mean of the ranks' losses, a rank's feature gradients over W and the mean of the ranks' scale and bias gradients
are the single-process loss and gradients of the global batch. shift and bidir must also match gather, rank by
rank, and save only their four inputs for the backward at any W, while gather saves more with more ranks. A DDP run
with bidir against one process: tests/train/test_distributed.py."""

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.train.siglip_worker import INPUTS, MODES, B, D, global_batch, measure, rank_worker
from train.config import ConfigError, load_config
from train.loss import SigLipLoss

WORLDS = (2, 4)
TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")


@pytest.fixture(scope="module")
def meshes(tmp_path_factory) -> dict[int, list[dict]]:
    """world size -> each rank's results, from one spawn of 4 ranks (the first 2 of them run a world of 2 too)."""
    folder = tmp_path_factory.mktemp("meshes")
    mp.spawn(rank_worker, args=(max(WORLDS), str(folder)), nprocs=max(WORLDS))
    return {world: [torch.load(folder / f"{world}-{rank}.pt") for rank in range(world)] for world in WORLDS}


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("mode", MODES)
def test_each_exchange_equals_one_process_with_the_global_batch(meshes, mode, world):
    ranks = [results[mode] for results in meshes[world]]
    one = measure(SigLipLoss(), *global_batch(world))  # no process group: the plain loss over world * B rows
    close(torch.stack([r["loss"] for r in ranks]).mean(), one["loss"])
    for rank, r in enumerate(ranks):
        rows = slice(rank * B, (rank + 1) * B)
        close(r["images"] / world, one["images"][rows])
        close(r["texts"] / world, one["texts"][rows])
        for key in ("loss", *INPUTS):  # rank by rank what all_gather gives
            close(r[key], meshes[world][rank]["gather"][key])
    for key in ("scale", "bias"):
        close(torch.stack([r[key] for r in ranks]).mean(0), one[key])


def test_the_ring_saves_only_its_inputs_at_any_world_size(meshes):
    saved = {mode: [meshes[world][0][mode]["saved"] for world in WORLDS] for mode in MODES}
    inputs = (2 * B * D + 2) * 4  # fp32 image and text features [B, D], scale and bias [1]
    assert saved["shift"] == saved["bidir"] == [inputs, inputs]
    assert saved["gather"][0] > inputs and saved["gather"][1] > saved["gather"][0], saved["gather"]


def test_an_unknown_exchange_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as caught:
        load_config([TINY, "train.loss=siglip", "train.siglip_exchange=ring"])
    assert str(caught.value) == "train.siglip_exchange must be one of gather, shift, bidir, got 'ring'"
    with pytest.raises(ConfigError, match=r"^train.siglip_exchange=bidir would be ignored: train.loss=clip "):
        load_config([TINY, "train.siglip_exchange=bidir"])
    assert load_config([TINY, "train.loss=siglip", "train.siglip_exchange=bidir"]).train.siglip_exchange == "bidir"
