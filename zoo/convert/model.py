"""Converting a softmax-pretrained ViT to an efficient attention at a new resolution, as LoLCATs converts language
models: "LoLCATs: On Low-Rank Linearizing of Large Language Models" (Zhang et al. 2024),
https://arxiv.org/abs/2410.10254, with Hedgehog's learned feature maps (https://arxiv.org/abs/2402.04347).

The pieces, on models (the loops are `zoo.train.loop.Trainer`'s, driven by `zoo.convert.run`):

1. `swap_attention(teacher, "hedgehog", img_size=256)`: a copy of the teacher at the target resolution
   (`pos_embed` resampled) whose every block's attention is the target variant, with all of timm's attention
   weights (qkv, q/k norms, norm, gate, proj) copied.
2. `AttentionTransfer(teacher, student)`, stage 1's objective ("attention transfer"): everything is frozen
   but the new attention's own parameters (`attention_parameters`: Hedgehog's feature maps, Linformer's
   projections, Nystrom's conv), trained to minimise, per block, the MSE between the student attention's output
   and the teacher's softmax attention output on the same inputs: the teacher's hidden states, captured with
   forward hooks (LoLCATs feeds the teacher's hidden states to both). The teacher runs its own attention (SDPA for
   zoo's `softmax` and timm's fused attention), so no N x N matrix is formed here. Variants with no parameters of
   their own skip this stage.
3. `Distillation(kind, task, teacher=...)`, stage 2's objective: the task loss on all weights (or low-rank adapters
   through `peft`), optionally distilled from the teacher's logits by timm's `LogitDistillationTask`.

`attention_mse` measures stage 1's objective, per block, without training.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import to_2tuple
from timm.task import LogitDistillationTask
from torch import Tensor, nn

from .._validate import check_int
from ..attention import auxiliary_loss, create_attention, get_attention
from ..attention._common import TIMM_ATTENTION_KEYS
from ..train._objective import Objective, TaskObjective

__all__ = [
    "AttentionTransfer",
    "Distillation",
    "FinetuneReport",
    "TransferReport",
    "attention_modules",
    "attention_mse",
    "attention_parameters",
    "swap_attention",
]

_logger = logging.getLogger(__name__)


@dataclass
class TransferReport:
    """What stage 1 did: `losses` is the per-block mean MSE at each step; `parameters` the names trained."""

    skipped: bool
    steps: int = 0
    parameters: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


@dataclass
class FinetuneReport:
    """What stage 2 did: the loss at each step, and its task and distillation parts (empty without a teacher)."""

    steps: int = 0
    losses: list[float] = field(default_factory=list)
    task_losses: list[float] = field(default_factory=list)
    distill_losses: list[float] = field(default_factory=list)
    lora_rank: int | None = None


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`("blocks.i.attn", module)` for every block of a timm VisionTransformer; each must have timm's `qkv` and
    `proj` (timm's `Attention` or any zoo variant but GAU)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Sequential):
        raise TypeError(f"{type(model).__name__} has no `blocks` sequence: expected a timm VisionTransformer")
    found = []
    for index, block in enumerate(blocks):
        attn = getattr(block, "attn", None)
        if not (
            isinstance(getattr(attn, "qkv", None), nn.Linear) and isinstance(getattr(attn, "proj", None), nn.Linear)
        ):
            raise TypeError(
                f"block {index} ({type(block).__name__}) has no timm-style attention with `qkv` and `proj` to "
                "convert (GAU blocks cannot be converted); expected timm's Block with any zoo attention but 'gau'"
            )
        found.append((f"blocks.{index}.attn", attn))
    return found


def attention_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The attention variant's own parameters, by full name: every attention parameter that timm's `Attention`
    does not have (Hedgehog's feature maps, Linformer's projections, Nystrom's conv), each once."""
    own, seen = {}, set()
    for prefix, attn in attention_modules(model):
        for name, param in attn.named_parameters():
            if not name.startswith(TIMM_ATTENTION_KEYS) and id(param) not in seen:
                seen.add(id(param))
                own[f"{prefix}.{name}"] = param
    return own


def _image_size(model: nn.Module) -> tuple[int, int]:
    return tuple(model.patch_embed.img_size)


