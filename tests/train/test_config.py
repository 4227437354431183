"""Config file + overrides -> typed Config; every mistake is one clear line before any work."""

import pytest

from tests.train.common import cli, finish, run, tiny_config
from train.config import Config, ConfigError, OptimConfig, apply_override, build_config, load_config
from train.main import preflight


def test_overrides_are_parsed_as_yaml_and_typed(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic)
    cfg = load_config(
        [
            str(path),
            "train.max_steps=3",
            "optim.lr=1e-4",
            "train.deterministic=true",
            "model.image_attention=[softmax, linear_elu]",
            "optim.grad_clip_norm=1",
            "train.wandb_name=null",
        ]
    )
    assert isinstance(cfg, Config)
    assert cfg.train.max_steps == 3 and cfg.train.deterministic is True and cfg.train.wandb_name is None
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.grad_clip_norm == 1.0 and isinstance(cfg.optim.grad_clip_norm, float)
    assert cfg.model.image_attention == ["softmax", "linear_elu"]
    assert cfg.data.train_shards == synthetic["train"]
    assert cfg.optim.betas == [0.9, 0.98] and cfg.optim.eps == 1e-6 and cfg.optim.weight_decay == 0.2


def test_nested_dict_override():
    raw = {}
    apply_override(raw, "model.image_attention_options.max_length=64")
    assert build_config(raw).model.image_attention_options == {"max_length": 64}


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"train": {"max_step": 3}}, "unknown config key train.max_step; valid keys of 'train': run_dir, max_steps"),
        ({"optim": {"lr": "fast"}}, "optim.lr must be float, got str 'fast'"),
        ({"train": {"max_steps": 2.5}}, "train.max_steps must be int, got float 2.5"),
        ({"train": {"deterministic": "yes"}}, "train.deterministic must be bool"),
        ({"train": {"precision": "fp8"}}, "train.precision must be one of fp32, bf16, fp16"),
        ({"modell": {}}, "unknown config section 'modell'; valid sections: model, data, optim, train, eval"),
        ({"model": {"image_attention": 3}}, "model.image_attention must be str | list[str]"),
    ],
)
def test_bad_values_are_one_line_errors(raw, message):
    with pytest.raises(ConfigError) as e:
        build_config(raw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_override_syntax_and_missing_file(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic)
    with pytest.raises(ConfigError, match=r"must look like section.key=value"):
        load_config([str(path), "max_steps=3"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([str(tmp_path / "nope.yaml")])


def test_preflight_errors(tmp_path, synthetic):
    cfg = load_config([str(tiny_config(tmp_path, synthetic)), "data.batch_size=9"])
    with pytest.raises(ConfigError, match=r"data.batch_size=9 is not a positive multiple of world_size=2"):
        preflight(cfg, world_size=2)
    cfg = load_config([str(tiny_config(tmp_path, synthetic)), "eval.dataset=/no/such/eval"])
    with pytest.raises(ConfigError, match=r"eval.dataset=/no/such/eval does not exist"):
        preflight(cfg, world_size=1)


def test_missing_shards_fail_before_training(tmp_path, synthetic):
    path = tiny_config(tmp_path, synthetic)
    with pytest.raises(ConfigError, match="shard files do not exist"):
        run(path, "data.train_shards=/no/such/{00000..00003}.tar")
    assert not (tmp_path / "run").exists()


def test_online_wandb_without_key_fails_at_once(tmp_path, synthetic, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"train.wandb=online needs WANDB_API_KEY"):
        run(tiny_config(tmp_path, synthetic), "train.wandb=online")


def test_cli_prints_one_line_and_exits_1(tmp_path, synthetic):
    code, _, err = finish(cli([str(tiny_config(tmp_path, synthetic)), "train.bogus=1"]), timeout=120)
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("error: unknown config key train.bogus; valid keys of 'train':")
    assert "Traceback" not in err


def test_defaults_are_open_clips_laion_recipe():
    optim = OptimConfig()
    assert (optim.lr, optim.betas, optim.eps, optim.weight_decay) == (5e-4, [0.9, 0.98], 1e-6, 0.2)


def test_unknown_attention_is_a_config_error(tmp_path, synthetic):
    unknown = r"model.image_attention: unknown attention 'nope'; known attentions: .*softmax"
    with pytest.raises(ConfigError, match=unknown):
        run(tiny_config(tmp_path, synthetic), "model.image_attention=nope")
    # refused when the config loads, so a Slurm job or sweep with a typo is refused at submission
    with pytest.raises(ConfigError, match=r"model.text_attention: attention 'efficient' cannot be causal"):
        load_config(["configs/tiny.yaml", "model.text_attention=efficient"])
    with pytest.raises(ConfigError, match=r"model.image_pos_embed='alibi' is not known; use one of learnable, rope"):
        load_config(["configs/tiny.yaml", "model.image_pos_embed=alibi"])
