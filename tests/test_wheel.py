"""The wheel works without the repository: built from the tracked files, installed into a fresh venv, it carries the
C kernels and the configs the code reads, and a tiny model's linear attention runs on the C kernel there."""

import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch

    import models
    from models import config
    from models.attention import attend
    from models.attention.ops import cpu_build, dispatch

    venv = Path(sys.argv[1])
    assert venv in Path(models.__file__).resolve().parents, models.__file__
    assert all(p.is_file() for p in cpu_build.SOURCES + cpu_build.HEADERS), cpu_build.SOURCES
    names = {"causal_cpu.c", "manhattan_cpu.c", "nodenom_cpu.c", "affine_cpu.c"}
    assert {p.name for p in cpu_build.SOURCES} == names, cpu_build.SOURCES
    assert (config.TINY_CONFIG_DIR / "tiny-s.json").is_file() and (config.OPEN_CLIP_COPIES / "ViT-B-16.json").is_file()
    root = config.TINY_CONFIG_DIR.parents[1]
    assert all((root / f).is_file() for f in ("configs/demo.yaml", "configs/study/demo.yaml", "configs/tiny.yaml"))
    lib, why = cpu_build.load()
    assert lib is not None, why
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 17, 16, requires_grad=True) for _ in range(3))
    assert dispatch.resolve("linear_affine_nodenom", "auto", q, False) == "cpu"
    out = attend("linear_affine_nodenom", q, k, v)
    want = dispatch.TABLES["linear_affine_nodenom"].reference(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    model = models.create_model("tiny-s", "linear_affine_nodenom", "linear_affine_nodenom")
    model(torch.randn(2, 3, 32, 32), models.tokenizer("tiny-s")(["a red circle", "a blue square"]))[0].sum().backward()
    print("ok")
    """
)


def test_the_wheel_carries_the_kernels_and_configs_and_runs_linear_attention_on_them(tmp_path):
    from models.attention.ops import cpu_build

    if cpu_build.compiler() is None:
        pytest.skip("no C compiler: the wheel's C kernels cannot be built here")
    # the checkout's build, under its name: the child loads it only where the wheel's kernel sources, headers and
    # flags hash to the same key (cpu_build.build), so it is not compiled again (compiling takes about 20 s on one core)
    built = cpu_build.build(cpu_build.compiler())
    (tmp_path / "kernels").mkdir()
    shutil.copy2(built, tmp_path / "kernels" / built.name)
    source = tmp_path / "source"
    for name in subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split():
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), "."]
    subprocess.run(build, cwd=source, check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("clip_attention-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    # the dependencies (torch, open_clip, ...) come from this venv's site-packages, after the wheel's own; the
    # editable install of the repository is a .pth of this site-packages, which a path added by .pth does not run
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "CLIP_KERNEL_CACHE": str(tmp_path / "kernels"),
        "CLIP_CPU_KERNEL": "1",
        "CC": cpu_build.compiler(),  # the compiler of the key
    }
    child = subprocess.run(
        [str(python), "-c", CHILD, str(venv)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0 and child.stdout.strip().endswith("ok"), child.stderr[-3000:]
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [built.name]  # the same sources: nothing compiled
