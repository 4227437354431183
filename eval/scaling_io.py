"""Reading run results into one table (one row per point), and evaluating column expressions on it.

What is read from each kind of input:

- ``*.csv``: every row is a point; the columns are whatever the file names them.
- ``*.json``: one JSON object per file, one point (the eval result files: top1, top5, params,
  params_without_token_embedding, gmacs_per_sample, samples_seen, step, image_attention, text_attention, model,
  ...). Nested objects are flattened with dots: ``{"model": {"width": 512}}`` becomes the column ``model.width``.
- a run directory (a folder holding ``metrics.jsonl``, or that file itself): its evaluations, each a point. A record
  is a line of ``metrics.jsonl`` or an eval JSON file (``zeroshot*.json``, ``retrieval*.json``, ``eval*.json``,
  ``eval/*.json``, eval.suite's ``eval/<checkpoint>/<data set>.json``); every record gets the run's own columns,
  ``config.yaml`` (else ``config.json``) flattened with dots (``model.image_attention``, ``optim.schedule``) and
  ``summary.json`` (the model summary that training writes: params, params_without_token_embedding,
  gmacs_per_sample, the attentions; models.summary); the record's own values win. With a y expression, the records
  are those on which y has a value (for ``error``: the zero-shot evaluations). ``points`` picks among them, per run:
    ``all``       every record, in order (the learning curve);
    ``last``      the latest record (largest step, then samples_seen; an eval JSON after a metrics line of the
                  same step);
    ``cooldown``  the annealed points only: the final record of a run whose ``optim.schedule`` decays to its end
                  (any schedule but ``constant``), when its step is ``train.max_steps`` (the run finished).
  A run none of whose records has y gives its last record (its y is then missing: the fit drops it and says so).
- any other directory: every run directory below it (each ``metrics.jsonl`` found recursively).

Every row also gets a column ``@source``: the file or run directory it came from (a column of that name already
in the input is kept as it is).

Column expressions (``--x``/``--y``): a column name; ``compute`` = a ``compute`` column, else
gmacs_per_sample * samples_seen, else a ``gmacs_total`` column; ``error`` = 1 - top1 (``top1`` of eval JSONs,
else ``zeroshot/top1`` of the training run's own evaluations; read as percent when any value is > 1); or a
product of factors ``a*b*c`` where a factor is a column, a number, or ``NUMBER-column`` (``1-top1``).
``EXPR@NAME`` (``error@imagenet-v2``, ``image_to_text_R@5@coco``) is EXPR on the rows of data set NAME (the
``dataset`` key of eval.suite's results) and missing on every other row; ``error`` alone on rows from several
data sets is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from models import run_folder


class ScalingInputError(ValueError):
    """Input that cannot be fitted; the message is one line naming the problem and the fix."""


class ScalingWarning(UserWarning):
    """Input that was fitted after a repair (rows dropped) or whose intervals mean little."""


EVAL_JSON_PATTERNS = ("zeroshot*.json", "retrieval*.json", "eval*.json", "eval/*.json", "eval/*/*.json")
POINTS = ("all", "last", "cooldown")
SOURCE = "@source"  # the column naming where each row came from; "@" keeps it apart from config and CSV columns
TOP1_COLUMNS = ("top1", "zeroshot/top1")
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
    if (run / run_folder.CONFIG).is_file():
        try:
            config = yaml.safe_load((run / run_folder.CONFIG).read_text()) or {}
        except yaml.YAMLError as err:
            raise ScalingInputError(f"cannot parse {run / run_folder.CONFIG}: {err}".replace("\n", " ")) from None
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


def _eval_order(item: tuple[Path, dict]) -> tuple:
    path, obj = item
    when = obj.get("step", obj.get("samples_seen"))
    return (float(when) if isinstance(when, (int, float)) else float("-inf"), path.name)


def _records(run: Path) -> list[dict]:
    """A run's records: the lines of metrics.jsonl in order, then its eval JSON files oldest first."""
    files = sorted({p for pattern in EVAL_JSON_PATTERNS for p in run.glob(pattern) if p.is_file()})
    evals = [obj for _, obj in sorted(((p, _read_json_object(p)) for p in files), key=_eval_order)]
    return _read_metrics(run / run_folder.METRICS) + evals


def _run_columns(run: Path) -> dict:
    """What holds for every point of a run: its config and its model summary."""
    columns = _read_config(run)
    if (run / run_folder.SUMMARY).is_file():
        columns.update(_read_json_object(run / run_folder.SUMMARY))
    return columns


def _has_value(rows: list[dict], y: str) -> np.ndarray:
    """Whether expression y has a finite value on each row [len(rows)] bool."""
    try:
        return np.isfinite(evaluate(pd.DataFrame(rows), y))
    except ScalingInputError:
        return np.zeros(len(rows), dtype=bool)


def _when(row: dict) -> tuple[float, float]:
    def number(value) -> float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("-inf")

    return number(row.get("step")), number(row.get("samples_seen"))


def _select(rows: list[dict], points: str) -> list[dict]:
    """The rows that --points keeps (module docstring); rows are in record order."""
    if points == "all" or not rows:
        return rows
    # the latest record; on a tie the later one in record order
    last = rows[max(reversed(range(len(rows))), key=lambda i: _when(rows[i]))]
    if points == "last":
        return [last]
    schedule, total = last.get("optim.schedule"), last.get("train.max_steps")
    finished = total is None or last.get("step") == total
    return [last] if schedule is not None and schedule != "constant" and finished else []


