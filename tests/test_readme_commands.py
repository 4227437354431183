"""Every `python -m` command of the README works as written in the activated environment: its module exists, its
`--help` exits 0 and lists every flag the README gives it, and every `section.key=` override it gives names a real
config key (a file it names exists). The README says once how to activate the environment."""

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

from train.config import SECTIONS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
SUBCOMMANDS = ("sweep", "eval", "suite")  # train.submit's


def commands() -> list[tuple[str, str]]:
    """(module, the rest of the command) for each `python -m` in the README, continuation lines joined; a command
    ends at a backtick, a line end or a shell comment."""
    text = re.sub(r"\\\n\s*", " ", README)
    return [(m[1], m[2].strip()) for m in re.finditer(r"python -m ([a-z_][\w.]*)([^`\n#]*)", text)]


def help_argv(module: str, rest: str) -> list[str]:
    sub = rest.split()[0] if rest.split() and rest.split()[0] in SUBCOMMANDS and module == "train.submit" else None
    return [sub, "--help"] if sub else ["--help"]


def help_text(module: str, argv: list[str]) -> str:
    """What `python -m module *argv` prints, run in-process through its main(argv); it must exit 0."""
    main = importlib.import_module(module).main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code in (0, None), f"python -m {module} {' '.join(argv)}: {out.getvalue()[-300:]}"
    return out.getvalue()


def test_the_readme_activates_the_environment_once_and_writes_python_everywhere():
    assert "source .venv/bin/activate" in README
    assert README.count(".venv/bin/") == 2  # the activation line and its note; every command says `python`
    assert not re.search(r"python scripts/", README)  # scripts run as modules, from any folder


def test_every_module_exists():
    missing = {m for m, _ in commands() if importlib.util.find_spec(m) is None}
    assert not missing, missing


OURS = ("data.", "eval.", "models.", "scripts.", "train.")  # (python -m train takes a config, no --help)


@pytest.mark.parametrize("module", sorted({m for m, _ in commands() if m.startswith(OURS)}))
def test_help_exits_0_and_lists_every_flag_the_readme_uses(module):
    by_argv: dict[tuple, set[str]] = {}
    for m, rest in commands():
        if m == module:
            by_argv.setdefault(tuple(help_argv(m, rest)), set()).update(re.findall(r"(?<![\w-])--[a-z][\w-]*", rest))
    for argv, flags in by_argv.items():
        text = help_text(module, list(argv))
        assert not {f for f in flags if f not in text}, f"python -m {module}: flags the README uses but --help lacks"


def test_every_override_names_a_config_key_and_every_config_file_exists():
    keys = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    root = Path(__file__).resolve().parents[1]
    for module, rest in commands():
        if module not in ("train", "train.submit"):
            continue
        used = set(re.findall(r"(?<![\w.])([a-z_]+\.[a-z_]+)=", rest))
        assert used <= keys, f"python -m {module} {rest}: unknown keys {used - keys}"
        for path in re.findall(r"(?<!\S)(configs/\S+\.yaml)", rest):
            assert "$" in path or (root / path).is_file(), path
