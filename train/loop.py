"""The training loop: one optimizer step per iteration, over a contrastive loss of the whole (accumulated) batch.

A step: draw `accum_freq` micro-batches, compute gradients (`compute_gradients`) and their norm (clipped when
configured), agree over all ranks on the loss, the norm and whether a pre-emption signal arrived, then take
the optimizer step (or skip it), step the schedule, clamp the logit scale, log, evaluate and checkpoint as
configured. That agreement is the step's only host synchronisation: the GPU never waits for Python between
logging steps (fp16's gradient scaler adds its own check of the gradients).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import Tensor, nn

from data.errors import skip_limit_problem
from models import run_folder
from train import ema as weights_ema
from train.checkpoint import CheckpointWriteError, save_checkpoint
from train.config import TrainConfig
from train.dist import (
    StopFlag,
    agree,
    mean_over_ranks,
    patient_collectives,
    set_collective_timeout,
    sum_over_ranks,
)
from train.log import RunLog
from train.metrics import Throughput
from train.optim import clamp_logit_scale
from train.storage import RunStorage

PREEMPTED = 75  # exit code after a pre-emption checkpoint; the Slurm wrapper requeues on it
EVAL_SHOWN = ("val_loss", "zeroshot/top1", "zeroshot/top5", "ema/val_loss", "ema/zeroshot/top1")  # in its line


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. too many non-finite steps); `python -m train` prints it and exits with 1."""


@dataclass
class Progress:
    """Where the run is; saved in every checkpoint's meta.json."""

    step: int = 0
    samples_seen: int = 0
    bad_steps: int = 0  # non-finite steps skipped so far
    consecutive_bad: int = 0
    eval_pending: bool = False  # the evaluation of `step` was deferred by a pre-emption: it runs first on resume


class DataStream:
    """Endless micro-batches from `build_train_data`'s result, epoch after epoch, moved to the device (and there
    through the data's batch_transform, if it has one)."""

    def __init__(self, data, device: torch.device, epoch: int = 0):
        self.data, self.device, self.epoch = data, device, epoch
        self.iterator = None

    def next(self) -> tuple[Tensor, Tensor]:
        """-> (images [b, 3, H, W], tokens [b, L]) of this rank."""
        while True:
            if self.iterator is None:
                self.data.set_epoch(self.epoch)
                self.iterator = iter(self.data.loader)
            try:
                images, tokens = next(self.iterator)
                images = images.to(self.device, non_blocking=True)
                finish = getattr(self.data, "batch_transform", None)  # e.g. uint8 -> normalised float
                return images if finish is None else finish(images), tokens.to(self.device, non_blocking=True)
            except StopIteration:
                self.iterator, self.epoch = None, self.epoch + 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "stream": self.data.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self.data.load_state_dict(state["stream"])


def truncation(captions: dict[str, int]) -> dict:
    """Metrics of the captions cut to the context length so far: their count and their fraction of all captions."""
    if not captions:
        return {}
    seen, cut = captions.get("seen", 0), captions.get("truncated", 0)
    return {"captions_truncated": cut, "captions_truncated_fraction": cut / seen if seen else 0.0}


