"""Config errors come before the heavy imports (issue 49): `python -m train` checks keys, types and ranges before
torch is imported, attention and impl names with torch and the registry alone, and imports open_clip, torchvision,
timm and accelerate only for a config that passed. Checked by the modules loaded, not by timing."""

import subprocess
import sys

import pytest

HEAVY = ("open_clip", "torchvision", "timm", "accelerate", "webdataset")
PROBE = """
import runpy, sys
sys.argv = ["train", *sys.argv[1:]]
try:
    runpy.run_module("train", run_name="__main__")
except SystemExit as e:
    code = e.code
print("loaded:", sorted(m for m in ("torch",) + {heavy} if m in sys.modules), "exit:", code)
"""


def loaded_modules(*argv: str) -> tuple[str, str]:
    probe = PROBE.replace("{heavy}", repr(HEAVY))
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    return done.stdout.strip().splitlines()[-1], done.stderr


@pytest.mark.parametrize(
    "override,message,loaded",
    [
        ("optim.lr=.inf", "error: optim.lr=inf is not a finite number", "[]"),
        ("train.keep_steps=[-5]", "error: train.keep_steps", "[]"),
        ("model.image_size=33", "error: model.image_size=33 is not a multiple of", "[]"),
        ("model.image_attention=sofmax", "did you mean 'softmax'?", "['torch']"),
        ("model.attention_impl=trition", "did you mean 'triton'?", "['torch']"),
    ],
)
def test_config_errors_come_before_the_training_imports(override, message, loaded):
    last, err = loaded_modules("configs/tiny.yaml", override)
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert last == f"loaded: {loaded} exit: 1"


def test_models_config_and_the_registry_load_without_open_clip():
    """`import models` and the model section need neither open_clip nor torchvision; building a model registers the
    tiny sizes with open_clip (models.clip), so open_clip.create_model("tiny-s") works after it."""
    probe = (
        "import sys, models, models.config, models.attention\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "from models import create_model\n"
        "import open_clip\n"
        "print(open_clip.get_model_config('tiny-s')['vision_cfg']['patch_size'])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["[]", "8"], done.stderr