def read_run(run: Path, y: str | None = None, points: str = "last") -> list[dict]:
    """The points of a run directory (one dict each); see the module docstring for what is read and kept."""
    shared = _run_columns(run)
    rows = [{**shared, **record} for record in _records(run)]
    if y is not None:
        rows = [row for row, keep in zip(rows, _has_value(rows, y)) if keep] or rows[-1:]
    return [{**row, SOURCE: str(run)} for row in _select(rows, points)]


def _run_dirs(path: Path) -> list[Path]:
    runs = [path] if (path / run_folder.METRICS).is_file() else sorted(p.parent for p in path.rglob(run_folder.METRICS))
    if not runs:
        raise ScalingInputError(
            f"no metrics.jsonl in or below directory {path}; pass run directories, JSON or CSV files"
        )
    return runs


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ScalingInputError(f"cannot read CSV file {path}: {err}".replace("\n", " ")) from None
    return frame if SOURCE in frame.columns else frame.assign(**{SOURCE: str(path)})


def load_points(inputs, y: str | None = None, points: str = "last") -> pd.DataFrame:
    """Read CSV files, JSON result files and run directories into one DataFrame (one row per point).

    ``y``: the expression to be fitted; in run directories the points are the records on which it has a value.
    ``points``: all | last | cooldown, which of a run directory's points are kept (CSV and JSON rows all are).
    """
    if points not in POINTS:
        raise ScalingInputError(f"--points must be one of {', '.join(POINTS)}, got {points!r}")
    frames, rows = [], []
    for item in [inputs] if isinstance(inputs, (str, Path)) else inputs:
        path = Path(item)
        if path.name == run_folder.METRICS and path.is_file():
            path = path.parent
        if path.is_dir():
            rows += [row for run in _run_dirs(path) for row in read_run(run, y, points)]
        elif path.suffix == ".csv" and path.is_file():
            frames.append(_read_csv(path))
        elif path.suffix == ".json" and path.is_file():
            rows.append({SOURCE: str(path), **_read_json_object(path)})
        elif not path.exists():
            raise ScalingInputError(f"input {path} does not exist")
        else:
            raise ScalingInputError(
                f"cannot read {path}: expected a .csv file, a .json file or a run directory with metrics.jsonl"
            )
    if rows:
        frames.append(pd.DataFrame(rows))
    if not frames:
        message = "no inputs given; pass CSV files, JSON result files or run directories"
        if points == "cooldown":
            message = (
                "no annealed points: --points cooldown keeps the final evaluation of finished runs whose "
                "optim.schedule is not constant; use --points all or last"
            )
        raise ScalingInputError(message)
    return pd.concat(frames, ignore_index=True)


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


def _top1(df: pd.DataFrame) -> np.ndarray:
    """top1 of each row as a fraction: the column top1, else zeroshot/top1 (a training run's own evaluations)."""
    names = [name for name in TOP1_COLUMNS if name in df.columns]
    if not names:
        raise _missing("top1", "error = 1 - top1", df)
    values = np.full(len(df), np.nan)
    for name in reversed(names):
        top1 = numeric_column(df, name, "error = 1 - top1")
        # top1 reported in percent (0-100) by some tools: an error rate must stay in [0, 1].
        top1 = top1 / 100.0 if np.nanmax(top1, initial=0.0) > 1.0 else top1
        values = np.where(np.isfinite(top1), top1, values)
    return values


def datasets_of(df: pd.DataFrame) -> list[str]:
    """The data sets named in the column ``dataset`` (eval.suite's JSON and CSV files), sorted."""
    return sorted({str(d) for d in df["dataset"].dropna()}) if "dataset" in df.columns else []


def _on_dataset(df: pd.DataFrame, expr: str, name: str) -> np.ndarray:
    """``expr@name``: expr on the rows whose ``dataset`` is name (eval.suite's results), NaN on every other row."""
    found = datasets_of(df)
    if name not in found:
        raise ScalingInputError(f"no evaluation on data set '{name}' in the inputs; found: {', '.join(found)}")
    mine = (df["dataset"].astype(str) == name).to_numpy()
    values = np.full(len(df), np.nan)
    values[mine] = evaluate(df[mine], expr)
    return values


def evaluate(df: pd.DataFrame, expr: str) -> np.ndarray:
    """Values of a column expression (see the module docstring) as a float64 array of len(df)."""
    expr = expr.strip()
    if expr in df.columns:
        return numeric_column(df, expr)
    if expr == "compute":
        if {"gmacs_per_sample", "samples_seen"} <= set(df.columns):
            return evaluate(df, "gmacs_per_sample*samples_seen")
        if "gmacs_total" in df.columns:
            return numeric_column(df, "gmacs_total")
        raise _missing("gmacs_per_sample", "compute = gmacs_per_sample*samples_seen", df)
    if expr == "error":
        several = datasets_of(df)
        if len(several) > 1:
            raise ScalingInputError(
                f"the points come from {len(several)} data sets ({', '.join(several)}); name one, e.g. "
                f"--y error@{several[0]}"
            )
        return 1.0 - _top1(df)
    if "@" in expr and "dataset" in df.columns:
        return _on_dataset(df, *expr.rsplit("@", 1))
    values = np.ones(len(df))
    for factor in expr.split("*"):
        values = values * _factor(df, factor.strip(), expr)
    return values
