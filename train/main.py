"""`python -m train CONFIG.yaml [section.key=value ...]`: train a CLIP from a config file plus overrides.

    python -m train configs/tiny.yaml model.image_attention=linear_elu train.max_steps=50 optim.lr=1e-4

Config sections: model (models.ModelConfig), data (data.DataConfig), optim, train, eval; every field with its
default is in train/config.py and data/config.py, models/config.py. Launch on one process, or under `torchrun` /
`accelerate launch` / Slurm's `srun` for many; configs/*.yaml give the launch command of each experiment.
Without train.run_dir each run gets a folder of its own (runs/<config>-<attentions>-<time>, printed at its start
and end); with it, a rerun of the same command resumes from the newest complete checkpoint (train.resume=auto).
Log lines (pretrained loading, attention impls, the run's messages) show on stderr and go to RUN/out.log (train/log.py).
Exit codes: 0 done, 75 pre-empted (SIGTERM/SIGUSR1: checkpoint written after the current step), 1 error.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

import torch
from torch import nn

from data import DataConfig, build_train_data
from data.errors import DataError
from eval.datasets import EvalInputError, open_retrieval
from eval.replay import Replay
from eval.retrieval import evaluate_pairs
from eval.sharding import Shard, random_state_kept
from eval.smoothing import kept_per_layer, sample_images
from eval.val_loss import check_val_shards, validation_loss
from eval.zeroshot import evaluate
from models import ModelConfig, build_clip, run_folder, summary, tokenizer, tokenizer_key, transforms
from models.preprocess import CachedTokenizer, split_normalise
from models.run_folder import CheckpointError, is_url, read_meta
from train import distill, stages, towers
from train import ema as weights_ema
from train.branch import starting_point
from train.checkpoint import load_checkpoint, upload
from train.config import Config, ConfigError, dump, load_config, name_run_dir, to_dict
from train.dist import (
    StopFlag,
    collective_failure,
    make_accelerator,
    rank_from_env,
    shard_model,
    world_size_from_env,
)
from train.log import LOG_FILE, RunLog, check_wandb, console_logging, file_logging, git_commit, trim_metrics
from train.loop import DataStream, Progress, Trainer, TrainingError, plain_param
from train.loss import build_loss
from train.optim import (
    build_optimizer,
    check_optimizer,
    check_schedule,
    follow_schedule,
    keep_configured_rates,
    schedule_change,
)
from train.storage import RunStorage

logger = logging.getLogger(__name__)  # `log` in fit is the RunLog
SIGLIP_INIT = {"logit_scale": math.log(10), "logit_bias": -10.0}  # Zhai et al. 2023, sec. 3.1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with console_logging(main=rank_from_env() == 0):
        cfg = load_config(argv)
        name_run_dir(cfg, argv[0], world_size_from_env())
        if cfg.distill.stage == "both":
            return stages.run_both(cfg, argv)  # each stage a `python -m train` of its own
        preflight(cfg, world_size_from_env())
        return run_in_folder(cfg)


def run_in_folder(cfg: Config) -> int:
    """One run in its folder: its log lines also in RUN/out.log (rank 0), `run folder: PATH` at the start and after
    the done line, SIGTERM/SIGUSR1 meaning: checkpoint after the current step, exit 75."""
    storage, main_rank = RunStorage.from_config(cfg.train), rank_from_env() == 0
    if main_rank:
        storage.pull_run_files()  # a remote run's metrics, wandb id and log, before this launch adds to them
    stop = StopFlag()
    try:
        with file_logging(storage.local / LOG_FILE if main_rank else None):
            logger.info("run folder: %s", cfg.train.run_dir)
            code = fit(cfg, stop)
            logger.info("run folder: %s", cfg.train.run_dir)
            return code
    finally:
        stop.restore()


def cli(argv: list[str] | None = None) -> int:
    """main() as `python -m train` runs it: errors the user can fix are one line on stderr and exit code 1."""
    try:
        return main(argv)
    except (ConfigError, TrainingError, CheckpointError, DataError) as e:
        # one write of the whole line: the ranks of a job share stderr, and print's separate newline lets the lines of
        # two ranks run into one (the line is far below PIPE_BUF, so one write is not interleaved)
        sys.stderr.write(f"error: {e}\n")
        sys.stderr.flush()
        return 1


def fit(cfg: Config, stop: StopFlag) -> int:
    """Build everything from the config, resume if there is a checkpoint, train; returns the exit code."""
    accelerator = make_accelerator(cfg.train)
    data = build_data(cfg.data, cfg.model, cfg.train.augment, accelerator)
    model = build_model(cfg.model, cfg.train.loss, cfg.train.compile)
    objective = distill.objective(cfg, model, accelerator) if cfg.distill.teacher else None
    towers.lock_towers(model, cfg.optim)  # optim.lock_image / lock_text: requires_grad=False, no optimizer state
    sizes = summary(model)  # before sharding: whole-model parameter counts and GMACs
    trainable = towers.trainable_line(model)
    ema = weights_ema.make_ema(model, cfg.train, accelerator)  # before sharding: FSDP modules cannot be copied
    if accelerator.distributed_type.name == "FSDP":
        model = shard_model(model, cfg.train, accelerator.device.type)
    optimizer, schedule = build_optimizer(model, cfg.optim, cfg.train.max_steps)
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    stream, progress = DataStream(data, accelerator.device), Progress()
    storage = RunStorage.from_config(cfg.train)
    configured = [{k: g[k] for k in ("initial_lr", "weight_decay") if k in g} for g in optimizer.param_groups]
    folder = resume(cfg, accelerator, storage, stream, progress)
    weights_ema.resume(ema, accelerator.unwrap_model(model), folder, accelerator)
    keep_configured_rates(optimizer, schedule.scheduler, configured)
    follow_schedule(schedule.scheduler)
    log = start_run_dir(cfg, accelerator, storage, progress.step, sizes)
    if cfg.optim.lock_image or cfg.optim.lock_text:
        log.write(trainable)
    trainer = Trainer(
        accelerator,
        model,
        optimizer,
        schedule,
        build_loss(cfg.train.loss, siglip_exchange=cfg.train.siglip_exchange),
        stream,
        cfg.train,
        log,
        to_dict(cfg),
        clip_norm=cfg.optim.grad_clip_norm,
        evaluate=make_evaluator(cfg, accelerator, model, teacher=getattr(objective, "teacher", None), ema=ema),
        eval_every=cfg.eval.every,
        progress=progress,
        gmacs_per_sample=sizes["gmacs_per_sample"],
        objective=objective,
        max_skip_fraction=cfg.data.max_skip_fraction,
        ema=ema,
    )
    try:
        code = trainer.run(stop)
    except RuntimeError as e:  # a rank that hung or died: one line, not a gloo traceback
        line = collective_failure(e, cfg.train.dist_timeout_s)
        if line is None:
            raise
        raise TrainingError(line) from None
    if accelerator.is_main_process:
        storage.upload_run_files()  # the lines logged after the last checkpoint (final eval, skip summary)
        if code == 0:
            finish_uploads(cfg, storage)
    accelerator.end_training()
    return code


def finish_uploads(cfg: Config, storage: RunStorage) -> None:
    """A finished remote run whose staging folder still holds checkpoints the remote lacks (the last upload failed,
    or this is the rerun that its error line asked for): upload them now; if that fails too, the run ends in one
    line instead of exiting 0 with the final checkpoint only on this node."""
    pending = storage.pending() if storage.remote else []
    if not pending:
        return
    upload(storage, pending[0], cfg.train.keep_last, cfg.train.keep_steps)
    left = storage.pending()
    if left:
        raise TrainingError(
            f"the run finished, but {len(left)} checkpoint(s) are not on {storage.remote}: "
            f"{', '.join(p.name for p in reversed(left))} kept in {left[0].parent}; rerun the same command once the "
            "storage is reachable: it finds the run finished and uploads them"
        )


def preflight(cfg: Config, world_size: int) -> None:
    """Every check that needs no work: paths, batch split, wandb credentials. Raises ConfigError."""
    try:
        cfg.data.validate(world_size)
    except DataError as e:
        raise ConfigError(str(e)) from None
    if cfg.eval.val_shards:
        try:
            check_val_shards(cfg.eval.val_shards)
        except DataError as e:
            raise ConfigError(f"eval.val_shards: {e}") from None
    if cfg.eval.dataset and "://" not in cfg.eval.dataset and not Path(cfg.eval.dataset).exists():
        raise ConfigError(
            f"eval.dataset={cfg.eval.dataset} does not exist; point it at an ImageFolder tree or set eval.dataset=null"
        )
    if cfg.eval.smoothing and not (cfg.eval.dataset and Path(cfg.eval.dataset).is_dir()):
        raise ConfigError(
            f"eval.smoothing={cfg.eval.smoothing} measures on images of eval.dataset, which must be an ImageFolder "
            f"tree (it is {cfg.eval.dataset}); set eval.dataset to one or eval.smoothing=0"
        )
    if cfg.eval.retrieval:
        try:
            open_retrieval(cfg.eval.retrieval, lambda image: image, cfg.eval.retrieval_split)
        except EvalInputError as e:
            raise ConfigError(f"eval.retrieval: {e}; or set eval.retrieval=null") from None
    check_schedule(cfg.optim, cfg.train.max_steps)
    check_optimizer(cfg.optim)
    check_wandb(cfg.train.wandb)
    check_storage(cfg, world_size)


def check_storage(cfg: Config, world_size: int) -> None:
    """A remote train.run_dir must be reachable, and with several nodes its staging folder shared by all."""
    if not is_url(cfg.train.run_dir):
        return
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if local_world != world_size and not cfg.train.stage_dir:
        raise ConfigError(
            f"train.run_dir={cfg.train.run_dir} is remote and this job spans several nodes: set train.stage_dir to "
            "a folder every node sees (rank 0 uploads every rank's files from there)"
        )
    problem = RunStorage.of(cfg.train.run_dir, cfg.train.stage_dir).check_reachable()
    if problem:
        raise ConfigError(
            f"train.run_dir={cfg.train.run_dir} cannot be used ({problem}); check the URL, its fsspec package "
            "(s3fs for s3://) and the credentials"
        )


def build_data(data_cfg: DataConfig, model_cfg: ModelConfig, augment: bool, accelerator):
    """The train stream of this rank; a missing or bad shard spec is a ConfigError before any training."""
    try:
        train_transform, eval_transform = transforms(model_cfg)
    except ValueError as e:  # a size the patch does not divide, found first here: the data comes before the model
        raise ConfigError(f"model: {e}") from None
    # the same numbers, cheaper: uint8 from the workers, normalised on the device; repeated captions tokenized once
    per_sample, per_batch = split_normalise(train_transform if augment else eval_transform)
    try:
        return build_train_data(
            data_cfg,
            per_sample,
            CachedTokenizer(tokenizer(model_cfg), key=tokenizer_key(model_cfg)),
            rank=accelerator.process_index,
            world_size=accelerator.num_processes,
            batch_transform=per_batch,
        )
    except DataError as e:
        raise ConfigError(str(e)) from None


def build_model(model_cfg: ModelConfig, loss: str, compile: bool) -> nn.Module:
    """The CLIP of the model section; SigLIP adds a learnable logit bias and starts from its own temperature."""
    try:
        model = build_clip(model_cfg)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    if loss == "siglip":
        with torch.no_grad():
            model.logit_scale.fill_(SIGLIP_INIT["logit_scale"])
        model.logit_bias = nn.Parameter(torch.full((1,), SIGLIP_INIT["logit_bias"]))  # [1]: see models.CLIP
    if compile:
        model.compile()  # in place: state-dict keys stay those of the plain model, so checkpoints move freely
    return model


def resume(cfg: Config, accelerator, storage: RunStorage, stream: DataStream, progress: Progress) -> Path | None:
    """Load the checkpoint train.resume names (auto: the newest complete one in the run directory), else the
    train.branch_from checkpoint of another run; returns its folder (None: a fresh start)."""
    folder, branching = starting_point(cfg, storage, accelerator)
    if folder is None:
        return None
    # how the weights were first loaded is not the model; a field newer than the checkpoint has its default there
    loading = ("pretrained", "text_pos_keep", "pretrained_fresh")
    saved_all = read_meta(folder)["config"]
    saved = {**to_dict(ModelConfig()), **saved_all["model"]}
    saved = {k: v for k, v in saved.items() if k not in loading}
    wanted = {k: v for k, v in to_dict(cfg)["model"].items() if k not in loading}
    if saved != wanted:
        changed = ", ".join(
            f"model.{k}={saved.get(k)!r} there" for k in sorted(wanted) if saved.get(k) != wanted.get(k)
        )
        raise ConfigError(
            f"{folder} holds another model ({changed}); pick a new train.run_dir or set train.resume=none"
        )
    try:
        meta, data_state = load_checkpoint(accelerator, folder)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    progress.step, progress.samples_seen, progress.bad_steps = (
        meta["step"],
        meta["samples_seen"],
        meta.get("bad_steps", 0),
    )
    progress.eval_pending = bool(meta.get("eval_pending")) and not branching  # deferred by a pre-emption
    stream.load_state_dict(data_state)
    if accelerator.is_main_process:
        verb = "branched" if branching else "resumed"
        logger.info("%s from %s at step %d (%d samples seen)", verb, folder, progress.step, progress.samples_seen)
        change = None if branching else schedule_change(saved_all, cfg.optim, cfg.train.max_steps, progress.step)
        if change:
            logger.warning(change.removeprefix("warning: "))
    return folder


def start_run_dir(cfg: Config, accelerator, storage: RunStorage, step: int, sizes: dict) -> RunLog:
    """RUN/config.yaml, RUN/summary.json (models.summary: parameters, GMACs per sample, attentions),
    RUN/git_commit.txt, metrics.jsonl trimmed to the resumed step, and the run's log."""
    run_dir = storage.local
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / run_folder.CONFIG).write_text(dump(cfg))
        (run_dir / run_folder.SUMMARY).write_text(json.dumps(sizes, indent=1) + "\n")
        (run_dir / run_folder.GIT_COMMIT).write_text(git_commit() + "\n")
        trim_metrics(run_dir / run_folder.METRICS, step)
        storage.upload_run_files()
    accelerator.wait_for_everyone()
    return RunLog(
        run_dir,
        to_dict(cfg),
        main=accelerator.is_main_process,
        wandb_mode=cfg.train.wandb,
        project=cfg.train.wandb_project,
        name=cfg.train.wandb_name,
        total_steps=cfg.train.max_steps,
        start_step=step,
        progress=cfg.train.progress,
    )


