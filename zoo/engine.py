"""Training and evaluation of a recipe through accelerate (CPU, one GPU, many GPUs under `accelerate launch`).

Every batch is a dict (`zoo.data.collate_for`: `{"image", "label"}`, or the 1-D sets' `tokens` or `values`, `mask`
and targets, padded); the model kind (`zoo.model_kinds`) builds the model and says which keys it reads, the task
(`zoo.tasks`) which key holds the targets, the loss, the metrics and the validation score that picks the best
checkpoint. The attention's `auxiliary_loss` is added to the task's loss.

A run directory holds `recipe.yaml` (the resolved recipe), `metrics.jsonl` (one JSON object per evaluation),
`checkpoints/last` and `checkpoints/best` (accelerate state: model, optimizer, RNG, train state) and
`train_summary.json`. A checkpoint is written to a temporary directory and renamed into place, so a crash never
leaves a partial checkpoint where a good one was.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import gather_object, set_seed
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler, StepLRScheduler
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from .attention import on_optimizer_step
from .attention._registry import auxiliary_loss
from .data import DataContext, build_dataset, collate_for, get_dataset
from .metrics import metrics_to_python
from .model_kinds import get_model_kind
from .recipe import Recipe, save_recipe
from .tasks import Task

__all__ = [
    "Trainer",
    "build_loader",
    "build_split",
    "data_context",
    "evaluate",
    "find_checkpoint",
    "model_for",
    "resolve_mixed_precision",
]

_logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Progress that a checkpoint restores: optimizer steps, finished epochs, batches into this epoch."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_metric: float = -math.inf

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
        img_size=model.img_size,
        in_chans=model.in_chans,
        dynamic_img_size=model.dynamic_img_size,
    )


def build_split(recipe: Recipe, split: str) -> Dataset:
    """The recipe's dataset for `split`."""
    return build_dataset(recipe.data.name, data_context(recipe, split), **recipe.data.options)


def model_for(recipe: Recipe, train_set: Dataset) -> nn.Module:
    """The recipe's model (`model.kind`), sized from the training split."""
    kind = get_model_kind(recipe.model.kind)
    return kind.build(recipe, train_set, kind.task(recipe))


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


