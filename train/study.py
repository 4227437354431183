"""The study as data: the grid of training runs (sizes x attentions x image sizes x budgets, per seed) that one
study config describes (configs/study/*.yaml), and each run's `python -m train` command.

configs/study/demo.yaml holds the grid (sizes x attentions), the embedded data set's size, per-size settings,
how many runs share the machine, and the fits; `quick:` overrides it for `--quick`. Each run is
`python -m train RUN_CONFIG size-overrides run-overrides paths`; train/study_local.py runs them on this machine
(`jobs` at a time with `threads_per_job` threads: tiny models use a core far better alone than split over two
threads, so two one-thread runs at a time finish the grid sooner than one two-thread run at a time).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from data import make_synthetic
from eval.optimizer_study import ARM_SEPARATOR, attention_of
from eval.study_report import DEFAULT_TITLE
from models import run_folder
from models.config import ModelConfig, resolved_size
from models.run_folder import step_name

REPO = Path(__file__).resolve().parents[1]
MADE = "made.json"  # in a study's data folder: the settings and seed it was made with, written when it is whole


class StudyError(ValueError):
    """A study config that cannot run; one line naming the key and the fix."""


@dataclass
class Study:
    """What configs/study/demo.yaml may hold (see that file for the meaning of each key)."""

    data: dict  # keyword arguments of data.make_synthetic
    attentions: list[str]
    sizes: dict[str, dict]  # size -> {dotted.key: value} overrides of the run config for that size
    title: str = DEFAULT_TITLE  # the report's and its docs page's first line
    run_config: str = "configs/demo.yaml"
    run: dict = field(default_factory=dict)  # {dotted.key: value} overrides of the run config for every run
    jobs: int = 2
    threads_per_job: int = 1
    launch: str = "fork"  # fork: each run a fork of the study's process (no imports); exec: a fresh interpreter
    fits: dict = field(default_factory=dict)
    bench: list = field(default_factory=list)  # arguments of scripts.bench_attention
    # attention -> how it trains where it differs from the others: {lr_scale: x (times each size's optim.lr),
    # run: {dotted.key: value} (e.g. a longer train.max_steps)}
    per_attention: dict[str, dict] = field(default_factory=dict)
    # several budgets from one run (Hägele et al. 2024): {fractions: [f, ...] of each run's train.max_steps,
    # cooldown: the fraction of every budget that cools down}; {} = one cosine run per size and attention
    budgets: dict = field(default_factory=dict)
    # a learning-rate sweep at one size, its best multiple used at every size (train/lr_sweep.py); {} = none
    lr_sweep: dict = field(default_factory=dict)
    # instead of a sweep: the rates another study's sweep chose (train/lr_sweep.adopt), from its finished folders or
    # its docs page's data/ (paths relative to the repository; the first folder that swept an attention wins); with
    # an lr_sweep beside it, the sweep's multiples multiply those rates (a sweep around them, e.g. at a longer budget)
    rates_from: list[str] = field(default_factory=list)
    # the linearisation arm (train/linearise.py) on the best softmax run: {transfer_steps, distill_steps,
    # eval_every, warmup_steps} (its options); {} = none
    linearise: dict = field(default_factory=dict)
    # image sizes (px, model.image_size) as an axis beside the model sizes: every size at each, named SIZE@RESpx
    # (its patch size must divide each); [] = each size at its own image size. Expanded into `sizes` on load.
    image_sizes: list[int] = field(default_factory=list)
    # optimizers (optim.name) as an axis beside the attentions: every attention with each, its runs named
    # ATTENTION@OPTIMIZER (per_attention and lr_sweep.scales keyed by either name); [] = the run config's optimizer.
    # Expanded into `attentions` on load (eval/optimizer_study.py: ARM_SEPARATOR, attention_of).
    optimizers: list[str] = field(default_factory=list)
    # {size: {attention: multiple}}: multiples of the size's learning rate per attention (in a config: rates chosen
    # per size and attention, e.g. by sweeps at two depths); a sweep at several sizes multiplies them by its choices
    # where they do not transfer across sizes (train/lr_sweep.apply); read by attention_settings
    lr_by_size: dict = field(default_factory=dict)
    # images per full-budget run on which eval/smoothing.py measures each image-tower layer's kept share of token
    # spread after training (the report's over-smoothing section); 0 = not measured
    smoothing: int = 0
    # set on load, not a config key: the sweep rows whose chosen rates the study trains with (rates_from)
    adopted: list[dict] = field(default_factory=list)


def spec_of(folder: Path) -> str:
    """The brace pattern of a folder's shards 00000.tar ... (train.config's data.train_shards)."""
    count = len(list(folder.glob("*.tar")))
    return str(folder / f"{{00000..{count - 1:05d}}}.tar") if count > 1 else str(folder / "00000.tar")


def finished(run_dir: Path) -> bool:
    """The run has its checkpoint at its last step (train.max_steps of its saved config)."""
    if not (run_dir / run_folder.CONFIG).is_file():
        return False
    last = yaml.safe_load((run_dir / run_folder.CONFIG).read_text())["train"]["max_steps"]
    return any(folder.name == run_folder.step_name(last) for folder in run_folder.step_folders(run_dir))


def branch_point(job: Job, start: int) -> Path | None:
    """The checkpoint of `job`'s run that a budget whose cooldown starts at step `start` branches from: the one at
    `start`, which the run keeps (train.keep_steps); where the run finished before that budget was added to the
    study (done_before: a study resumed with --resume keeps it), its newest kept checkpoint before `start`, the
    branch training the constant-rate steps between as the run did (resuming equals not stopping:
    tests/train/test_preemption.py); None where it kept none before `start`: the budget trains from step 0."""
    exact = job.run_dir / run_folder.CHECKPOINTS / step_name(start)
    if exact.is_dir() or not done_before(job):
        return exact
    kept = [p for p in run_folder.step_folders(job.run_dir) if int(p.name.removeprefix("step_")) <= start]
    return kept[0] if kept else None


def done_before(job: Job) -> bool:
    """The job's folder holds a finished run trained with the job's own config (train.resume aside; keys added to the
    config since then read at their defaults): a resumed study (scripts.demo --resume) does not train it again."""
    from train.config import load_config, to_dict  # the config's checks: only where a study resumes

    if not finished(job.run_dir):
        return False
    saved = to_dict(load_config([str(job.run_dir / run_folder.CONFIG)], warn=False))
    wanted = to_dict(load_config(job.argv[job.argv.index("train") + 1 :], warn=False))
    for cfg in (saved, wanted):  # which checkpoints a run keeps does not change its training
        for key in ("resume", "keep_steps"):
            cfg["train"].pop(key)
    return saved == wanted


def data_paths(folder: Path) -> dict[str, str]:
    """A study's data set in `folder`: {"train", "val" (shard specs), "eval" (ImageFolder)}."""
    return {k: spec_of(folder / k) for k in ("train", "val")} | {"eval": str(folder / "eval")}


