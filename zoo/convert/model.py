"""Converting a softmax-pretrained ViT to an efficient attention at a new resolution, as LoLCATs converts language
models: "LoLCATs: On Low-Rank Linearizing of Large Language Models" (Zhang et al. 2024),
https://arxiv.org/abs/2410.10254, with Hedgehog's learned feature maps (https://arxiv.org/abs/2402.04347).

Three plain functions on models and iterables of batches, independent of the training engine:

1. `swap_attention(teacher, "hedgehog", img_size=256)`: a copy of the teacher at the target resolution
   (`pos_embed` resampled) whose every block's attention is the target variant, with all of timm's attention
   weights (qkv, q/k norms, norm, gate, proj) copied.
2. `transfer_attention(teacher, student, batches, steps)`, stage 1 ("attention transfer"): everything is frozen
   but the new attention's own parameters (`attention_parameters`: Hedgehog's feature maps, Linformer's
   projections, Nystrom's conv), trained to minimise, per block, the MSE between the student attention's output
   and the teacher's softmax attention output on the same inputs: the teacher's hidden states, captured with
   forward hooks (LoLCATs feeds the teacher's hidden states to both). The teacher runs its own attention (SDPA for
   zoo's `softmax` and timm's fused attention), so no N x N matrix is formed here. Variants with no parameters of
   their own skip this stage.
3. `finetune(student, loader, steps)`, stage 2: the task loss on all weights (or low-rank adapters through `peft`),
   optionally distilled from the teacher's logits.

`attention_mse` measures stage 1's objective, per block, without training.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.layers import to_2tuple
from torch import Tensor, nn

from .._validate import check_int
from ..attention import auxiliary_loss, create_attention, get_attention, on_optimizer_step
from ..attention._common import TIMM_ATTENTION_KEYS

__all__ = [
    "FinetuneReport",
    "TransferReport",
    "attention_modules",
    "attention_mse",
    "attention_parameters",
    "finetune",
    "swap_attention",
    "transfer_attention",
]

_logger = logging.getLogger(__name__)

SCHEDULES = ("cosine", "constant")


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


def _cycle(batches: Iterable) -> Iterator:
    """Batches without end: the iterable is iterated again each time it runs out (a DataLoader or a list)."""
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise ValueError("the batches gave nothing (an empty loader, or a generator already used up)")


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


def transfer_attention(
    teacher: nn.Module,
    student: nn.Module,
    batches: Iterable,
    steps: int,
    lr: float = 1e-2,
    *,
    weight_decay: float = 0.0,
    log_every: int = 0,
) -> TransferReport:
    """Stage 1, attention transfer: train only `attention_parameters(student)` for `steps` AdamW steps (LoLCATs:
    lr 1e-2) to minimise the sum over blocks of MSE(student attention(x_i), teacher attention(x_i)), with x_i the
    teacher's hidden state entering block i on each batch of unlabeled images (`batches`: tensors or (images, ...)
    tuples at the student's resolution, iterated again when they run out).

    The teacher runs at the student's resolution (a resampled copy when they differ; the teacher is not modified);
    both run in eval mode (the targets are deterministic). Every other student tensor is left bitwise unchanged
    and the previous `requires_grad` flags and train/eval mode are restored. A variant with no parameters of its
    own returns at once with `skipped=True`.
    """
    check_int("steps", steps, 0)
    _check_positive("lr", lr)
    own = attention_parameters(student)
    if not own:
        name = getattr(student, "zoo_args", {}).get("attention", "this attention")
        _logger.info("%s has no parameters of its own: stage 1 (attention transfer) skipped", name)
        return TransferReport(skipped=True)
    teacher = _at_resolution(teacher, _image_size(student))
    modules = [attn for _, attn in attention_modules(student)]
    optimizer = torch.optim.AdamW(own.values(), lr=lr, weight_decay=weight_decay)
    report = TransferReport(skipped=False, parameters=list(own))
    with _mode(teacher, False), _mode(student, False), _only_trainable(student, own.values()):
        # _cycle never ends: `steps` bounds the loop
        for step, batch in zip(range(steps), _cycle(batches), strict=False):
            records = _teacher_attention(teacher, _images(batch).to(_device(student)))
            losses = [F.mse_loss(attn(x), target) for attn, (x, target) in zip(modules, records, strict=True)]
            loss = torch.stack(losses).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            report.losses.append(loss.item() / len(losses))
            report.steps = step + 1
            if log_every and (step + 1) % log_every == 0:
                _logger.info("attention transfer step %d/%d: mean block MSE %.4g", step + 1, steps, report.losses[-1])
    return report


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


def _schedule(optimizer: torch.optim.Optimizer, schedule: str, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {', '.join(map(repr, SCHEDULES))}")
    if schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / max(steps, 1)))
    )


def _distillation(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """KL(teacher || student) of the temperature-softened distributions, times T^2 (Hinton et al. 2015)."""
    log_student = F.log_softmax(student_logits / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher_logits / temperature, dim=-1)
    return F.kl_div(log_student, log_teacher, reduction="batchmean", log_target=True) * temperature**2


def _finetune_loss(
    model: nn.Module,
    student: nn.Module,
    batch: Any,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    teacher: nn.Module | None,
    distill_weight: float,
    temperature: float,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The loss of one (images, targets) batch, its task part and its distillation part (None without a teacher)."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise ValueError("finetune needs (images, targets) batches; got a batch without targets")
    device = _device(student)
    images, targets = batch[0].to(device), batch[1].to(device)
    logits = model(images)
    task = loss_fn(logits, targets) + auxiliary_loss(student)
    if teacher is None:
        return task, task, None
    with torch.no_grad():
        teacher_logits = teacher(images)
    distill = _distillation(logits, teacher_logits, temperature)
    return (1 - distill_weight) * task + distill_weight * distill, task, distill


def finetune(
    student: nn.Module,
    loader: Iterable,
    steps: int,
    lr: float = 1e-4,
    *,
    teacher: nn.Module | None = None,
    distill_weight: float = 0.5,
    temperature: float = 1.0,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    schedule: Literal["cosine", "constant"] = "cosine",
    loss_fn: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
    log_every: int = 0,
) -> FinetuneReport:
    """Stage 2: `steps` AdamW steps of `loss_fn(student(images), targets)` on (images, targets) batches from
    `loader` (iterated again when it runs out), in train mode, the student changed in place.

    All weights train, or with `lora_rank` only LoRA adapters of that rank on every attention's qkv and proj plus
    the classifier head (through `peft`, merged back into the plain model at the end; alpha defaults to 2 rank).
    With a `teacher` (run at the student's resolution, eval mode) the loss is `(1 - distill_weight) * task +
    distill_weight * KL` of the temperature-softened logits; without one `distill_weight` and `temperature` are
    unused. The learning rate follows `schedule` (cosine decay to 0 over `steps`, or constant); gradients are
    clipped to `max_grad_norm` (None: not clipped). Auxiliary attention losses (VQ) are added to the task loss.
    """
    _check_finetune(steps, lr, temperature, distill_weight, lora_rank)
    if teacher is not None:
        teacher = _at_resolution(teacher, _image_size(student))
    flags = {param: param.requires_grad for param in student.parameters()}
    model = student if lora_rank is None else _with_lora(student, lora_rank, lora_alpha)
    report = FinetuneReport(lora_rank=lora_rank)
    try:
        if lora_rank is not None:
            # peft froze everything but the adapters: the classifier is task-specific, so it trains too.
            for param in student.get_classifier().parameters():
                param.requires_grad_(True)
        trainable = [param for param in model.parameters() if param.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
        scheduler = _schedule(optimizer, schedule, steps)
        with _mode(student, True), contextlib.nullcontext() if teacher is None else _mode(teacher, False):
            # _cycle never ends: `steps` bounds the loop
            for step, batch in zip(range(steps), _cycle(loader), strict=False):
                loss, task, distill = _finetune_loss(
                    model, student, batch, loss_fn, teacher, distill_weight, temperature
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
                optimizer.step()
                scheduler.step()
                on_optimizer_step(student)
                _record(report, step, loss, task, distill)
                if log_every and (step + 1) % log_every == 0:
                    _logger.info("finetune step %d/%d: loss %.4g", step + 1, steps, report.losses[-1])
    finally:
        if lora_rank is not None:
            # The adapters are merged into qkv and proj: the student is a plain timm model again, same keys.
            model.merge_and_unload()
        for param, flag in flags.items():
            param.requires_grad_(flag)
    return report


def _check_finetune(steps: int, lr: float, temperature: float, distill_weight: float, lora_rank: int | None) -> None:
    """`finetune`'s settings, each wrong one a one-line error naming it."""
    check_int("steps", steps, 0)
    _check_positive("lr", lr)
    _check_positive("temperature", temperature)
    if not 0 <= distill_weight <= 1:
        raise ValueError(f"distill_weight={distill_weight!r} must lie in [0, 1]")
    if lora_rank is not None:
        check_int("lora_rank", lora_rank, 1)


def _record(report: FinetuneReport, step: int, loss: Tensor, task: Tensor, distill: Tensor | None) -> None:
    """One step's losses into the report (read on the host once per step)."""
    report.losses.append(loss.item())
    report.task_losses.append(task.item())
    if distill is not None:
        report.distill_losses.append(distill.item())
    report.steps = step + 1
