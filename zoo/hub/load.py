"""A zoo ViT (or NaFlex ViT) as a folder: `save_pretrained`, `load_model`, and the Hugging Face hub.

`save_pretrained(model, folder)` writes `model.safetensors` and a `config.json` in timm's hub layout
(`architecture`, `model_args`, `pretrained_cfg`, `label_names`) through timm's `save_for_hf`, so
`load_model(folder)` rebuilds the model in eval mode with its preprocessing attached
(`timm.data.resolve_data_config(model=model)` gives its own input size, mean and std),
`timm.create_model(architecture, pretrained=True, pretrained_cfg_overlay=dict(file=...), **model_args)` reads the
weights back, and the folder can go to the hub (`push_to_hub`, `load_model("hf-hub:owner/name")`). `load_model`
also reads a run of tools/train.py (`runs/NAME`, a checkpoint folder in it, or its `model.safetensors`): the model
is rebuilt from the run's `recipe.yaml` and `model.json` (`zoo.hub.runs`) without its training data, with the weights
that `zoo.hub._run_weights.open_run` verified (the one route from a run or checkpoint to weights). Reading and
checking weights (`read_weights`, `check_state_dict`, `WeightsError`) live in `zoo._weights`.

A NaFlex ViT (`zoo.models.naflex`, classifier or segmentation) goes the same way: its config records no input size
(each image is read at its own), and a NaFlex run's normalisation (`model.json`'s `naflex` entry) becomes the saved
`mean` and `std`. Its config.json has one entry of its own, `naflex`: how `zoo.predict` reads an image for it
(`zoo.data.images.native.NativeLoader`, `READING_KEYS`):

- `patch_size`: the model's patch side in px;
- `max_tokens`: patches an image at most (a larger one is scaled down keeping its aspect ratio): a run's
  `data.options.max_tokens`, else `save_pretrained(..., naflex={"max_tokens": N})`, else as many as the model's
  position table holds (`zoo.models.naflex.native_budget`);
- `resize`: `native` (each image at its own size) or `square` (the largest square grid within the budget), a run's
  own or `naflex={"resize": ...}`;
- `mean`, `std`: the saved `pretrained_cfg`'s normalisation, repeated.

`load_model` gives such a model (a folder without the entry: the model's defaults above) the description a NaFlex
run's model carries, `model.zoo_run` (`zoo.hub.runs.saved_description`), so `zoo.predict` and
`zoo.predict.image_loader` read each image at its own size and write a segmentation's masks at each file's size.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import timm
from huggingface_hub import hf_hub_download, is_offline_mode
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled
from timm.models import PretrainedCfg, push_to_hf_hub, save_for_hf
from torch import nn

from .._validate import first_line, unknown_name
from .._weights import WEIGHTS_NAME, WeightsError, check_state_dict, read_weights
from ..models.naflex import NaFlexSegmentation, ZooNaFlexVit, native_budget
from ..models.vit import per_channel
from ._run_weights import CHECKPOINTS, RunWeights, find_run, open_run
from .runs import MODEL_FILE, RECIPE_FILE, saved_description

__all__ = [
    "WeightsError",
    "check_state_dict",
    "is_model_source",
    "load_model",
    "model_args",
    "push_to_hub",
    "read_weights",
    "save_pretrained",
]

_logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
_DATA_KEYS = ("mean", "std", "interpolation", "crop_pct", "crop_mode")


def model_args(model: nn.Module) -> dict[str, Any]:
    """The keyword arguments that rebuild `model` as it is now with `timm.create_model(architecture, **args)`: its
    construction record (`zoo_args`, set in `ZooVisionTransformer.__init__` and `ZooNaFlexVit.__init__`, updated by
    `zoo.convert.model`'s attention swap) with what timm changes since (`reset_classifier`, `set_input_size`); drop
    rates left out."""
    recorded = getattr(model, "zoo_args", None)
    if not isinstance(recorded, dict):
        raise TypeError(
            f"{type(model).__name__} records no construction arguments (zoo_args): save_pretrained saves zoo ViTs "
            "built by zoo.create_model or timm.create_model('zoo_...')"
        )
    args = {k: v for k, v in recorded.items() if not k.endswith("drop_rate")}
    _check_attention(model, args)
    args.update(num_classes=model.num_classes, global_pool=model.global_pool)
    if not isinstance(model, ZooNaFlexVit):
        # a NaFlex ViT has no input size: each image is patchified at its own
        args.update(
            img_size=list(model.patch_embed.img_size),
            patch_size=list(model.patch_embed.patch_size),
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


def _check_attention(model: nn.Module, args: Mapping[str, Any]) -> None:
    """Every block's attention is the one the construction record (`zoo_args`, which `zoo.convert.model` updates)
    names."""
    layout = list(args.get("global_blocks", []))
    for index, block in enumerate(model.blocks):
        used = getattr(getattr(block, "attn", None), "attention_name", None)
        wanted = args.get("global_attention", "softmax") if index in layout else args["attention"]
        if used is not None and used != wanted:
            raise ValueError(
                f"block {index} uses attention {used!r} but the model's record (zoo_args) says {wanted!r}: "
                "after swapping attention modules by hand, update model.zoo_args to match"
            )


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
    # a NaFlex ViT reads each image at its own size: the architecture's size stands as a nominal one
    size = args["img_size"] if "img_size" in args else list(cfg.get("input_size", (in_chans, 384, 384)))[1:]
    cfg.update(
        input_size=[in_chans, *size],
        fixed_input_size=not args.get("dynamic_img_size", True),
        num_classes=args["num_classes"],
        pool_size=None,
        custom_load=False,
        mean=per_channel("mean", cfg.get("mean", (0.5,)), in_chans),
        std=per_channel("std", cfg.get("std", (0.5,)), in_chans),
    )
    return cfg


def save_pretrained(
    model: nn.Module,
    folder: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    data_config: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    naflex: Mapping[str, Any] | None = None,
) -> Path:
    """Write `model.safetensors` and `config.json` (timm's hub layout, by timm's `save_for_hf`) to `folder`;
    returns the folder.

    `class_names`: one per output of the head (`label_names`, read back as `model.pretrained_cfg["label_names"]`);
    by default the model's own (a run's class names). `data_config`: the preprocessing the weights were trained
    with (`mean`, `std`, `interpolation`, `crop_pct`, `crop_mode`); by default the model's `pretrained_cfg` (a
    run's own), else the architecture's. `extra`: more top-level JSON entries (e.g. the recipe's name). `naflex`
    (NaFlex models): how predict reads their images, `max_tokens` and `resize` (see the module docstring); by
    default the run's own, else the model's.
    """
    model_config, args = _hub_config(model, class_names, data_config, extra, naflex)
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".save_pretrained.") as written:
        save_for_hf(model, written, model_config=model_config, model_args=args, safe_serialization=True)
        # weights first, config last: a folder with a config.json is complete
        for name in (WEIGHTS_NAME, CONFIG_NAME):
            os.replace(Path(written) / name, folder / name)
    return folder


# config.json's entries that save_pretrained writes itself (an `extra` entry may not replace one)
_CONFIG_KEYS = ("architecture", "num_classes", "num_features", "global_pool", "model_args", "pretrained_cfg", "naflex")
_LABEL_KEYS = ("label_names", "label_descriptions", "labels")


def _hub_config(
    model: nn.Module,
    class_names: Sequence[str] | None,
    data_config: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None,
    naflex: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """timm's `model_config` (the preprocessing, class names, a NaFlex model's reading settings and extra entries)
    and `model_args` of `model`."""
    args = model_args(model)
    if class_names is None:
        own = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
        class_names = own if own is not None and len(own) == args["num_classes"] else None
    # the architecture goes to config.json's top level, and the architecture's weights tag names other weights:
    # the same config.json with timm 1.0.29 (which writes this cfg as given) and 1.0.31 (which merges it)
    pretrained_cfg = {**_data_config(model, args, data_config), "tag": None}
    pretrained_cfg.pop("architecture", None)
    config: dict[str, Any] = {
        "num_classes": args["num_classes"],
        "global_pool": args["global_pool"],
        "pretrained_cfg": pretrained_cfg,
    }
    if class_names is not None:
        config["label_names"] = _class_names(class_names, args["num_classes"])
    reading = _saved_reading(model, pretrained_cfg, naflex)
    if reading is not None:
        config["naflex"] = reading
    for key, value in (extra or {}).items():
        if key in _CONFIG_KEYS or key in _LABEL_KEYS:
            raise ValueError(f"extra key {key!r} would replace a config.json entry; choose another name")
        try:
            config[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            raise ValueError(f"extra[{key!r}]={value!r} is not JSON-serialisable") from None
    return config, args


# what a caller may set of a NaFlex model's reading (the patch size is the model's, mean/std the data config's)
_NAFLEX_OPTIONS = ("max_tokens", "resize")


def _saved_reading(
    model: nn.Module, pretrained_cfg: Mapping[str, Any], naflex: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """config.json's `naflex` entry of `model`: the caller's `naflex` over its run's (`zoo_run`), over the model's
    defaults; None for a model that is not NaFlex."""
    if not isinstance(model, ZooNaFlexVit):
        if naflex is not None:
            raise ValueError(f"naflex={dict(naflex)!r} sets how NaFlex models read images; {type(model).__name__} "
                             "is not one: leave it out")  # fmt: skip
        return None
    for key in naflex or {}:
        if key not in _NAFLEX_OPTIONS:
            raise unknown_name("naflex key", key, _NAFLEX_OPTIONS)
    run = (getattr(model, "zoo_run", None) or {}).get("naflex")
    return _native_reading(model, pretrained_cfg, "save_pretrained(naflex=...)", run, naflex)


def _native_reading(
    model: ZooNaFlexVit, pretrained_cfg: Mapping[str, Any], where: str, *settings: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """NativeLoader's settings for `model` (`READING_KEYS`): its patch size, `max_tokens` and `resize` of the last
    of `settings` that has them (else `native_budget` and `native`), the normalisation of `pretrained_cfg`; None for
    a model the native sets cannot cut (non-square patches)."""
    from ..data.images.native import check_reading

    budget = native_budget(model)
    if budget is None:
        return None
    reading = {**budget, "resize": "native"}
    for given in settings:
        if given is not None and not isinstance(given, Mapping):
            raise ValueError(f"{where}={given!r} must be an object of {', '.join(_NAFLEX_OPTIONS)}")
        reading.update({key: value for key, value in (given or {}).items() if key in _NAFLEX_OPTIONS})
    mean, std = (per_channel(key, pretrained_cfg[key], model.in_chans) for key in ("mean", "std"))
    return check_reading({**reading, "mean": mean, "std": std}, where)


def native_description(
    model: nn.Module, naflex: Mapping[str, Any] | None = None, where: str = "naflex"
) -> dict[str, Any] | None:
    """The description a NaFlex run's model carries (`model.zoo_run`) for a NaFlex `model` without a run (built in
    memory, or read from a folder): its task, class names, sizes and the reading settings `naflex` (config.json's
    entry), the model's defaults where it has none; None for another model."""
    if not isinstance(model, ZooNaFlexVit):
        return None
    reading = _native_reading(model, model.pretrained_cfg, where, naflex)
    if reading is None:
        return None
    task = "segmentation" if isinstance(model, NaFlexSegmentation) else "classification"
    sizes = {"in_chans": model.in_chans, "num_classes": model.num_classes}
    return saved_description("naflex", task, model.pretrained_cfg.get("label_names"), sizes, naflex=reading)


