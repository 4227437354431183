"""Settings checked once, when the config loads (issue 44): each mistake is one ConfigError line that names the key,
the problem and the fix, so `python -m train.submit` refuses it before anything is queued."""

import pytest

from models.attention import get_attention
from tests.train.common import REPO
from train import config as train_config
from train.config import ConfigError, load_config

TINY = str(REPO / "configs" / "tiny.yaml")


def refused(*overrides: str) -> str:
    """The one-line ConfigError that configs/tiny.yaml with these overrides raises."""
    with pytest.raises(ConfigError) as caught:
        load_config([TINY, *overrides])
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_image_size_the_patch_does_not_divide():
    # demo-w32's patches are 8 px (configs/models/demo-w32.json)
    message = refused("model.name=demo-w32", "model.image_size=33")
    assert message == "model.image_size=33 is not a multiple of demo-w32's patch size 8; nearest valid sizes: 32, 40"
    assert load_config([TINY, "model.name=demo-w32", "model.image_size=40"]).model.image_size == 40


def test_an_unknown_model_size_names_the_key():
    assert refused("model.name=tiny-q").startswith("model.name: unknown model size 'tiny-q'; use one of ")


def test_an_unknown_attention_impl_lists_the_known_ones_and_the_closest():
    assert refused("model.attention_impl=trition") == (
        "model.attention_impl='trition' is not known; use one of auto, reference, torch, cpu, triton; "
        "did you mean 'triton'?"
    )


def test_an_impl_that_rope_would_ignore_is_refused():
    rope = ["model.image_attention=linear_elu", "model.image_pos_embed=rope"]
    assert refused(*rope, "model.attention_impl=cpu") == (
        "model.attention_impl=cpu would be ignored: with model.image_pos_embed=rope, linear_elu runs its rotary form "
        "in PyTorch ops whatever the impl (models/attention/rope.py); set model.attention_impl=auto (or torch), "
        "or model.image_pos_embed=learnable"
    )
    assert refused(*rope, "model.image_attention_options={impl: triton}").startswith(
        "model.image_attention_options impl=triton would be ignored: "
    )
    # what runs is PyTorch ops, so auto and torch say the truth; learned positions or linear_affine honour any impl
    for fine in (["model.attention_impl=torch"], ["model.image_pos_embed=learnable", "model.attention_impl=cpu"]):
        assert load_config([TINY, *rope, *fine]).model.image_attention == "linear_elu"
    assert load_config([TINY, *rope, "model.image_attention=linear_affine", "model.attention_impl=cpu"])


@pytest.mark.parametrize("value, shown", [(".inf", "inf"), ("-.inf", "-inf"), (".nan", "nan"), ("nan", "nan")])
def test_non_finite_numbers_are_refused(value, shown):
    assert refused(f"optim.lr={value}") == f"optim.lr={shown} is not a finite number; give a finite value"


def test_non_finite_numbers_inside_lists_and_options_are_refused():
    assert refused("optim.betas=[0.9, .nan]").startswith("optim.betas=[0.9, nan] is not a finite number")
    assert refused("model.image_attention_options={eps: .inf}").startswith("model.image_attention_options=")


def test_negative_keep_steps_are_refused():
    assert refused("train.keep_steps=[100, -5]") == (
        "train.keep_steps=[100, -5] is out of range: it must be a list of steps >= 0"
    )


@pytest.mark.parametrize("section", ["eval", "data"])
def test_a_cache_larger_than_the_machine_is_refused(section, monkeypatch):
    monkeypatch.setattr(train_config, "machine_mb", lambda: 2048.0)
    workers = ["data.workers=0"] if section == "data" else []
    assert refused(f"{section}.cache_mb=1e12", *workers) == (
        f"{section}.cache_mb=1e+12 is more than this machine's memory (2048 MB); set it below 2048, or 0 for no cache"
    )
    assert getattr(load_config([TINY, f"{section}.cache_mb=2000", *workers]), section).cache_mb == 2000


def test_the_machine_memory_is_read_from_sysconf():
    assert train_config.machine_mb() > 100  # MB: any machine that runs the tests


def test_unknown_attention_and_key_name_the_closest():
    closest = "; did you mean 'linear_elu'?"
    assert refused("model.image_attention=linear_eluu").endswith(closest)
    with pytest.raises(ValueError, match=closest):
        get_attention("linear_eluu")
    assert "did you mean" not in refused("model.image_attention=nope")
    assert refused("train.max_step=3").endswith("; did you mean 'max_steps'?")


def test_submit_dry_run_refuses_in_one_line_before_queueing(tmp_path, monkeypatch):
    from train import submit

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(submit, "submit", lambda *a: pytest.fail("a job was rendered for submission"))
    with pytest.raises(SystemExit) as caught:
        submit.main([TINY, "model.attention_impl=trition", "--time", "10", "--gpus-per-node", "0", "--dry-run"])
    assert str(caught.value) == (
        "train.submit: error: model.attention_impl='trition' is not known; use one of auto, reference, torch, cpu, "
        "triton; did you mean 'triton'?"
    )
    assert not any(tmp_path.iterdir())
