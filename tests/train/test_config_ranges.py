"""Every number of the config in its allowed range, refused in one line that gives the range."""

import pytest

from train.config import RANGES, ConfigError, build_config, load_config


@pytest.mark.parametrize(
    "section, key, value, allowed",
    [
        ("optim", "lr", -0.001, "> 0"),
        ("optim", "lr", 0.0, "> 0"),
        ("optim", "betas", [0.9, 1.0], "two numbers in [0, 1)"),
        ("optim", "betas", [-0.1, 0.98], "two numbers in [0, 1)"),
        ("optim", "betas", [0.9], "two numbers in [0, 1)"),
        ("optim", "eps", 0.0, "> 0"),
        ("optim", "weight_decay", -0.1, ">= 0"),
        ("optim", "warmup_steps", -1, ">= 0"),
        ("optim", "min_lr_ratio", 1.5, "in [0, 1]"),
        ("optim", "grad_clip_norm", 0.0, "> 0"),
        ("data", "batch_size", 0, "> 0"),
        ("data", "workers", -1, ">= 0"),
        ("data", "shuffle_buffer", 0, ">= 1"),
        ("data", "train_num_samples", 0, ">= 1"),
        ("data", "seed", -3, "in [0, 2**32)"),
        ("data", "max_skip_fraction", 1.5, "in [0, 1]"),
        ("data", "max_skip_fraction", -0.1, "in [0, 1]"),
        ("model", "patch_dropout", 1.0, "in [0, 1)"),
        ("train", "max_steps", 0, ">= 1"),
        ("train", "accum_freq", 0, ">= 1"),
        ("train", "keep_last", 0, ">= 1"),
        ("train", "max_bad_steps", 0, ">= 1"),
        ("train", "save_every", -1, ">= 0"),
        ("train", "seed", 2**32, "in [0, 2**32)"),
        ("train", "dist_timeout_s", 0.0, "> 0"),
        ("train", "max_restarts", -1, ">= 0"),
        ("train", "storage_retry_s", -1.0, "in [0, 1800]: the other ranks wait for the upload"),
        ("train", "storage_retry_s", 3600.0, "in [0, 1800]: the other ranks wait for the upload"),
        ("train", "max_failed_saves", 0, ">= 1"),
        ("optim", "image_layer_decay", 1.5, "in (0, 1]"),
        ("optim", "text_lr", 0.0, "> 0"),
        ("data", "shard_timeout_s", 0.0, "> 0"),
        ("data", "shard_retries", -1, ">= 0"),
        ("train", "max_failed_uploads", 0, ">= 1"),
        ("eval", "every", -2, ">= 0"),
        ("eval", "batch_size", 0, "> 0"),
        ("eval", "workers", -1, ">= 0"),
        ("distill", "transfer_lr", 0.0, "> 0"),
        ("distill", "transfer_warmup_steps", -1, ">= 0"),
    ],
)
def test_out_of_range_values_name_the_allowed_range(section, key, value, allowed):
    raw = {section: {key: value}, "optim": {"warmup_steps": 0, **({key: value} if section == "optim" else {})}}
    with pytest.raises(ConfigError) as caught:
        build_config(raw)
    assert str(caught.value) == f"{section}.{key}={value!r} is out of range: it must be {allowed}"


def test_every_range_accepts_the_defaults_and_the_boundaries():
    cfg = build_config(
        {
            "optim": {"betas": [0.0, 0.999], "weight_decay": 0, "warmup_steps": 5, "min_lr_ratio": 1, "eps": 1e-12},
            "train": {"max_steps": 5, "save_every": 0, "seed": 2**32 - 1},
            "data": {"workers": 0},
            "eval": {"every": 0},
        }
    )
    assert cfg.optim.warmup_steps == cfg.train.max_steps == 5
    assert all(section.split(".")[0] in ("optim", "data", "model", "train", "eval", "distill") for section, _ in RANGES)


@pytest.mark.parametrize(
    "key, value, allowed",
    [("decay", 1.0, "in [0, 1)"), ("decay", -0.1, "in [0, 1)"), ("warmup_power", 0.0, "> 0"), ("every", 0, ">= 1")],
)
def test_out_of_range_ema_settings_name_the_allowed_range(key, value, allowed):
    with pytest.raises(ConfigError) as caught:
        build_config({"train": {"ema": {"decay": 0.999, key: value}}})
    assert str(caught.value) == f"train.ema.{key}={value!r} is out of range: it must be {allowed}"


def test_ema_settings_in_range_and_off_by_default():
    assert build_config({}).train.ema.decay == 0
    ema = build_config({"train": {"ema": {"decay": 0, "warmup": True, "warmup_power": 0.75, "every": 1}}}).train.ema
    assert (ema.decay, ema.warmup, ema.warmup_power, ema.every, ema.device) == (0.0, True, 0.75, 1, "model")


def test_ema_keys_and_the_cpu_ema_of_a_sharded_model_are_refused_in_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  ema:\n    decay: 0.999\n")
    assert load_config([str(path), "train.ema.every=4"]).train.ema.every == 4
    with pytest.raises(ConfigError, match=r"^unknown config key train.ema.decy; .*did you mean 'decay'\?$"):
        load_config([str(path), "train.ema.decy=0.9"])
    with pytest.raises(ConfigError, match=r"^config section 'train.ema' must be a mapping"):
        load_config([str(path), "train.ema=0.9"])
    with pytest.raises(ConfigError) as caught:
        load_config([str(path), "train.distributed=fsdp", "train.ema.device=cpu"])
    assert str(caught.value) == (
        "train.ema.device=cpu cannot hold the EMA of a model sharded with train.distributed=fsdp (it is sharded like "
        "the model, on its devices); set train.ema.device=model"
    )


def test_a_warmup_longer_than_the_run_is_one_warning_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  warmup_steps: 20\ntrain:\n  max_steps: 10\n")
    assert load_config([str(path)]).optim.warmup_steps == 20
    assert capsys.readouterr().err == (
        "warning: optim.warmup_steps=20 is more than train.max_steps=10: the learning rate never reaches optim.lr; "
        "make it <= train.max_steps for the full schedule\n"
    )
    load_config([str(path), "train.max_steps=20"])
    assert capsys.readouterr().err == ""


def test_a_config_file_that_is_not_yaml_is_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  max_steps: [1, 2\n")
    with pytest.raises(ConfigError) as caught:
        load_config([str(path)])
    assert str(caught.value).startswith(f"{path} is not valid YAML at line 3, column 1: ")
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match=r"is not a text file \(not UTF-8\); give a YAML config file"):
        load_config([str(path)])
