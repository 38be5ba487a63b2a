"""Image files listed in a CSV of ``(path, label)`` rows (``load_image_folder``), decoded with Pillow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .encoding import OrdinalDataset, RankEncoder, _make_dataset
from .tables import _column, _parse_labels, _read_csv, _stem

__all__ = ["load_image_folder"]


# --------------------------------------------------------------------------------------------------
# Images


def _import_pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("loading image files needs Pillow: pip install pillow") from None
    return Image


_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}


def _image_array(img: Any, channels: int, size: tuple[int, int]) -> np.ndarray:
    """A PIL image as float32 ``[C, H, W]`` in [0, 1], resized to ``size = (H, W)``."""
    Image = _import_pil()
    if channels == 3:
        arr = np.asarray(img.convert("RGB").resize(size[::-1], Image.BILINEAR), dtype=np.float32) / 255.0
        return arr.transpose(2, 0, 1)
    if img.mode.startswith("I"):
        # 16-bit (and 32-bit integer) grayscale: scale by the 16-bit range instead of clipping at 255.
        arr = np.asarray(img, dtype=np.float32) / 65535.0
        img = Image.fromarray(arr, mode="F")
    elif img.mode == "F":
        pass  # already float; taken as [0, 1]
    else:
        img = Image.fromarray(np.asarray(img.convert("L"), dtype=np.float32) / 255.0, mode="F")
    arr = np.asarray(img.resize(size[::-1], Image.BILINEAR), dtype=np.float32)
    return arr[None]


def load_image_folder(csv_path: str | Path, root: str | Path | None = None, path_column: str = "path",
                      label_column: str = "label", image_size: int | tuple[int, int] = 64,
                      step: float | None = None, min_value: float | None = None,
                      max_value: float | None = None, *, encoder: RankEncoder | None = None,
                      channels: int | None = None, name: str | None = None,
                      delimiter: str | None = None) -> OrdinalDataset:
    """Images listed in a CSV of ``(path, label)`` rows, decoded with Pillow (PNG, JPEG, BMP, TIFF, …).

    Args:
        csv_path: the list; paths in it are relative to ``root`` (default: the CSV's folder) or absolute.
        path_column, label_column: the CSV's column names.
        image_size: every image is resized (bilinear, aspect ratio not kept) to ``image_size`` squared, or
            ``(H, W)``.
        channels: 1 (grayscale) or 3 (RGB); default 1 when every image is grayscale, else 3.
        step, min_value, max_value, encoder, name, delimiter: as in :func:`load_csv`.

    Returns:
        ``OrdinalDataset`` of kind "images", features float32 ``[N, C, H, W]`` in [0, 1]
        (``N * C * H * W * 4`` bytes in memory).
    """
    Image = _import_pil()
    csv_path = Path(csv_path)
    header, body = _read_csv(csv_path, delimiter)
    jp = _column(header, path_column, csv_path, "path")
    jl = _column(header, label_column, csv_path, "label")
    values = _parse_labels(body, jl, label_column, csv_path)
    root = csv_path.parent if root is None else Path(root)
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (H, W), got {image_size}")
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1, 3 or None (automatic), got {channels}")

    files = []
    for i, row in enumerate(body):
        p = Path(row[jp])
        p = p if p.is_absolute() else root / p
        if not p.is_file():
            raise FileNotFoundError(f"image {p} (data row {i + 1} of {csv_path}) not found; paths are read "
                                    f"relative to root={root}")
        files.append(p)

    def _open(i: int) -> Any:
        try:
            img = Image.open(files[i])
            img.load()
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise ValueError(f"cannot read image {files[i]} (data row {i + 1} of {csv_path}): {err}. "
                             "Replace the file or remove its row") from None
        return img

    if channels is None:
        # First pass reads only the headers (Image.open is lazy) to pick gray or colour for all images.
        channels = 1
        for i, f in enumerate(files):
            try:
                with Image.open(f) as img:
                    mode = img.mode
            except (OSError, ValueError) as err:
                raise ValueError(f"cannot read image {f} (data row {i + 1} of {csv_path}): {err}. "
                                 "Replace the file or remove its row") from None
            if mode not in _GRAY_MODES:
                channels = 3
                break
    x = np.empty((len(files), channels, *size), dtype=np.float32)
    for i in range(len(files)):
        with _open(i) as img:
            x[i] = _image_array(img, channels, size)
    schema = {"format": "images", "path_column": path_column, "label_column": label_column,
              "image_size": list(size), "channels": channels}
    return _make_dataset(torch.from_numpy(x), values, name=name or _stem(csv_path), kind="images",
                         encoder=encoder, step=step, min_value=min_value, max_value=max_value,
                         source=str(csv_path), schema=schema)
