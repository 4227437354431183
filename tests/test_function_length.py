"""The house rule of issue 25: no production function over 60 lines (decorators left out, docstring counted)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "data", "train", "eval", "scripts")


def test_no_function_over_60_lines():
    long = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                    long.append(
                        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
                    )
    assert not long, "split these functions: " + ", ".join(long)