def make_evaluator(cfg: Config, accelerator, model: nn.Module, teacher: nn.Module | None = None, ema=None):
    """A callable returning {"val_loss": ..., "zeroshot/top1": ..., "retrieval/...": ...} on rank 0 ({} on the
    others), called on every rank; None without eval.dataset, eval.val_shards and eval.retrieval. With a distillation
    teacher, its zero-shot results (computed at the first evaluation, once) are logged beside the student's as
    teacher/zeroshot/*; with an EMA of the weights (train.ema), its results as ema/val_loss, ema/zeroshot/* and
    ema/retrieval/*."""
    zeroshot, val = make_zeroshot(cfg, accelerator, model), make_val_loss(cfg, accelerator, model)
    retrieval, smoothing = make_retrieval(cfg, accelerator, model), make_smoothing(cfg, accelerator, model)
    if zeroshot is None and val is None and retrieval is None:
        return None
    ema_eval = make_ema_evaluator(cfg, accelerator, ema) if ema is not None else None
    teacher_zeroshot = make_zeroshot(cfg, accelerator, teacher, net_of=lambda: teacher) if teacher else None
    teacher_results: dict = {}
    teacher_done = False

    def run() -> dict:
        nonlocal teacher_done
        results = val() if val is not None else {}
        results.update(zeroshot() if zeroshot is not None else {})
        results.update(retrieval() if retrieval is not None else {})
        results.update(smoothing() if smoothing is not None else {})
        if teacher_zeroshot is not None and not teacher_done:  # every rank takes part (sharded eval), once
            teacher_results.update({f"teacher/{k}": v for k, v in teacher_zeroshot().items()})
            teacher_done = True
        results.update(teacher_results)
        results.update(ema_eval() if ema_eval is not None else {})
        return results if accelerator.is_main_process else {}

    return run


