"""The layout of STYLE.md and issue 44: the library's floors import only downwards, no library module imports a
script, no script imports another, and every script is a command-line wrapper of at most 150 lines."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# package -> the project packages it may import (besides itself)
MAY_IMPORT = {
    "models": set(),
    "data": set(),
    "eval": {"models", "data"},
    "train": {"models", "data", "eval"},
    "scripts": {"models", "data", "eval", "train"},
}
SCRIPT_LINES = 150


def imported(path: Path) -> set[str]:
    """The top-level names of every module `path` imports (at any depth: functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_package_imports_only_the_floors_below_it():
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((REPO / package).rglob("*.py")):
            for name in sorted(imported(path) & (set(MAY_IMPORT) - allowed - {package})):
                wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert not wrong, "; ".join(wrong)


def test_no_script_imports_another_script():
    # a script imports scripts only as `from scripts import x` / `import scripts.x`, caught above as "scripts"
    # importing itself; what two scripts share belongs in the library
    wrong = [
        str(path.relative_to(REPO)) for path in sorted((REPO / "scripts").glob("*.py")) if "scripts" in imported(path)
    ]
    assert not wrong, "these scripts import a script: " + ", ".join(wrong)


def test_scripts_are_short_wrappers():
    long = {
        str(p.relative_to(REPO)): n
        for p in sorted((REPO / "scripts").glob("*.py"))
        if (n := len(p.read_text().splitlines())) > SCRIPT_LINES
    }
    assert not long, f"scripts over {SCRIPT_LINES} lines (move their work into the library): {long}"


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from train.loop import Trainer\n    import scripts.demo\n")
    assert imported(bad) == {"train", "scripts"}
