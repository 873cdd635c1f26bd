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
crash never leaves a partial checkpoint where a good one was.

The evaluation loop is `zoo.train.eval_loop` (`evaluate_loader`, re-exported here), what a run reports (tracker,
progress bar, `metrics.jsonl`) `zoo.train._tracking`, `train.compile` (torch.compile through accelerate, checkpoints
under the plain model's keys) `zoo.train._compile`. What a run optimises is an objective (`zoo.train._objective`):
the task's loss by default; self-pretraining (`zoo.train.self_pretrain`) and conversion (`zoo.convert`) run through
this class with their own objective and model, and nothing else of theirs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import DataLoaderConfiguration
from accelerate.utils import set_seed
from timm.optim import create_optimizer_v2
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from .._validate import first_line
from ..attention import on_optimizer_step
from ..config import Recipe, save_recipe
from ..data import DataContext, build_dataset, collate_for, get_dataset
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
from ..hub.runs import copy_run_files, describe_model, write_description
from ..kinds import build_model, get_model_kind, sizes_of
from ._compile import StepTimes, dynamo_plugin, plain_state_dict_keys
from ._ema import ModelEma
from ._mixup import training_objective
from ._objective import Objective
from ._schedule import build_scheduler
from ._stopping import early_stop_reason
from ._tracking import flat_config, log_eval, log_step, progress_bar, tracker_name
from .distributed import build_accelerator, is_sharded, local_shard, replica_mismatches, save_checkpoint, sync_buffers
from .eval_loop import evaluate_loader
from .self_pretrain import pretrain

__all__ = [
    "NonFiniteError",
    "Trainer",
    "build_loader",
    "build_split",
    "data_context",
    "evaluate_loader",
    "find_checkpoint",
    "model_for",
    "resolve_mixed_precision",
]

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


def resolve_mixed_precision(value: str) -> str:
    """`auto` means bf16 on a GPU that supports it, full precision elsewhere."""
    if value != "auto":
        return value
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def data_context(recipe: Recipe, split: str) -> DataContext:
    """What a dataset builder reads of the recipe besides data.options: the split, seed, sample count, root and
    the model's image size."""
    data, model = recipe.data, recipe.model
    samples = {"train": data.train_samples, "val": data.val_samples, "test": data.test_samples}
    return DataContext(
        split=split,
        is_training=split == "train",
        seed=data.seed,
        num_samples=samples.get(split),
        root=data.root,
        # what the model kind tells the builders (a ViT's image size and channels)
        **get_model_kind(model.kind).data_context(model.options),
    )


def build_split(recipe: Recipe, split: str) -> Dataset:
    """The recipe's dataset for `split`."""
    return build_dataset(recipe.data.name, data_context(recipe, split), **recipe.data.options)


def model_for(recipe: Recipe, train_set: Dataset) -> nn.Module:
    """The recipe's model (`model.kind`), sized from the training split."""
    return build_model(recipe, sizes_of(recipe, train_set))


def build_loader(recipe: Recipe, dataset: Dataset, train: bool) -> DataLoader:
    """Shuffled, whole batches for training; every item, in order, for evaluation. Batches are dicts (1-D items
    padded)."""
    batch_size = recipe.data.batch_size if train else recipe.data.eval_batch_size or recipe.data.batch_size
    workers = recipe.data.num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train,
        drop_last=train,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
        collate_fn=collate_for(get_dataset(recipe.data.name).kind),
    )