def make_ema_evaluator(cfg: Config, accelerator, ema):
    """A callable returning {"ema/val_loss": ..., "ema/zeroshot/top1": ...} of the EMA of the weights, evaluated as
    the weights are; its plain CLIP (train/ema.py's eval_net) is made once per evaluation, on every rank."""
    held: list[nn.Module] = []
    makers = (make_val_loss, make_zeroshot, make_retrieval)
    evals = [e for e in (make(cfg, accelerator, None, net_of=lambda: held[0]) for make in makers) if e is not None]

    def run() -> dict:
        held.append(weights_ema.eval_net(ema, accelerator, cfg.model))
        try:
            results = {k: v for evaluate_one in evals for k, v in evaluate_one().items()}
        finally:
            held.clear()
        return {f"ema/{k}": v for k, v in results.items()}

    return run


def make_val_loss(cfg: Config, accelerator, model: nn.Module, net_of=None):
    """A callable returning {"val_loss": ...} on every rank (eval/val_loss.py), or None without eval.val_shards.
    net_of: returns the module to evaluate (else the unwrapped `model`)."""
    if not cfg.eval.val_shards:
        return None
    _, eval_transform = transforms(cfg.model)
    tok, loss_fn = tokenizer(cfg.model), build_loss(cfg.train.loss, gather=False)
    replay = Replay(cfg.eval.cache_mb)

    def run() -> dict:
        net = net_of() if net_of is not None else accelerator.unwrap_model(model)
        loss = validation_loss(
            net,
            cfg.eval.val_shards,
            loss_fn,
            batch_size=cfg.eval.batch_size,
            image_transform=eval_transform,
            tokenizer=tok,
            device=accelerator.device,
            logit_bias=plain_param(getattr(net, "logit_bias", None)),
            replay=replay,
        )
        return {"val_loss": loss}

    return run