def plain_param(p: Tensor | None) -> Tensor | None:
    """A parameter as an ordinary tensor, also when FSDP holds it as a sharded DTensor (gathered with grad)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def compute_gradients(
    accelerator: Accelerator,
    model: nn.Module,
    loss_fn: nn.Module,
    micro_batches: list,
    *,
    logit_bias: Tensor | None = None,
) -> Tensor:
    """Backward of the contrastive loss over all micro-batches together; returns the loss (detached).

    With several micro-batches (open_clip's --accum-freq): first the features of every micro-batch without
    gradients, then each micro-batch again with gradients, scored against the cached features of the others.
    The gradients sum to those of one batch of the combined size. The logit scale and bias take part with
    gradients in the last pass only (the one that syncs across ranks), so they are counted once.
    """
    cached = None
    if len(micro_batches) > 1:
        with torch.no_grad():
            cached = [model(images, tokens)[:2] for images, tokens in micro_batches]
    for j, (images, tokens) in enumerate(micro_batches):
        last = j == len(micro_batches) - 1
        with nullcontext() if last else accelerator.no_sync(model):
            image_features, text_features, scale = model(images, tokens)
            bias = plain_param(logit_bias)
            if not last:
                scale, bias = scale.detach(), None if bias is None else bias.detach()
            if cached is not None:
                image_features = torch.cat(
                    [c[0] for c in cached[:j]] + [image_features] + [c[0] for c in cached[j + 1 :]]
                )
                text_features = torch.cat(
                    [c[1] for c in cached[:j]] + [text_features] + [c[1] for c in cached[j + 1 :]]
                )
            loss = loss_fn(image_features, text_features, scale, bias)
            accelerator.backward(loss)
    return loss.detach()


def objective_gradients(
    accelerator: Accelerator, model: nn.Module, objective, micro_batches: list
) -> tuple[Tensor, dict[str, float]]:
    """Backward of `objective(model, images, tokens)` (a per-sample mean, e.g. train/distill.py's attention
    transfer) averaged over the micro-batches; returns it (detached) and the mean of the objective's `terms`
    (those of a composite loss, this rank's) over the micro-batches."""
    total, terms = 0.0, {}
    for j, (images, tokens) in enumerate(micro_batches):
        with nullcontext() if j == len(micro_batches) - 1 else accelerator.no_sync(model):
            loss = objective(model, images, tokens) / len(micro_batches)
            accelerator.backward(loss)
        total = total + loss.detach()
        for k, v in getattr(objective, "terms", {}).items():
            terms[k] = terms.get(k, 0.0) + v / len(micro_batches)
    return total, terms


def clip_gradients(accelerator: Accelerator, model: nn.Module, clip_norm: float | None) -> Tensor:
    """The global gradient norm as a device tensor (read later, with the loss); gradients scaled to clip_norm.
    Without clip_norm (and outside FSDP/DeepSpeed, whose norms span shards) only the norm: torch's clip_grad_norm_
    computes it the same way, then multiplies every gradient by 1."""
    if clip_norm or accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return accelerator.clip_grad_norm_(model.parameters(), clip_norm if clip_norm else math.inf)
    accelerator.unscale_gradients()
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])


def should_step(accelerator: Accelerator, loss: float, grad_norm: float) -> bool:
    """Step unless the loss or the gradient norm is non-finite.

    Under fp16 a non-finite norm is the gradient scaler's business: it skips the step and lowers the scale.
    """
    return math.isfinite(loss) and (math.isfinite(grad_norm) or accelerator.scaler is not None)


def close_skipped_step(accelerator: Accelerator) -> None:
    """A step not taken (a non-finite loss): under fp16 the gradient scaler, whose unscale_ ran in clip_gradients,
    still ends its step with update() (the optimizer's step would have), or its next unscale_ raises."""
    if accelerator.scaler is not None:
        accelerator.scaler.update()


