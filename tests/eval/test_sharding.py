"""Evaluation split over 2 gloo processes (torchrun) gives exactly the numbers of one process: the suite on every
layout, and the zero-shot evaluation during training; an evaluation leaves the training random state alone."""

import json
import random

import numpy as np
import pytest
import torch
import yaml

import models
from data import make_synthetic
from eval import retrieval, suite, zeroshot
from eval.sharding import Shard, random_state_kept
from tests.eval import evalsets
from tests.train.common import (
    TORCHRUN,
    checkpoints,
    cli,
    finish,
    metrics,
    reset_accelerate,
    run,
    tiny_config,
    train_records,
    weights,
)
from train import main as train_main

# timings and the world size differ between the runs; everything else must be equal
VARYING = {"seconds", "images_per_s", "world_size", "skipped_examples"}


def torchrun(module: str, args: list[str]) -> tuple[int, str, str]:
    """`torchrun --nproc_per_node 2 -m MODULE ARGS` on the CPU; returns (exit code, stdout, stderr)."""
    return finish(cli(args, launcher=TORCHRUN, module=module, env={"CUDA_VISIBLE_DEVICES": ""}))


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    """A suite of every layout: ImageFolder (5 images a class, one unreadable), its webdataset in 4 shards (a block
    of shards per rank) and in 1 shard (every other sample per rank), caption pairs as TSV and webdataset."""
    root = tmp_path_factory.mktemp("sets")
    folder = evalsets.synthetic_eval(root / "synthetic", per_class=5)
    (folder / "red_square" / "unreadable.png").write_bytes(b"not an image")
    pairs = evalsets.caption_pairs(root / "pairs", count=11)
    spec = {
        "synthetic": str(folder),
        "synthetic-wds4": str(evalsets.to_webdataset(folder, root / "wds4", per_shard=31)),
        "synthetic-wds1": str(evalsets.to_webdataset(folder, root / "wds1", per_shard=1000)),
        "pairs": str(pairs / "pairs.tsv"),
        "pairs-wds": {"path": str(pairs / "wds"), "task": "retrieval"},
    }
    (root / "suite.yaml").write_text(yaml.safe_dump({"datasets": spec}))
    return root / "suite.yaml", evalsets.tiny_checkpoint(root / "tiny-s.safetensors")


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_shards_partition_every_set(world_size):
    for n in (0, 1, 5, 121):
        ranges = [Shard(r, world_size).index_range(n) for r in range(world_size)]
        assert [i for r in ranges for i in r] == list(range(n))
        assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
    urls = [f"{i}.tar" for i in range(5)]
    blocks = [Shard(r, world_size).split_urls(urls) for r in range(world_size)]
    if world_size <= 5:
        assert [u for b, split in blocks for u in b] == urls and not any(split for _, split in blocks)
    else:
        assert all(b == urls and split for b, split in blocks)
        kept = [list(Shard(r, world_size).every_nth(range(20))) for r in range(world_size)]
        assert sorted(i for k in kept for i in k) == list(range(20))


def test_suite_on_two_ranks_equals_one_process(suite_file, tmp_path):
    spec, weights_file = suite_file
    args = ["--open-clip-model", "tiny-s", "--checkpoint", str(weights_file), "--suite", str(spec)]
    args += ["--workers", "0", "--batch-size", "8", "--device", "cpu"]
    code, out, err = torchrun("eval.suite", [*args, "--out", str(tmp_path / "two")])
    assert code == 0, err[-3000:]
    assert out.strip().endswith(f"results: {tmp_path / 'two' / 'results.csv'}")
    one = {r["dataset"]: r for r in suite.main([*args, "--out", str(tmp_path / "one")])}
    for name, expected in one.items():
        got = json.loads((tmp_path / "two" / f"{name}.json").read_text())
        assert got["world_size"] == 2 and expected["world_size"] == 1
        assert {k: v for k, v in got.items() if k not in VARYING} == {
            k: v for k, v in expected.items() if k not in VARYING
        }, name
        assert sorted(got["skipped_examples"]) == sorted(expected["skipped_examples"])
    assert one["synthetic"]["num_images"] == 24 * 5 and one["synthetic"]["skipped"] == 1
    assert one["pairs-wds"]["num_images"] == 10 and one["pairs-wds"]["num_captions"] == 20


