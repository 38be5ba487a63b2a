"""Image files decoded on access: :class:`ImageFiles`, the ``features`` of an image data set that
is not held in memory, and :func:`read_image`, how one file becomes the model's input."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["ImageFiles", "read_image", "image_size_pair", "row_numbers"]


def import_pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("loading image files needs Pillow: pip install pillow") from None
    return Image


GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}


def _image_array(img: Any, channels: int, size: tuple[int, int]) -> np.ndarray:
    """A PIL image as float32 ``[C, H, W]`` in [0, 1], resized to ``size = (H, W)``."""
    Image = import_pil()
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
    arr = np.array(img.resize(size[::-1], Image.BILINEAR), dtype=np.float32)  # a writable copy
    return arr[None]


def read_image(path: str | Path, channels: int, size: tuple[int, int], where: str = "") -> torch.Tensor:
    """One image file as float32 ``[C, H, W]`` in [0, 1], resized (bilinear, aspect ratio not kept)
    to ``size = (H, W)``. ``where`` ("data row 3 of list.csv") goes into the error of an unreadable
    file."""
    Image = import_pil()
    try:
        with Image.open(path) as img:
            if img.format == "JPEG":
                # libjpeg decodes at 1/2, 1/4 or 1/8 scale when that still covers the target size:
                # a large photo costs a fraction of a full decode
                img.draft("RGB" if channels == 3 else "L", (size[1], size[0]))
            img.load()
            return torch.from_numpy(_image_array(img, channels, size))
    except (OSError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ValueError(f"cannot read image {path}{f' ({where})' if where else ''}: {err}. "
                         "Replace the file or remove its row") from None


class ImageFiles:
    """Image files decoded on access: the ``features`` of an image data set that is not held in
    memory. Indexing with row numbers (a tensor, array, list or slice) gives the files of those rows,
    still undecoded; :meth:`read` decodes one, :meth:`load` all of them.

    Args:
        files: the image paths.
        channels: 1 (grayscale) or 3 (RGB): every image is converted to it.
        size: ``(H, W)`` every image is resized to.
        source: the list the paths came from, for error messages.
        rows: the data row (from 0, the first after the header) of each file in ``source``; default
            ``0 … N-1``.
    """

    dtype = torch.float32

    def __init__(self, files: Sequence[str | Path], channels: int, size: Sequence[int], source: str = "",
                 rows: Sequence[int] | None = None):
        # numpy arrays of strings: DataLoader workers read them without touching per-object reference
        # counts, so forked workers do not copy the list page by page
        self.files = np.asarray([str(f) for f in files], dtype=np.str_)
        self.rows = np.arange(len(self.files)) if rows is None else np.asarray(rows, dtype=np.int64)
        self.channels = int(channels)
        self.size = (int(size[0]), int(size[1]))
        self.source = source

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.files), self.channels, *self.size))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: Any) -> "ImageFiles":
        index = row_numbers(index, len(self.files))
        return ImageFiles(self.files[index], self.channels, self.size, self.source, self.rows[index])

    def read(self, i: int) -> torch.Tensor:
        """Image ``i`` as float32 ``[C, H, W]`` in [0, 1]."""
        return read_image(self.files[i], self.channels, self.size,
                          f"data row {self.rows[i]} of {self.source}" if self.source else "")

    def load(self) -> torch.Tensor:
        """Every image, decoded: float32 ``[N, C, H, W]`` (``N * C * H * W * 4`` bytes)."""
        out = torch.empty(tuple(self.shape), dtype=torch.float32)
        for i in range(len(self)):
            out[i] = self.read(i)
        return out

    def __repr__(self) -> str:
        return f"ImageFiles({len(self)} files of {self.source or '?'}, {self.channels} x {self.size})"


def row_numbers(index: Any, count: int) -> np.ndarray:
    """``[k]`` int row numbers of ``index`` (a tensor, array or list of numbers or booleans, a slice, a
    number) into ``count`` rows: what the data sets whose rows are read on access are indexed with."""
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    rows = np.arange(count)[index] if isinstance(index, slice) else np.asarray(index)
    if rows.dtype == np.bool_:
        rows = np.flatnonzero(rows)
    return rows.reshape(-1)


def image_size_pair(image_size: int | Sequence[int]) -> tuple[int, int]:
    """``image_size`` (a side or ``(H, W)``) as ``(H, W)``; a ValueError where it is not positive."""
    size = (image_size, image_size) if isinstance(image_size, (int, np.integer)) else tuple(image_size)
    if len(size) != 2 or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1
                                 for s in size):
        raise ValueError(f"image_size must be a positive int or (H, W), got {image_size}")
    return int(size[0]), int(size[1])
