"""Evaluation metrics for rank estimation: MAE, cumulative score, Pearson and Spearman.

Every function takes two 1-D sequences of the same length ``N`` (torch tensors, numpy arrays or lists),
predictions first and ground truth second, in the same units (label units when the predictions were
decoded with :meth:`sol_ext.driver.data.RankEncoder.decode`, rank units otherwise), and returns plain Python
floats. Computation is in float64 on the CPU, so the numbers do not depend on the device or the input
dtype.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

__all__ = ["mae", "cumulative_score", "cs_curve", "pearson", "spearman", "summarize"]

ArrayLike = Any  # torch.Tensor | np.ndarray | Sequence[float]


def _as_pair(pred: ArrayLike, true: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as float64 numpy vectors ``[N]``, checked for equal length, N >= 1 and finiteness."""
    p = _as_vector(pred, "pred")
    t = _as_vector(true, "true")
    if p.shape != t.shape:
        raise ValueError(f"pred and true must have the same length, got {p.shape[0]} and {t.shape[0]}")
    if p.size == 0:
        raise ValueError("metrics need at least one sample, got empty pred and true")
    return p, t


def _as_vector(x: ArrayLike, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        # [N, 1] predictions are common; anything else is a caller mistake.
        if a.ndim == 2 and a.shape[1] == 1:
            a = a[:, 0]
        else:
            raise ValueError(f"{name} must be a 1-D vector [N], got shape {tuple(a.shape)}")
    if not np.all(np.isfinite(a)):
        bad = int(np.flatnonzero(~np.isfinite(a))[0])
        raise ValueError(f"{name} contains a non-finite value ({a[bad]}) at index {bad}")
    return a


def mae(pred: ArrayLike, true: ArrayLike) -> float:
    """Mean absolute error ``mean |pred - true|``."""
    p, t = _as_pair(pred, true)
    return float(np.mean(np.abs(p - t)))


def _within(err: np.ndarray, theta: float) -> np.ndarray:
    # A relative slack of 1e-9 keeps decimal thresholds exact: 0.55 - 0.30 is 0.25000000000000006 in
    # binary floating point, and should count as within 0.25.
    return err <= theta + 1e-9 * max(1.0, abs(theta))


def cumulative_score(pred: ArrayLike, true: ArrayLike, theta: float) -> float:
    """CS@theta: the percentage (0–100) of samples with ``|pred - true| <= theta``."""
    if not np.isfinite(theta) or theta < 0:
        raise ValueError(f"theta must be a finite number >= 0, got {theta}")
    p, t = _as_pair(pred, true)
    return float(100.0 * np.mean(_within(np.abs(p - t), float(theta))))


def cs_curve(pred: ArrayLike, true: ArrayLike, thetas: Iterable[float]) -> list[float]:
    """Cumulative scores (percent) at each threshold of ``thetas``, in the given order."""
    p, t = _as_pair(pred, true)
    err = np.abs(p - t)
    out = []
    for theta in thetas:
        theta = float(theta)
        if not np.isfinite(theta) or theta < 0:
            raise ValueError(f"every theta must be a finite number >= 0, got {theta}")
        out.append(float(100.0 * np.mean(_within(err, theta))))
    return out


def _pearson(p: np.ndarray, t: np.ndarray) -> float:
    pc = p - p.mean()
    tc = t - t.mean()
    denom = np.sqrt(np.sum(pc * pc) * np.sum(tc * tc))
    if denom == 0.0:
        # Correlation is undefined when either side is constant.
        return float("nan")
    return float(np.clip(np.sum(pc * tc) / denom, -1.0, 1.0))


def pearson(pred: ArrayLike, true: ArrayLike) -> float:
    """Pearson correlation coefficient; NaN when either input is constant (or N = 1)."""
    p, t = _as_pair(pred, true)
    return _pearson(p, t)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..N of ``x`` with ties given their average rank (as in Spearman's definition)."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Boundaries of runs of equal values in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]
    avg = (starts + ends + 1) / 2.0  # mean of the 1-based positions start+1 .. end
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(pred: ArrayLike, true: ArrayLike) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when either input is constant."""
    p, t = _as_pair(pred, true)
    return _pearson(_average_ranks(p), _average_ranks(t))


def summarize(pred: ArrayLike, true: ArrayLike, theta: float) -> dict[str, float]:
    """All four metrics at once: ``{"mae", "cs", "pearson", "spearman"}``; ``cs`` is CS@theta in percent."""
    return {
        "mae": mae(pred, true),
        "cs": cumulative_score(pred, true, theta),
        "pearson": pearson(pred, true),
        "spearman": spearman(pred, true),
    }
