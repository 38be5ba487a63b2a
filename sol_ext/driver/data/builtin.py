"""The built-in data sets: UCI Abalone and Wine Quality (shipped in ``sol_ext/datasets/``) and
Fashion-MNIST with a controlled degradation level as the rank (from Debian's package; nothing is downloaded).
"""

from __future__ import annotations

import gzip
import math
import struct
from pathlib import Path

import numpy as np
import torch

from ...labels import LabelGrid
from ..errors import data_file_errors
from .encoding import OrdinalDataset
from .image_files import image_size_pair
from .tables import load_table

__all__ = [
    "load_abalone", "load_wine_red", "load_fashion_mnist_degradation", "degradation_strengths",
    "DATASETS_DIR", "FASHION_MNIST_DIR", "FASHION_MNIST_INSTALL",
]

# The package data (setup.py's package_data "datasets/*"): sol_ext/datasets, two levels above this file.
DATASETS_DIR = Path(__file__).resolve().parents[2] / "datasets"
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # where Debian's package installs it
FASHION_MNIST_INSTALL = "apt-get install -y dataset-fashion-mnist"


# --------------------------------------------------------------------------------------------------
# Shipped tables


ABALONE_SEX = ("F", "I", "M")


def load_abalone() -> OrdinalDataset:
    """UCI Abalone (Nash et al. 1994, CC BY 4.0), shipped with the package (``sol_ext/datasets/ABALONE.md``).

    4177 samples; label: rings 1–29 on a step-1 grid (29 ranks; 28 rings never occurs).
    Features ``[N, 10]``: ``Sex`` one-hot (``Sex=F``, ``Sex=I``, ``Sex=M``) and the seven raw
    measurements (length, diameter, height, four weights), unscaled: call :func:`standardize` after
    splitting, so test data never shape the scaling.
    """
    return load_table(DATASETS_DIR / "abalone.csv.gz", label_column="Rings",
                    grid=LabelGrid(min_value=1.0, step=1.0, num_ranks=29),
                    categorical={"Sex": ABALONE_SEX}, name="abalone")


def load_wine_red() -> OrdinalDataset:
    """UCI Wine Quality, red (Cortez et al. 2009, CC BY 4.0), shipped (``sol_ext/datasets/WINE_QUALITY.md``).

    1599 wines; label: ``quality`` 3–8 on a step-1 grid (6 ranks, imbalanced: 10, 53, 681, 638, 199, 18
    wines). Features ``[N, 11]``: the raw physicochemical measurements (fixed acidity … alcohol),
    unscaled: call :func:`standardize` after splitting. The file is UCI's semicolon-delimited CSV.
    """
    return load_table(DATASETS_DIR / "winequality-red.csv.gz", label_column="quality",
                    grid=LabelGrid(min_value=3.0, step=1.0, num_ranks=6), name="wine-red",
                    delimiter=";")


# --------------------------------------------------------------------------------------------------
# Fashion-MNIST with a controlled degradation level as the rank

DEGRADATIONS = ("blur", "noise")
# Strength at the top level K-1. Blur: Gaussian sigma in pixels; noise: std of additive Gaussian pixel noise
# on [0, 1] intensities (then clipped to [0, 1]).
DEFAULT_MAX_STRENGTH = {"blur": 2.5, "noise": 0.5}
# Blur below sigma 0.5 px hardly changes a 28x28 image, while each further step of sigma matters less and
# less: blur levels 1..K-1 are spaced geometrically from this sigma up to the maximum.
MIN_BLUR_SIGMA = 0.5


def degradation_strengths(levels: int, kind: str = "blur", max_strength: float | None = None) -> list[float]:
    """The strength of each level ``0 … levels-1`` (level 0 is the original image, strength 0).

    ``kind="blur"``: Gaussian sigma in pixels, geometric from 0.5 at level 1 to ``max_strength`` (2.5)
    at the top level. ``kind="noise"``: std of additive pixel noise, linear ``k / (levels-1) * max_strength``
    (0.5).
    """
    if kind not in DEGRADATIONS:
        raise ValueError(f"kind must be one of {DEGRADATIONS}, got {kind!r}")
    if isinstance(levels, bool) or int(levels) != levels or levels < 2:
        raise ValueError(f"levels must be an integer >= 2, got {levels}")
    top = DEFAULT_MAX_STRENGTH[kind] if max_strength is None else float(max_strength)
    if not (math.isfinite(top) and top > 0):
        raise ValueError(f"max_strength must be a finite number > 0, got {max_strength}")
    levels = int(levels)
    if kind == "noise":
        return [top * k / (levels - 1) for k in range(levels)]
    low = min(MIN_BLUR_SIGMA, top)
    if levels == 2:
        return [0.0, top]
    return [0.0] + [low * (top / low) ** ((k - 1) / (levels - 2)) for k in range(1, levels)]


def _read_idx_images(path: Path) -> np.ndarray:
    """An IDX3 ubyte file (gzipped) as uint8 ``[N, H, W]``."""
    with data_file_errors(path), gzip.open(path, "rb") as fh:
        data = fh.read()
    magic, n, h, w = struct.unpack(">IIII", data[:16])
    if magic != 2051 or len(data) != 16 + n * h * w:
        raise ValueError(f"{path} is not an IDX image file (magic {magic}, {len(data)} bytes)")
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, h, w)


