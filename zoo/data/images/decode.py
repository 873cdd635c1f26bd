"""Decoding any image file into an 8-bit RGB or grayscale PIL image, the same way for training and prediction.

`open_image(path, mode)` takes the first frame (GIF, multi-frame TIFF), applies the EXIF orientation, and converts
every PIL mode by what its values mean rather than by clipping:

- integer images of more than 8 bits (`I;16`, `I;16B`, `I;16L`, `I`) are scaled by the bit depth in use: the
  smallest of 8, 10, 12, 14, 16, 24 or 32 bits that holds the image's largest value reaches white (a 16-bit ramp
  stays a ramp, a 12-bit scan stored in 16 bits is not a dark image); an image with negative values is scaled
  by its own minimum and maximum;
- floating-point images (`F`) with values in [0, 1] are scaled by 255, others by their minimum and maximum;
- transparency (`RGBA`, `LA`, `PA`, a palette or grayscale image with a transparent colour) is composited on
  black: a pixel keeps its colour times its opacity, a fully transparent pixel is black;
- palette (`P`), `CMYK`, `YCbCr` and 1-bit (`1`) images are converted by PIL.

A file that is missing, truncated, or not an image PIL can decode raises `ImageError`, whose message names the path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ..._validate import first_line, unknown_name

__all__ = ["MODES", "ImageError", "open_image"]

# What open_image returns: 8-bit colour or 8-bit grayscale.
MODES = ("RGB", "L")
# Bit depths an integer image may use, smallest first: its largest value picks the first that holds it.
_BIT_DEPTHS = (8, 10, 12, 14, 16, 24, 32)
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


class ImageError(ValueError):
    """An image file that cannot be decoded; `path` and `reason` are kept for callers that skip and count."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


def open_image(path: str | Path, mode: str = "RGB") -> Image.Image:
    """The first frame of the image at `path` as an 8-bit `mode` (`RGB` or `L`) PIL image, decoded in full now
    (a truncated file fails here, not later in a data loader). See the module docstring for each source mode."""
    if mode not in MODES:
        raise unknown_name("image mode", mode, MODES)
    path = Path(path)
    if not path.is_file():
        raise ImageError(path, "no such file" if not path.exists() else "not a file")
    try:
        with Image.open(path) as image:
            image.seek(0)
            image.load()
            # exif_transpose returns a new image (or a copy), independent of the file closed below
            return _to_8_bit(ImageOps.exif_transpose(image), mode)
    # PIL's decoders fail with many exception types (OSError, SyntaxError, ValueError, struct.error, ...) on
    # malformed files; every one of them is this file's fault, reported with its path.
    except Exception as error:
        raise ImageError(path, _reason(error)) from error


def _reason(error: Exception) -> str:
    text = first_line(error, "")
    if isinstance(error, Image.UnidentifiedImageError):
        return "not an image file PIL can read"
    if isinstance(error, Image.DecompressionBombError):
        return f"{text} (raise PIL.Image.MAX_IMAGE_PIXELS to read it)"
    return f"cannot decode the image ({type(error).__name__}: {text or 'no message'})"


def _to_8_bit(image: Image.Image, mode: str) -> Image.Image:
    """`image` (any PIL mode) as an 8-bit `mode` image."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        image = Image.fromarray(_scaled(np.asarray(image)), "L")
    elif image.mode == "PA" or (image.mode in ("P", "L", "RGB") and "transparency" in image.info):
        image = image.convert("RGBA")
    if image.mode in _ALPHA_MODES:
        image = _on_black(image)
    return image.convert(mode)


def _scaled(values: np.ndarray) -> np.ndarray:
    """`[H, W]` integers or floats -> `[H, W]` uint8 by their bit depth in use (or value range, see the module)."""
    floating = np.issubdtype(values.dtype, np.floating)
    values = values.astype(np.float64)
    if not np.isfinite(values).all():
        raise ValueError("the image holds NaN or infinite values")
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if floating and low >= 0 and high <= 1:
        scaled = values
    elif not floating and low >= 0:
        bits = next(b for b in _BIT_DEPTHS if high < 2**b)
        scaled = values / (2**bits - 1)
    else:
        scaled = (values - low) / (high - low) if high > low else np.zeros_like(values)
    return np.round(scaled * 255).astype(np.uint8)


def _on_black(image: Image.Image) -> Image.Image:
    """An image with an alpha channel composited on black: colour times opacity."""
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba).convert("RGB")