def make_retrieval(cfg: Config, accelerator, model: nn.Module, net_of=None):
    """A callable returning {"retrieval/text_to_image_R@1": ...} on rank 0 ({} on the others), or None without
    eval.retrieval: recall@k both ways (eval/retrieval.py), each rank embedding its slice of the pairs."""
    if not cfg.eval.retrieval:
        return None
    _, eval_transform = transforms(cfg.model)
    tok, shard = tokenizer(cfg.model), Shard(accelerator.process_index, accelerator.num_processes)
    pairs = open_retrieval(cfg.eval.retrieval, eval_transform, cfg.eval.retrieval_split)

    def run() -> dict:
        net = net_of() if net_of is not None else eval_model(accelerator, model, cfg.model)
        with random_state_kept(accelerator.device):  # as zero-shot: a resumed run must not diverge
            out = evaluate_pairs(
                net,
                pairs,
                tok,
                batch_size=cfg.eval.batch_size,
                device=accelerator.device,
                workers=cfg.eval.workers,
                shard=shard,
            )
        return {f"retrieval/{k}": v for k, v in out.items() if "_R@" in k} if accelerator.is_main_process else {}

    return run


def make_smoothing(cfg: Config, accelerator, model: nn.Module):
    """A callable returning {"smoothing/layer<i>": ...} on rank 0 ({} on the others): each image-tower layer's kept
    share of token spread (eval/smoothing.py) on eval.smoothing images of eval.dataset; None when it is 0."""
    if not cfg.eval.smoothing or not cfg.eval.dataset:
        return None
    _, eval_transform = transforms(cfg.model)
    images = sample_images(Path(cfg.eval.dataset), eval_transform, cfg.eval.smoothing)

    def run() -> dict:
        net = eval_model(accelerator, model, cfg.model)  # every rank: under FSDP the full copy is gathered
        if not accelerator.is_main_process:
            return {}
        was_training = net.training
        net.eval()
        with random_state_kept(accelerator.device):
            kept = kept_per_layer(net, images.to(accelerator.device))
        net.train(was_training)
        return {f"smoothing/layer{i + 1}": k for i, k in enumerate(kept)}

    return run


