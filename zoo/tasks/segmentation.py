"""`segmentation`: one class per pixel (semantic segmentation), cross-entropy over the labelled pixels, mIoU,
per-class IoU and pixel accuracy (torchmetrics), a mask per predicted image.

The model is the `vit` kind's `zoo.models.segmentation.SegmentationViT`: any attention's patch tokens through a
light decoder (`decoder`: `linear`, Segmenter's; `pyramid`, ViTDet's simple feature pyramid with
`decoder_channels` per level; `progressive`, SAM's transposed-convolution upsampling to the input size fused with a
full-resolution convolution path from the image, `decoder_channels` wide), logits at the input size. Both options
are the recipe's `model.decoder` and `model.decoder_channels`. A dataset for it yields `(image [c, H, W] float32,
mask [H, W] int64)` pairs, `IGNORE_INDEX` where a pixel has no label, and names its classes (`classes`, background
included).

Letter legend: b - batch, k - classes, H/W - image height and width.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data._interface import IGNORE_INDEX

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    from ..data._sizes import ModelSizes
from ._base import Task, register_task

__all__ = ["DECODER_NAMES", "Segmentation"]

# the decoders of zoo.models.segmentation (checked here too: tasks sit below models)
DECODER_NAMES = ("linear", "pyramid", "progressive")


@dataclass(frozen=True)
class Segmentation(Task):
    """One class per pixel: logits `[b, k, H, W]`, masks `[b, H, W]` (`IGNORE_INDEX` where unlabelled)."""

    name = "segmentation"
    target_key = "label"
    metrics = ("miou", "iou", "pixel_accuracy", "confusion")
    default_metrics = ("miou", "pixel_accuracy")
    eval_metrics = ("miou", "iou", "pixel_accuracy", "confusion")
    selection = ("miou", True)
    # no 1-D model input: images only (the vit kind)
    inputs = ()
    model_options = ("decoder", "decoder_channels")
    ignore_index = IGNORE_INDEX
    # zoo.predict writes each row's `mask` as a PNG
    predicts_masks = True
    decoder: str = "linear"
    # pyramid: channels of every level; progressive: of the upsampling and image paths
    decoder_channels: int = 128

    def __post_init__(self) -> None:
        if self.decoder not in DECODER_NAMES:
            raise ValueError(f"decoder {self.decoder!r} is not one of {', '.join(DECODER_NAMES)}")

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        """Mean cross-entropy over the labelled pixels (0 for a batch without any)."""
        if not (targets != IGNORE_INDEX).any():
            # torch's mean over no pixel is NaN; keep the graph for every process's backward
            return outputs.float().sum() * 0.0
        return F.cross_entropy(outputs.float(), targets, ignore_index=IGNORE_INDEX)

    def loss_units(self, targets: Tensor, mask: Tensor | None) -> int:
        return int((targets != IGNORE_INDEX).sum())

    def metric_inputs(self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`[b, k, H, W]`, `[b, H, W]` -> predicted classes `[b, H, W]` (what every metric counts), the masks."""
        return outputs.argmax(1), targets

    def model_sizes(self, sizes: ModelSizes) -> dict[str, Any]:
        """The pixel classes and the decoder (`zoo.models.segmentation.SegmentationViT`'s arguments)."""
        options = {"channels": self.decoder_channels} if self.decoder != "linear" else {}
        return {"num_classes": sizes.num_classes, "decoder": self.decoder, "decoder_options": options}

    def num_outputs(self, sizes: ModelSizes) -> int:
        return sizes.num_classes

    def prediction_rows(
        self, meta: dict[str, Any], outputs: Tensor, mask: Tensor | None, description: Mapping[str, Any], top_k: int
    ) -> list[dict[str, Any]]:
        """logits `[k, H, W]` -> one row: the predicted mask (`mask`, int64 `[H, W]`, which `zoo.predict` writes as a
        PNG), and the classes it covers, largest share first, with their shares of the image (at most `top_k`)."""
        predicted = outputs.argmax(0)
        counts = torch.bincount(predicted.flatten(), minlength=outputs.shape[0])
        shares, classes = (counts.float() / predicted.numel()).sort(descending=True, stable=True)
        names = description.get("label_names")
        kept = [(c, s) for c, s in zip(classes.tolist(), shares.tolist(), strict=True) if s > 0][:top_k]
        return [
            {
                **meta,
                "mask": predicted,
                "classes": [names[c] if names else str(c) for c, _ in kept],
                "shares": [round(s, 6) for _, s in kept],
            }
        ]


register_task(Segmentation())
