"""Training and evaluation of a recipe through accelerate (CPU, one GPU, many GPUs under `accelerate launch`).

Every batch is a dict (`zoo.data.collate_for`: `{"image", "label"}`, or the 1-D sets' `tokens` or `values`, `mask`
and targets, padded); the model kind (`zoo.kinds`) builds the model and says which keys it reads, the task
(`zoo.tasks`) which key holds the targets, the loss, the metrics and the validation score that picks the best
checkpoint. The attention's `auxiliary_loss` is added to the task's loss.

A run directory holds `recipe.yaml` (the resolved recipe), `metrics.jsonl` (one JSON object per evaluation, its
`epoch` numbered as the progress bar numbers it: an evaluation after part of an epoch counts that epoch),
`checkpoints/last` and `checkpoints/best` (accelerate state: model, optimizer, RNG, train state; best by the
task's validation score, or the last evaluation's under `train.validate: false`, which reads no validation split),
`train_summary.json` (with the step times: `first_step_s`, the run's first step, which compiles under
`train.compile`; `step_s`, the mean of the others; `compile_s`, their difference under `train.compile`), and with
`train.log_with: tensorboard` TensorBoard's files in `logs/` (any `train.log_with` tracker gets the evaluations and,
every `train.log_every_steps`, the loss, learning rate and samples/s; samples/s counts the steps after the run's
first, which compiles and warms up). A checkpoint is written to a temporary directory and renamed into place, so a
crash never leaves a partial checkpoint where a good one was. The first SIGINT or SIGTERM finishes the current step,
writes `checkpoints/last` and raises `TrainingInterrupted` (`zoo.train._interrupt`); a resumed run ends with the bytes
of an uninterrupted one (each loader draws from a generator of its own, `zoo.splits.seed_loader`, never from the one
the model's drop path draws from). A run's first lines say how it runs and which habits are on
(`zoo.train._announce`); each evaluation record names the weights it scored (`weights`: raw or ema; under
`train.ema` the other weights' scores as `<raw|ema>_val_*`).

The splits and their loaders come from `zoo.splits`, the evaluation loop from `zoo.train.eval_loop`, what a run
reports (tracker, progress bar, `metrics.jsonl`) from `zoo.train._tracking`, `train.compile` (torch.compile through
accelerate, checkpoints under the plain model's keys) from `zoo.train._compile`. What a run optimises is an objective
(`zoo.train._objective`): the task's loss by default; self-pretraining and the conversion stages are runs of this class
with their own objective and model, and nothing else of theirs. What runs before a recipe's Trainer (its
self-pretraining) is composed above it, in `zoo.train.stages`: the constructor only builds the run's parts.

What a subclass or a tool may override or call besides `fit()` (the rest is private): `create_scheduler()` (the
learning-rate schedule, called once by the constructor), `train_batch(batch)` (one forward/backward, and the optimizer
step once its batches are in), `train_epoch()` (one epoch of `train_batch`), `save(which)` (write a checkpoint) and
`restore()` (load the checkpoint a resumed run continues from).
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import shutil
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from timm.optim import create_optimizer_v2
from torch import Tensor, nn

from .._validate import first_line
from ..attention import on_optimizer_step
from ..config import Recipe, save_recipe
from ..hub.checkpoints import (
    CheckpointError,
    check_checkpoint_weights,
    find_checkpoint,
    model_identity,
    read_manifest,
    replace_dir,
    usable_checkpoint,
    write_manifest,
)
from ..hub.runs import copy_run_files, write_description
from ..splits import build_loader, seed_loader
from ._announce import run_lines, scored_weights
from ._compile import StepTimes, plain_state_dict_keys
from ._ema import ModelEma
from ._interrupt import StopSignals, TrainingInterrupted
from ._mixup import training_objective
from ._objective import Objective
from ._schedule import build_scheduler
from ._stopping import early_stop_reason
from ._tracking import flat_config, log_eval, log_step, progress_bar
from .distributed import (
    is_sharded,
    local_shard,
    raise_if_diverged,
    replica_mismatches,
    save_checkpoint,
    sync_buffers,
)
from .eval_loop import evaluate_loader
from .parts import RunParts, build_parts

__all__ = ["NonFiniteError", "TrainState", "Trainer", "TrainingInterrupted", "nonfinite_batches", "resume_from"]

_logger = logging.getLogger(__name__)


class NonFiniteError(ValueError):
    """A loss or weights that are NaN or infinite: the run stops rather than train or save nonsense."""


@dataclass
class TrainState:
    """Progress that a checkpoint restores: optimizer steps, finished epochs, batches into this epoch, batches
    skipped for a non-finite loss (train.skip_nonfinite)."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_metric: float = -math.inf
    skipped_batches: int = 0
    # train.pretrain ran (once, before step 0): a resumed run never pretrains again
    pretrained: bool = False
    # evaluations in a row that did not beat best_metric (train.early_stopping)
    evals_since_best: int = 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def nonfinite_batches(accelerator: Accelerator, seen: Tensor) -> int:
    """The most non-finite losses any process counted in the step that just ended (`seen[0]`, on the device): the
    one host sync of the step's check. Every process gets the same number, so every process skips the step or none
    does (a gather, where an all-reduce sum would count a batch once per process)."""
    counts = accelerator.gather(seen[:1]) if accelerator.num_processes > 1 else seen[:1]
    return int(counts.max())