def make_zeroshot(cfg: Config, accelerator, model: nn.Module, net_of=None):
    """A callable returning {"zeroshot/top1": ...} on rank 0 ({} on the others), or None without eval.dataset.

    Every rank scores its slice of the images and the counts are summed over the ranks (eval.sharding), which gives
    the numbers of one process evaluating everything.
    """
    if not cfg.eval.dataset:
        return None
    _, eval_transform = transforms(cfg.model)
    tok = tokenizer(cfg.model)
    shard = Shard(accelerator.process_index, accelerator.num_processes)
    replay = Replay(cfg.eval.cache_mb)

    def run() -> dict:
        net = net_of() if net_of is not None else eval_model(accelerator, model, cfg.model)
        was_training = net.training
        net.eval()
        # the eval must not move the training RNG, or a resumed run would diverge from an uninterrupted one
        with random_state_kept(accelerator.device):
            out = evaluate(
                net,
                dataset=cfg.eval.dataset,
                tokenizer=tok,
                transform=eval_transform,
                classnames=cfg.eval.classnames,
                templates=cfg.eval.templates,
                batch_size=cfg.eval.batch_size,
                device=accelerator.device,
                workers=cfg.eval.workers,
                shard=shard,
                replay=replay,
                fewshot={"shots": cfg.eval.fewshot, "draws": cfg.eval.fewshot_draws} if cfg.eval.fewshot else None,
            )
        net.train(was_training)
        if not accelerator.is_main_process:
            return {}
        probes = {f"fewshot/{k}shot": v for k, v in out.get("fewshot", {}).items()}
        return {**{f"zeroshot/{k}": v for k, v in out.items() if isinstance(v, (int, float))}, **probes}

    return run


def eval_model(accelerator, model: nn.Module, model_cfg: ModelConfig) -> nn.Module:
    """The plain CLIP each rank evaluates: the unwrapped model, or under FSDP a full copy gathered from the shards."""
    if accelerator.distributed_type.name != "FSDP":
        return accelerator.unwrap_model(model)
    return full_copy(model, model_cfg, accelerator.device)


def full_copy(model: nn.Module, model_cfg: ModelConfig, device) -> nn.Module:
    """A plain CLIP holding the full weights of a model sharded with fully_shard, on every rank (all must call it)."""
    # imported here: torch.distributed.checkpoint costs a process ~1 s to import, and only FSDP runs come here
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # without cpu_offload every rank receives the full tensors (with it, only rank 0 would)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    full = build_clip(model_cfg).to(device)
    full.load_state_dict({k: v for k, v in state.items() if k != "logit_bias"})
    return full