def _resume_from(resume: bool | str) -> str | None:
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
    """Trains `recipe` into `run_dir`; `fit()` returns the last evaluation."""

    def __init__(
        self,
        recipe: Recipe,
        run_dir: Path,
        *,
        resume: bool | str = False,
        model: nn.Module | None = None,
        objective: Objective | None = None,
    ) -> None:
        """`resume`: False, True (from `checkpoints/last`) or the checkpoint to continue from, `last` or `best`.
        `model`: the model to train in place (default: the one the recipe builds); `objective`: its loss and the module
        that trains (default: the task's loss on the model, `zoo.train._objective`)."""
        self.recipe, self.run_dir = recipe, Path(run_dir)
        self.resume = _resume_from(resume)
        cfg = recipe.train
        self.accelerator = build_accelerator(
            cfg.distributed,
            # accelerate takes the gloo data-parallel path under torchrun only when told it runs on the CPU
            cpu=not torch.cuda.is_available(),
            mixed_precision=resolve_mixed_precision(cfg.mixed_precision),
            gradient_accumulation_steps=cfg.grad_accum_steps,
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=recipe.seed),
            log_with=tracker_name(cfg.log_with),
            project_dir=str(self.run_dir / "logs") if cfg.log_with else None,
            # train.compile: accelerate's prepare compiles the model (last, around any DDP wrapper)
            dynamo_plugin=dynamo_plugin(cfg.compile_mode),
        )
        if cfg.deterministic:
            # cuBLAS's deterministic mode needs a fixed workspace, set before its first call
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        set_seed(recipe.seed, deterministic=cfg.deterministic)
        self.kind = get_model_kind(recipe.model.kind)
        self.task = self.kind.task(recipe)
        train_set = build_split(recipe, "train")
        # train.validate false: no validation split is read, the last evaluation's weights are the best
        val_set = build_split(recipe, "val") if cfg.validate else None
        # the run's sizes, read once: every model of the run is built from them (runs/NAME/model.json)
        sizes = sizes_of(recipe, train_set)
        self.num_classes = self.task.num_outputs(sizes)
        self.objective = objective or training_objective(self.kind, self.task, cfg, self.num_classes)
        model = self.kind.build(recipe, sizes, self.task) if model is None else model
        # what rebuilds the model without the data (zoo.load_model)
        self.description = describe_model(recipe, train_set, self.task, sizes)
        # self-pretraining (zoo.train.self_pretrain) once, before step 0; a resumed run loads its result instead
        pretrained = cfg.pretrain is not None and not self.resume
        if pretrained:
            # a run of its own through this class (passed in: zoo.train.self_pretrain sits below it)
            pretrain(recipe, model, self.run_dir, Trainer)
        module = self.objective.module(model)
        optimizer = create_optimizer_v2(
            module,
            opt=recipe.optim.name,
            lr=recipe.optim.lr,
            weight_decay=recipe.optim.weight_decay,
            layer_decay=recipe.optim.layer_decay,
            betas=tuple(recipe.optim.betas),
        )
        self.model, self.optimizer, self.train_loader = self.accelerator.prepare(
            module, optimizer, build_loader(recipe, train_set, True)
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
        self.val_loader = None if val_set is None else self.accelerator.prepare(build_loader(recipe, val_set, False))
        self.steps_per_epoch = len(self.train_loader) // cfg.grad_accum_steps
        if self.steps_per_epoch == 0:
            raise ValueError(_too_few_samples(recipe, len(train_set), self.accelerator.num_processes))
        planned = cfg.epochs * self.steps_per_epoch
        self.total_steps = min(planned, cfg.max_steps) if cfg.max_steps else planned
        self.scheduler = self._scheduler()
        self.state = TrainState(pretrained=pretrained)
        # [count, last value] of the non-finite losses among the current step's batches, on the device
        self._nonfinite_losses: Tensor | None = None
        # set once the replicas were compared after this process's first optimizer step
        self._replicas_compared = False
        self.step_times = StepTimes()
        self.selection, self.higher_is_better = self.task.selection_metric(recipe.metrics)
        self.accelerator.register_for_checkpointing(self.state)

    def _scheduler(self) -> Any:
        """The recipe's schedule over the run's `total_steps` (a subclass may step it otherwise: device_train's
        wall-clock runs)."""
        return build_scheduler(self.optimizer, self.recipe.schedule, self.total_steps)

    @property
    def batches_per_epoch(self) -> int:
        return self.steps_per_epoch * self.recipe.train.grad_accum_steps

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def _save(self, which: str) -> None:
        """Write `checkpoints/<which>` into a temporary directory, then rename it into place; weights that are not
        finite are never saved over a good checkpoint."""
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

    def _restore(self) -> None:
        """Load `checkpoints/<resume>` once its manifest, the recipe and the weights' shapes agree."""
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
        if self.resume:
            self._restore()
        elif self.state.pretrained:
            self._save("last")  # the pretrained weights at step 0: a resume from here does not pretrain again
        last_eval: dict = {}
        while self.state.epoch < self.recipe.train.epochs and self.state.step < self.total_steps:
            train_loss, samples_per_s = self._train_epoch()
            epoch_done = self.state.batch_in_epoch == 0
            due = self.state.epoch % self.recipe.train.eval_every_epochs == 0 or self.state.step >= self.total_steps
            if due or not epoch_done:
                last_eval = self._evaluate_and_checkpoint(train_loss, samples_per_s)
                stop = early_stop_reason(self.recipe.train.early_stopping, self.state.evals_since_best, self.selection)
                if stop is not None:
                    _logger.info(stop)
                    self.accelerator.print(stop)
                    break
        self._finish(last_eval)
        return last_eval

    def _train_epoch(self) -> tuple[float, float]:
        """One epoch (or what is left of it after a resume); returns mean loss and samples/s."""
        acc, cfg = self.accelerator, self.recipe.train
        self.model.train()
        self.train_loader.set_epoch(self.state.epoch)
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
            loss = self._train_batch(batch)
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
                self._save("last")
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

    def _train_batch(self, batch: Mapping[str, Tensor]) -> Tensor:
        """One forward/backward; an optimizer step once `grad_accum_steps` batches are in, unless one of their losses
        was not finite (`_step_is_finite`: read on the host once per step, where gradients synchronise)."""
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
        # every process skips the same step, or none does: the most non-finite batches any process saw (a gather,
        # where an all-reduce sum would count a batch once per process)
        counts = self.accelerator.gather(seen[:1]) if self.accelerator.num_processes > 1 else seen[:1]
        bad = int(counts.max())
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
            self._save("best")
            self._copy_checkpoint("best", "last")
        else:
            self._save("last")
        return record

    def _validate(self) -> dict[str, Any]:
        """The validation split's metrics; none under train.validate false."""
        if self.val_loader is None:
            return {}
        ema = self.recipe.train.ema
        return evaluate_loader(
            # train.ema.evaluate ema: the average is scored, and so picks checkpoints/best
            self.ema.module if self.ema is not None and ema.evaluate == "ema" else self.model,
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
            _raise_if_diverged(*replica_mismatches(self.plain_model), self.state.step)

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
        _raise_if_diverged(checksums, differ, self.state.step)


def _raise_if_diverged(checksums: list[str], differ: list[str], step: int) -> None:
    """A RuntimeError naming the state entries (`zoo.train.distributed.replica_mismatches`) that differ between the
    processes at `step`: a bug in zoo, never a user's mistake."""
    if differ:
        more = ", ..." if len(differ) > 5 else ""
        raise RuntimeError(
            f"replicas diverged at step {step}: {len(differ)} state entries differ between the processes "
            f"({', '.join(differ[:5])}{more}); checksums {checksums}"
        )
