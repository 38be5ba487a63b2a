"""Images listed in a CSV of ``(path, label)`` rows (``load_image_folder``), decoded with Pillow on
access (:class:`~.image_files.ImageFiles`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...labels import LabelGrid
from .encoding import DatasetIdentity, LabelSpec, OrdinalDataset, make_dataset
from .image_files import GRAY_MODES, ImageFiles, image_size_pair, import_pil
from .tables import column_index, file_stem, parse_labels, read_csv_rows

__all__ = ["load_image_folder"]


def _image_modes(files: list[Path], csv_path: Path) -> list[str]:
    """The mode of every image, from its header only (``Image.open`` does not decode): a file that
    is no image is refused here, before training starts."""
    Image = import_pil()
    modes = []
    for i, f in enumerate(files):
        try:
            with Image.open(f) as img:
                modes.append(img.mode)
        except (OSError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            # DecompressionBombWarning: a header between Pillow's limit and twice it, where
            # warnings are errors (python -W error)
            raise ValueError(f"cannot read image {f} (data row {i} of {csv_path}): "
                             f"{str(err).rstrip('.')}. Replace the file or remove its row") from None
    return modes


def load_image_folder(csv_path: str | Path, root: str | Path | None = None, path_column: str = "path",
                      label_column: str = "label", image_size: int | tuple[int, int] | None = 64,
                      step: float | None = None, min_value: float | None = None,
                      max_value: float | None = None, *, grid: LabelGrid | None = None,
                      channels: int | None = None, name: str | None = None,
                      delimiter: str | None = None, in_memory: bool = False) -> OrdinalDataset:
    """Images listed in a CSV of ``(path, label)`` rows, decoded with Pillow (PNG, JPEG, BMP, TIFF, …).

    Args:
        csv_path: the list; paths in it are relative to ``root`` (default: the CSV's folder) or absolute.
        path_column, label_column: the CSV's column names.
        image_size: every image is resized (bilinear, aspect ratio not kept) to ``image_size`` squared, or
            ``(H, W)``; None: 64.
        channels: 1 (grayscale) or 3 (RGB); default 1 when every image is grayscale, else 3.
        in_memory: decode every image now into one tensor (``N * C * H * W * 4`` bytes); by default
            the images stay files, decoded when a batch needs them.
        step, min_value, max_value, grid, name, delimiter: as in :func:`load_table`.

    Returns:
        ``OrdinalDataset`` of kind "images" whose features are :class:`ImageFiles` (``[N, C, H, W]``,
        decoded to float32 in [0, 1] on access), or the decoded tensor with ``in_memory=True``. Every
        file's header is read here, so a missing file or one that is no image is refused at once.
    """
    # The keyword API users call: the listing is read by _listed_images, the grid arguments become
    # one LabelSpec.
    csv_path = Path(csv_path)
    size = image_size_pair(64 if image_size is None else image_size)
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1, 3 or None (automatic), got {channels}")
    files, values = _listed_images(csv_path, root, path_column, label_column, delimiter)
    modes = _image_modes(files, csv_path)
    if channels is None:
        channels = 1 if all(m in GRAY_MODES for m in modes) else 3
    images = ImageFiles(files, channels, size, source=str(csv_path))
    schema = {"format": "images", "path_column": path_column, "label_column": label_column,
              "image_size": list(size), "channels": channels}
    identity = DatasetIdentity(name or file_stem(csv_path), "images", source=str(csv_path), schema=schema)
    return make_dataset(images.load() if in_memory else images, values, identity,
                        LabelSpec(grid, step, min_value, max_value))


def _listed_images(csv_path: Path, root: str | Path | None, path_column: str, label_column: str,
                   delimiter: str | None) -> tuple[list[Path], np.ndarray]:
    """The image files an image list names (each checked to be a file) and their labels ``[N]``."""
    header, body = read_csv_rows(csv_path, delimiter)
    jp = column_index(header, path_column, csv_path, "path")
    jl = column_index(header, label_column, csv_path, "label")
    values = parse_labels(body, jl, label_column, csv_path)
    root = csv_path.parent if root is None else Path(root)
    files = []
    for i, row in enumerate(body):
        p = Path(row[jp])
        p = p if p.is_absolute() else root / p
        if not p.is_file():
            what = ("is not a regular file" if p.exists() else "not found")
            raise FileNotFoundError(f"image {p} (data row {i} of {csv_path}) {what}; paths are read "
                                    f"relative to {root} (the list's folder; in Python: root=)")
        files.append(p)
    return files, values