def make_data(folder: Path, study: Study, seed: int, report=None) -> dict[str, str]:
    """The embedded data set of the study (data.make_synthetic with its `data:` settings) in `folder`, its shards
    written by `jobs` processes (the same bytes as one). A set that `folder` already holds, made to the end with
    the same settings and seed (its MADE file, written last), is kept: the same bytes would be written again (a
    study resumed with --resume, or run in parts with --sizes)."""
    wanted = json.loads(json.dumps({"seed": seed, **study.data}))  # tuples as lists, as read back
    made = folder / MADE
    with contextlib.suppress(OSError, ValueError):
        if json.loads(made.read_text()) == wanted:
            if report:
                report(f"kept: made with the same settings and seed ({made})")
            return data_paths(folder)
    made.unlink(missing_ok=True)
    make_synthetic(folder, seed=seed, **{"workers": study.jobs, **study.data})
    run_folder.write_text_atomic(made, json.dumps(wanted, indent=1))
    return data_paths(folder)


def merge(base: dict, changes: dict) -> dict:
    """Nested dict update: mappings merge key by key, anything else replaces."""
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def load_study(path: str | Path, quick: bool = False, rates_from: list | None = None) -> Study:
    """The study of a YAML file (with its `quick:` section merged in when quick); `rates_from` (folders, e.g. from
    `--rates-from`) replaces the file's own: the study then trains with the rates their sweeps chose, no sweep."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"study config {path} does not exist; use configs/study/demo.yaml or a copy of it")
    raw = yaml.safe_load(path.read_text()) or {}
    quick_part = raw.pop("quick", {}) or {}
    if quick:
        raw = merge(raw, quick_part)
    known = {f.name for f in fields(Study)} - {"adopted"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise StudyError(f"{path}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(known))}, quick")
    try:
        study = Study(**raw)
    except TypeError as e:
        raise StudyError(f"{path}: {e}") from None
    # null (as `quick:` sets them): none
    study.budgets, study.lr_sweep, study.per_attention, study.linearise = (
        study.budgets or {},
        study.lr_sweep or {},
        study.per_attention or {},
        study.linearise or {},
    )
    if not study.sizes or not study.attentions or study.jobs < 1 or study.threads_per_job < 1:
        raise StudyError(f"{path}: needs sizes and attentions, jobs >= 1 and threads_per_job >= 1")
    if study.launch not in ("fork", "exec"):
        raise StudyError(f"{path}: launch: {study.launch!r} is neither fork nor exec")
    for name, settings in study.per_attention.items():
        unknown = sorted(set(settings or {}) - {"lr_scale", "run"})
        if unknown or not (settings or {}).get("lr_scale", 1) > 0:
            raise StudyError(
                f"{path}: per_attention.{name}: "
                + (f"unknown key {unknown[0]!r}; valid keys: lr_scale, run" if unknown else "lr_scale must be > 0")
            )
    unknown = sorted(set(study.linearise) - LINEARISE_KEYS)
    if unknown:
        raise StudyError(
            f"{path}: linearise: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(LINEARISE_KEYS))}"
        )
    check_lr_by_size(study, path)
    expand_image_sizes(study, path)
    expand_optimizers(study, path)
    check_budgets(study.budgets, path)
    check_sweep(study, path)
    adopt_rates(study, path, rates_from)
    return study


def check_lr_by_size(study: Study, path: Path) -> None:
    """lr_by_size ({size: {attention: multiple}}, e.g. the rates sweeps at two depths chose): a size or attention the
    study does not train, or a multiple that is not > 0, is one StudyError line."""
    study.lr_by_size = study.lr_by_size or {}
    for size, multiples in study.lr_by_size.items():
        if size not in study.sizes:
            raise StudyError(f"{path}: lr_by_size: unknown size {size!r}; the study's sizes: {', '.join(study.sizes)}")
        for attention, multiple in (multiples or {}).items():
            if attention not in study.attentions:
                known = ", ".join(study.attentions)
                raise StudyError(f"{path}: lr_by_size.{size}: unknown attention {attention!r}; the study's: {known}")
            if not isinstance(multiple, (int, float)) or not multiple > 0:
                raise StudyError(f"{path}: lr_by_size.{size}.{attention}: {multiple!r} is not a multiple > 0")


def resolve_folder(folder: str | Path) -> Path:
    """A folder as a config names it: as given where it exists (or is absolute), else relative to the repository."""
    return Path(folder) if Path(folder).is_absolute() or Path(folder).exists() else REPO / folder


def adopt_rates(study: Study, path: Path, rates_from: list | None) -> None:
    """The study's rates from other studies' sweeps (its `rates_from`, or the caller's instead), each folder checked
    here: one that does not exist, or chose no rate for an attention, is one StudyError line."""
    around = bool(study.rates_from and study.lr_sweep and not rates_from)  # a sweep around those rates
    folders = rates_from or study.rates_from
    folders = [folders] if isinstance(folders, (str, Path)) else list(folders or [])
    if not folders:
        return
    resolved = [resolve_folder(f) for f in folders]
    missing = [str(f) for f in resolved if not f.is_dir()]
    if missing:
        raise StudyError(f"{path}: rates_from: {missing[0]} is not a folder; give a finished study or a page's data/")
    from train.lr_sweep import adopt  # it imports this module

    study.rates_from = [str(f) for f in folders]
    named = {str(r): str(f) for r, f in zip(resolved, folders)}  # as given: the report names it, not this path
    try:
        rows = adopt(study, resolved, keep_sweep=around)
    except StudyError as e:
        raise StudyError(f"{path}: rates_from: {e}") from None
    study.adopted = [{**row, "from": named.get(row["from"], row["from"])} for row in rows]


def expand_image_sizes(study: Study, path: Path) -> None:
    """sizes x image_sizes -> sizes named SIZE@RESpx whose overrides set model.name and model.image_size (smallest
    resolution first within a size), lr_by_size's too; a resolution the size's patch does not divide is one
    StudyError line."""
    if not study.image_sizes:
        return
    expanded = {}
    for size, settings in study.sizes.items():
        for res in sorted(study.image_sizes):
            try:
                resolved_size(ModelConfig(name=size, image_size=res))
            except (ValueError, KeyError) as e:
                raise StudyError(f"{path}: image_sizes: {str(e).splitlines()[0]}") from None
            expanded[f"{size}@{res}px"] = {"model.name": size, "model.image_size": res, **(settings or {})}
    study.sizes = expanded
    study.lr_by_size = {f"{s}@{res}px": m for s, m in study.lr_by_size.items() for res in study.image_sizes}


def expand_optimizers(study: Study, path: Path) -> None:
    """attentions x optimizers -> arms ATTENTION@OPTIMIZER: each arm's run overrides set both towers' attention and
    optim.name, then the attention's own per_attention settings, then the arm's; lr_sweep.scales and lr_by_size per
    attention are copied to its arms. An unknown optimizer is one StudyError line listing the known ones."""
    if not study.optimizers:
        return
    from train.optim import known_optimizers  # timm's list: imported only by studies with this axis

    known = known_optimizers()
    unknown = [o for o in study.optimizers if o not in known]
    if unknown:
        raise StudyError(f"{path}: optimizers: {unknown[0]!r} is not an optimizer; known: {', '.join(known)}")
    arms, per_arm = [], {}
    for attention in study.attentions:
        for optimizer in study.optimizers:
            arm = f"{attention}{ARM_SEPARATOR}{optimizer}"
            base, own = study.per_attention.get(attention) or {}, study.per_attention.get(arm) or {}
            tower = {"model.image_attention": attention, "model.text_attention": attention, "optim.name": optimizer}
            per_arm[arm] = {**base, **own, "run": {**tower, **(base.get("run") or {}), **(own.get("run") or {})}}
            arms.append(arm)
    scales = study.lr_sweep.get("scales") if study.lr_sweep else None
    if isinstance(scales, dict):
        study.lr_sweep["scales"] = {a: scales.get(a, scales.get(attention_of(a))) for a in arms}
    study.attentions, study.per_attention = arms, per_arm
    study.lr_by_size = {
        size: {f"{a}{ARM_SEPARATOR}{o}": m for a, m in (multiples or {}).items() for o in study.optimizers}
        for size, multiples in study.lr_by_size.items()
    }


SWEEP_KEYS = {"size", "scales", "metric", "run"}
LINEARISE_KEYS = {"transfer_steps", "distill_steps", "transfer_lr", "eval_every", "warmup_steps"}


def check_sweep(study: Study, path: Path) -> None:
    sweep = study.lr_sweep
    if not sweep:
        return
    unknown = sorted(set(sweep) - SWEEP_KEYS)
    if unknown:
        raise StudyError(f"{path}: lr_sweep: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(SWEEP_KEYS))}")
    named = sweep.get("size") if isinstance(sweep.get("size"), list) else [sweep.get("size")]
    if not named or any(size not in study.sizes for size in named):
        raise StudyError(
            f"{path}: lr_sweep.size must be one of the study's sizes, or a list of them: {', '.join(study.sizes)}"
        )
    scales = sweep.get("scales") or []
    by_attention = scales if isinstance(scales, dict) else dict.fromkeys(study.attentions, scales)
    missing = [a for a in study.attentions if a not in by_attention]
    if missing:
        raise StudyError(f"{path}: lr_sweep.scales has no multiples for {missing[0]}; give every attention its list")
    for attention, own in by_attention.items():
        if not isinstance(own, list) or len(own) < 2 or not all(isinstance(s, (int, float)) and s > 0 for s in own):
            raise StudyError(
                f"{path}: lr_sweep.scales ({attention}) needs at least two positive multiples, e.g. [0.5, 1.0, 2.0]"
            )
    if sweep.get("metric", "val_loss") not in ("val_loss", "error"):
        raise StudyError(f"{path}: lr_sweep.metric is val_loss or error, not {sweep['metric']!r}")


def check_budgets(budgets: dict, path: Path) -> None:
    if not budgets:
        return
    unknown = sorted(set(budgets) - {"fractions", "cooldown"})
    if unknown:
        raise StudyError(f"{path}: budgets: unknown key {unknown[0]!r}; valid keys: fractions, cooldown")
    fractions, cooldown = budgets.get("fractions") or [], budgets.get("cooldown", 0.2)
    if not all(0 < f < 1 for f in fractions) or sorted(set(fractions)) != list(fractions):
        raise StudyError(f"{path}: budgets.fractions must increase strictly and lie in (0, 1), e.g. [0.33, 0.67]")
    if not 0 < cooldown < 1:
        raise StudyError(f"{path}: budgets.cooldown is the fraction of a budget that cools down: in (0, 1), e.g. 0.2")


def budget_steps(study: Study, max_steps: int) -> list[tuple[int, int]]:
    """[(steps, cooldown steps)] of every budget of a run of `max_steps` steps, the run itself last."""
    cooldown = study.budgets.get("cooldown", 0.2)
    steps = sorted({max(2, round(f * max_steps)) for f in study.budgets.get("fractions") or []} - {max_steps})
    return [(t, max(1, round(cooldown * t))) for t in [*steps, max_steps]]


def attention_settings(study: Study, size: str) -> dict[str, dict]:
    """attention -> {dotted.key: value} overrides of its runs at `size`: per_attention's run overrides, and
    optim.lr scaled by its lr_scale from the size's (else the run config's) learning rate."""
    out = {}
    for attention in study.attentions:
        settings = study.per_attention.get(attention) or {}
        overrides = dict(settings.get("run") or {})
        scale = settings.get("lr_scale", 1) * (study.lr_by_size.get(size) or {}).get(attention, 1)
        if scale != 1:
            base = {**study.run, **(study.sizes[size] or {})}.get("optim.lr")
            if base is None:
                base = yaml.safe_load((REPO / study.run_config).read_text())["optim"]["lr"]
            overrides["optim.lr"] = float(base) * scale
        out[attention] = overrides
    return out


def overrides(values: dict) -> list[str]:
    """{"optim.lr": 0.001} -> ["optim.lr=0.001"] (values as YAML, as python -m train parses them)."""
    return [
        f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
        for key, value in values.items()
    ]


@dataclass
class Job:
    """One training run: its folder, its command line and, once finished, its wall and CPU seconds."""

    size: str
    attention: str
    run_dir: Path
    argv: list[str]
    process: subprocess.Popen | None = None
    started: float = 0.0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    after: Job | None = None  # a cooldown branch starts once the run it branches from has finished
    budgets: list[Job] = field(default_factory=list)  # a run's cooldown branches (shorter budgets)
    reused: bool = False  # trained by the learning-rate sweep (train/lr_sweep.reuse_chosen), not again


def jobs_of(study: Study, out: Path, paths: dict[str, str], seed: int) -> list[Job]:
    """Every (size, attention) run of the grid, the biggest sizes first (they take longest)."""
    jobs = []
    for size in reversed(list(study.sizes)):
        for attention, own in attention_settings(study, size).items():
            run_dir = out / "runs" / f"{size}-{attention}"
            settings = {
                "model.name": size,  # unless the size's overrides name the model (image_sizes: SIZE@RESpx)
                **study.run,
                **(study.sizes[size] or {}),
                "model.image_attention": attention,
                "model.text_attention": attention,
                **own,  # per_attention's run overrides may set a tower's attention or options
                "data.train_shards": paths["train"],
                "eval.val_shards": paths["val"],
                "eval.dataset": paths["eval"],
                "train.run_dir": str(run_dir),
                "train.seed": seed,
                "data.seed": seed,
                "train.resume": "none",
                "train.progress": False,
            }
            if not study.budgets:
                jobs.append(Job(size, attention, run_dir, train_argv(study, settings)))
                continue
            jobs += with_budgets(study, Job(size, attention, run_dir, []), settings)
    return jobs


def train_argv(study: Study, settings: dict) -> list[str]:
    return [sys.executable, "-m", "train", study.run_config, *overrides(settings)]


def with_budgets(study: Study, job: Job, settings: dict) -> list[Job]:
    """The run at constant learning rate cooling down over its last budgets.cooldown, keeping the checkpoint where
    each shorter budget's cooldown starts, and one branch per shorter budget that cools down from there
    (train/branch.py); the branches' folders are RUN-budget<steps>."""
    base = yaml.safe_load((REPO / study.run_config).read_text())
    max_steps = int(settings.get("train.max_steps", base["train"]["max_steps"]))
    *shorter, (_, cooldown) = budget_steps(study, max_steps)
    schedule = {"optim.schedule": "const-cooldown", "optim.cooldown_steps": cooldown}
    keep = [steps - cool for steps, cool in shorter]
    job.argv = train_argv(study, {**settings, **schedule, "train.keep_steps": keep})
    for (steps, cool), start in zip(shorter, keep):
        run_dir = job.run_dir.parent / f"{job.run_dir.name}-budget{steps}"
        parent = branch_point(job, start)
        branch = {
            **settings,
            "optim.schedule": "const-cooldown",
            "optim.cooldown_steps": cool,
            "train.max_steps": steps,
            **({"train.branch_from": str(parent)} if parent else {}),
            "train.run_dir": str(run_dir),
        }
        job.budgets.append(Job(job.size, job.attention, run_dir, train_argv(study, branch), after=job))
    return [job, *job.budgets]