def resume_from(resume: bool | str) -> str | None:
    """The checkpoint `resume` names: None (start afresh), `last` (True) or `best`."""
    if resume is True:
        return "last"
    if resume is False or resume is None:
        return None
    if resume not in ("last", "best"):
        raise ValueError(f"resume must be True, False, 'last' or 'best', got {resume!r}")
    return resume


def _too_few_samples(recipe: Recipe, samples: int, processes: int) -> str:
    """Why no training step fits in an epoch, and the largest batch size that would."""
    data, accum = recipe.data, recipe.train.grad_accum_steps
    largest = samples // (accum * processes)
    fix = f"lower data.batch_size to at most {largest}" if largest else "add training samples"
    return (
        f"dataset {data.name!r} has {samples} training samples, fewer than one step takes (data.batch_size "
        f"{data.batch_size} x train.grad_accum_steps {accum} x {processes} processes; incomplete batches are "
        f"dropped): {fix}"
    )


class Trainer:
    """Trains `recipe` into `run_dir`; `fit()` returns the last evaluation.

    The constructor builds and prepares the run's parts and trains nothing; a recipe with `train.pretrain` is trained
    through `zoo.train.stages.train`, which pretrains the model first. Its public steps (see the module docstring):
    `create_scheduler`, `train_batch`, `train_epoch`, `save`, `restore`.
    """

    def __init__(
        self,
        recipe: Recipe,
        run_dir: Path,
        *,
        resume: bool | str = False,
        model: nn.Module | None = None,
        objective: Objective | None = None,
        parts: RunParts | None = None,
        pretrained: bool = False,
    ) -> None:
        """`resume`: False, True (from `checkpoints/last`) or the checkpoint to continue from, `last` or `best`.
        `model`: the model to train in place (default: the one the recipe builds); `objective`: its loss and the module
        that trains (default: the task's loss on the model, `zoo.train._objective`). `parts`: the run's parts built
        already (`zoo.train.parts.build_parts`), in place of `model`; `pretrained`: their model was pretrained on
        `train.pretrain`'s objective (`zoo.train.stages`), which the run's checkpoints record."""
        self.recipe, self.run_dir = recipe, Path(run_dir)
        self.resume = resume_from(resume)
        cfg = recipe.train
        if cfg.pretrain is not None and not self.resume and not pretrained:
            raise ValueError(
                f"recipe {recipe.name!r} asks for train.pretrain, which runs before the Trainer: train it with "
                "zoo.train.stages.train (tools/train.py), or pass the pretrained model's parts with pretrained=True"
            )
        if parts is not None and model is not None:
            raise TypeError("Trainer takes a model or the run's parts (which hold the model), not both")
        parts = build_parts(recipe, self.run_dir, model) if parts is None else parts
        self.accelerator, self.kind, self.task = parts.accelerator, parts.kind, parts.task
        self.num_classes = self.task.num_outputs(parts.sizes)
        self.objective = objective or training_objective(self.kind, self.task, cfg, self.num_classes)
        self.description = parts.description
        self.threads = parts.threads
        module = self.objective.module(parts.model)
        optimizer = create_optimizer_v2(
            module,
            opt=recipe.optim.name,
            lr=recipe.optim.lr,
            weight_decay=recipe.optim.weight_decay,
            layer_decay=recipe.optim.layer_decay,
            betas=tuple(recipe.optim.betas),
        )
        self.model, self.optimizer, self.train_loader = self.accelerator.prepare(
            module, optimizer, build_loader(recipe, parts.train_set, True)
        )
        # the model without the wrappers prepare put around it (DDP, torch.compile's OptimizedModule, whose attribute
        # lookups fall through to the model): its state's keys are the checkpoint's, its modules the attention's
        self.plain_model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        # a compiled model's checkpoints under the plain model's keys, without `_orig_mod.`
        if not is_sharded(self.accelerator):
            plain_state_dict_keys(self.model)
        # train.ema: the moving average of the plain model's weights, beside it on its device
        self.ema = ModelEma(self.plain_model, cfg.ema) if cfg.ema is not None else None
        self.objective.setup(self.accelerator, self.model)
        val_set = parts.val_set
        self.val_loader = None if val_set is None else self.accelerator.prepare(build_loader(recipe, val_set, False))
        self.steps_per_epoch = len(self.train_loader) // cfg.grad_accum_steps
        if self.steps_per_epoch == 0:
            raise ValueError(_too_few_samples(recipe, len(parts.train_set), self.accelerator.num_processes))
        planned = cfg.epochs * self.steps_per_epoch
        self.total_steps = min(planned, cfg.max_steps) if cfg.max_steps else planned
        self.scheduler = self.create_scheduler()
        # train.pretrain ran on the model (once, before step 0): a resumed run never pretrains again
        self.state = TrainState(pretrained=pretrained)
        # [count, last value] of the non-finite losses among the current step's batches, on the device
        self._nonfinite_losses: Tensor | None = None
        # set once the replicas were compared after this process's first optimizer step
        self._replicas_compared = False
        self.step_times = StepTimes()
        # SIGINT / SIGTERM while fit runs: the signal that asked to stop after the current step (zoo.train._interrupt)
        self._signals = StopSignals()
        self._stop: int | None = None
        self.selection, self.higher_is_better = self.task.selection_metric(recipe.metrics)
        self.accelerator.register_for_checkpointing(self.state)

    def create_scheduler(self) -> Any:
        """Extension point: the run's learning-rate scheduler, built once by the constructor (after the optimizer and
        `total_steps`); the Trainer calls its `step_update(step)` after every optimizer step. Default: the recipe's
        schedule over `total_steps` (a subclass may step it otherwise: device_train's wall-clock runs)."""
        return build_scheduler(self.optimizer, self.recipe.schedule, self.total_steps)

    @property
    def batches_per_epoch(self) -> int:
        return self.steps_per_epoch * self.recipe.train.grad_accum_steps

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def save(self, which: str) -> None:
        """Extension point: write `checkpoints/<which>` (`last` or `best`) into a temporary directory, then rename it
        into place; weights that are not finite are never saved over a good checkpoint (a NonFiniteError instead)."""
        if not self._weights_are_finite():
            raise NonFiniteError(
                f"the weights hold NaN or inf at step {self.state.step}: training stopped without saving, "
                f"{self._last_good_checkpoint()}; lower optim.lr or set train.clip_grad"
            )
        tmp = self.run_dir / "checkpoints" / f"{which}.tmp"
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            # every process writes its own RNG state into it
            tmp.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        save_checkpoint(self.accelerator, self.model, tmp)
        self.accelerator.wait_for_everyone()
        if self.is_main:
            (tmp / "meta.json").write_text(json.dumps(self.state.state_dict()))
            copy_run_files(self.run_dir, tmp)
            if self.ema is not None:
                self.ema.save(tmp)
            # last: a folder with a manifest was written to the end
            write_manifest(tmp, model=model_identity(self.recipe), state=self.state.state_dict())
            replace_dir(tmp, tmp.with_name(which))
        self.accelerator.wait_for_everyone()

    def _copy_checkpoint(self, source: str, which: str) -> None:
        if self.is_main:
            root = self.run_dir / "checkpoints"
            tmp = root / f"{which}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(root / source, tmp)
            replace_dir(tmp, root / which)
        self.accelerator.wait_for_everyone()

    def restore(self) -> None:
        """Load `checkpoints/<resume>` (weights, optimizer, RNG, train state, EMA) once its manifest, the recipe and
        the weights' shapes agree: what `fit` does first in a resumed run."""
        checkpoint, _ = usable_checkpoint(self.run_dir, self.resume, self.recipe, "this recipe")
        check_checkpoint_weights(self.plain_model, checkpoint)
        try:
            self.accelerator.load_state(str(checkpoint))
        except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as error:
            raise CheckpointError(f"{checkpoint}: cannot load the training state: {first_line(error)}") from error
        if self.ema is not None:
            self.ema.load(checkpoint)
        if self.recipe.train.pretrain is not None and not self.state.pretrained:
            raise CheckpointError(f"{checkpoint} was trained without train.pretrain, which the recipe asks for")
        self.accelerator.print(f"resumed from {checkpoint} at step {self.state.step}, epoch {self.state.epoch}")

    def fit(self) -> dict:
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_recipe(self.recipe, self.run_dir / "recipe.yaml")
            write_description(self.run_dir, self.description)
        if self.recipe.train.log_with:
            self.accelerator.init_trackers(self.recipe.name, config=flat_config(self.recipe))
        self._announce()
        with self._signals:
            if self.resume:
                self.restore()
            elif self.state.pretrained:
                self.save("last")  # the pretrained weights at step 0: a resume from here does not pretrain again
            last_eval = self._train_and_evaluate()
        self._finish(last_eval)
        return last_eval

    def _train_and_evaluate(self) -> dict:
        """The epochs, each evaluated and checkpointed when due; a signal (`zoo.train._interrupt`) stops them after a
        step, with `checkpoints/last` written there, as `TrainingInterrupted`."""
        last_eval: dict = {}
        while self.state.epoch < self.recipe.train.epochs and self.state.step < self.total_steps:
            train_loss, samples_per_s = self.train_epoch()
            epoch_done = self.state.batch_in_epoch == 0
            finished = self.state.step >= self.total_steps
            due = self.state.epoch % self.recipe.train.eval_every_epochs == 0 or finished
            if self._stop is not None and not finished:
                # the evaluation an uninterrupted run makes at this epoch's end, so that the resumed run's
                # metrics.jsonl and best are that run's; mid-epoch only the checkpoint
                if epoch_done and due:
                    self._evaluate_and_checkpoint(train_loss, samples_per_s)
                else:
                    self.save("last")
                raise self._interrupted()
            if due or not epoch_done:
                last_eval = self._evaluate_and_checkpoint(train_loss, samples_per_s)
                stop = early_stop_reason(self.recipe.train.early_stopping, self.state.evals_since_best, self.selection)
                if stop is not None:
                    _logger.info(stop)
                    self.accelerator.print(stop)
                    break
                # a signal during the evaluation: its checkpoint is written
                self._stop = self._signals.requested(self.accelerator)
                if self._stop is not None and not finished:
                    raise self._interrupted()
        return last_eval

    def _interrupted(self) -> TrainingInterrupted:
        """The error that ends a run stopped by signal `self._stop`, its checkpoint written."""
        name = signal.Signals(self._stop).name
        where = self.run_dir / "checkpoints" / "last"
        message = f"{name}: stopped after step {self.state.step} of {self.total_steps}, saved in {where}"
        _logger.warning(message)
        return TrainingInterrupted(message, self._stop)

    def _announce(self) -> None:
        """The run's first lines (zoo.train._announce): device, precision, threads and the habits in force."""
        lines = run_lines(
            self.recipe, self.accelerator, self.threads, steps=self.total_steps, steps_per_epoch=self.steps_per_epoch
        )
        if self.is_main:
            for line in lines:
                _logger.info(line)

    def train_epoch(self) -> tuple[float, float]:
        """Extension point: one epoch of `train_batch` (or what is left of it after a resume), without the evaluation
        and checkpoint that `fit` adds at its end; returns the mean loss and samples/s."""
        acc, cfg = self.accelerator, self.recipe.train
        self.model.train()
        self.train_loader.set_epoch(self.state.epoch)
        seed_loader(self.train_loader, self.recipe.seed, self.state.epoch)
        skip = self.state.batch_in_epoch
        loader = acc.skip_first_batches(self.train_loader, skip) if skip else self.train_loader
        bar = progress_bar(
            total=self.steps_per_epoch,
            initial=skip // cfg.grad_accum_steps,
            enabled=self.is_main,
            desc=f"epoch {self.state.epoch + 1}/{cfg.epochs}",
        )
        loss_sum, batches, samples = torch.zeros((), device=acc.device), 0, 0
        self.step_times.new_epoch()
        tick = time.perf_counter()
        for batch in loader:
            loss = self.train_batch(batch)
            # a skipped batch's non-finite loss is not averaged in (no device sync: the flag stays a tensor)
            finite = torch.isfinite(loss.detach())
            loss_sum += torch.where(finite, loss.detach(), 0.0)
            batches += finite
            samples += len(batch[self.task.target_key]) * acc.num_processes
            self.state.batch_in_epoch += 1
            if not acc.sync_gradients:
                continue
            self.state.step += 1
            self.scheduler.step_update(self.state.step)
            on_optimizer_step(self.plain_model)
            self._sync_replicas()
            if self.ema is not None:
                self.ema.update(self.plain_model, self.state.step)
            if self.step_times.add(time.perf_counter() - tick, samples):
                self._log_first_step()
            samples = 0
            bar.update(1)
            if self.state.step % cfg.log_every_steps == 0:
                rate = self.step_times.samples_per_s()
                log_step(acc, bar, self.state.step, loss=loss.item(), lr=self._lr(), samples_per_s=rate)
            if cfg.checkpoint_every_steps and self.state.step % cfg.checkpoint_every_steps == 0:
                self.save("last")
            self._stop = self._signals.requested(acc)
            if self._stop is not None:
                break
            # the next step's time starts here: logging and checkpoints are not a step's
            tick = time.perf_counter()
            if self.state.step >= self.total_steps or self.state.batch_in_epoch >= self.batches_per_epoch:
                break
        bar.close()
        if self.state.batch_in_epoch >= self.batches_per_epoch:
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
        mean_loss = float(acc.reduce(loss_sum, "mean")) / max(int(batches), 1)
        return mean_loss, self.step_times.samples_per_s()

    def _log_first_step(self) -> None:
        """The first step's time into the run's log: under train.compile, most of it is compiling."""
        mode = self.recipe.train.compile_mode
        what = "eager" if mode is None else f"compiling the model, train.compile mode {mode!r}"
        _logger.info("first training step: %.2f s (%s)", self.step_times.first_s, what)

    def train_batch(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Extension point: one batch's forward/backward, and an optimizer step once `grad_accum_steps` batches are in
        unless one of their losses was not finite (read on the host once per step, where gradients synchronise).
        Returns the batch's loss (a scalar tensor, not synchronised). `train_epoch` calls it for every batch."""
        acc, cfg = self.accelerator, self.recipe.train
        with acc.accumulate(self.model):
            with acc.autocast():
                loss = self.objective.loss(self.model, batch)
            self._count_nonfinite(loss)
            acc.backward(loss)
            if acc.sync_gradients and not self._step_is_finite():
                # no optimizer step: the step's batches, whose gradients a non-finite loss spoiled, are dropped
                self.optimizer.zero_grad(set_to_none=True)
                return loss
            if acc.sync_gradients and cfg.clip_grad:
                acc.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _count_nonfinite(self, loss: Tensor) -> None:
        """Count a batch's non-finite loss on the device: a batch that is not its step's last never waits for it."""
        loss = loss.detach().float()
        bad = ~torch.isfinite(loss)
        seen = torch.stack([bad.float(), torch.where(bad, loss, 0.0)])
        if self._nonfinite_losses is not None:
            seen[0] += self._nonfinite_losses[0]
            seen[1] = torch.where(bad, loss, self._nonfinite_losses[1])
        self._nonfinite_losses = seen

    def _step_is_finite(self) -> bool:
        """At the step's last batch: True when every loss of the step was finite on every process, read with one
        host sync per optimizer step. Otherwise the step is skipped while at most `train.skip_nonfinite` batches
        were, else the run stops with a NonFiniteError naming the step and last checkpoint."""
        seen, self._nonfinite_losses = self._nonfinite_losses, None
        bad = nonfinite_batches(self.accelerator, seen)
        if not bad:
            return True
        self.state.skipped_batches += bad
        last, accum = self.state.batch_in_epoch + 1, self.recipe.train.grad_accum_steps
        batches = f"batch {last}" if accum == 1 else f"batches {max(1, last - accum + 1)}-{last}"
        where = f"step {self.state.step + 1} (epoch {self.state.epoch + 1}, {batches})"
        allowed = self.recipe.train.skip_nonfinite
        if self.state.skipped_batches > allowed:
            value = f"{float(seen[1]):g}" if seen[0] else "on another process"
            raise NonFiniteError(
                f"non-finite loss ({value}) at {where}: training stopped, "
                f"{self._last_good_checkpoint()}; lower optim.lr, check the data, or set train.skip_nonfinite "
                f"to skip up to that many such batches (now {allowed})"
            )
        _logger.warning(
            "non-finite loss at %s: step skipped (%d batches of train.skip_nonfinite=%d)",
            where,
            self.state.skipped_batches,
            allowed,
        )
        return False

    def _last_good_checkpoint(self) -> str:
        """`the last good checkpoint is <path> (step N)`, or that none was written yet."""
        found = find_checkpoint(self.run_dir, "last")
        if found is None:
            return "no checkpoint was written yet"
        step = ((read_manifest(found) or {}).get("state") or {}).get("step", "?")
        return f"the last good checkpoint is {found} (step {step})"

    def _weights_are_finite(self) -> bool:
        """Whether every weight is finite on every process (a finite loss can still overflow a gradient)."""
        flags = [torch.isfinite(local_shard(p.detach())).all() for p in self.model.parameters()]
        bad = (
            (~torch.stack(flags).all()).float().reshape(1) if flags else torch.zeros(1, device=self.accelerator.device)
        )
        if self.accelerator.num_processes > 1:
            bad = self.accelerator.reduce(bad, "sum")
        return not bad.item()

    def _lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _evaluate_and_checkpoint(self, train_loss: float, samples_per_s: float) -> dict:
        metrics = self._validate()
        others = self._validate_other_weights() if metrics else {}
        record = {
            # the epoch as the progress bar numbers it: one that train.max_steps stopped part-way counts
            "epoch": self.state.epoch + int(self.state.batch_in_epoch > 0),
            "step": self.state.step,
            "train_loss": train_loss,
            "lr": self._lr(),
            "samples_per_s": samples_per_s,
            **self.objective.metrics(self.accelerator),
            **{f"val_{k}": v for k, v in metrics.items() if not isinstance(v, list)},
        }
        if metrics:
            # the weights val_* scored (and that pick checkpoints/best); under train.ema the other ones' as <them>_val_*
            record["weights"] = scored_weights(self.recipe)
            for weights, scores in others.items():
                record.update({f"{weights}_val_{k}": v for k, v in scores.items() if not isinstance(v, list)})
        log_eval(self.accelerator, self.run_dir, record)
        if self.val_loader is None:
            # nothing to choose by: the latest weights are the best there are
            improved = True
        else:
            score = metrics[self.selection] if self.higher_is_better else -metrics[self.selection]
            improved = score > self.state.best_metric
            self.state.evals_since_best = 0 if improved else self.state.evals_since_best + 1
            self.state.best_metric = max(score, self.state.best_metric)
        if improved:
            # best first: a crash before `last` is replaced resumes before this evaluation and repeats it, where
            # `last` first would resume past it with `best` never written
            self.save("best")
            self._copy_checkpoint("best", "last")
        else:
            self.save("last")
        return record

    def _weights(self) -> dict[str, nn.Module]:
        """The weights validation may score, by name: `raw` (the optimizer's), `ema` under train.ema."""
        return {"raw": self.model, **({"ema": self.ema.module} if self.ema is not None else {})}

    def _validate(self) -> dict[str, Any]:
        """The validation split's metrics of the weights that pick checkpoints/best (train.ema.evaluate: the average or
        the raw weights); none under train.validate false."""
        if self.val_loader is None:
            return {}
        return self._score(self._weights()[scored_weights(self.recipe)])

    def _validate_other_weights(self) -> dict[str, dict[str, Any]]:
        """Under train.ema, the other weights' validation metrics by their name (`raw` or `ema`), as timm's training
        script reports both."""
        scored = scored_weights(self.recipe)
        return {name: self._score(model) for name, model in self._weights().items() if name != scored}

    def _score(self, model: nn.Module) -> dict[str, Any]:
        return evaluate_loader(
            model,
            self.val_loader,
            self.accelerator,
            task=self.task,
            model_inputs=self.kind.inputs,
            metric_names=self.recipe.metrics,
            num_classes=self.num_classes,
        )

    def _sync_replicas(self) -> None:
        """After every optimizer step: process 0's buffers to every process (zoo.train.distributed.sync_buffers); after
        the first, the replicas compared, so that a divergence stops the run at once, not at its end."""
        sync_buffers(self.model)
        if not self._replicas_compared and self.accelerator.num_processes > 1:
            self._replicas_compared = True
            raise_if_diverged(*replica_mismatches(self.plain_model), self.state.step)

    def _selected(self) -> dict[str, Any]:
        """What picked checkpoints/best, for train_summary.json."""
        if self.val_loader is None:
            return {"best_checkpoint": "the last evaluation's (train.validate: false)"}
        return {f"best_val_{self.selection}": self.state.best_metric * (1 if self.higher_is_better else -1)}

    def _finish(self, last_eval: dict) -> None:
        """Check that every replica holds the same weights and buffers, then write `train_summary.json`."""
        checksums, differ = replica_mismatches(self.plain_model)
        times = self.step_times.summary(compiled=self.recipe.train.compile_mode is not None)
        if times["step_s"] is not None:
            first = "eager" if times["compile_s"] is None else f"{times['compile_s']:.2f} s more: compiling, warm-up"
            _logger.info(
                "steady training step: %.4f s (mean of %d steps); the first: %.2f s (%s)",
                times["step_s"],
                self.step_times.steady_steps,
                times["first_step_s"],
                first,
            )
        if self.is_main:
            summary = {
                "recipe": self.recipe.name,
                "steps": self.state.step,
                "epochs": self.state.epoch,
                "num_processes": self.accelerator.num_processes,
                "mixed_precision": self.accelerator.mixed_precision,
                "device": str(self.accelerator.device),
                "compile": self.recipe.train.compile_mode or False,
                **times,
                "replica_checksums": checksums,
                "replicas_identical": not differ,
                **self._selected(),
                "last_eval": last_eval,
            }
            (self.run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
        # not accelerator.end_training(): that also ends the process group, which the caller may still use
        for tracker in self.accelerator.trackers:
            tracker.finish()
        self.accelerator.wait_for_everyone()
        raise_if_diverged(checksums, differ, self.state.step)
