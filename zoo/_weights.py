"""Reading weights files safely and checking a state dict against a model, with one-line errors.

Weights are read only through safetensors and `torch.load(weights_only=True)`: a pickle that needs code is refused
unread. A file that holds no weights says what it is (empty, text, an HTML page, a git-lfs pointer, truncated); a
state dict that does not fit a model names what differs: another architecture (its foreign keys), width, depth,
patch size, MLP width, input channels, class count, token count, a variant's own attention parameters.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from timm.models import clean_state_dict
from torch import nn

from ._validate import first_line

__all__ = ["WEIGHTS_NAME", "WeightsError", "check_state_dict", "read_weights"]

WEIGHTS_NAME = "model.safetensors"
# What a weights folder may hold, in the order looked for (accelerate and the hub write the first).
_FOLDER_WEIGHTS = (WEIGHTS_NAME, "pytorch_model.bin")
# Containers that training scripts wrap a state dict in.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module")
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


class WeightsError(ValueError):
    """Weights that cannot be read or do not fit the model; the message is one line naming the file."""


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
        raise WeightsError(f"{path}: corrupt safetensors file: {first_line(error)}") from None


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
        raise WeightsError(f"{path}: truncated or corrupt torch checkpoint: {first_line(error)}") from None


def _unwrap(state: Any, path: Path) -> dict[str, torch.Tensor]:
    while isinstance(state, Mapping):
        inner = next((state[k] for k in _CONTAINER_KEYS if isinstance(state.get(k), Mapping)), None)
        if inner is None:
            break
        state = inner
    if not isinstance(state, Mapping) or not state:
        raise WeightsError(
            f"{path}: holds no state dict (found {type(state).__name__}{' (empty)' if not state else ''})"
        )
    bad = next(((k, v) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise WeightsError(
            f"{path}: not a state dict: entry {bad[0]!r} is a {type(bad[1]).__name__}, not a tensor "
            f"(top-level keys: {', '.join(map(str, list(state)[:6]))})"
        )
    # timm's: the DDP (`module.`) and torch.compile (`_orig_mod.`) prefixes, wrapped in either order
    return clean_state_dict(dict(state))


def check_state_dict(
    model: nn.Module, state: Mapping[str, torch.Tensor], source: str | Path, *, adapt: bool = False
) -> None:
    """Raise a one-line `WeightsError` naming `source` and what differs unless `state` fits `model` exactly: every
    key of the model present with its shape (a tied weight stored once is enough), no key the model lacks.

    `adapt=True` allows what loading pretrained weights fixes: a classifier of another size (re-initialised),
    other input channels (adapted), another token count or patch size (resampled), and a variant's own attention
    parameters missing from the file or of another shape (kept at their initialisation).
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
    shapes = list(dict.fromkeys(
        f"{_pattern(k)} {found[k]} in the file, {expected[k]} in the model"
        for k in expected if k in found and expected[k] != found[k] and not allowed(k)
    ))  # fmt: skip
    if shapes:
        problems.append(f"shapes differ: {', '.join(shapes[:3])}{_more(shapes, 3)}")
    aliases = _tied_aliases(model)
    missing = [
        k for k in expected if k not in found and k not in aliases and not allowed(k) and not _is_attention_own(k)
    ]
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
    """The message for weights of another architecture (at most half the key names shared, either way), or None."""
    ours = {_pattern(k) for k in expected if not _is_attention_own(k)}
    theirs = {_pattern(k) for k in found}
    shared = len(ours & theirs) * 2
    if not ours or shared > len(ours) or shared > len(theirs):
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
    ("patch size", lambda s: _dim(s, "patch_embed.proj.weight", slice(2, 4)), True),
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