def _describe_native(model: nn.Module, config: Mapping[str, Any], where: Path) -> None:
    """A NaFlex model read from a folder gets the description a NaFlex run's model carries (`native_description`
    of config.json's `naflex` entry)."""
    description = native_description(model, config.get("naflex"), f"{where}: naflex")
    if description is not None:
        model.zoo_run = description


def _class_names(names: Sequence[str], num_classes: int) -> list[str]:
    if isinstance(names, (str, bytes)):
        raise TypeError(f"class_names={names!r} must be a list of names, one per class")
    names = [str(name) for name in names]
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class_names for a head of {num_classes} classes: give one name per class")
    return names


def load_model(source: str | Path, *, checkpoint: str = "best", **overrides: Any) -> nn.Module:
    """The model saved by `save_pretrained` or trained by tools/train.py, in eval mode with its `pretrained_cfg`
    (input size, mean/std, crop, `label_names`) attached, from: a folder (config.json + model.safetensors), its
    `model.safetensors` or `config.json`, `hf-hub:owner/name[@revision]`, or a run: `runs/NAME` (its
    `checkpoints/<checkpoint>`, `best` or `last`), a checkpoint folder, or the `model.safetensors` in one. A run's
    model (ViT or 1-D) also gets `model.zoo_run`, the run's `model.json` (`zoo.hub.runs`); a NaFlex model from a
    folder gets one built from its config.json (its `naflex` entry, see the module docstring).

    `overrides` change construction arguments of a ViT (`img_size=512`, `attention='performer'`, `num_classes=3`,
    ...); the weights are then adapted as pretrained weights are (`pos_embed` resampled, a new head, a variant's
    own attention parameters initialised). Without overrides they must fit exactly.
    """
    if isinstance(source, str) and source.startswith("hf-hub:"):
        config_path, weights = _from_hub(source.removeprefix("hf-hub:"))
        config = _read_config(config_path)
    else:
        found = _local_source(Path(source).expanduser(), checkpoint)
        if isinstance(found, RunWeights):
            model = _load_run(found)
            if not overrides:
                return model
            config_path, weights, config = found.home / MODEL_FILE, found.weights, _run_config(model, found)
        else:
            config_path, weights = found
            config = _read_config(config_path)
    args = {**config["model_args"], **overrides}
    architecture = config["architecture"]
    if not timm.is_model(architecture):
        raise unknown_name(f"architecture in {config_path}:", architecture, timm.list_models("zoo_*"))
    if args.get("num_classes") != config["model_args"].get("num_classes"):
        # a new head: the saved class names name other outputs
        config = {**config, "label_names": None}
    cfg = _pretrained_cfg(config, config_path)
    if overrides:
        cfg["file"] = str(weights)
        model = timm.create_model(architecture, pretrained=True, pretrained_cfg=cfg, **args)
        # the preprocessing of the rebuilt model: its own input size and class count, the weights' normalisation
        rebuilt = {"architecture": architecture, "pretrained_cfg": _data_config(model, model_args(model), None)}
        rebuilt["label_names"] = config.get("label_names")
        model.pretrained_cfg = model.default_cfg = _pretrained_cfg(rebuilt, config_path)
    else:
        model = timm.create_model(architecture, pretrained_cfg=cfg, **args)
        state = read_weights(weights)
        check_state_dict(model, state, weights)
        model.load_state_dict(state, strict=False)
    _describe_native(model, config, config_path)
    return model.eval()