def _gather(
    accelerator: Accelerator, outputs: Tensor, targets: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Every process's outputs, targets and target mask (no sample twice): only what the loss and metrics read,
    never the inputs. Per-position batches are first padded to one length across processes, the padding masked
    out."""
    tensors = (outputs, targets) if mask is None else (outputs, targets, mask)
    if accelerator.num_processes > 1 and mask is not None:
        # pad_across_processes pads with zeros through an addition, which turns a bool mask into int64
        tensors = tuple(accelerator.pad_across_processes(t, dim=1) for t in tensors)
    gathered = accelerator.gather_for_metrics(tensors)
    return gathered[0], gathered[1], None if mask is None else gathered[2].bool()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    accelerator: Accelerator,
    *,
    task: Task,
    model_inputs: Callable[[Mapping[str, Tensor]], tuple[Tensor, ...]],
    metric_names: Sequence[str],
    num_classes: int,
) -> dict:
    """Loss and metrics of `task` over the whole split, gathered from every process (no sample counted twice).

    `model_inputs`: the model's inputs from a batch (`ModelKind.inputs`). `num_classes`: what the metrics count
    (`Task.num_outputs`). The loss is the mean over every term the task's loss averages (`Task.loss_units`).
    """
    model.eval()
    metrics = task.build_metrics(metric_names, num_classes).to(accelerator.device)
    loss_sum, units, count = torch.zeros((), device=accelerator.device), 0, 0
    for batch in loader:
        targets, mask = task.targets(batch)
        with accelerator.autocast():
            outputs = model(*model_inputs(batch))
        outputs, targets, mask = _gather(accelerator, outputs.float(), targets, mask)
        batch_units = task.loss_units(targets, mask)
        if batch_units:
            loss_sum += task.loss(outputs, targets, mask) * batch_units
        units += batch_units
        count += targets.shape[0]
        metrics.update(*task.metric_inputs(outputs, targets, mask))
    result = {"loss": float(loss_sum) / max(units, 1), "samples": count}
    return {**result, **metrics_to_python(metrics.compute())}


def _state_checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def find_checkpoint(run_dir: Path, which: str = "last") -> Path | None:
    """`checkpoints/<which>`, or its `.old` twin if a crash fell between the two renames of a save."""
    for candidate in (run_dir / "checkpoints" / which, run_dir / "checkpoints" / f"{which}.old"):
        if candidate.is_dir():
            return candidate
    return None


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move `tmp` to `final`; the previous `final` survives as `final.old` until the new one is in place."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


class Trainer:
    """Trains `recipe` into `run_dir`; `fit()` returns the last evaluation."""

    def __init__(self, recipe: Recipe, run_dir: Path, *, resume: bool = False) -> None:
        self.recipe, self.run_dir, self.resume = recipe, Path(run_dir), resume
        cfg = recipe.train
        self.accelerator = Accelerator(
            # accelerate takes the gloo data-parallel path under torchrun only when told it runs on the CPU
            cpu=not torch.cuda.is_available(),
            mixed_precision=resolve_mixed_precision(cfg.mixed_precision),
            gradient_accumulation_steps=cfg.grad_accum_steps,
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=recipe.seed),
        )
        set_seed(recipe.seed)
        self.kind = get_model_kind(recipe.model.kind)
        self.task = self.kind.task(recipe)
        train_set, val_set = build_split(recipe, "train"), build_split(recipe, "val")
        self.num_classes = self.task.num_outputs(train_set)
        model = self.kind.build(recipe, train_set, self.task)
        optimizer = create_optimizer_v2(
            model,
            opt=recipe.optim.name,
            lr=recipe.optim.lr,
            weight_decay=recipe.optim.weight_decay,
            layer_decay=recipe.optim.layer_decay,
            betas=tuple(recipe.optim.betas),
        )
        self.model, self.optimizer, self.train_loader, self.val_loader = self.accelerator.prepare(
            model, optimizer, build_loader(recipe, train_set, True), build_loader(recipe, val_set, False)
        )
        self.steps_per_epoch = len(self.train_loader) // cfg.grad_accum_steps
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"data.batch_size x train.grad_accum_steps x processes exceeds the {len(train_set)} training samples"
            )
        planned = cfg.epochs * self.steps_per_epoch
        self.total_steps = min(planned, cfg.max_steps) if cfg.max_steps else planned
        self.scheduler = self._scheduler()
        self.state = TrainState()
        self.selection, self.higher_is_better = self.task.selection_metric(recipe.metrics)
        self.accelerator.register_for_checkpointing(self.state)

    def _scheduler(self):
        sched, warmup = self.recipe.schedule, self.recipe.schedule.warmup_steps
        common = {"warmup_t": warmup, "warmup_lr_init": sched.warmup_lr, "t_in_epochs": False}
        if sched.name == "cosine":
            return CosineLRScheduler(self.optimizer, t_initial=self.total_steps, lr_min=sched.min_lr, **common)
        decay_t = max(self.total_steps // 3, 1)
        rate = 1.0 if sched.name == "constant" else 0.1
        return StepLRScheduler(self.optimizer, decay_t=decay_t, decay_rate=rate, **common)

    @property
    def batches_per_epoch(self) -> int:
        return self.steps_per_epoch * self.recipe.train.grad_accum_steps

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def _save(self, which: str) -> None:
        """Write `checkpoints/<which>` into a temporary directory, then rename it into place."""
        tmp = self.run_dir / "checkpoints" / f"{which}.tmp"
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            # every process writes its own RNG state into it
            tmp.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        self.accelerator.save_state(str(tmp))
        self.accelerator.wait_for_everyone()
        if self.is_main:
            (tmp / "meta.json").write_text(json.dumps(self.state.state_dict()))
            _replace_dir(tmp, tmp.with_name(which))
        self.accelerator.wait_for_everyone()

    def _copy_checkpoint(self, source: str, which: str) -> None:
        if self.is_main:
            root = self.run_dir / "checkpoints"
            tmp = root / f"{which}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(root / source, tmp)
            _replace_dir(tmp, root / which)
        self.accelerator.wait_for_everyone()

    def _restore(self) -> None:
        checkpoint = find_checkpoint(self.run_dir, "last")
        if checkpoint is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.run_dir / 'checkpoints' / 'last'}")
        self.accelerator.load_state(str(checkpoint))
        self.accelerator.print(f"resumed from {checkpoint} at step {self.state.step}, epoch {self.state.epoch}")

    def _log_eval(self, record: dict) -> None:
        if self.is_main:
            with open(self.run_dir / "metrics.jsonl", "a") as handle:
                handle.write(json.dumps(record) + "\n")
        self.accelerator.print(
            "eval " + " ".join(f"{k}={v:.4g}" for k, v in record.items() if isinstance(v, (int, float)))
        )

    def fit(self) -> dict:
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_recipe(self.recipe, self.run_dir / "recipe.yaml")
        if self.resume:
            self._restore()
        last_eval: dict = {}
        while self.state.epoch < self.recipe.train.epochs and self.state.step < self.total_steps:
            train_loss, samples_per_s = self._train_epoch()
            epoch_done = self.state.batch_in_epoch == 0
            due = self.state.epoch % self.recipe.train.eval_every_epochs == 0 or self.state.step >= self.total_steps
            if due or not epoch_done:
                last_eval = self._evaluate_and_checkpoint(train_loss, samples_per_s)
        self._finish(last_eval)
        return last_eval

    def _train_epoch(self) -> tuple[float, float]:
        """One epoch (or what is left of it after a resume); returns mean loss and samples/s."""
        acc, cfg = self.accelerator, self.recipe.train
        self.model.train()
        self.train_loader.set_epoch(self.state.epoch)
        skip = self.state.batch_in_epoch
        loader = acc.skip_first_batches(self.train_loader, skip) if skip else self.train_loader
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=skip // cfg.grad_accum_steps,
            disable=not self.is_main,
            desc=f"epoch {self.state.epoch + 1}/{cfg.epochs}",
            dynamic_ncols=True,
            # redirected to a log (CI, a cluster job), a line per 30 s instead of a carriage return per step
            mininterval=0.1 if sys.stderr.isatty() else 30.0,
        )
        loss_sum, batches, samples, start = torch.zeros((), device=acc.device), 0, 0, time.perf_counter()
        for batch in loader:
            loss = self._train_batch(batch)
            loss_sum += loss.detach()
            batches += 1
            samples += len(batch[self.task.target_key]) * acc.num_processes
            self.state.batch_in_epoch += 1
            if not acc.sync_gradients:
                continue
            self.state.step += 1
            self.scheduler.step_update(self.state.step)
            on_optimizer_step(self.model)
            bar.update(1)
            if self.state.step % cfg.log_every_steps == 0:
                rate = samples / (time.perf_counter() - start)
                bar.set_postfix(
                    loss=f"{loss.item():.4f}", lr=f"{self._lr():.2e}", samples_s=f"{rate:.1f}", refresh=False
                )
            if cfg.checkpoint_every_steps and self.state.step % cfg.checkpoint_every_steps == 0:
                self._save("last")
            if self.state.step >= self.total_steps or self.state.batch_in_epoch >= self.batches_per_epoch:
                break
        bar.close()
        if self.state.batch_in_epoch >= self.batches_per_epoch:
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
        mean_loss = float(acc.reduce(loss_sum, "mean")) / max(batches, 1)
        return mean_loss, samples / max(time.perf_counter() - start, 1e-9)

    def _train_batch(self, batch: Mapping[str, Tensor]) -> Tensor:
        """One forward/backward; an optimizer step once `grad_accum_steps` batches are in."""
        acc, cfg = self.accelerator, self.recipe.train
        targets, mask = self.task.targets(batch)
        with acc.accumulate(self.model):
            with acc.autocast():
                outputs = self.model(*self.kind.inputs(batch))
                loss = self.task.loss(outputs, targets, mask, label_smoothing=cfg.label_smoothing)
                loss = loss + auxiliary_loss(self.model)
            acc.backward(loss)
            if acc.sync_gradients and cfg.clip_grad:
                acc.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _evaluate_and_checkpoint(self, train_loss: float, samples_per_s: float) -> dict:
        metrics = evaluate(
            self.model,
            self.val_loader,
            self.accelerator,
            task=self.task,
            model_inputs=self.kind.inputs,
            metric_names=self.recipe.metrics,
            num_classes=self.num_classes,
        )
        record = {
            "epoch": self.state.epoch,
            "step": self.state.step,
            "train_loss": train_loss,
            "lr": self._lr(),
            "samples_per_s": samples_per_s,
            **{f"val_{k}": v for k, v in metrics.items() if not isinstance(v, list)},
        }
        self._log_eval(record)
        score = metrics[self.selection] if self.higher_is_better else -metrics[self.selection]
        is_best = score > self.state.best_metric
        if is_best:
            self.state.best_metric = score
        self._save("last")
        if is_best:
            self._copy_checkpoint("last", "best")
        return record

    def _finish(self, last_eval: dict) -> None:
        """Check that every replica holds the same weights, then write `train_summary.json`."""
        checksums = gather_object([_state_checksum(self.accelerator.unwrap_model(self.model))])
        if self.is_main:
            summary = {
                "recipe": self.recipe.name,
                "steps": self.state.step,
                "epochs": self.state.epoch,
                "num_processes": self.accelerator.num_processes,
                "mixed_precision": self.accelerator.mixed_precision,
                "device": str(self.accelerator.device),
                "replica_checksums": checksums,
                "replicas_identical": len(set(checksums)) == 1,
                f"best_val_{self.selection}": self.state.best_metric * (1 if self.higher_is_better else -1),
                "last_eval": last_eval,
            }
            (self.run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
        self.accelerator.wait_for_everyone()
        if len(set(checksums)) != 1:
            raise RuntimeError(f"replicas diverged: weight checksums {checksums}")
