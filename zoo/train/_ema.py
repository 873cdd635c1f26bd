"""`train.ema`: an exponential moving average of the model's weights through timm's `ModelEmaV3`.

After optimizer step t (counted from 1) every parameter becomes `ema = d_t * ema + (1 - d_t) * weights`, with
`d_1 = 0` (a copy), then `d_t = min(decay, 1 - t ** -warmup_power)` under warm-up, else `decay` (timm's
`ModelEmaV3.get_decay`). Buffers are copied, not averaged (timm's `exclude_buffers`): Performer's random features are
redrawn, never learned, and an average of two draws would be neither. The average lives beside the model on its
device, in its dtype, in eval mode. A checkpoint holds it as `model_ema.safetensors` beside accelerate's
`model.safetensors`: a resumed run continues the average, and `zoo.hub._run_weights.resolve_run` hands it to
`zoo.load_model` and `tools/eval.py` when `train.ema.evaluate` is `ema`.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_model
from timm.utils import ModelEmaV3
from torch import nn

from ..config._config import EmaConfig
from ..hub._run_weights import load_checked
from ..hub.checkpoints import EMA_WEIGHTS_NAME

__all__ = ["ModelEma"]


class ModelEma:
    """The moving average of `model` (the plain model, without DDP or torch.compile wrappers) that `config` asks
    for; `module` is the averaged model."""

    def __init__(self, model: nn.Module, config: EmaConfig) -> None:
        self.config = config
        self._ema = ModelEmaV3(
            model,
            decay=config.decay,
            use_warmup=config.warmup,
            warmup_power=config.warmup_power,
            exclude_buffers=True,
        )

    @property
    def module(self) -> nn.Module:
        return self._ema.module

    def update(self, model: nn.Module, step: int) -> None:
        """Fold `model`'s weights in after optimizer step `step` (from 1)."""
        self._ema.update(model, step=step)

    def save(self, folder: Path) -> None:
        """`model_ema.safetensors` in `folder` (a weight tied to another stored once, as accelerate stores them)."""
        save_model(self.module, str(Path(folder) / EMA_WEIGHTS_NAME))

    def load(self, folder: Path) -> None:
        """The average saved in `folder`; a checkpoint written without train.ema starts it from the loaded weights."""
        path = Path(folder) / EMA_WEIGHTS_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder} holds no {EMA_WEIGHTS_NAME}: it was trained without train.ema, which the recipe asks for"
            )
        load_checked(self.module, path)
