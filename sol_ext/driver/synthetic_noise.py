"""Synthetic label noise on the rank grid, as in the paper's experiments (docs/math.md section 9, Appendix C.2).

The noise scale is ``s = kappa * sigma_X`` with ``sigma_X`` the standard deviation of the clean ranks
(population std, in rank units). A noisy label is the clean rank plus a draw ``e`` of the chosen
distribution, rounded to the nearest rank (halves up) and clipped to ``0 … n-1``:

=================== ==========================================================================
``gaussian``        ``e ~ N(0, s^2)``
``laplacian``       ``e ~ Laplace(0, s)`` (scale ``s``, so std ``sqrt(2) s``)
``uniform``         ``e ~ U(-s, s)``
``skewed``          ``e ~ SkewNorm(a=5, loc=0, scale=s)``: mean ``s * 0.978 * sqrt(2/pi) ≈ 0.78 s`` > 0
``input-dependent`` ``e ~ N(0, s(r)^2)``, ``s(r) = s * (1 + exp(-(r - peak)^2 / (2 width^2)))``
``none``            no noise: the noisy labels are a copy of the clean ones
=================== ==========================================================================

``fraction < 1`` gives the paper's "partial" setting: exactly ``round(fraction * N)`` samples, chosen at
random, receive noise; the rest keep their clean rank. Everything is drawn from numpy generators seeded
by ``seed``; the noise values and the choice of noisy samples come from two independent streams, so for
one seed the noise a sample would get does not depend on ``fraction``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["NOISE_TYPES", "NoisyLabels", "add_label_noise", "noise_scale", "noise_statistics",
           "default_peak_width", "input_dependent_scale"]

NOISE_TYPES = ("gaussian", "laplacian", "uniform", "skewed", "input-dependent", "none")

SKEW_ALPHA = 5.0  # SkewNorm shape parameter a of the paper

# The paper's input-dependent setting is given for MORPH II (ages 16-77, 62 ranks): r_peak = 40 and
# w = 15 years. Expressed as fractions of the rank range (n - 1 = 61) they carry over to any dataset and
# reproduce the paper's values exactly on MORPH II: peak 24 ranks (age 40), width 15 ranks.
PEAK_FRACTION = 24.0 / 61.0
WIDTH_FRACTION = 15.0 / 61.0


@dataclass
class NoisyLabels:
    """Noisy training labels next to the clean ones they were made from.

    Attributes:
        noisy: ``[N]`` int64 ranks in ``0 … n-1``, the labels to train on.
        clean: ``[N]`` int64 ranks, a copy of the input clean ranks.
        selected: ``[N]`` bool, the samples that received a noise draw (all of them unless
            ``fraction < 1``; none for ``noise="none"`` or ``kappa=0``). A selected sample may still keep
            its clean rank when its draw rounds to 0.
        scale: ``s = kappa * sigma_X`` in rank units (0.0 for no noise).
    """

    noisy: torch.Tensor
    clean: torch.Tensor
    selected: torch.Tensor
    scale: float


def _as_ranks(clean_ranks: Any, num_ranks: int) -> torch.Tensor:
    """Clean ranks as an int64 CPU tensor ``[N]``, checked to lie in ``0 … num_ranks-1``."""
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise ValueError(f"num_ranks must be an integer >= 1, got {num_ranks!r}")
    r = clean_ranks if isinstance(clean_ranks, torch.Tensor) else torch.as_tensor(np.asarray(clean_ranks))
    r = r.detach().cpu()
    if r.dim() != 1:
        raise ValueError(f"clean_ranks must be a 1-D vector [N], got shape {tuple(r.shape)}")
    if r.is_floating_point():
        if not bool(torch.all(r == torch.round(r))):
            raise ValueError("clean_ranks must be integer ranks (0-based); got non-integer values. "
                             "Map label values to ranks first with LabelGrid.encode.")
    elif r.dtype == torch.bool or r.is_complex():
        raise ValueError(f"clean_ranks must be integer ranks, got dtype {r.dtype}")
    r = r.to(torch.int64)
    if r.numel() and (int(r.min()) < 0 or int(r.max()) >= num_ranks):
        raise ValueError(f"clean_ranks must lie in 0 … {num_ranks - 1} (num_ranks={num_ranks}), "
                         f"got values from {int(r.min())} to {int(r.max())}")
    return r


def noise_key(noise: str) -> str:
    """A noise type as :func:`add_label_noise` reads it: "Laplacian" and "laplacian" are one type."""
    return str(noise).strip().lower().replace("_", "-")


def _check_noise(noise: str) -> str:
    key = noise_key(noise)
    if key not in NOISE_TYPES:
        raise ValueError(f"unknown noise type {noise!r}; expected one of {', '.join(NOISE_TYPES)}")
    return key


def _check_kappa(kappa: float) -> float:
    kappa = float(kappa)
    if not math.isfinite(kappa) or kappa < 0:
        raise ValueError(f"kappa must be a finite number >= 0, got {kappa}; the paper uses 0.1 … 0.5")
    return kappa


def noise_scale(clean_ranks: Any, kappa: float) -> float:
    """``s = kappa * sigma_X``: ``kappa`` times the population std of the clean ranks ``[N]``."""
    kappa = _check_kappa(kappa)
    r = np.asarray(clean_ranks.cpu() if isinstance(clean_ranks, torch.Tensor) else clean_ranks,
                   dtype=np.float64)
    if r.size == 0:
        return 0.0
    return kappa * float(r.std())


def default_peak_width(num_ranks: int) -> tuple[float, float]:
    """Default ``(peak, width)`` of input-dependent noise, in rank units, for ``num_ranks`` ranks.

    The paper's MORPH II values (age 40 and 15 years on ages 16–77) as fractions of the rank range:
    ``peak = 0.393 (n-1)``, ``width = 0.246 (n-1)``.
    """
    span = max(num_ranks - 1, 1)
    return PEAK_FRACTION * span, WIDTH_FRACTION * span


def input_dependent_scale(clean_ranks: np.ndarray, s: float, peak: float, width: float) -> np.ndarray:
    """``[N]`` std of ``input-dependent`` noise at each clean rank: ``s (1 + exp(-(r - peak)^2 / (2 width^2)))``."""
    clean_ranks = np.asarray(clean_ranks, dtype=np.float64)
    return s * (1.0 + np.exp(-((clean_ranks - peak) ** 2) / (2.0 * width**2)))


def _draw(kind: str, rng: np.random.Generator, clean: np.ndarray, s: float,
          peak: float, width: float) -> np.ndarray:
    """One noise value per sample ``[N]`` float64, in rank units."""
    n = clean.size
    if kind == "gaussian":
        return rng.normal(0.0, s, size=n)
    if kind == "laplacian":
        return rng.laplace(0.0, s, size=n)
    if kind == "uniform":
        return rng.uniform(-s, s, size=n)
    if kind == "skewed":
        # Skew-normal by its stochastic representation (Azzalini): with u0, u1 ~ N(0, 1) independent and
        # delta = a / sqrt(1 + a^2), delta |u0| + sqrt(1 - delta^2) u1 ~ SkewNorm(a, 0, 1).
        delta = SKEW_ALPHA / math.sqrt(1.0 + SKEW_ALPHA**2)
        u = rng.standard_normal(size=(2, n))
        return s * (delta * np.abs(u[0]) + math.sqrt(1.0 - delta**2) * u[1])
    if kind == "input-dependent":
        return rng.standard_normal(size=n) * input_dependent_scale(clean, s, peak, width)
    raise AssertionError(kind)  # unreachable: _check_noise filtered the name


def add_label_noise(
    clean_ranks: Any,
    num_ranks: int,
    noise: str = "gaussian",
    kappa: float = 0.3,
    seed: int = 0,
    fraction: float = 1.0,
    peak: float | None = None,
    width: float | None = None,
) -> NoisyLabels:
    """Corrupt clean ranks with synthetic label noise on the rank grid.

    Args:
        clean_ranks: ``[N]`` integer ranks in ``0 … num_ranks-1`` (tensor, array or list).
        num_ranks: ``n``, the number of ranks; noisy ranks are clipped to ``0 … n-1``.
        noise: one of :data:`NOISE_TYPES` (underscores and case are accepted: ``"Input_Dependent"``).
        kappa: noise ratio ``>= 0``; ``s = kappa * std(clean_ranks)``. ``kappa=0`` gives a clean copy.
        seed: seed of the numpy generators; the same arguments always give the same labels.
        fraction: share of samples in ``[0, 1]`` that receive noise (the paper's partial setting,
            ``eps% = 100 * fraction``).
        peak, width: centre and width of the input-dependent bump, in rank units (only for
            ``noise="input-dependent"``); defaults from :func:`default_peak_width`.

    Returns:
        :class:`NoisyLabels` with int64 ``noisy`` and ``clean`` ``[N]`` on the device of ``clean_ranks``.
    """
    # The keyword API users call: its arguments are checked by _check_noise_options.
    kind = _check_noise(noise)
    kappa = _check_kappa(kappa)
    _check_noise_options(kind, fraction, peak, width, seed)
    device = clean_ranks.device if isinstance(clean_ranks, torch.Tensor) else torch.device("cpu")
    clean = _as_ranks(clean_ranks, num_ranks)
    c = clean.numpy().astype(np.float64)
    s = noise_scale(c, kappa)

    if kind == "none" or s == 0.0 or c.size == 0:
        return NoisyLabels(noisy=clean.clone().to(device), clean=clean.clone().to(device),
                           selected=torch.zeros(c.size, dtype=torch.bool, device=device), scale=0.0)

    default_peak, default_width = default_peak_width(num_ranks)
    peak = default_peak if peak is None else float(peak)
    width = default_width if width is None else float(width)
    if kind == "input-dependent" and not (math.isfinite(peak) and math.isfinite(width) and width > 0):
        raise ValueError(f"input-dependent noise needs a finite peak and a width > 0 (rank units), "
                         f"got peak={peak}, width={width}")

    noise_seq, pick_seq = np.random.SeedSequence(int(seed)).spawn(2)
    e = _draw(kind, np.random.default_rng(noise_seq), c, s, peak, width)
    selected = _noised_samples(c.size, fraction, pick_seq)
    # Round half up, like LabelGrid.encode; ties have probability zero for continuous noise anyway.
    noisy = np.clip(np.floor(c + e + 0.5), 0, num_ranks - 1)
    noisy = np.where(selected, noisy, c).astype(np.int64)
    return NoisyLabels(noisy=torch.from_numpy(noisy).to(device), clean=clean.clone().to(device),
                       selected=torch.from_numpy(selected).to(device), scale=s)


def _check_noise_options(kind: str, fraction: float, peak: float | None, width: float | None, seed: Any) -> None:
    """ValueError naming the argument of :func:`add_label_noise` that is out of its range."""
    if not (0.0 <= float(fraction) <= 1.0):
        raise ValueError(f"fraction must be in [0, 1] (share of samples that get noise), got {fraction}")
    if (peak is not None or width is not None) and kind != "input-dependent":
        raise ValueError(f"peak and width apply only to noise='input-dependent', not to noise={kind!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")


def _noised_samples(size: int, fraction: float, pick_seq: np.random.SeedSequence) -> np.ndarray:
    """``[size]`` bool: the samples that get noise, every one, or a random ``fraction`` of them."""
    selected = np.ones(size, dtype=bool)
    if fraction < 1.0:
        count = int(math.floor(fraction * size + 0.5))
        selected[:] = False
        selected[np.random.default_rng(pick_seq).permutation(size)[:count]] = True
    return selected


def noise_statistics(noisy: Any, clean: Any) -> dict[str, float]:
    """How far noisy labels ``[N]`` are from clean ones ``[N]`` (same units, usually ranks).

    Returns ``{"mae": mean |noisy - clean|, "mean": mean (noisy - clean), "std": population std of
    (noisy - clean), "fraction_wrong": share of samples with noisy != clean,
    "max_abs": max |noisy - clean|}``.
    """
    a = np.asarray(noisy.cpu() if isinstance(noisy, torch.Tensor) else noisy, dtype=np.float64)
    b = np.asarray(clean.cpu() if isinstance(clean, torch.Tensor) else clean, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"noisy and clean must be 1-D of the same length, got shapes {a.shape} and "
                         f"{b.shape}")
    if a.size == 0:
        raise ValueError("noise_statistics needs at least one sample")
    d = a - b
    return {
        "mae": float(np.mean(np.abs(d))),
        "mean": float(np.mean(d)),
        "std": float(np.std(d)),
        "fraction_wrong": float(np.mean(d != 0)),
        "max_abs": float(np.max(np.abs(d))),
    }
