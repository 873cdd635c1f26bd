"""How the processes of a run share the model: `train.distributed` is `ddp` or `fsdp`.

`ddp`: every process holds the whole model and optimizer; gradients are all-reduced (accelerate's default).
`fsdp`: PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`) through accelerate's FSDP plugin: parameters,
gradients and optimizer state are sharded over the processes, one unit per transformer block (each child of the
model's `blocks`) plus the root unit for the rest (embeddings, class token, final norm, head). A block's
parameters are gathered just before it runs and freed after, so a process holds a 1/P share of the weights plus
about one block whole: a ViT-L at 2048 px (16K tokens) trains on GPUs that cannot hold it, with the recipe
unchanged. Activation checkpointing is the model's own `model.grad_checkpointing` (torch's non-reentrant
checkpoint around each block, inside its unit): accelerate's `activation_checkpointing` recomputes without
restoring the random state, so drop path and dropout would draw other masks in the recompute.

A checkpoint holds accelerate's sharded state (`pytorch_model_fsdp_0/`, `optimizer_0/`: torch.distributed.checkpoint
files, one per process) and the whole weights in `model.safetensors`, as a `ddp` checkpoint does, for
`tools/eval.py` and `zoo.hub.load`.

FSDP needs several processes: with one, `fsdp` trains the whole model on that process, as `ddp` does. On the
CPU (gloo), where accelerate 1.15 enables FSDP only for accelerator devices though FSDP2 runs there, the run is
switched to FSDP the way accelerate switches a GPU run, so that the tests exercise sharding without a GPU.

Buffers, under both strategies, are process 0's: `sync_buffers` broadcasts every persistent buffer from process 0
after every optimizer step (the engine calls it, in every run), and DDP's own broadcast before every
forward is turned off, so that one rule holds for both. FSDP shards parameters only, and a buffer that a process updates
from its own batch (BatchNorm's running statistics in the conv stem) drifts apart otherwise. Synchronised BatchNorm was
the other choice; it is not taken because it covers BatchNorm alone, runs only on GPUs (the CPU tests could not
exercise it) and changes what the statistics are (the global batch's, where DDP keeps process 0's). Modules that
update a buffer from every replica's data keep it identical themselves (VQ all-reduces its codebook statistics;
Performer and Reformer draw from a seed buffer), which the broadcast leaves as it is. `replica_mismatches` finds any
entry of the state that still differs: the engine runs it after the first step and at the end of a run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import (
    DistributedDataParallelKwargs,
    DistributedType,
    FullyShardedDataParallelPlugin,
    gather_object,
)
from torch import Tensor, nn

from .._validate import unknown_name

__all__ = [
    "STRATEGIES",
    "build_accelerator",
    "is_sharded",
    "local_shard",
    "raise_if_diverged",
    "replica_mismatches",
    "save_checkpoint",
    "shard_units",
    "sync_buffers",
    "whole_state",
]

_logger = logging.getLogger(__name__)

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _BlockShardingPlugin(FullyShardedDataParallelPlugin):
    """accelerate's FSDP2 plugin whose units are the model's blocks: the class names accelerate wraps are read off
    the model when `Accelerator.prepare` sees it, not typed by the user."""

    def set_auto_wrap_policy(self, model: nn.Module) -> None:
        if self.transformer_cls_names_to_wrap is None:
            self.transformer_cls_names_to_wrap = shard_units(model)
        super().set_auto_wrap_policy(model)


def shard_units(model: nn.Module) -> list[str]:
    """The class names of the children of every `blocks` container of `model` (a timm ViT's `blocks`, a sequence
    model's `backbone.blocks`): each such block becomes one FSDP unit.

    Raises ValueError for a model without blocks, for reversible blocks (one autograd function runs the whole
    stack and recomputes it, which per-block sharding cannot follow) and for two block classes sharing a name
    (accelerate finds a unit class by its name)."""
    containers = [
        (name, module)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] == "blocks" and isinstance(module, (nn.Sequential, nn.ModuleList))
    ]
    if not containers:
        raise ValueError(
            f"train.distributed 'fsdp' shards a model block by block, but {type(model).__name__} has no `blocks`; "
            "use train.distributed 'ddp'"
        )
    for name, container in containers:
        if type(container).__name__ == "ReversibleSequence":
            raise ValueError(
                f"train.distributed 'fsdp' cannot shard reversible blocks ({name}: one autograd function recomputes "
                "the whole stack); set model.reversible false (model.grad_checkpointing saves memory instead) or "
                "use train.distributed 'ddp'"
            )
    classes = {type(block) for _, container in containers for block in container}
    names = sorted({cls.__name__ for cls in classes})
    for cls_name in names:
        same_name = {type(m) for m in model.modules() if type(m).__name__ == cls_name}
        if len(same_name) > 1:
            raise ValueError(
                f"train.distributed 'fsdp': {len(same_name)} module classes of the model are named {cls_name!r}, "
                "so accelerate cannot tell the block class apart; use train.distributed 'ddp'"
            )
    return names


def _plugin(mixed_precision: str) -> _BlockShardingPlugin:
    # Parameters are kept and updated in fp32; blocks compute in the autocast dtype and gradients are
    # reduce-scattered in fp32 (accelerate's default would reduce in bf16 too).
    policy = None
    if mixed_precision in _DTYPES:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(param_dtype=_DTYPES[mixed_precision], reduce_dtype=torch.float32)
    return _BlockShardingPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        reshard_after_forward=True,
        state_dict_type="SHARDED_STATE_DICT",
        mixed_precision_policy=policy,
        activation_checkpointing=False,
        cpu_ram_efficient_loading=False,
    )


def build_accelerator(
    distributed: str, *, cpu: bool = False, mixed_precision: str = "no", **kwargs: Any
) -> Accelerator:
    """An `Accelerator` for strategy `distributed` (`ddp` or `fsdp`); the other arguments are the Accelerator's."""
    if distributed not in STRATEGIES:
        raise unknown_name("train.distributed", distributed, STRATEGIES)
    processes = PartialState(cpu=cpu).num_processes
    if distributed == "ddp" or processes == 1:
        if distributed == "fsdp":
            _logger.info("train.distributed 'fsdp' with one process: nothing to shard over, the model stays whole")
        # buffers travel in sync_buffers, once per optimizer step, not before every forward
        handlers = [
            *(kwargs.pop("kwargs_handlers", None) or ()),
            DistributedDataParallelKwargs(broadcast_buffers=False),
        ]
        return Accelerator(cpu=cpu, mixed_precision=mixed_precision, kwargs_handlers=handlers, **kwargs)
    plugin = _plugin(mixed_precision)
    accelerator = Accelerator(cpu=cpu, mixed_precision=mixed_precision, fsdp_plugin=plugin, **kwargs)
    if accelerator.distributed_type == DistributedType.MULTI_CPU:
        _shard_on_cpu(accelerator, plugin)
    if not accelerator.is_fsdp2:
        raise ValueError(
            f"train.distributed 'fsdp' needs FSDP2, but accelerate set up {accelerator.distributed_type} on "
            f"{accelerator.device}; use train.distributed 'ddp'"
        )
    return accelerator


def end_processes() -> None:
    """End a process of a distributed run (a launcher's: torchrun, accelerate launch) that finished well, with exit
    status 0; without a process group, return.

    Every process waits for the others, leaves the process group, flushes its logs and output, then exits at once
    (`os._exit`), skipping the interpreter's teardown. Leaving the group does not stop gloo's threads (its loop and
    work threads stay alive: a sharded model's DTensors keep the device mesh, and so the group, referenced from
    torch's caches), and a C++ thread that takes the GIL while the interpreter is torn down is ended mid-call, which
    aborts the process ("terminate called without an active exception", SIGABRT) after its last checkpoint: the
    launch fails, as it did in CI. A failed run does not come here: its peers may be waiting in a collective, and
    the launcher ends them. The last call of a tool: nothing after it runs."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    PartialState().destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _shard_on_cpu(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin) -> None:
    """What `AcceleratorState` does for FSDP on a GPU (accelerate/state.py), for a gloo run on the CPU."""
    state = accelerator.state
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def is_sharded(accelerator: Accelerator) -> bool:
    """Whether the prepared model's parameters are sharded over the processes."""
    return accelerator.distributed_type == DistributedType.FSDP


def save_checkpoint(accelerator: Accelerator, model: nn.Module, directory: Path) -> None:
    """`accelerator.save_state` into `directory` (every process), plus, for a sharded model, its whole weights as
    `model.safetensors` (written by the main process), which a `ddp` checkpoint holds already."""
    accelerator.save_state(str(directory))
    if is_sharded(accelerator):
        # gathers every shard: a collective, so every process calls it
        accelerator.save_model(model, str(directory))


def local_shard(tensor: Tensor) -> Tensor:
    """This process's part of `tensor`: the local shard of a sharded parameter (a DTensor), else `tensor`."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def whole_state(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """The entries of `model.state_dict()` sorted by name, each whole: a sharded one (a DTensor) is gathered,
    one at a time, so no process ever holds more than one whole tensor. A collective under `fsdp`: every process
    must consume it."""
    for name, tensor in sorted(model.state_dict().items()):
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _persistent_buffers(model: nn.Module) -> list[Tensor]:
    """The buffers `model.state_dict()` holds, in module order (the same on every process)."""
    return [
        buffer
        for module in model.modules()
        for name, buffer in module.named_buffers(recurse=False)
        if name not in module._non_persistent_buffers_set
    ]


@torch.no_grad()
def sync_buffers(model: nn.Module) -> None:
    """Copy process 0's persistent buffers into every other process's `model`, one broadcast per device and dtype.

    A collective: every process calls it, after every optimizer step (see the module docstring). Non-persistent
    buffers are constants derived from the configuration (lookup tables, masks), never sent."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for buffer in _persistent_buffers(model):
        groups.setdefault((buffer.device, buffer.dtype), []).append(buffer)
    # the same order on every process, whichever GPU it holds
    for (_, dtype), buffers in sorted(groups.items(), key=lambda item: (item[0][0].type, str(item[0][1]))):
        flat = torch.cat([buffer.reshape(-1) for buffer in buffers])
        # gloo and NCCL broadcast bytes, not booleans
        dist.broadcast(flat.view(torch.uint8) if dtype == torch.bool else flat, src=0)
        for buffer, part in zip(buffers, flat.split([b.numel() for b in buffers]), strict=True):
            buffer.copy_(part.view_as(buffer))


def _digests(model: nn.Module) -> dict[str, str]:
    """The SHA-256 of the bytes of every entry of the state (weights and persistent buffers), whole; a collective
    under fsdp."""
    return {
        name: hashlib.sha256(
            tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()
        ).hexdigest()
        for name, tensor in whole_state(model)
    }


def _checksum(digests: dict[str, str]) -> str:
    """One checksum of a whole state from its entries' digests."""
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def replica_mismatches(model: nn.Module) -> tuple[list[str], list[str]]:
    """Every process's checksum of the whole state of `model`, and the names of the state entries (weights, buffers)
    whose values differ between the processes (empty: the replicas are identical). A collective: every process calls it
    and gets the same answer, so all of them raise together or none does."""
    digests = _digests(model)
    every = gather_object([digests])
    differ = [name for name in digests if len({process[name] for process in every}) > 1]
    return [_checksum(process) for process in every], differ


def raise_if_diverged(checksums: list[str], differ: list[str], step: int) -> None:
    """A RuntimeError naming the state entries (`zoo.train.distributed.replica_mismatches`) that differ between the
    processes at `step`: a bug in zoo, never a user's mistake."""
    if differ:
        more = ", ..." if len(differ) > 5 else ""
        raise RuntimeError(
            f"replicas diverged at step {step}: {len(differ)} state entries differ between the processes "
            f"({', '.join(differ[:5])}{more}); checksums {checksums}"
        )
