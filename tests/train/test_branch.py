"""Cooldown branches (train/branch.py): a new run from another run's checkpoint, the same training up to its
cooldown, then the cooldown; kept branch points; refused branches."""

import shutil

import pytest
import torch

from tests.train.common import checkpoints, run, tiny_config, train_records, weights
from train.config import ConfigError, load_config

DETERMINISTIC = {"deterministic": True, "save_every": 1, "keep_last": 1}


@pytest.fixture(scope="module")
def parent(tmp_path_factory, synthetic):
    """A constant-LR run of 6 steps whose checkpoints 3, 4, 5 are kept (keep_steps) although keep_last is 1."""
    tmp = tmp_path_factory.mktemp("parent")
    # module fixtures run before the per-test one-thread setting (tests/conftest.py); the branch runs with one
    # thread, and a different thread count sums matmuls in another order
    torch.set_num_threads(1)
    path = tiny_config(
        tmp, synthetic, optim={"schedule": "constant"}, train={**DETERMINISTIC, "max_steps": 6, "keep_steps": [3, 4, 5]}
    )
    assert run(path) == 0
    yield tmp / "run"
    shutil.rmtree(tmp, ignore_errors=True)  # 200 MB of checkpoints


def branch_config(tmp_path, synthetic, parent, **optim):
    optim = {"schedule": "const-cooldown", "cooldown_steps": 2, **optim}
    return tiny_config(
        tmp_path,
        synthetic,
        optim=optim,
        train={
            **DETERMINISTIC,
            "keep_last": 3,
            "max_steps": 6,
            "branch_from": str(parent / "checkpoints" / "step_00000003"),
        },
    )


def test_keep_steps_survive_pruning(parent):
    assert [p.name for p in checkpoints(parent)] == [f"step_{s:08d}" for s in (3, 4, 5, 6)]


def test_branch_continues_the_parent_then_cools_down(tmp_path, synthetic, parent, capsys):
    """Branch at step 3 of the constant run, to step 6 with a 2-step cooldown (lr 1, 1, then 0.5 x optim.lr):
    steps 4 and 5 are bit for bit the parent's, step 6 is not."""
    path = branch_config(tmp_path, synthetic, parent)
    assert run(path) == 0
    assert f"branched from {parent / 'checkpoints' / 'step_00000003'} at step 3 (48 samples seen)" in (
        capsys.readouterr().err
    )
    ours, theirs = train_records(tmp_path / "run"), train_records(parent)
    assert [r["step"] for r in ours] == [4, 5, 6] and [r["samples_seen"] for r in ours] == [64, 80, 96]
    assert [r["lr"] for r in ours] == pytest.approx([1e-3, 1e-3, 0.5e-3])
    assert [r["loss"] for r in ours[:2]] == [r["loss"] for r in theirs[3:5]]
    saved = {p.name: weights(p) for p in checkpoints(tmp_path / "run")}
    parent_saved = {p.name: weights(p) for p in checkpoints(parent)}
    for name in ("step_00000004", "step_00000005"):
        assert all(torch.equal(saved[name][k], parent_saved[name][k]) for k in saved[name]), name
    last, parent_last = saved["step_00000006"], parent_saved["step_00000006"]
    assert not all(torch.equal(last[k], parent_last[k]) for k in last)
    assert load_config([str(tmp_path / "run" / "config.yaml")]).train.branch_from.endswith("step_00000003")
    # a rerun (a requeued job) resumes the branch's own progress, not the parent's checkpoint
    assert run(path) == 0
    assert "nothing to do: the run is at step 6" in capsys.readouterr().err


def test_a_branch_from_an_earlier_checkpoint_or_from_step_0_equals_one_from_its_cooldown_start(
    tmp_path, synthetic, parent
):
    """A budget added after the parent run finished (train/study.branch_point): its cooldown starts at a step the
    parent did not keep, so it branches from an earlier checkpoint, or trains from step 0 where none is earlier;
    both train the parent's constant-rate steps again bit for bit, so the budget's end is the same model."""

    def budget(name: str, max_steps: int, start_from: int | None) -> dict:
        (tmp_path / name).mkdir()
        path = branch_config(tmp_path / name, synthetic, parent, cooldown_steps=1)
        extra = [f"train.max_steps={max_steps}"]
        if start_from is None:
            extra.append("train.branch_from=null")
        else:
            extra.append(f"train.branch_from={parent / 'checkpoints' / f'step_{start_from:08d}'}")
        assert run(path, *extra) == 0
        return weights(checkpoints(tmp_path / name / "run")[-1])

    late, early = budget("at5", 6, 5), budget("at3", 6, 3)  # cooldown from step 5: at 5, or from 3 then 2 steps
    assert late.keys() == early.keys() and all(torch.equal(late[k], early[k]) for k in late)
    exact, scratch = budget("at3-4", 4, 3), budget("at0-4", 4, None)  # cooldown from step 3: at 3, or from 0
    assert all(torch.equal(exact[k], scratch[k]) for k in exact)
    assert not all(torch.equal(exact[k], late[k]) for k in exact)  # another budget, another model


@pytest.mark.parametrize(
    "change,message",
    [
        ({"optim": {"lr": 2e-3}}, r"the parent run has optim.lr=0.001; a branch keeps the parent's model"),
        ({"optim": {"cooldown_steps": 4}}, r"learning rate is 1 x optim.lr in the parent run .* but 0.75 x in this"),
        (
            {"train": {"max_steps": 3}, "optim": {"cooldown_steps": 1}},
            r"train.branch_from is at step 3, not before train.max_steps=3",
        ),
        ({"train": {"branch_from": "nowhere"}}, r"train.branch_from=nowhere is not a loadable checkpoint"),
        ({"train": {"branch_from": "PARENT"}}, r"is a run directory; name one of its checkpoints"),
        ({"train": {"resume": "PARENT/checkpoints/step_00000004"}}, r"both name a checkpoint to start from; keep one"),
        ({"model": {"image_attention": "linear_elu"}}, r"the parent run has model.image_attention='softmax'"),
    ],
)
def test_a_branch_that_cannot_continue_the_parent_is_refused(tmp_path, synthetic, parent, change, message):
    branch_config(tmp_path, synthetic, parent)
    overrides = [
        f"{section}.{key}={str(value).replace('PARENT', str(parent))}"
        for section, values in change.items()
        for key, value in values.items()
    ]
    with pytest.raises(ConfigError, match=message):
        run(tmp_path / "config.yaml", *overrides)
    assert not (tmp_path / "run").exists()


def test_cooldown_shape_is_one_of_linear_cosine(tmp_path, synthetic):
    with pytest.raises(ConfigError, match=r"optim\.cooldown_shape must be one of linear, cosine, got 'square'"):
        load_config([str(tiny_config(tmp_path, synthetic)), "optim.cooldown_shape=square"])