def is_model_source(path: Path) -> bool:
    """Whether `load_model` reads `path` as a model: a folder (a save_pretrained or run folder, or one it explains
    it cannot read), or the weights in a save_pretrained folder or in a run's checkpoint; False for a bare weights
    file, which `zoo.create_model(..., pretrained_file=PATH)` reads into an architecture."""
    if path.is_dir():
        return True
    return (path.parent / CONFIG_NAME).is_file() or find_run(path) is not None


def _local_source(path: Path, checkpoint: str = "best") -> tuple[Path, Path] | RunWeights:
    """(config.json, weights) of a save_pretrained folder, given the folder or one of its files; for a part of a run
    of tools/train.py (a run directory, one of its checkpoint folders, or the weights in one) the run's verified
    weights and what rebuilds their model (`zoo.hub._run_weights.open_run`, one pass over the run). The one place
    that decides what a path is."""
    folder = path if path.is_dir() else path.parent
    if path.is_file() and path.name not in (CONFIG_NAME, WEIGHTS_NAME) and path.suffix != ".safetensors":
        raise ValueError(
            f"{path}: load_model reads a save_pretrained folder (config.json + model.safetensors) or a run directory "
            "of tools/train.py"
        )
    if (folder / CONFIG_NAME).is_file():
        weights = path if path.suffix == ".safetensors" else folder / WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(f"{folder} has a config.json but no {weights.name}")
        return folder / CONFIG_NAME, weights
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_dir() and (path / RECIPE_FILE).is_file() and checkpoint not in CHECKPOINTS:
        raise unknown_name("checkpoint", checkpoint, CHECKPOINTS)
    run = open_run(path, checkpoint)
    if run is not None:
        return run
    raise ValueError(
        f"{path}: no config.json and no recipe.yaml; load_model reads a folder written by zoo.save_pretrained "
        f"(config.json + model.safetensors) or a run directory of tools/train.py"
        f"{'' if path.is_dir() else ' beside the weights'}; bare timm weights load with "
        "zoo.create_model(name, ..., pretrained_file=PATH)"
    )