def test_fsdp_sharded_model_is_gathered_and_evaluated_on_two_ranks(suite_file, tmp_path):
    """Blocks sharded with torch's fully_shard on a 2-process gloo mesh: every rank gathers the full weights and
    scores half of the images; the result equals one process evaluating the unsharded model."""
    folder = suite_file[0].parent / "synthetic" / "eval"
    code, _, err = torchrun("tests.eval.fsdp_worker", [str(folder), str(tmp_path / "r.json"), "7"])
    assert code == 0, err[-3000:]
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["sharded_parameters"] > 0 and got["weights_equal"]
    torch.manual_seed(7)
    cfg = models.ModelConfig(name="tiny-s")
    expected = zeroshot.evaluate(
        models.build_clip(cfg),
        dataset=str(folder),
        tokenizer=models.tokenizer(cfg),
        transform=models.transforms(cfg)[1],
    )
    for key in ("top1", "top5", "mean_per_class_recall", "num_images", "skipped"):
        assert got[key] == expected[key], key


@pytest.fixture
def training_data(tmp_path):
    spec = make_synthetic(tmp_path / "synthetic", train_samples=256, eval_per_class=3, shard_size=64)
    yield {"train": spec, "eval": str(tmp_path / "synthetic" / "eval")}
    reset_accelerate()


def test_evaluation_during_training_on_two_ranks_equals_one_process(training_data, tmp_path):
    """2 ranks each score half of the images at the end of training; the logged numbers equal one process
    evaluating the final checkpoint."""
    config = tiny_config(tmp_path, training_data, train={"max_steps": 2, "save_every": 2}, eval={"dataset": None})
    val = str(tmp_path / "synthetic" / "val")  # the validation shards (images with txt captions) as a caption set
    extra = [f"eval.dataset={training_data['eval']}", "eval.fewshot=[1,2]", f"eval.retrieval={val}"]
    code, _, err = torchrun("train", [str(config), *extra])
    assert code == 0, err[-3000:]
    logged = next(r for r in metrics(tmp_path / "run") if "zeroshot/top1" in r)
    argv = [str(tmp_path / "run"), "--dataset", training_data["eval"], "--workers", "0", "--fewshot", "1,2"]
    result = zeroshot.main(argv)
    assert result["step"] == logged["step"] == 2
    for key in ("top1", "top5", "mean_per_class_recall", "num_images", "skipped"):
        assert logged[f"zeroshot/{key}"] == result[key], key
    # the few-shot probes see every rank's features, in the order of one process
    assert [logged[f"fewshot/{k}shot"] for k in (1, 2)] == [result["fewshot"][k] for k in (1, 2)]
    assert result["num_images"] == 24 * 3
    # retrieval at the same step, each rank embedding half of the pairs: the numbers of one process (eval.retrieval)
    recall = retrieval.main([str(tmp_path / "run"), "--dataset", val, "--workers", "0"])
    keys = [k for k in recall if "_R@" in k]
    assert len(keys) == 6 and all(logged[f"retrieval/{k}"] == recall[k] for k in keys)
    assert recall["num_images"] == 512 and 0 < recall["text_to_image_R@10"] < 1


def test_evaluation_leaves_the_training_random_state(training_data, tmp_path, monkeypatch):
    """Random crops on (train.augment), and after every step an evaluation that draws from torch, numpy and Python's
    generators: the same losses and weights as no evaluation at all."""
    real = train_main.evaluate

    def drawing_evaluate(*args, **kwargs):
        draw()
        return real(*args, **kwargs)

    monkeypatch.setattr(train_main, "evaluate", drawing_evaluate)
    losses, final = {}, {}
    for every in (0, 1):
        folder = tmp_path / f"every{every}"
        folder.mkdir()
        evaluation = {"dataset": training_data["eval"] if every else None, "every": every}
        data = {"shuffle_buffer": 8}
        config = tiny_config(folder, training_data, data=data, train={"max_steps": 3, "augment": True}, eval=evaluation)
        assert run(config) == 0
        losses[every] = [r["loss"] for r in train_records(folder / "run")]
        final[every] = weights(checkpoints(folder / "run")[-1])
    assert sum("zeroshot/top1" in r for r in metrics(tmp_path / "every1" / "run")) == 3
    assert losses[0] == losses[1]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the global generators are what must be kept


def draw() -> tuple:
    return torch.rand(3).tolist(), random.random(), np.random.random()  # noqa: NPY002


def test_random_state_kept_restores_every_generator():
    seed_all(1)
    expected = draw()
    seed_all(1)
    with random_state_kept():
        draw()
    assert draw() == expected