def _at_resolution(model: nn.Module, img_size: int | tuple[int, int] | None) -> nn.Module:
    """`model` itself when it already takes `img_size` (or img_size is None), else a copy that does (timm's
    `set_input_size`: `pos_embed` resampled bicubically, prefix tokens kept)."""
    if img_size is None or to_2tuple(img_size) == _image_size(model):
        return model
    size = to_2tuple(img_size)
    if not all(isinstance(side, int) and side > 0 for side in size):
        raise ValueError(f"img_size={img_size!r} must be a positive integer or a pair of them")
    resized = copy.deepcopy(model)
    resized.set_input_size(img_size=size)
    return resized


def _shared_arguments(attn: nn.Module, target: type[nn.Module]) -> dict[str, Any]:
    """timm's constructor arguments that rebuild `attn`'s projections, read from the module itself."""
    q_norm, norm = attn.q_norm, getattr(attn, "norm", nn.Identity())
    norm_layer = next((type(m) for m in (q_norm, norm) if not isinstance(m, nn.Identity)), None)
    attn_drop = attn.attn_drop.p if isinstance(getattr(attn, "attn_drop", None), nn.Dropout) else 0.0
    if attn_drop > 0 and not getattr(target, "has_attention_weights", True):
        _logger.warning(
            "%r forms no attention weights: the teacher's attn_drop=%s is dropped", target.attention_name, attn_drop
        )
        attn_drop = 0.0
    return {
        "attn_head_dim": attn.head_dim,
        "dim_out": attn.proj.out_features,
        "qkv_bias": attn.qkv.bias is not None,
        "qk_norm": not isinstance(q_norm, nn.Identity),
        "scale_norm": not isinstance(norm, nn.Identity),
        "proj_bias": attn.proj.bias is not None,
        "gated": getattr(attn, "gate", None) is not None,
        "attn_drop": attn_drop,
        "proj_drop": attn.proj_drop.p if isinstance(getattr(attn, "proj_drop", None), nn.Dropout) else 0.0,
        "norm_layer": norm_layer,
        "device": attn.qkv.weight.device,
        "dtype": attn.qkv.weight.dtype,
    }


def _swapped(attn: nn.Module, attention: str, options: dict[str, Any]) -> nn.Module:
    """A new `attention` module with `attn`'s timm weights (and norm modules, eps included)."""
    new = create_attention(
        attention, attn.qkv.in_features, attn.num_heads, **_shared_arguments(attn, get_attention(attention)), **options
    )
    for name in ("q_norm", "k_norm", "norm"):
        if not isinstance(getattr(attn, name, nn.Identity()), nn.Identity):
            setattr(new, name, copy.deepcopy(getattr(attn, name)))
    timm_state = {k: v for k, v in attn.state_dict().items() if k.startswith(TIMM_ATTENTION_KEYS)}
    missing, unexpected = new.load_state_dict(timm_state, strict=False)
    missing = [k for k in missing if k.startswith(TIMM_ATTENTION_KEYS)]
    if missing or unexpected:
        raise ValueError(
            f"attention {attention!r} does not take timm's weights: missing {missing}, unexpected {unexpected}"
        )
    return new.train(attn.training)


def swap_attention(
    teacher: nn.Module,
    attention: str,
    attention_options: dict[str, Any] | None = None,
    img_size: int | tuple[int, int] | None = None,
) -> nn.Module:
    """A copy of `teacher` (a timm VisionTransformer, e.g. from `zoo.create_model`) at `img_size` (default: the
    teacher's) whose every block's attention is `attention` with `attention_options`; qkv, q/k norms, norm, gate
    and proj are copied, the variant's own parameters keep their initialisation. The teacher is not modified.

    2-D variants (`needs_grid`) get the target patch grid and prefix-token count unless the options set them.
    """
    options = dict(attention_options or {})
    cls = get_attention(attention)
    student = _at_resolution(teacher, img_size)
    student = copy.deepcopy(student) if student is teacher else student
    if getattr(cls, "needs_grid", False):
        options.setdefault("grid_size", tuple(student.patch_embed.grid_size))
        options.setdefault("num_prefix_tokens", student.num_prefix_tokens)
    for (_, attn), block in zip(attention_modules(student), student.blocks, strict=True):
        block.attn = _swapped(attn, attention, options)
    if isinstance(getattr(student, "zoo_args", None), dict):
        # the construction record (save_pretrained rebuilds from it): every block now holds `attention`
        student.zoo_args = {
            **student.zoo_args, "attention": attention, "attention_options": options, "global_blocks": [],
            "global_attention": "softmax", "global_attention_options": {},
        }  # fmt: skip
    return student


def _images(batch: Any) -> Tensor:
    """The images of a batch: a tensor, or the first item of a (images, targets, ...) tuple or list."""
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not isinstance(images, Tensor):
        raise TypeError(f"a batch must be an image tensor or an (images, targets) pair, got {type(batch).__name__}")
    return images


