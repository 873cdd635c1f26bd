"""Weights in and out: reading a weights file safely, checking it against a model, and a zoo ViT as a folder.

`save_pretrained(model, folder)` writes `model.safetensors` and a `config.json` in timm's hub layout
(`architecture`, `model_args`, `pretrained_cfg`, `label_names`), so `load_model(folder)` rebuilds the model in eval
mode with its preprocessing attached (`timm.data.resolve_data_config(model=model)` gives its own input size, mean
and std), `timm.create_model(architecture, pretrained=True, pretrained_cfg_overlay=dict(file=...), **model_args)`
reads the weights back, and the folder can go to the Hugging Face hub (`push_to_hub`, `load_model("hf-hub:o/n")`).

Weights are read only through safetensors and `torch.load(weights_only=True)`: a pickle that needs code is refused.
Whatever does not fit is a one-line `WeightsError` naming the file and what differs: another architecture (the
foreign keys), width, depth, patch size, MLP width, input channels, class count, token count, attention
parameters; or a file that holds no weights (empty, text, an HTML page, a git-lfs pointer, a truncated file).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import re
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import timm
import torch
from huggingface_hub import is_offline_mode
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from timm.models import PretrainedCfg
from torch import nn

from ._validate import unknown_name

__all__ = [
    "WeightsError",
    "check_state_dict",
    "load_model",
    "model_args",
    "push_to_hub",
    "read_weights",
    "save_pretrained",
]

_logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# What a weights folder may hold, in the order looked for (accelerate and the hub write the first).
_FOLDER_WEIGHTS = (WEIGHTS_NAME, "pytorch_model.bin")
# Containers that training scripts wrap a state dict in.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module")
# Prefixes that wrappers add to every key: DistributedDataParallel, torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"
_BLOCK_INDEX = re.compile(r"(?:^|\.)blocks\.(\d+)\.")
# The parameters of timm's Attention; a variant's other `.attn.` parameters are its own.
_TIMM_ATTENTION = ("qkv.", "q_norm.", "k_norm.", "norm.", "proj.")
_FAMILIES = (
    ({"conv1", "layer1"}, "a ResNet"),
    ({"stem", "stages"}, "a ConvNeXt or another staged network"),
    ({"features", "classifier"}, "a torchvision CNN"),
    ({"embeddings", "encoder"}, "a Hugging Face transformers model"),
)
_DATA_KEYS = ("mean", "std", "interpolation", "crop_pct", "crop_mode")


class WeightsError(ValueError):
    """Weights that cannot be read or do not fit the model; the message is one line naming the file."""


# ---------------------------------------------------------------------------------------------------------------
def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict in `path`: a `.safetensors` file, a torch checkpoint (read with `weights_only=True`), or a
    folder holding `model.safetensors` / `pytorch_model.bin`. Wrappers are removed (`{"state_dict": ...}`,
    `module.` / `_orig_mod.` prefixes). Anything else is a `WeightsError` saying what the file is."""
    path = _weights_file(Path(path).expanduser())
    with path.open("rb") as file:
        head = file.read(512)
    if _is_safetensors(head):
        state = _read_safetensors(path, head)
    elif head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        state = _read_torch(path)
    else:
        raise WeightsError(f"{path}: not a weights file: {_what_it_is(head, path.stat().st_size)}")
    return _unwrap(state, path)


def _weights_file(path: Path) -> Path:
    if path.is_dir():
        found = [path / name for name in _FOLDER_WEIGHTS if (path / name).is_file()]
        if not found:
            raise FileNotFoundError(f"{path} holds no weights file: expected one of {', '.join(_FOLDER_WEIGHTS)}")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.suffix == ".npz":
        raise WeightsError(f"{path}: .npz (JAX) checkpoints are not supported; convert to .safetensors or .pth")
    return path


def _is_safetensors(head: bytes) -> bool:
    """A safetensors file opens with the little-endian length of its JSON header, then the header's `{`."""
    return len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1


def _what_it_is(head: bytes, size: int) -> str:
    """What a file that is neither safetensors nor a torch checkpoint holds, from its first bytes."""
    if size == 0:
        return "it is empty (0 bytes)"
    if head.startswith(_LFS_POINTER):
        return "it is a git-lfs pointer, not the weights it points to: run `git lfs pull` in its repository"
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "it is an HTML page (a download link that returned a web page? use the file's direct link)"
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"it is neither safetensors nor a torch checkpoint (it starts with bytes {head[:8].hex(' ')})"
    first = decoded.strip().splitlines()[0][:60] if decoded.strip() else ""
    return f"it is a text file (it starts with {first!r}), not safetensors or a torch checkpoint"


