"""Reading run results into one table, and evaluating column expressions on it.

What is read from each kind of input (one row of the table per run, or per CSV row):

- ``*.csv``: every row is a point; the columns are whatever the file names them.
- ``*.json``: one JSON object per file (the eval result files: top1, top5, params, params_without_token_embedding,
  gmacs_per_sample, samples_seen, step, image_attention, text_attention, model, ...). Nested objects
  are flattened with dots: ``{"model": {"width": 512}}`` becomes the column ``model.width``.
- a run directory (a folder holding ``metrics.jsonl``, or that file itself): one row merged from
    1. ``config.yaml`` (else ``config.json``), flattened with dots (``model.image_attention``);
    2. the eval JSON files ``zeroshot*.json``, ``retrieval*.json``, ``eval*.json``, ``eval/*.json``,
       merged oldest to newest by their ``step`` (else ``samples_seen``, then file name): newer keys win;
    3. one line of ``metrics.jsonl``: the last line holding every requested column that appears
       anywhere in metrics.jsonl (the last line when nothing is requested).
  On keys present in both 2 and 3 (``step``, ``samples_seen``...), the record that holds the y column
  wins, so x is read at the same point of training as y; the metrics line wins when both or neither do.
- any other directory: every run directory below it (each ``metrics.jsonl`` found recursively).

Every row also gets a ``source`` column: the file or run directory it came from.

Column expressions (``--x``/``--y``): a column name; ``compute`` = a ``compute`` column, else
gmacs_per_sample (or gmacs) * samples_seen, else a ``gmacs_total`` column; ``error`` = 1 - top1 (top1 read as
percent when any value is > 1); or a product of factors ``a*b*c`` where a factor is a column, a number, or
``NUMBER-column`` (``1-top1``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml


class ScalingInputError(ValueError):
    """Input that cannot be fitted; the message is one line naming the problem and the fix."""


class ScalingWarning(UserWarning):
    """Input that was fitted after a repair (rows dropped) or whose intervals mean little."""


EVAL_JSON_PATTERNS = ("zeroshot*.json", "retrieval*.json", "eval*.json", "eval/*.json")
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def flatten(obj: dict, prefix: str = "") -> dict:
    """{"model": {"width": 512}} -> {"model.width": 512}; lists and scalars are kept as values."""
    flat = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _read_json_object(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ScalingInputError(f"cannot read JSON file {path}: {err}") from None
    if not isinstance(obj, dict):
        raise ScalingInputError(f"{path} holds a JSON {type(obj).__name__}; expected one JSON object per file")
    return flatten(obj)


def _read_config(run: Path) -> dict:
    if (run / "config.yaml").is_file():
        try:
            config = yaml.safe_load((run / "config.yaml").read_text()) or {}
        except yaml.YAMLError as err:
            raise ScalingInputError(f"cannot parse {run / 'config.yaml'}: {err}".replace("\n", " ")) from None
        return flatten(config) if isinstance(config, dict) else {}
    if (run / "config.json").is_file():
        return _read_json_object(run / "config.json")
    return {}


def _read_metrics(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(flatten(json.loads(line)))
        except (json.JSONDecodeError, AttributeError):
            raise ScalingInputError(f"{path} line {number} is not a JSON object; fix or remove that line") from None
    if not rows:
        raise ScalingInputError(f"{path} is empty; the run has logged no metrics yet")
    return rows


def _pick_metrics_line(rows: list[dict], columns: set[str]) -> dict:
    logged = set().union(*rows)
    wanted = columns & logged
    for row in reversed(rows):
        if wanted <= row.keys():
            return row
    return rows[-1]


def _eval_order(item: tuple[Path, dict]) -> tuple:
    path, obj = item
    when = obj.get("step", obj.get("samples_seen"))
    return (float(when) if isinstance(when, (int, float)) else float("-inf"), path.name)


def read_run(run: Path, columns=(), y_columns=()) -> dict:
    """One row for a run directory; see the module docstring for what is read and which value wins."""
    metrics = _pick_metrics_line(_read_metrics(run / "metrics.jsonl"), set(columns))
    files = sorted({p for pattern in EVAL_JSON_PATTERNS for p in run.glob(pattern) if p.is_file()})
    evals = {}
    for _, obj in sorted(((p, _read_json_object(p)) for p in files), key=_eval_order):
        evals.update(obj)
    y_in_evals = any(c in evals for c in y_columns)
    y_in_metrics = any(c in metrics for c in y_columns)
    layers = [evals, metrics] if y_in_metrics or not y_in_evals else [metrics, evals]
    row = _read_config(run)
    for layer in layers:
        row.update(layer)
    row["source"] = str(run)
    return row


def load_points(inputs, columns=(), y_columns=()) -> pd.DataFrame:
    """Read CSV files, JSON result files and run directories into one DataFrame (one row per point).

    ``columns``: the columns the fit will use (to choose the metrics.jsonl line of a run directory);
    ``y_columns``: those of y (to decide whether metrics or eval JSON supplies shared keys).
    """
    frames, rows = [], []
    for item in [inputs] if isinstance(inputs, (str, Path)) else inputs:
        path = Path(item)
        if path.name == "metrics.jsonl" and path.is_file():
            path = path.parent
        if path.is_dir():
            runs = (
                [path] if (path / "metrics.jsonl").is_file() else sorted(p.parent for p in path.rglob("metrics.jsonl"))
            )
            if not runs:
                raise ScalingInputError(
                    f"no metrics.jsonl in or below directory {path}; pass run directories, JSON or CSV files"
                )
            rows += [read_run(run, columns, y_columns) for run in runs]
        elif path.suffix == ".csv" and path.is_file():
            try:
                frames.append(pd.read_csv(path).assign(source=str(path)))
            except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
                raise ScalingInputError(f"cannot read CSV file {path}: {err}".replace("\n", " ")) from None
        elif path.suffix == ".json" and path.is_file():
            rows.append({**_read_json_object(path), "source": str(path)})
        elif not path.exists():
            raise ScalingInputError(f"input {path} does not exist")
        else:
            raise ScalingInputError(
                f"cannot read {path}: expected a .csv file, a .json file or a run directory with metrics.jsonl"
            )
    if rows:
        frames.append(pd.DataFrame(rows))
    if not frames:
        raise ScalingInputError("no inputs given; pass CSV files, JSON result files or run directories")
    return pd.concat(frames, ignore_index=True)


def referenced_columns(expr: str) -> set[str]:
    """Every column name ``expr`` may read (aliases expanded), used before the table exists."""
    names = {expr}
    if expr == "compute":
        names |= {"gmacs_per_sample", "gmacs", "samples_seen", "gmacs_total"}
    if expr == "error":
        names |= {"top1"}
    for factor in expr.split("*"):
        factor = factor.strip()
        match = re.fullmatch(rf"({NUMBER})\s*-\s*(.+)", factor)
        names.add(match.group(2).strip() if match else factor)
    return names


def _missing(name: str, expr: str, df: pd.DataFrame) -> ScalingInputError:
    available = ", ".join(str(c) for c in df.columns)
    where = f" (in '{expr}')" if expr != name else ""
    return ScalingInputError(f"column '{name}'{where} not found; available columns: {available}")


def numeric_column(df: pd.DataFrame, name: str, expr: str | None = None) -> np.ndarray:
    """Column ``name`` as float64 (missing entries -> NaN); text that is not a number is an error."""
    if name not in df.columns:
        raise _missing(name, expr or name, df)
    values = pd.to_numeric(df[name], errors="coerce")
    bad = df[name].notna() & values.isna()
    if bad.any():
        example = df[name][bad].iloc[0]
        raise ScalingInputError(f"column '{name}' is not numeric (e.g. {example!r}); pick a numeric column")
    return values.to_numpy(dtype=float, na_value=np.nan)


def _factor(df: pd.DataFrame, factor: str, expr: str) -> np.ndarray | float:
    if factor in df.columns:
        return numeric_column(df, factor, expr)
    if re.fullmatch(NUMBER, factor):
        return float(factor)
    match = re.fullmatch(rf"({NUMBER})\s*-\s*(.+)", factor)
    if match:
        return float(match.group(1)) - numeric_column(df, match.group(2).strip(), expr)
    raise _missing(factor, expr, df)


def evaluate(df: pd.DataFrame, expr: str) -> np.ndarray:
    """Values of a column expression (see the module docstring) as a float64 array of len(df)."""
    expr = expr.strip()
    if expr in df.columns:
        return numeric_column(df, expr)
    if expr == "compute":
        for per_sample in ("gmacs_per_sample", "gmacs"):
            if {per_sample, "samples_seen"} <= set(df.columns):
                return evaluate(df, f"{per_sample}*samples_seen")
        if "gmacs_total" in df.columns:
            return numeric_column(df, "gmacs_total")
        raise _missing("gmacs_per_sample", "compute = gmacs_per_sample*samples_seen", df)
    if expr == "error":
        top1 = numeric_column(df, "top1", "error = 1 - top1")
        # top1 reported in percent (0-100) by some tools: an error rate must stay in [0, 1].
        return 1.0 - (top1 / 100.0 if np.nanmax(top1, initial=0.0) > 1.0 else top1)
    values = np.ones(len(df))
    for factor in expr.split("*"):
        values = values * _factor(df, factor.strip(), expr)
    return values