def _load_run(run: RunWeights) -> nn.Module:
    """The run's model built by its model kind from the recipe and model.json, with the checkpoint's weights
    (verified by `open_run`), its description attached."""
    model = run.build_model()
    description = run.description
    model.zoo_run = description
    # a ViT run records timm's preprocessing, a NaFlex run its normalisation (its images keep their own size)
    stored = description.get("pretrained_cfg") or description.get("naflex")
    if stored is not None:
        cfg = _data_config(model, model_args(model), {k: stored[k] for k in _DATA_KEYS if k in stored})
        config = {"architecture": model.pretrained_cfg["architecture"], "pretrained_cfg": cfg}
        config["label_names"] = description.get("label_names")
        model.pretrained_cfg = model.default_cfg = _pretrained_cfg(config, run.home / MODEL_FILE)
    return model.eval()


def _run_config(model: nn.Module, run: RunWeights) -> dict[str, Any]:
    """A save_pretrained config of a run's ViT, to rebuild it with other construction arguments."""
    if not hasattr(model, "zoo_args"):
        raise ValueError(
            f"{run.home}: construction overrides rebuild ViT models; this run's model is a {type(model).__name__} "
            f"(model.kind {model.zoo_run['kind']!r}): load it without overrides"
        )
    cfg = {k: v for k, v in model.pretrained_cfg.items() if k not in ("label_names", "architecture")}
    return {
        "architecture": model.pretrained_cfg["architecture"],
        "model_args": model_args(model),
        "pretrained_cfg": cfg,
        "label_names": model.pretrained_cfg.get("label_names"),
        "naflex": model.zoo_run.get("naflex"),
    }


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}): {error.msg}") from None
    # a JSON list or string (not an object) has none of the keys either
    missing = [
        k for k in ("architecture", "model_args", "pretrained_cfg") if not isinstance(config, dict) or k not in config
    ]
    if missing:
        raise ValueError(f"{path}: not a save_pretrained config: missing {', '.join(missing)}")
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
    repo_id, _, revision = repo.partition("@")
    try:
        files = [
            Path(hf_hub_download(repo_id, name, revision=revision or None)) for name in (CONFIG_NAME, WEIGHTS_NAME)
        ]
    except (EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled) as error:
        reason = "offline (HF_HUB_OFFLINE=1) and not in the cache" if is_offline_mode() else first_line(error)
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
    naflex: Mapping[str, Any] | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Add model",
) -> str:
    """Upload `save_pretrained`'s files to the hub repository `repo_id` (created if needed) by timm's
    `push_to_hf_hub`; returns the commit's URL. `class_names`, `data_config`, `naflex`: as for `save_pretrained`.
    `load_model("hf-hub:" + repo_id)` and timm's `create_model("hf-hub:" + repo_id)` (with zoo imported) read it."""
    if is_offline_mode():
        raise ConnectionError(
            f"cannot push to {repo_id!r}: the hub client is offline (HF_HUB_OFFLINE=1); save the folder with "
            "zoo.save_pretrained(model, DIR) and upload it later (huggingface-cli upload REPO DIR)"
        )
    model_config, args = _hub_config(model, class_names, data_config, None, naflex)
    try:
        commit = push_to_hf_hub(
            model, repo_id, commit_message=commit_message, token=token, private=private,
            model_config=model_config, model_args=args, safe_serialization=True,
        )  # fmt: skip
    except (HfHubHTTPError, OfflineModeIsEnabled) as error:
        raise ConnectionError(f"could not push to {repo_id!r}: {first_line(error)}") from None
    return str(commit)