def _read_safetensors(path: Path, head: bytes) -> dict[str, torch.Tensor]:
    size = path.stat().st_size
    header_size = int.from_bytes(head[:8], "little")
    if 8 + header_size > size:
        raise WeightsError(
            f"{path}: truncated safetensors file: its header alone needs {8 + header_size} bytes, the file has {size}"
        )
    with path.open("rb") as file:
        file.seek(8)
        try:
            header = json.loads(file.read(header_size))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise WeightsError(f"{path}: corrupt safetensors file: its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: corrupt safetensors file: its header is not a JSON object")
    offsets = [entry.get("data_offsets", [0, 0]) for key, entry in header.items() if key != "__metadata__"]
    needed = 8 + header_size + max((int(end) for _, end in offsets), default=0)
    if needed > size:
        raise WeightsError(f"{path}: truncated safetensors file: {size} bytes, its header describes {needed}")
    try:
        return load_file(str(path))
    except SafetensorError as error:
        raise WeightsError(f"{path}: corrupt safetensors file: {_first_line(error)}") from None


def _read_torch(path: Path) -> Any:
    """`torch.load(weights_only=True)`: a pickle that needs code (any global that is not a tensor type) is refused
    before anything runs."""
    try:
        with warnings.catch_warnings():
            # a plain pickle (not torch.save) of another protocol: refused below anyway, the warning adds nothing
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL ([\w.]+)|Unsupported operand \d+", str(error))
        what = f" (it references {found.group(1)})" if found and found.group(1) else ""
        raise WeightsError(
            f"{path}: refused: unpickling it needs torch.load(weights_only=False), which can run code{what}; zoo "
            "reads weights only: re-save the state dict with safetensors or torch.save(model.state_dict())"
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError) as error:
        raise WeightsError(f"{path}: truncated or corrupt torch checkpoint: {_first_line(error)}") from None


