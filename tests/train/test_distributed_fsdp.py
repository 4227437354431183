"""FSDP (train.dist.shard_model, torch's fully_shard) on 2 gloo CPU processes equals DDP and one process;
its sharded checkpoint saves and resumes. The workload is tests/train/fsdp_worker.py."""

import json

import pytest
from safetensors.torch import load_file

from tests.train.common import TORCHRUN, finish, max_difference, popen
from tests.train.fsdp_worker import OPTIM, STEPS, fresh_model, train_steps
from train.config import TrainConfig
from train.dist import make_accelerator
from train.optim import build_optimizer


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The worker's outputs: {run: (record, weights)} for ddp, fsdp and resumed, and the checkpoint folder."""
    out = tmp_path_factory.mktemp("fsdp")
    code, _, err = finish(popen([*TORCHRUN, "-m", "tests.train.fsdp_worker", str(out)]), timeout=300)
    assert code == 0, err[-3000:]
    runs = {
        name: (json.loads((out / f"{name}.json").read_text()), load_file(str(out / f"{name}.safetensors")))
        for name in ("ddp", "fsdp", "resumed")
    }
    return runs, out / "checkpoint"


def one_process() -> tuple[dict, dict]:
    """The same 3 steps with the whole batch in this process (no process group)."""
    accelerator = make_accelerator(TrainConfig(cpu=True))
    model = fresh_model()
    optimizer, schedule = build_optimizer(model, OPTIM, STEPS)
    return train_steps(accelerator, model, optimizer, schedule, range(STEPS)), model.state_dict()


def test_fsdp_equals_ddp_and_one_process(two_ranks):
    runs, _ = two_ranks
    one, one_weights = one_process()
    for name in ("ddp", "fsdp"):
        record, weights = runs[name]
        assert len(record["losses"]) == STEPS
        for a, b in zip(one["losses"], record["losses"]):
            assert abs(a - b) < 1e-5, name
        for a, b in zip(one["grad_norms"], record["grad_norms"]):
            assert abs(a - b) < 1e-5 * a, name
        assert max_difference(one_weights, weights) < 1e-5, name
        assert weights["logit_scale"].shape == (1,)
    assert runs["fsdp"][0]["logit_scale_local_shape"] == [1]  # a sharded [1] parameter: what fully_shard needs


def test_sharded_checkpoint_resumes_exactly(two_ranks):
    runs, checkpoint = two_ranks
    fsdp, resumed = runs["fsdp"], runs["resumed"]
    # every rank wrote its own half (torch.distributed.checkpoint), no rank a full copy
    full_bytes = sum(t.numel() * t.element_size() for t in fsdp[1].values())
    for part, copies in (("pytorch_model_fsdp_0", 1), ("optimizer_0", 2)):  # Adam: 2 moments per weight
        files = {p.name: p.stat().st_size for p in (checkpoint / part).iterdir()}
        assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"], part
        assert all(0.4 < files[f"__{rank}_0.distcp"] / (copies * full_bytes) < 0.6 for rank in (0, 1)), files
    assert resumed[0]["losses"] == fsdp[0]["losses"][-1:]
    assert max_difference(fsdp[1], resumed[1]) == 0.0