def _gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``[N, 1, H, W]`` with edge replication; sigma in pixels (0 = identity)."""
    if sigma <= 0:
        return x
    radius = max(1, int(math.ceil(3.0 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-(t**2) / (2.0 * sigma**2))
    k = (k / k.sum()).to(x.dtype)
    x = torch.nn.functional.pad(x, (radius, radius, radius, radius), mode="replicate")
    x = torch.nn.functional.conv2d(x, k.view(1, 1, 1, -1))
    return torch.nn.functional.conv2d(x, k.view(1, 1, -1, 1))


def load_fashion_mnist_degradation(levels: int = 8, samples_per_level: int = 500, kind: str = "blur",
                                   seed: int = 0, root: str | Path | None = None, split: str = "train",
                                   max_strength: float | None = None,
                                   image_size: int | tuple[int, int] | None = None) -> OrdinalDataset:
    """Real Fashion-MNIST images whose rank is a degradation level ``0 … levels-1`` applied to them.

    ``levels * samples_per_level`` distinct images (default 4000) are drawn at random from the split,
    each is given a level (balanced: ``samples_per_level`` per level) and degraded with the strength of
    its level (:func:`degradation_strengths`): a Gaussian blur of sigma 0.5 … 2.5 pixels, geometric in the
    level, for ``kind="blur"``; additive Gaussian pixel noise of std ``k / (levels-1) * 0.5``, clipped to
    [0, 1], for ``kind="noise"``. Level 0 is the original image. ``max_strength`` changes the top level's
    strength. Features: float32 ``[N, 1, 28, 28]`` in [0, 1], or resized (bilinear, after the
    degradation) to ``image_size`` squared or ``(H, W)``.

    The data come from Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``;
    ``root=`` points elsewhere, to a folder with the ``*-images-idx3-ubyte.gz`` files). ``split="test"``
    draws from the 10 000 test images, so a train/test pair shares no source image.
    """
    strengths = degradation_strengths(levels, kind, max_strength)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if isinstance(samples_per_level, bool) or int(samples_per_level) != samples_per_level \
            or samples_per_level < 1:
        raise ValueError(f"samples_per_level must be an integer >= 1, got {samples_per_level}")
    # The keyword API users call; the images are read by _fashion_mnist_images, degraded by _degrade.
    levels, samples_per_level = int(levels), int(samples_per_level)
    images = _fashion_mnist_images(root, split)
    total = levels * samples_per_level
    if total > images.shape[0]:
        raise ValueError(f"levels * samples_per_level = {total} exceeds the {images.shape[0]} images of the "
                         f"{split} split")
    rng = np.random.default_rng(seed)
    pick = rng.choice(images.shape[0], size=total, replace=False)
    level = rng.permutation(np.repeat(np.arange(levels), samples_per_level))
    x = _degrade(torch.from_numpy(images[pick].astype(np.float32) / 255.0)[:, None], level, strengths, kind, seed)
    if image_size is not None and image_size_pair(image_size) != tuple(x.shape[2:]):
        x = torch.nn.functional.interpolate(x, size=image_size_pair(image_size), mode="bilinear",
                                            antialias=True, align_corners=False).clamp_(0.0, 1.0)
    grid = LabelGrid(min_value=0.0, step=1.0, num_ranks=levels)
    # new images for prediction: an image folder, read as 28 x 28 grayscale
    schema = {"format": "images", "path_column": "path", "label_column": "label",
              "image_size": [int(x.shape[2]), int(x.shape[3])], "channels": 1}
    return OrdinalDataset(features=x, ranks=torch.from_numpy(level.astype(np.int64)), grid=grid,
                          name=f"fashion-mnist-{kind}", kind="images", schema=schema)


def _fashion_mnist_images(root: str | Path | None, split: str) -> np.ndarray:
    """The uint8 images ``[N, 28, 28]`` of a Fashion-MNIST split, from ``root`` (default Debian's folder)."""
    folder = FASHION_MNIST_DIR if root is None else Path(root)
    path = folder / ("train-images-idx3-ubyte.gz" if split == "train" else "t10k-images-idx3-ubyte.gz")
    if not path.is_file():
        raise FileNotFoundError(f"Fashion-MNIST not found: {path} is missing. Install it with "
                                f"`{FASHION_MNIST_INSTALL}` (Debian/Ubuntu, as root), or put "
                                f"train-images-idx3-ubyte.gz and t10k-images-idx3-ubyte.gz in {folder} (in "
                                "Python: or pass root= another folder)")
    return _read_idx_images(path)


def _degrade(x: torch.Tensor, level: np.ndarray, strengths: list[float], kind: str, seed: int) -> torch.Tensor:
    """Images ``x`` ``[N, 1, H, W]`` (changed in place), each blurred or noised with the strength of its
    ``level``; the noise drawn from a generator seeded with ``seed``."""
    noise_gen = torch.Generator().manual_seed(int(seed))
    for k in range(1, len(strengths)):
        rows = torch.from_numpy(np.flatnonzero(level == k))
        s = strengths[k]
        if kind == "blur":
            x[rows] = _gaussian_blur(x[rows], s)
        else:
            noisy = x[rows] + s * torch.randn(x[rows].shape, generator=noise_gen)
            x[rows] = noisy.clamp_(0.0, 1.0)
    return x