@contextlib.contextmanager
def _captured_attention(model: nn.Module) -> Iterator[list[tuple[Tensor, Tensor]]]:
    """Every attention module's (input `[b, n, c]`, output `[b, n, c]`) of each forward inside the block, by hooks."""
    records: list[tuple[Tensor, Tensor]] = []

    def hook(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> None:
        records.append((args[0] if args else kwargs["x"], output))

    handles = [attn.register_forward_hook(hook, with_kwargs=True) for _, attn in attention_modules(model)]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


def _teacher_attention(teacher: nn.Module, images: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Per block, the teacher's attention input and output on `images` (no gradient)."""
    with torch.no_grad(), _captured_attention(teacher) as records:
        teacher(images)
    return list(records)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def _only_trainable(model: nn.Module, trainable: Iterable[nn.Parameter]) -> Iterator[None]:
    """Freeze every parameter of `model` but `trainable`; the previous flags come back on exit."""
    flags = {param: param.requires_grad for param in model.parameters()}
    keep = {id(param) for param in trainable}
    try:
        for param in model.parameters():
            param.requires_grad_(id(param) in keep)
        yield
    finally:
        for param, flag in flags.items():
            param.requires_grad_(flag)


@contextlib.contextmanager
def _mode(model: nn.Module, training: bool) -> Iterator[None]:
    was_training = model.training
    model.train(training)
    try:
        yield
    finally:
        model.train(was_training)


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return float(value)


def attention_mse(
    teacher: nn.Module, student: nn.Module, batches: Iterable, max_batches: int | None = None
) -> list[float]:
    """Stage 1's objective without training: per block, the mean over `batches` of the MSE between the student
    attention's output and the teacher's on the teacher's hidden states (both in eval mode) -> one float per block.
    """
    teacher = _at_resolution(teacher, _image_size(student))
    modules = [attn for _, attn in attention_modules(student)]
    totals, count = [0.0] * len(modules), 0
    with _mode(teacher, False), _mode(student, False), torch.no_grad():
        for batch in itertools.islice(batches, max_batches):
            records = _teacher_attention(teacher, _images(batch).to(_device(student)))
            for index, (attn, (x, target)) in enumerate(zip(modules, records, strict=True)):
                totals[index] += F.mse_loss(attn(x), target).item()
            count += 1
    if count == 0:
        raise ValueError("attention_mse got no batches")
    return [total / count for total in totals]


def _with_lora(model: nn.Module, rank: int, alpha: float | None) -> nn.Module:
    """`model` with LoRA adapters on every attention's qkv and proj (LoLCATs' q/k/v/o), through `peft`."""
    try:
        import peft
    except ImportError:
        raise ImportError(
            f"lora_rank={rank} needs the peft package, which is not installed: pip install peft "
            "(or finetune without lora_rank, on all weights)"
        ) from None
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha if alpha is not None else 2 * rank, target_modules=r".*\.attn\.(qkv|proj)"
    )
    return peft.get_peft_model(model, config)


class _AttentionStack(nn.Module):
    """The student's attention modules (shared, not copied) as one module for stage 1 to train: `forward(inputs)`
    runs block i's attention on `inputs[i]` (`[b, n, c]` each). It stays in eval mode: stage 1's targets and
    outputs are deterministic (no attention or projection dropout)."""

    def __init__(self, student: nn.Module) -> None:
        super().__init__()
        self.attention = nn.ModuleList(attn for _, attn in attention_modules(student))

    def train(self, mode: bool = True) -> _AttentionStack:
        return super().train(False)

    def forward(self, inputs: list[Tensor]) -> list[Tensor]:
        return [attn(x) for attn, x in zip(self.attention, inputs, strict=True)]


class AttentionTransfer(Objective):
    """Stage 1's loss: the sum over blocks of MSE(student attention(x_i), teacher attention(x_i)), x_i the teacher's
    hidden state entering block i on the batch's images (labels unused). The teacher runs at the student's
    resolution (a resampled copy when they differ), in eval mode, without gradients; what trains is the student's
    attention modules (`_AttentionStack`), of which the caller leaves only `attention_parameters` trainable.
    `losses` holds the per-block mean MSE of every batch (on the device)."""

    def __init__(self, teacher: nn.Module, student: nn.Module) -> None:
        self.teacher = _at_resolution(teacher, _image_size(student)).eval()
        self.losses: list[Tensor] = []

    def module(self, model: nn.Module) -> nn.Module:
        return _AttentionStack(model)

    def setup(self, accelerator: Any, module: nn.Module) -> None:
        self.teacher.to(accelerator.device)

    def loss(self, module: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        records = _teacher_attention(self.teacher, batch["image"])
        outputs = module([x for x, _ in records])
        pairs = zip(outputs, records, strict=True)
        losses = torch.stack([F.mse_loss(out.float(), target.float()) for out, (_, target) in pairs])
        self.losses.append(losses.detach().mean())
        return losses.sum()


class Distillation(TaskObjective):
    """Stage 2's loss: the task's loss on the student's outputs (plus the attention's auxiliary loss), or with a
    `teacher` timm's `LogitDistillationTask`: `(1 - distill_weight) * task + distill_weight * T^2 KL(teacher ||
    student)` of the logits softened by `temperature` (Hinton et al. 2015), the teacher at the student's resolution
    in eval mode. With `lora_rank` the module that trains is the student under LoRA adapters of that rank on every
    attention's qkv and proj (`peft`; alpha defaults to 2 rank) plus its classifier; `merge` folds them back.
    `parts` holds every batch's (loss, task part, distillation part) on the device."""

    def __init__(
        self,
        kind: Any,
        task: Any,
        *,
        label_smoothing: float = 0.0,
        teacher: nn.Module | None = None,
        distill_weight: float = 0.5,
        temperature: float = 1.0,
        lora_rank: int | None = None,
        lora_alpha: float | None = None,
    ) -> None:
        super().__init__(kind, task, label_smoothing=label_smoothing)
        if not 0 <= distill_weight <= 1:
            raise ValueError(f"distill_weight={distill_weight!r} must lie in [0, 1]")
        _check_positive("temperature", temperature)
        if lora_rank is not None:
            check_int("lora_rank", lora_rank, 1)
        self.teacher, self.distill_weight, self.temperature = teacher, distill_weight, temperature
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha
        self.distiller: LogitDistillationTask | None = None
        # the student under its adapters, while they are not merged
        self.adapted: nn.Module | None = None
        self.parts: list[Tensor] = []

    def module(self, model: nn.Module) -> nn.Module:
        if self.teacher is not None:
            self.teacher = _at_resolution(self.teacher, _image_size(model)).eval()
        if self.lora_rank is None:
            return model
        self.adapted = _with_lora(model, self.lora_rank, self.lora_alpha)
        # peft froze everything but the adapters: the classifier is task-specific, so it trains too
        for param in model.get_classifier().parameters():
            param.requires_grad_(True)
        return self.adapted

    def merge(self) -> None:
        """The LoRA adapters merged into qkv and proj: the student is a plain timm model again, with the same keys."""
        if self.adapted is not None:
            self.adapted.merge_and_unload()
            self.adapted = None

    def setup(self, accelerator: Any, module: nn.Module) -> None:
        if self.teacher is None:
            return
        self.teacher.to(accelerator.device)
        self.distiller = LogitDistillationTask(
            module,
            self.teacher,
            criterion=self._task_loss,
            task_loss_weight=1 - self.distill_weight,
            distill_loss_weight=self.distill_weight,
            temperature=self.temperature,
            device=accelerator.device,
            verbose=False,
        )
        # zoo's data is normalised once, for both models: the teacher reads the student's input as it is. timm's task
        # would map it from the student's pretrained_cfg mean / std to the teacher's, which differ for no reason of
        # the data's (a freshly built student keeps timm's 0.5 / 0.5, a loaded zoo run its data's 0 / 1): the teacher
        # then saw shifted images and its logits, the distillation target, were at chance
        self.distiller.student_mean = self.distiller.student_std = None

    def _task_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return self.task.loss(outputs, targets, label_smoothing=self.label_smoothing)

    def loss(self, module: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        if self.distiller is None:
            loss = super().loss(module, batch)
            self.parts.append(torch.stack([loss.detach(), loss.detach(), torch.zeros_like(loss.detach())]))
            return loss
        targets, _ = self.task.targets(batch)
        # the prepared module (DDP, compiled) is the student the distiller runs
        self.distiller.trainable_module = module
        out = self.distiller(*self.kind.inputs(batch), targets)
        aux = auxiliary_loss(module)
        loss = out["loss"] + (1 - self.distill_weight) * aux
        self.parts.append(torch.stack([loss, out["task_loss"] + aux, out["kd_loss"]]).detach().float())
        return loss