@dataclass
class Trainer:
    """Everything the loop touches; built by train.main."""

    accelerator: Accelerator
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    loss_fn: nn.Module
    stream: DataStream
    cfg: TrainConfig
    log: RunLog
    config_dict: dict  # the resolved config, stored in every checkpoint
    clip_norm: float | None = None
    evaluate: Callable[[], dict] | None = None  # zero-shot results (on rank 0; {} elsewhere)
    eval_every: int = 0
    progress: Progress = field(default_factory=Progress)
    gmacs_per_sample: float | None = None  # the model's forward MACs per sample, for TFLOP/s
    throughput: Throughput | None = None  # started by run()
    objective: Callable | None = None  # objective(model, images, tokens) -> loss in place of the contrastive loss
    terms: dict[str, float] = field(default_factory=dict)  # the objective's terms of the last step, this rank's
    max_skip_fraction: float | None = None  # data.max_skip_fraction, checked at every logging step
    ema: nn.Module | None = None  # timm's ModelEmaV3 of the weights (train/ema.py), updated after optimizer steps
    failed_saves: int = 0  # periodic checkpoints the storage refused in a row (train.max_failed_saves)

    def run(self, stop: StopFlag) -> int:
        """Train to cfg.max_steps; returns the exit code (0 done, 75 pre-empted). An evaluation that a pre-emption
        deferred (see `step`) runs first, at the step it was due. From here on a collective waits train.dist_timeout_s
        at most, except inside checkpoint writes and evaluations."""
        set_collective_timeout(self.accelerator, self.cfg.dist_timeout_s)
        if self.progress.eval_pending and self.evaluate is not None:
            self.run_eval()
        self.progress.eval_pending = False
        if self.progress.step >= self.cfg.max_steps:
            self.message(
                f"nothing to do: the run is at step {self.progress.step} of train.max_steps={self.cfg.max_steps}"
            )
            self.log.close()
            return 0
        acc = self.accelerator
        self.throughput = Throughput(acc.num_processes, acc.device, self.gmacs_per_sample, self.progress.samples_seen)
        try:
            while self.progress.step < self.cfg.max_steps:
                if self.step(stop):
                    self.message(
                        f"signal {stop.signal} received: checkpoint at step {self.progress.step}, "
                        f"exiting with {PREEMPTED} to be requeued"
                    )
                    self.save()
                    self.summarise("preempted")
                    return PREEMPTED
            if not self.checkpoint_due() or self.failed_saves:  # the final checkpoint: a refusal stops the run
                self.save()
            if self.evaluate is not None and not self.due(self.eval_every):
                self.run_eval()
            self.summarise("done")
            return 0
        finally:
            self.log.close()

    def due(self, every: int) -> bool:
        """Whether something done every `every` steps (0 = never) falls on the current step."""
        return every > 0 and self.progress.step % every == 0

    def checkpoint_due(self) -> bool:
        """Every train.save_every steps, and at each of train.keep_steps."""
        return self.due(self.cfg.save_every) or self.progress.step in self.cfg.keep_steps

    def step(self, stop: StopFlag) -> bool:
        """One optimizer step with logging, eval and checkpoints; returns whether all ranks must stop now.

        The stop flag is read after the backward pass, so a signal during a step stops the run at that step. An
        evaluation due at that step is not run then: the pre-emption checkpoint (written by `run`) must fit in the
        signal's grace time, and an evaluation may not. The checkpoint records it as pending and the resumed run
        evaluates first, at this step, the weights it would have seen (evaluation leaves the training RNG alone)."""
        acc, p, cfg = self.accelerator, self.progress, self.cfg
        start = time.perf_counter()
        batches = [self.stream.next() for _ in range(cfg.accum_freq)]
        data_wait = time.perf_counter() - start
        self.optimizer.zero_grad(set_to_none=True)
        bias = getattr(acc.unwrap_model(self.model), "logit_bias", None)
        if self.objective is not None:
            loss, self.terms = objective_gradients(acc, self.model, self.objective, batches)
        else:
            loss = compute_gradients(acc, self.model, self.loss_fn, batches, logit_bias=bias)
        grad_norm = clip_gradients(acc, self.model, self.clip_norm)
        loss, grad_norm, stop_now = agree(acc, loss, grad_norm, stop.requested)
        bad = not should_step(acc, loss, grad_norm)
        if not bad:
            self.optimizer.step()
        else:
            close_skipped_step(acc)
        lr = self.schedule.get_last_lr()[0]
        self.schedule.step()
        clamp_logit_scale(acc.unwrap_model(self.model))
        p.step += 1
        if self.ema is not None and not bad:
            weights_ema.update(self.ema, acc.unwrap_model(self.model), p.step, self.cfg.ema.every)
        step_samples = sum(len(images) for images, _ in batches) * acc.num_processes
        p.samples_seen += step_samples
        self.count_bad(bad, loss, grad_norm)
        self.report(loss, lr, grad_norm, data_wait)
        last = p.step >= cfg.max_steps  # stopped there, the run's final evaluation is deferred too
        if self.evaluate is not None and (self.due(self.eval_every) or (last and stop_now)):
            if stop_now:
                p.eval_pending = True
                self.message(f"step {p.step}: evaluation deferred by the stop signal: it runs when the run resumes")
            else:
                self.run_eval()
        if self.checkpoint_due() and not stop_now:
            self.save_or_train_on()
        if self.due(self.eval_every) or self.due(cfg.save_every):
            self.throughput.restart(p.samples_seen)  # the speed figures are of training alone
        return stop_now

    def count_bad(self, bad: bool, loss: float, grad_norm: float) -> None:
        """Count a skipped step; too many in a row stop the run."""
        p = self.progress
        if not bad:
            p.consecutive_bad = 0
            return
        p.bad_steps += 1
        p.consecutive_bad += 1
        self.message(
            f"warning: step {p.step}: non-finite loss {loss} or gradient norm {grad_norm}, "
            f"optimizer step skipped ({p.consecutive_bad} in a row)"
        )
        if p.consecutive_bad >= self.cfg.max_bad_steps:
            raise TrainingError(
                f"stopped at step {p.step}: {p.consecutive_bad} consecutive steps with a non-finite loss or gradient "
                f"(train.max_bad_steps={self.cfg.max_bad_steps}); "
                "lower optim.lr, set optim.grad_clip_norm, or use train.precision=fp32"
            )

    def report(self, loss: float, lr: float, grad_norm: float, data_wait: float) -> None:
        """Progress bar every step (its speed figures from the last logging step); metrics.jsonl and wandb every
        log_every steps and at the last step, where the skipped samples of all ranks are held against
        data.max_skip_fraction (every rank sees the same sums, so all stop together)."""
        p, acc = self.progress, self.accelerator
        logging_step = self.due(max(1, self.cfg.log_every)) or p.step == self.cfg.max_steps
        speed = self.throughput.measure(p.samples_seen) if logging_step else self.throughput.last
        self.log.progress(1, loss=loss, lr=lr, **self.throughput.short())
        if not logging_step:
            return
        skipped = sum_over_ranks(acc, self.stream.data.skipped())
        captions = sum_over_ranks(acc, getattr(self.stream.data, "captions", {}))
        scale = float(plain_param(acc.unwrap_model(self.model).logit_scale).detach().exp())
        self.log.log(
            {
                "step": p.step,
                "samples_seen": p.samples_seen,
                "loss": loss,
                "lr": lr,
                "logit_scale": scale,
                **speed,
                "data_wait_s": data_wait,
                "grad_norm": grad_norm,
                "bad_steps": p.bad_steps,
                "skipped": skipped,
                **truncation(captions),
                "time": time.time(),
                **mean_over_ranks(acc, self.terms),  # each term of a composite objective (train/distill.py)
            }
        )
        problem = skip_limit_problem(skipped, p.samples_seen, self.max_skip_fraction)
        if problem:
            raise TrainingError(f"stopped at step {p.step}: {problem}")

    def summarise(self, end: str) -> None:
        """The end-of-run line of skipped samples by cause (all ranks, whole run): on stderr and last in
        metrics.jsonl. Call on every rank."""
        p = self.progress
        skipped = sum_over_ranks(self.accelerator, self.stream.data.skipped())
        captions = sum_over_ranks(self.accelerator, getattr(self.stream.data, "captions", {}))
        total = sum(skipped.values())
        causes = ", ".join(f"{cause} {n}" for cause, n in sorted(skipped.items()) if n)
        cut = captions.get("truncated", 0)
        self.message(
            f"{end} at step {p.step} ({p.samples_seen} samples): skipped samples: "
            + (f"{total} ({causes})" if total else "none")
            + (
                f"; captions cut to the context length: {cut} of {captions['seen']} "
                f"({100 * cut / captions['seen']:.1f}%)"
                if cut
                else ""
            )
        )
        self.log.log(
            {
                "step": p.step,
                "samples_seen": p.samples_seen,
                "end": end,
                "skipped": skipped,
                "skipped_total": total,
                **truncation(captions),
            }
        )

    def run_eval(self) -> None:
        with patient_collectives(self.accelerator, self.cfg.dist_timeout_s):
            results = self.evaluate()
        if results:
            self.log.log({"step": self.progress.step, "samples_seen": self.progress.samples_seen, **results})
            self.message(
                f"step {self.progress.step}: " + ", ".join(f"{k}={results[k]:.4f}" for k in EVAL_SHOWN if k in results)
            )

    def save_or_train_on(self) -> None:
        """A periodic checkpoint; storage that refuses it stops the run unless train.max_failed_saves allows more
        failures in a row (then one line per failure, and the next save tries again)."""
        try:
            self.save()
            self.failed_saves = 0
        except CheckpointWriteError as e:  # raised on every rank alike
            self.failed_saves += 1
            if self.failed_saves >= self.cfg.max_failed_saves:
                raise
            self.message(
                f"warning: {e}; training on, the next checkpoint tries again ({self.failed_saves} of "
                f"train.max_failed_saves={self.cfg.max_failed_saves} failed in a row)"
            )

    def save(self) -> Path:
        p = self.progress
        meta = {
            "step": p.step,
            "samples_seen": p.samples_seen,
            "epoch": self.stream.epoch,
            "bad_steps": p.bad_steps,
            "eval_pending": p.eval_pending,
            "config": self.config_dict,
        }
        storage = RunStorage.from_config(self.cfg)
        with patient_collectives(self.accelerator, self.cfg.dist_timeout_s):
            ema = {} if self.ema is None else {run_folder.EMA: weights_ema.state_dict(self.ema, self.accelerator)}
            return save_checkpoint(
                self.accelerator,
                self.model,
                storage,
                meta,
                self.stream.state_dict(),
                self.cfg.keep_last,
                self.cfg.keep_steps,
                weights=ema,
            )

    def message(self, text: str) -> None:
        """A line for the user on rank 0 (through the progress bar when there is one)."""
        self.log.write(text)
