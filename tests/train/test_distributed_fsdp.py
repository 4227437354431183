"""`python -m train` with train.distributed=fsdp on 2 gloo CPU processes: the losses and weights of one process
with the same global batch, a sharded checkpoint, and an exact resume from it; the same of the EMA of the weights
(train.ema, sharded like the model).

accelerate treats FSDP as GPU-only; the runs start `python -m scripts.fsdp_on_cpu` instead of `python -m train`, a
hook owned by the tests (production code never installs it) that lets the same code path (train.dist.shard_model,
accelerate's FSDP2 prepare, sharded save_state/load_state, no_sync) run on the CPU.
"""

import shutil

import pytest
from safetensors.torch import load_file

from models import run_folder
from tests.train.common import (
    TORCHRUN,
    checkpoints,
    cli,
    finish,
    max_difference,
    metrics,
    run,
    tiny_config,
    train_records,
)
from tests.train.common import weights as read_weights

# one optimizer step = one epoch of 16 samples, so every run sees the same samples at every step
COMMON = ["train.max_steps=3", "optim.lr=1e-4", "data.train_num_samples=16", "optim.grad_clip_norm=1.0"]
COMMON += ["train.ema.decay=0.5"]  # updates at steps 1 (a copy), 2 and 3


def fsdp(config, *overrides: str) -> None:
    """2 processes, micro-batches of 8 (4 per rank) x accum_freq 2 = 16 samples per step."""
    args = [str(config), *COMMON, "train.distributed=fsdp", "data.batch_size=8", "train.accum_freq=2", *overrides]
    code, _, err = finish(cli(args, launcher=TORCHRUN, module="scripts.fsdp_on_cpu"), timeout=400)
    assert code == 0, err[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synthetic):
    """{"fsdp": 3 steps, checkpoints at 2 and 3; "resumed": from its step 2 to 3; "one": one process} run dirs.
    "fsdp" and "one" evaluate at the end: zero-shot and the validation loss (batches of 32, 2 per rank)."""
    tmp = tmp_path_factory.mktemp("fsdp")
    config = tiny_config(tmp, synthetic)
    dirs = {name: tmp / name for name in ("fsdp", "resumed", "one")}
    evals = [f"eval.dataset={synthetic['eval']}", f"eval.val_shards={synthetic['val']}", "eval.batch_size=32"]
    fsdp(config, f"train.run_dir={dirs['fsdp']}", "train.save_every=2", "train.keep_last=2", *evals)
    fsdp(config, f"train.run_dir={dirs['resumed']}", f"train.resume={checkpoints(dirs['fsdp'])[0]}")
    assert run(config, f"train.run_dir={dirs['one']}", "data.batch_size=16", *COMMON, *evals) == 0
    yield dirs
    shutil.rmtree(tmp, ignore_errors=True)  # 200 MB of checkpoints


def test_fsdp_equals_one_process(runs):
    one, two = train_records(runs["one"]), train_records(runs["fsdp"])
    assert [r["samples_seen"] for r in two] == [r["samples_seen"] for r in one] == [16, 32, 48]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * a["grad_norm"]
    final = read_weights(checkpoints(runs["fsdp"])[-1])  # the full state dict, gathered from the shards
    assert max_difference(read_weights(checkpoints(runs["one"])[-1]), final) < 1e-5
    assert final["logit_scale"].shape == (1,)  # what fully_shard can shard
    # the evaluations of the sharded model (each rank a slice, results summed) equal one process's
    ends = [[r for r in metrics(runs[name]) if "val_loss" in r][-1] for name in ("one", "fsdp")]
    assert ends[0]["step"] == ends[1]["step"] == 3
    assert abs(ends[0]["val_loss"] - ends[1]["val_loss"]) < 1e-5
    assert ends[0]["zeroshot/top1"] == ends[1]["zeroshot/top1"]


def test_checkpoint_is_sharded_and_resumes_exactly(runs):
    state = checkpoints(runs["fsdp"])[0] / "state"
    full_bytes = sum(t.numel() * t.element_size() for t in read_weights(state.parent).values())
    for part, copies in (("pytorch_model_fsdp_0", 1), ("optimizer_0", 2)):  # AdamW: 2 moments per weight
        files = {p.name: p.stat().st_size for p in (state / part).iterdir()}
        assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"], part
        # each rank wrote its own half, none a full copy
        assert all(0.4 < files[f"__{rank}_0.distcp"] / (copies * full_bytes) < 0.6 for rank in (0, 1)), files
    resumed, straight = train_records(runs["resumed"]), train_records(runs["fsdp"])
    assert [r["step"] for r in resumed] == [3] and resumed[0]["loss"] == straight[-1]["loss"]
    assert (
        max_difference(read_weights(checkpoints(runs["fsdp"])[-1]), read_weights(checkpoints(runs["resumed"])[-1])) == 0
    )


def test_the_sharded_ema_equals_one_process_and_resumes_exactly(runs):
    last = {name: checkpoints(runs[name])[-1] / run_folder.EMA for name in runs}
    ema = {name: load_file(str(path)) for name, path in last.items()}
    assert ema["fsdp"].keys() == read_weights(checkpoints(runs["fsdp"])[-1]).keys()
    assert max_difference(ema["one"], ema["fsdp"]) < 1e-5
    assert max_difference(ema["fsdp"], ema["resumed"]) == 0
    assert max_difference(ema["fsdp"], read_weights(checkpoints(runs["fsdp"])[-1])) > 1e-6  # not the weights
    ends = [[r for r in metrics(runs[name]) if "ema/val_loss" in r][-1] for name in ("one", "fsdp")]
    assert abs(ends[0]["ema/val_loss"] - ends[1]["ema/val_loss"]) < 1e-5
    assert ends[0]["ema/zeroshot/top1"] == ends[1]["ema/zeroshot/top1"]
