"""The recipe's sections as dataclasses: the schema that ``zoo.config`` checks a YAML tree against.

Names that registries own are checked against them: ``model.attention`` (``zoo.attention``), ``model.kind`` and
the kind's own ``model`` keys (``zoo.kinds``: each kind's options dataclass), ``data.name`` and
``data.options`` (``zoo.data``: each dataset's options dataclass), ``task`` and ``metrics`` (``zoo.tasks``).
Nothing here names a dataset, a task or a model kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from accelerate.utils import LoggerType
from timm.optim import list_optimizers

from .._schema import bounded, show, unit_interval
from .._validate import did_you_mean
from ..attention import get_attention, list_attentions
from ..attention._config import AttentionConfig
from ..data import get_dataset, list_datasets
from ..data._registry import DEFAULT_NUM_SAMPLES
from ..tasks import get_task, list_tasks
from ..tasks.metrics import METRICS

__all__ = [
    "AttentionConfig",
    "DataConfig",
    "EarlyStoppingConfig",
    "EmaConfig",
    "MixupConfig",
    "ModelConfig",
    "OptimConfig",
    "PretrainConfig",
    "Recipe",
    "ScheduleConfig",
    "TrainConfig",
]


# accelerate's trackers by name (`all` left out: a recipe names the one it logs to)
TRACKERS = tuple(str(tracker) for tracker in LoggerType if tracker != LoggerType.ALL)

# torch.compile's modes, which train.compile names (true: the first), or false for none; cuda: the first where the
# run has a CUDA GPU, none elsewhere
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_CHOICES = (False, True, "cuda", *COMPILE_MODES)


def _kind_options(kind: str) -> type:
    from ..kinds import get_model_kind

    return get_model_kind(kind).options


def _every_kind_options() -> dict[str, type]:
    from ..kinds import get_model_kind, list_model_kinds

    return {name: get_model_kind(name).options for name in list_model_kinds()}


def _model_kinds() -> list[str]:
    from ..kinds import list_model_kinds

    return list_model_kinds()


@dataclass
class ModelConfig:
    """The keys every model kind shares; the kind's own options (``zoo.kinds``: ``ViTOptions``,
    ``SequenceOptions``, ...) sit beside them in the recipe's ``model`` section and are read as ``model.<key>``
    too. A key of another kind is taken only at that kind's default (a resolved recipe lists every key)."""

    # vit: timm's VisionTransformer (images); sequence: zoo's 1-D SequenceModel (DNA, time series, tokens)
    kind: str = field(default="vit", metadata={"choices": _model_kinds})
    # None sizes keep the model's own values (the ViT architecture's; create_sequence_model's dim 128, depth 4,
    # 4 heads, MLP ratio 4)
    embed_dim: int | None = bounded(None, min=1)
    depth: int | None = bounded(None, min=1)
    num_heads: int | None = bounded(None, min=1)
    mlp_ratio: float | None = bounded(None, min=0, min_exclusive=True)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    drop_rate: float = unit_interval(0.0)
    drop_path_rate: float = unit_interval(0.0)
    attn_drop_rate: float = unit_interval(0.0)
    grad_checkpointing: bool = False
    # the kind's options dataclass, its keys flat in the `model` section
    options: Any = field(
        default_factory=lambda: _kind_options("vit")(),
        metadata={"options_of": ("kind", _kind_options, _every_kind_options)},
    )

    def __getattr__(self, name: str) -> Any:
        # called only for a name that is not a shared key: the kind's own option (model.img_size, model.sequence)
        if name.startswith("__") or name == "options":
            raise AttributeError(name)
        options = self.options
        if not hasattr(options, name):
            raise AttributeError(f"model.kind {self.kind!r} has no option {name!r}")
        return getattr(options, name)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes` to shared keys or the kind's options; a key neither has raises ValueError."""
        shared = {f.name for f in dataclasses.fields(self)} - {"options"}
        own = {f.name for f in dataclasses.fields(self.options)}
        unknown = [key for key in changes if key not in shared | own]
        if unknown:
            raise ValueError(f"model.kind {self.kind!r} has no option {unknown[0]!r}; it has {', '.join(sorted(own))}")
        options = dataclasses.replace(self.options, **{k: v for k, v in changes.items() if k in own})
        return dataclasses.replace(self, options=options, **{k: v for k, v in changes.items() if k in shared})

    def without_pretrained(self) -> ModelConfig:
        """A copy whose kind fetches no pretrained weights (a checkpoint holds every weight)."""
        from ..kinds import get_model_kind

        return dataclasses.replace(self, options=get_model_kind(self.kind).without_pretrained(self.options))

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.embed_dim is not None and self.num_heads is not None and self.embed_dim % self.num_heads:
            problems.append(("num_heads", f"must divide embed_dim {self.embed_dim}, got {self.num_heads}"))
        return problems + self.options.problems_in(self)


@dataclass
class DataConfig:
    # a registered dataset (zoo.data.list_datasets()); the default is the quickstart's image set
    name: str = field(default="megamnist", metadata={"choices": list_datasets})
    # the dataset's files when it reads yours (required), or where to find the installed package files it reads
    # (optional, null: searched); whether a dataset takes it is its registration's `root`
    root: str | None = None
    # the options of data.name, checked against its options dataclass (zoo.data.get_dataset(name).options); only
    # the keys set are kept, a left-out option keeps the dataset's default
    options: dict[str, Any] = field(
        default_factory=dict, metadata={"schema_of": ("name", lambda name: get_dataset(name).options)}
    )
    # items per split (DataContext.num_samples): what a generated set makes; for a set of your files a subset drawn
    # from data.seed and counted in a warning (left at these defaults: every item); forecasting sets refuse them.
    # null: every item of your files, a generated set's own default count
    train_samples: int | None = bounded(DEFAULT_NUM_SAMPLES["train"], min=1)
    val_samples: int | None = bounded(DEFAULT_NUM_SAMPLES["val"], min=1)
    test_samples: int | None = bounded(DEFAULT_NUM_SAMPLES["test"], min=1)
    seed: int = 0
    batch_size: int = bounded(64, min=1)
    eval_batch_size: int | None = bounded(None, min=1)
    num_workers: int = bounded(2, min=0)

    def dataset_options(self) -> Any:
        """The dataset's options dataclass: the options set here, its defaults for the rest."""
        return get_dataset(self.name).make_options(self.options)

    def problems(self) -> list[tuple[str, str]]:
        use = get_dataset(self.name).root
        if use == "required" and self.root is None:
            return [("root", f"required when data.name is {self.name!r}, got null")]
        if use == "none" and self.root is not None:
            return [("root", f"dataset {self.name!r} reads no files of yours; leave it out, got {show(self.root)}")]
        return []


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = bounded(1e-3, min=0, min_exclusive=True)
    weight_decay: float = bounded(0.05, min=0)
    # the range applies to each beta
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999], metadata={"length": 2, "min": 0, "max": 1, "max_exclusive": True}
    )
    layer_decay: float | None = bounded(None, min=0, max=1, min_exclusive=True)

    def problems(self) -> list[tuple[str, str]]:
        # timm's names (timm.optim.list_optimizers()), optionally wrapped as `lookahead_<name>`
        names = list_optimizers()
        if self.name.lower().removeprefix("lookahead_") in names:
            return []
        examples = "adamw, sgd, lamb, lion, ..."
        problem = f"unknown optimizer {self.name!r}{did_you_mean(self.name, names)}"
        return [("name", f"{problem}; one of timm.optim.list_optimizers() ({len(names)} names: {examples})")]


@dataclass
class ScheduleConfig:
    name: Literal["cosine", "constant", "step"] = "cosine"
    warmup_steps: int = bounded(0, min=0)
    warmup_lr: float = bounded(1e-6, min=0)
    min_lr: float = bounded(1e-6, min=0)


@dataclass
class PretrainConfig:
    """``train.pretrain``: self-pretraining on the task's own training inputs before fine-tuning
    (``zoo.train.self_pretrain``; Amos et al. 2023, "Never Train from Scratch"). Token inputs only
    (``model.sequence.input`` tokens or dna)."""

    # mlm: predict masked tokens, bidirectional attention; causal: predict the next token, is_causal attention
    objective: Literal["mlm", "causal"] = "mlm"
    # passes over the training split, or optimizer steps; with both set, whichever ends first
    epochs: int | None = bounded(1, min=1)
    steps: int | None = bounded(None, min=1)
    # mlm only: the share of kept tokens masked (at least one per sequence)
    mask_prob: float = bounded(0.15, min=0, max=1, min_exclusive=True, max_exclusive=True)
    # null: optim.lr; warmed up over warmup_steps, then cosine to schedule.min_lr
    lr: float | None = bounded(None, min=0, min_exclusive=True)
    warmup_steps: int = bounded(0, min=0)

    def problems(self) -> list[tuple[str, str]]:
        if self.epochs is None and self.steps is None:
            return [("epochs", "set epochs or steps (or both: whichever ends first), got both null")]
        if self.objective != "mlm" and self.mask_prob != PretrainConfig.mask_prob:
            problem = f"only objective 'mlm' masks tokens (objective is {self.objective!r})"
            return [("mask_prob", f"{problem}; leave it out, got {self.mask_prob}")]
        return []


@dataclass
class EmaConfig:
    """``train.ema``: an exponential moving average of the weights (timm's ``ModelEmaV3``, zoo.train._ema), updated
    after every optimizer step, saved beside the raw weights in every checkpoint (``model_ema.safetensors``)."""

    # the weight of the average at each step once warmed up: ema = decay * ema + (1 - decay) * weights
    decay: float = bounded(0.999, min=0, max=1, min_exclusive=True, max_exclusive=True)
    # timm's warm-up: optimizer step t (from 1) uses min(decay, 1 - t ** -warmup_power), so early steps average over
    # few weights; false: decay from step 2 on. Step 1 copies the weights either way.
    warmup: bool = True
    warmup_power: float = bounded(0.75, min=0, min_exclusive=True)
    # the weights that validation scores, checkpoints/best is chosen by, and zoo.load_model / tools/eval.py load:
    # ema or raw (the optimizer's own)
    evaluate: Literal["ema", "raw"] = "ema"


@dataclass
class MixupConfig:
    """``train.mixup``: timm's ``Mixup`` (mixup and CutMix on the training batch, soft targets) with
    ``SoftTargetCrossEntropy`` (zoo.train._mixup); ``train.label_smoothing`` smooths the soft targets. Images and
    one class per sample only."""

    # Beta(alpha, alpha) of mixup's blend (0: no mixup)
    mixup_alpha: float = bounded(0.8, min=0)
    # Beta(alpha, alpha) of CutMix's box area (0: no CutMix)
    cutmix_alpha: float = bounded(1.0, min=0)
    # the share of batches that are mixed at all
    prob: float = bounded(1.0, min=0, max=1)
    # with both alphas set: the share of mixed batches that use CutMix rather than mixup
    switch_prob: float = bounded(0.5, min=0, max=1)

    def problems(self) -> list[tuple[str, str]]:
        if not self.mixup_alpha and not self.cutmix_alpha:
            return [("mixup_alpha", "mixup_alpha or cutmix_alpha must be > 0 (else leave train.mixup out), got both 0")]
        return []


@dataclass
class EarlyStoppingConfig:
    """``train.early_stopping``: stop once the validation score that picks checkpoints/best (the task's selection
    metric) has not improved for ``patience`` evaluations in a row."""

    patience: int = bounded(5, min=1)


@dataclass
class TrainConfig:
    epochs: int = bounded(10, min=1)
    max_steps: int | None = bounded(None, min=1)
    grad_accum_steps: int = bounded(1, min=1)
    clip_grad: float | None = bounded(1.0, min=0, min_exclusive=True)
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    label_smoothing: float = unit_interval(0.0)
    eval_every_epochs: int = bounded(1, min=1)
    # false: no validation split is read (train on every sample of the data's train split, as UCR's baselines do,
    # e.g. with the ucr set's data.options.val_fraction: 0); nothing picks an epoch, so checkpoints/best holds the
    # last evaluation's weights, and every eval_every_epochs only logs the training loss and checkpoints
    validate: bool = True
    log_every_steps: int = bounded(10, min=1)
    checkpoint_every_steps: int | None = bounded(None, min=1)
    # batches whose loss is NaN or inf that are skipped (no optimizer step) before the run stops with an error
    # naming the step and the last good checkpoint; 0: the first one stops it
    skip_nonfinite: int = bounded(0, min=0)
    # self-pretraining before step 0 (null: none); see PretrainConfig
    pretrain: PretrainConfig | None = None
    # ddp: every process holds the whole model; fsdp: parameters, gradients and optimizer state sharded over the
    # processes, one FSDP2 unit per block (zoo.train.distributed); activation checkpointing is model.grad_checkpointing
    distributed: Literal["ddp", "fsdp"] = "ddp"
    # accelerate's experiment tracker that also receives the training loss, learning rate and samples/s (every
    # log_every_steps) and every evaluation (epoch, validation loss and metrics), beside metrics.jsonl: tensorboard
    # (offline, into <run>/logs/<recipe name>), wandb, mlflow, comet_ml, aim, clearml, dvclive, swanlab, trackio;
    # its package must be installed. null: none.
    log_with: str | None = field(default=None, metadata={"choices": lambda: TRACKERS})
    # torch.compile of the model through accelerate's dynamo plugin (inductor): false runs it eagerly; true or one of
    # torch.compile's modes (true: 'default'); cuda: 'default' where the run has a CUDA GPU, eager on a CPU (where
    # compiling takes long and gains little). The first step's time, which includes compiling, and the steady step
    # time go into train.log and train_summary.json (first_step_s, step_s, compile_s); samples/s leaves it out.
    compile: Literal[COMPILE_CHOICES] = False
    # an exponential moving average of the weights (null: none); see EmaConfig
    ema: EmaConfig | None = None
    # mixup / CutMix of training images (null: none); see MixupConfig
    mixup: MixupConfig | None = None
    # stop when validation stops improving (null: run every epoch); see EarlyStoppingConfig
    early_stopping: EarlyStoppingConfig | None = None
    # true: accelerate's set_seed(seed, deterministic=True), torch's deterministic algorithms (an op without one
    # raises); the same recipe and seed then give the same weights on the same machine
    deterministic: bool = False
    # torch's intra-op threads in each process (null: OMP_NUM_THREADS where set, else this process's share of the
    # cores less the data loader's workers; zoo.train.threads)
    threads: int | None = bounded(None, min=1)

    @property
    def compile_mode(self) -> str | None:
        """The torch.compile mode that `compile` asks for on this machine; None: eager."""
        if self.compile is False or (self.compile == "cuda" and not torch.cuda.is_available()):
            return None
        return COMPILE_MODES[0] if self.compile in (True, "cuda") else self.compile


@dataclass
class Recipe:
    name: str
    description: str = ""
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # what the model learns (zoo.tasks.list_tasks()); the dataset must serve it
    task: str = field(default="classification", metadata={"choices": list_tasks})
    # the task's metrics (zoo.tasks: its metrics): classification top1 (accuracy), top5, f1 (macro), confusion, mcc,
    # auroc; token_classification the same per position; forecast mse, mae; causal_lm perplexity, top1.
    # Left out: the task's default_metrics (this default is classification's).
    metrics: list[Literal[METRICS]] = field(default_factory=lambda: ["top1", "top5", "f1"], metadata={"unique": True})
    output_dir: str | None = None

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        served, task = get_dataset(self.data.name).tasks, get_task(self.task)
        if self.task not in served:
            datasets = ", ".join(name for name in list_datasets() if self.task in get_dataset(name).tasks)
            problem = f"data.name {self.data.name!r} serves {_names(served)}; task {self.task!r} needs {datasets}"
            problems.append(("task", problem))
        problems += self._model_problems()
        problems += [
            (f"metrics[{i}]", f"task {self.task!r} takes one of {_names(task.metrics)}, got {name!r}")
            for i, name in enumerate(self.metrics)
            if name not in task.metrics
        ]
        if self.train.label_smoothing and not task.label_smoothing:
            users = [name for name in list_tasks() if get_task(name).label_smoothing]
            problems.append(("train.label_smoothing", f"only task {_names(users)} uses it, got task {self.task!r}"))
        return problems + self._pretrain_problems() + self._train_option_problems()

    def _train_option_problems(self) -> list[tuple[str, str]]:
        """train.mixup mixes images of one class each; train.ema keeps a whole copy of the weights (not sharded);
        train.early_stopping needs a validation split to watch."""
        cfg, task = self.train, get_task(self.task)
        domain = get_dataset(self.data.name).kind
        if cfg.mixup is not None and (domain != "image" or not (task.pooled and task.label_smoothing)):
            problem = "mixes images of one class each: needs image data and a one-class-per-sample task"
            return [("train.mixup", f"{problem}, got data.name {self.data.name!r} ({domain}) and task {self.task!r}")]
        if cfg.mixup is not None and self.data.batch_size % 2:
            return [("data.batch_size", f"must be even under train.mixup (timm's Mixup), got {self.data.batch_size}")]
        if cfg.ema is not None and cfg.distributed != "ddp":
            return [("train.ema", f"averages whole weights: needs train.distributed 'ddp', got {cfg.distributed!r}")]
        if cfg.early_stopping is not None and not cfg.validate:
            return [("train.early_stopping", "watches the validation score: needs train.validate true, got false")]
        return []

    def _pretrain_problems(self) -> list[tuple[str, str]]:
        """Self-pretraining predicts tokens: token inputs, a task that is not token prediction already, and an
        attention with a causal mode for the causal objective."""
        from ..kinds import get_model_kind

        pretrain, model = self.train.pretrain, self.model
        if pretrain is None:
            return []
        source = get_model_kind(model.kind).input_of(model.options) or f"model.kind {model.kind!r}"
        if source not in ("tokens", "dna"):
            problem = "predicts tokens: needs model.sequence.input 'tokens' or 'dna'"
            return [("train.pretrain", f"{problem}, got {source!r}")]
        if get_task(self.task).causal:
            return [("train.pretrain", f"task {self.task!r} already predicts tokens; leave train.pretrain out")]
        if self.train.distributed != "ddp":
            problem = f"runs data-parallel only: needs train.distributed 'ddp', got {self.train.distributed!r}"
            return [("train.pretrain", problem)]
        if pretrain.objective == "causal" and not get_attention(model.attention.name).supports_causal:
            causal = [name for name in list_attentions() if get_attention(name).supports_causal]
            problem = f"attention {model.attention.name!r} has no causal mode; use 'mlm' or one of {_names(causal)}"
            return [("train.pretrain.objective", f"{problem}, got 'causal'")]
        return []

    def _model_problems(self) -> list[tuple[str, str]]:
        """The model kind reads the dataset's kind of data; then the kind's own checks against data and task."""
        from ..kinds import get_model_kind, kinds_reading

        domain, kind = get_dataset(self.data.name).kind, get_model_kind(self.model.kind)
        if domain not in kind.data_kinds:
            readers = _names(kinds_reading(domain))
            problem = f"data.name {self.data.name!r} holds {domain} data: needs {readers}, got {kind.name!r}"
            return [("model.kind", problem)]
        return kind.recipe_problems(self)


def _names(values: Sequence[str]) -> str:
    return ", ".join(repr(value) for value in values)