def _unwrap(state: Any, path: Path) -> dict[str, torch.Tensor]:
    while isinstance(state, Mapping):
        inner = next((state[k] for k in _CONTAINER_KEYS if isinstance(state.get(k), Mapping)), None)
        if inner is None:
            break
        state = inner
    if not isinstance(state, Mapping) or not state:
        raise WeightsError(f"{path}: holds no state dict (found {type(state).__name__}{' (empty)' if not state else ''})")
    bad = next(((k, v) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise WeightsError(
            f"{path}: not a state dict: entry {bad[0]!r} is a {type(bad[1]).__name__}, not a tensor "
            f"(top-level keys: {', '.join(map(str, list(state)[:6]))})"
        )
    state = dict(state)
    for prefix in _WRAPPER_PREFIXES:
        if all(key.startswith(prefix) for key in state):
            state = {key.removeprefix(prefix): value for key, value in state.items()}
    return state


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ---------------------------------------------------------------------------------------------------------------
def check_state_dict(
    model: nn.Module, state: Mapping[str, torch.Tensor], source: str | Path, *, adapt: bool = False
) -> None:
    """Raise a one-line `WeightsError` naming `source` and what differs unless `state` fits `model` exactly: every
    key of the model present with its shape (a tied weight stored once is enough), no key the model lacks.

    `adapt=True` allows what loading pretrained weights fixes: a classifier of another size (re-initialised),
    other input channels (adapted), another token count (`pos_embed` resampled), and a variant's own attention
    parameters missing from the file (kept at their initialisation).
    """
    problems = _differences(model, state, adapt=adapt)
    if problems:
        raise WeightsError(f"{source}: weights do not fit {_model_name(model)}: {'; '.join(problems)}")


def _model_name(model: nn.Module) -> str:
    architecture = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    return f"{architecture} ({type(model).__name__})" if architecture else type(model).__name__


def _pattern(key: str) -> str:
    """`blocks.3.attn.qkv.weight` -> `blocks.*.attn.qkv.weight`: the key without its layer indices."""
    return ".".join("*" if part.isdigit() else part for part in key.split("."))


def _is_attention_own(key: str) -> bool:
    return ".attn." in key and not key.split(".attn.", 1)[1].startswith(_TIMM_ATTENTION)


def _differences(model: nn.Module, state: Mapping[str, torch.Tensor], *, adapt: bool) -> list[str]:
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    found = {key: tuple(value.shape) for key, value in state.items()}
    foreign = _foreign(expected, found)
    if foreign:
        return [foreign]
    problems = _dimension_differences(expected, found, adapt=adapt)
    if problems:
        # one dimension explains every key it reshapes
        return problems
    problems = [] if adapt else _attention_differences(expected, found)
    allowed = _adaptable if adapt else (lambda key: False)
    shapes = [k for k in expected if k in found and expected[k] != found[k] and not allowed(k)]
    if shapes:
        listed = ", ".join(f"{k} {found[k]} in the file, {expected[k]} in the model" for k in shapes[:3])
        problems.append(f"shapes differ: {listed}{_more(shapes, 3)}")
    aliases = _tied_aliases(model)
    missing = [k for k in expected if k not in found and k not in aliases and not allowed(k) and not _is_attention_own(k)]
    unexpected = [k for k in found if k not in expected and not allowed(k) and not _is_attention_own(k)]
    for label, keys in (("missing from the file", missing), ("in the file but not the model", unexpected)):
        patterns = list(dict.fromkeys(_pattern(k) for k in keys))
        if patterns:
            problems.append(f"{label}: {', '.join(patterns[:4])}{_more(patterns, 4)}")
    return problems


def _adaptable(key: str) -> bool:
    """What loading pretrained weights adapts: the classifier, the token table, the input channels (the patch
    embedding's width and patch size are measured apart) and a variant's own attention parameters."""
    return key.startswith("head.") or key in ("pos_embed", "patch_embed.proj.weight") or _is_attention_own(key)


def _more(items: Sequence, shown: int) -> str:
    return f" (and {len(items) - shown} more)" if len(items) > shown else ""


def _tops(keys) -> list[str]:
    return list(dict.fromkeys(key.split(".", 1)[0] for key in keys))


def _foreign(expected: dict[str, tuple], found: dict[str, tuple]) -> str | None:
    """The message for weights of another architecture (at most half the model's key names found), or None."""
    ours = {_pattern(k) for k in expected if not _is_attention_own(k)}
    theirs = {_pattern(k) for k in found}
    if not ours or len(ours & theirs) * 2 > len(ours):
        return None
    prefix = _tops(found)[0] if len(_tops(found)) == 1 else None
    if prefix and len(ours & {p.removeprefix(prefix + ".") for p in theirs}) * 2 > len(ours):
        return f"every key carries the prefix {prefix + '.'!r} (e.g. {next(iter(found))!r}): strip it before loading"
    strange = [top for top in _tops(found) if top not in _tops(expected)] or _tops(found)
    hint = next((f" (it looks like {name})" for tops, name in _FAMILIES if tops <= set(_tops(found))), "")
    return (
        f"another architecture{hint}: the file's keys {', '.join(strange[:8])}{_more(strange, 8)} are foreign to "
        f"this model, which expects {', '.join(_tops(expected)[:8])}"
    )


def _dim(shapes: dict[str, tuple], key: str, axis: int | slice) -> Any:
    return shapes[key][axis] if key in shapes else None


def _embed_dim(shapes: dict[str, tuple]) -> int | None:
    # cls_token [1, 1, D], norm.weight [D], patch_embed.proj.weight [D, C, p, p]
    for key, axis in (("cls_token", -1), ("norm.weight", 0), ("patch_embed.proj.weight", 0)):
        if key in shapes:
            return shapes[key][axis]
    return None


def _block_count(shapes: dict[str, tuple]) -> int:
    return len({match.group(1) for key in shapes if (match := _BLOCK_INDEX.search(key))})


# (label, measure of a {key: shape} dict (None: not measurable), adapted when loading pretrained weights)
_MEASURES = (
    ("width (embed_dim)", _embed_dim, False),
    ("depth (blocks)", _block_count, False),
    ("patch size", lambda s: _dim(s, "patch_embed.proj.weight", slice(2, 4)), False),
    ("MLP width", lambda s: _dim(s, "blocks.0.mlp.fc1.weight", 0), False),
    ("input channels (in_chans)", lambda s: _dim(s, "patch_embed.proj.weight", 1), True),
    ("number of classes (head)", lambda s: s["head.weight"][0] if "head.weight" in s else 0, True),
    ("pos_embed tokens (image size or prefix tokens)", lambda s: _dim(s, "pos_embed", 1), True),
)


def _shown(value: Any) -> str:
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _dimension_differences(expected: dict[str, tuple], found: dict[str, tuple], *, adapt: bool) -> list[str]:
    """The named dimensions that differ; when adapting, not those that loading pretrained weights adapts."""
    problems = []
    for label, measure, adaptable in _MEASURES:
        theirs, ours = measure(found), measure(expected)
        if not (adapt and adaptable) and None not in (theirs, ours) and theirs != ours:
            problems.append(f"{label} {_shown(theirs)} in the file, {_shown(ours)} in the model")
    return problems


def _attention_differences(expected: dict[str, tuple], found: dict[str, tuple]) -> list[str]:
    """Another attention variant: the variants' own parameters differ (other options: their shapes, listed apart)."""
    ours = sorted({_pattern(k) for k in expected if _is_attention_own(k)})
    theirs = sorted({_pattern(k) for k in found if _is_attention_own(k)})
    if ours == theirs:
        return []
    names = [", ".join(p.split(".attn.", 1)[1] for p in side) or "none" for side in (theirs, ours)]
    return [f"attention parameters {names[0]} in the file, {names[1]} in the model (another attention variant?)"]


def _tied_aliases(model: nn.Module) -> set[str]:
    """Keys whose tensor is shared with an earlier key (tied weights, saved once by safetensors)."""
    seen, aliases = set(), set()
    for key, value in model.state_dict(keep_vars=True).items():
        if value.numel() == 0:
            continue
        pointer = (value.data_ptr(), tuple(value.shape))
        if pointer in seen:
            aliases.add(key)
        seen.add(pointer)
    return aliases


# ---------------------------------------------------------------------------------------------------------------
def model_args(model: nn.Module) -> dict[str, Any]:
    """The keyword arguments that rebuild `model` as it is now with `timm.create_model(architecture, **args)`: its
    construction record (`zoo_args`, set in `ZooVisionTransformer.__init__`) updated with what changed since
    (`reset_classifier`, `set_input_size`, `zoo.convert`'s attention swap); drop rates left out."""
    recorded = getattr(model, "zoo_args", None)
    if not isinstance(recorded, dict):
        raise ValueError(
            f"{type(model).__name__} records no construction arguments (zoo_args): save_pretrained saves zoo ViTs "
            "built by zoo.create_model or timm.create_model('zoo_...')"
        )
    args = {k: v for k, v in recorded.items() if not k.endswith("drop_rate")}
    args.update(_attention_args(model))
    args.update(
        img_size=list(model.patch_embed.img_size),
        patch_size=list(model.patch_embed.patch_size),
        num_classes=model.num_classes,
        global_pool=model.global_pool,
        dynamic_img_size=model.dynamic_img_size,
    )
    for key, value in args.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"model argument {key}={value!r} cannot be saved in config.json; build the model with a JSON value "
                "(a layer by its name, e.g. act_layer='gelu')"
            ) from None
    return json.loads(json.dumps(args))


def _attention_args(model: nn.Module) -> dict[str, Any]:
    """Attention arguments from `zoo_attention`, the record `zoo.convert` updates, checked against the blocks."""
    record = model.zoo_attention
    layout = list(record.get("global_blocks", []))
    global_attention = record.get("global_attention", {"name": "softmax", "options": {}})
    for index, block in enumerate(model.blocks):
        used = getattr(getattr(block, "attn", None), "attention_name", None)
        wanted = global_attention["name"] if index in layout else record["name"]
        if used is not None and used != wanted:
            raise ValueError(
                f"block {index} uses attention {used!r} but the model's record (zoo_attention) says {wanted!r}: "
                "after swapping attention modules by hand, set model.zoo_attention to match"
            )
    return {
        "attention": record["name"],
        "attention_options": dict(record.get("options", {})),
        "global_blocks": layout,
        "global_attention": global_attention["name"],
        "global_attention_options": dict(global_attention.get("options", {})),
    }


def _data_config(model: nn.Module, args: dict[str, Any], data_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """timm's `pretrained_cfg` of the saved weights: this model's input size, and the normalisation,
    interpolation and crop it was trained with (`data_config`, else the architecture's)."""
    for key in data_config or {}:
        if key not in _DATA_KEYS:
            raise unknown_name("data_config key", key, _DATA_KEYS)
    base = dict(getattr(model, "pretrained_cfg", None) or {})
    cfg = {k: v for k, v in base.items() if k in {f.name for f in dataclasses.fields(PretrainedCfg)}}
    for key in ("state_dict", "file", "url", "hf_hub_id", "hf_hub_filename", "source", "tag", "test_input_size"):
        cfg.pop(key, None)
    cfg.update(data_config or {})
    in_chans = args.get("in_chans", 3)
    cfg.update(
        input_size=[in_chans, *args["img_size"]],
        fixed_input_size=not args["dynamic_img_size"],
        num_classes=args["num_classes"],
        pool_size=None,
        custom_load=False,
        mean=_per_channel("mean", cfg.get("mean", (0.5,)), in_chans),
        std=_per_channel("std", cfg.get("std", (0.5,)), in_chans),
    )
    return cfg


def _per_channel(name: str, values: Sequence[float], in_chans: int) -> list[float]:
    values = [float(v) for v in values]
    if len(values) == in_chans:
        return values
    if len(values) == 1:
        return values * in_chans
    if len(values) == 3 and in_chans == 1:
        # the convention of zoo.data's image folders: one channel gets the mean of the three
        return [sum(values) / 3]
    raise ValueError(
        f"{name} has {len(values)} values for a model of {in_chans} input channels: pass "
        f"data_config={{'{name}': [...]}} with 1 or {in_chans} values"
    )


def save_pretrained(
    model: nn.Module,
    folder: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    data_config: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write `model.safetensors` and `config.json` (timm's hub layout) to `folder`; returns the folder.

    `class_names`: one per output of the head (`label_names`, read back as `model.pretrained_cfg["label_names"]`).
    `data_config`: the preprocessing the weights were trained with (`mean`, `std`, `interpolation`, `crop_pct`,
    `crop_mode`); by default the architecture's. `extra`: more top-level JSON entries (e.g. the recipe's name).
    """
    args = model_args(model)
    config: dict[str, Any] = {
        "architecture": model.pretrained_cfg["architecture"],
        "num_classes": args["num_classes"],
        "num_features": model.num_features,
        "global_pool": args["global_pool"],
        "model_args": args,
        "pretrained_cfg": _data_config(model, args, data_config),
    }
    if class_names is not None:
        config["label_names"] = _class_names(class_names, args["num_classes"])
    for key, value in (extra or {}).items():
        if key in config or key == "label_names":
            raise ValueError(f"extra key {key!r} would replace a config.json entry; choose another name")
        try:
            config[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            raise ValueError(f"extra[{key!r}]={value!r} is not JSON-serialisable") from None
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    # weights first, config last: a folder with a config.json is complete
    _write_atomically(folder / WEIGHTS_NAME, lambda path: save_model(model, str(path)))
    _write_atomically(folder / CONFIG_NAME, lambda path: path.write_text(json.dumps(config, indent=2) + "\n"))
    return folder


def _class_names(names: Sequence[str], num_classes: int) -> list[str]:
    if isinstance(names, (str, bytes)):
        raise ValueError(f"class_names={names!r} must be a list of names, one per class")
    names = [str(name) for name in names]
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class_names for a head of {num_classes} classes: give one name per class")
    return names


def _write_atomically(path: Path, write) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


# ---------------------------------------------------------------------------------------------------------------
def load_model(source: str | Path, **overrides: Any) -> nn.Module:
    """The model saved by `save_pretrained`, in eval mode with its `pretrained_cfg` (input size, mean/std, crop,
    `label_names`) attached, from: a folder (config.json + model.safetensors), its `model.safetensors` or
    `config.json`, or `hf-hub:owner/name[@revision]`.

    `overrides` change construction arguments (`img_size=512`, `attention='performer'`, `num_classes=3`, ...);
    the weights are then adapted as pretrained weights are (`pos_embed` resampled, a new head, a variant's own
    attention parameters initialised). Without overrides they must fit exactly.
    """
    if isinstance(source, str) and source.startswith("hf-hub:"):
        config_path, weights = _from_hub(source.removeprefix("hf-hub:"))
    else:
        config_path, weights = _local_source(Path(source).expanduser())
    config = _read_config(config_path)
    args = {**config["model_args"], **overrides}
    architecture = config["architecture"]
    if architecture not in timm.list_models():
        raise unknown_name(f"architecture in {config_path}:", architecture, timm.list_models("zoo_*"))
    cfg = _pretrained_cfg(config, config_path)
    if overrides:
        cfg["file"] = str(weights)
        model = timm.create_model(architecture, pretrained=True, pretrained_cfg=cfg, **args)
    else:
        model = timm.create_model(architecture, pretrained_cfg=cfg, **args)
        state = read_weights(weights)
        check_state_dict(model, state, weights)
        model.load_state_dict(state, strict=False)
    return model.eval()


def _local_source(path: Path) -> tuple[Path, Path]:
    """(config.json, weights) of a save_pretrained folder, given the folder or one of its files.

    The one place that decides what a path is: a run directory of tools/train.py (recipe.yaml) would be a branch
    here."""
    folder = path if path.is_dir() else path.parent
    if path.is_file() and path.name not in (CONFIG_NAME, WEIGHTS_NAME) and path.suffix != ".safetensors":
        raise ValueError(f"{path}: load_model reads a save_pretrained folder (config.json + model.safetensors)")
    if (folder / CONFIG_NAME).is_file():
        weights = path if path.suffix == ".safetensors" else folder / WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(f"{folder} has a config.json but no {weights.name}")
        return folder / CONFIG_NAME, weights
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    what = "a run directory of tools/train.py" if (folder / "recipe.yaml").is_file() else "no config.json"
    raise ValueError(
        f"{path}: {what}; load_model reads a folder written by zoo.save_pretrained (config.json + model.safetensors)"
        f"{'' if path.is_dir() else ' beside the weights'}; bare timm weights load with "
        "zoo.create_model(name, ..., pretrained_file=PATH)"
    )


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}): {error.msg}") from None
    missing = [key for key in ("architecture", "model_args", "pretrained_cfg") if key not in config]
    if not isinstance(config, dict) or missing:
        raise ValueError(f"{path}: not a save_pretrained config: missing {', '.join(missing) or 'everything'}")
    return config


def _pretrained_cfg(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """timm's PretrainedCfg fields of the config (fields of a newer timm are dropped with a warning)."""
    fields = {field.name for field in dataclasses.fields(PretrainedCfg)}
    cfg = dict(config["pretrained_cfg"], architecture=config["architecture"])
    if config.get("label_names") is not None:
        cfg["label_names"] = tuple(config["label_names"])
    unknown = sorted(set(cfg) - fields)
    if unknown:
        _logger.warning("%s: pretrained_cfg fields unknown to this timm are ignored: %s", path, unknown)
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in fields}
    cfg.pop("file", None)
    return cfg


def _from_hub(repo: str) -> tuple[Path, Path]:
    from huggingface_hub import hf_hub_download

    repo_id, _, revision = repo.partition("@")
    try:
        files = [Path(hf_hub_download(repo_id, name, revision=revision or None)) for name in (CONFIG_NAME, WEIGHTS_NAME)]
    except (EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled) as error:
        reason = "offline (HF_HUB_OFFLINE=1) and not in the cache" if is_offline_mode() else _first_line(error)
        raise FileNotFoundError(
            f"could not fetch hf-hub:{repo} from the Hugging Face hub: {reason}. Download the folder where there is a "
            f"network (huggingface-cli download {repo_id} --local-dir DIR) and load it with zoo.load_model(DIR)"
        ) from None
    return files[0], files[1]


def push_to_hub(
    model: nn.Module,
    repo_id: str,
    *,
    class_names: Sequence[str] | None = None,
    data_config: Mapping[str, Any] | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Add model",
) -> str:
    """Upload `save_pretrained`'s folder to the hub repository `repo_id` (created if needed); returns its URL.
    `load_model("hf-hub:" + repo_id)` and timm's `create_model("hf-hub:" + repo_id)` (with zoo imported) read it."""
    if is_offline_mode():
        raise ConnectionError(
            f"cannot push to {repo_id!r}: the hub client is offline (HF_HUB_OFFLINE=1); save the folder with "
            "zoo.save_pretrained(model, DIR) and upload it later (huggingface-cli upload REPO DIR)"
        )
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder, class_names=class_names, data_config=data_config)
        try:
            repo = api.create_repo(repo_id, private=private, exist_ok=True)
            api.upload_folder(repo_id=repo.repo_id, folder_path=folder, commit_message=commit_message)
        except (HfHubHTTPError, OfflineModeIsEnabled) as error:
            raise ConnectionError(f"could not push to {repo_id!r}: {_first_line(error)}") from None
    return str(repo)
