"""Evaluation metrics for rank estimation: MAE, cumulative score, Pearson and Spearman, and the ordinal
metrics quadratic weighted kappa, macro-averaged MAE (AMAE), the worst per-rank MAE (MMAE), per-rank MAE
and the ranked probability score of predicted probabilities.

Every function takes two 1-D sequences of the same length ``N`` (torch tensors, numpy arrays or lists),
predictions first and ground truth second, in the same units (label units when the predictions were
decoded with :meth:`sol_ext.LabelGrid.decode`, rank units otherwise), and returns plain Python
floats (:func:`per_rank_mae`: a dict of them). Computation is in float64 on the CPU, so the numbers do not
depend on the device or the input dtype.

* :func:`quadratic_weighted_kappa` takes integer ranks ``0 … K-1`` (or integer labels
  >= 0), and equals ``sklearn.metrics.cohen_kappa_score(true, pred, weights="quadratic",
  labels=range(K))``. Quadratic weighting makes it unchanged by a common shift and scale of both inputs,
  so label values on a grid ``min + step * rank`` give the same kappa as their ranks; :func:`summarize`
  relies on that.
* :func:`macro_mae` (AMAE in the ordinal-regression literature) averages the
  MAE of each true value's samples (Baccianella et al., 2009), so a rare rank weighs as much as a common
  one; :func:`maximum_mae` (MMAE) is the largest of them, and :func:`per_rank_mae` gives
  them all.
* :func:`ranked_probability_score` (RPS) scores probabilities ``[N, K]`` rather than
  point predictions: the squared distance between the predicted and the true cumulative distribution.
* :func:`expected_calibration_error` and :func:`reliability_curve` say how far the probability of the
  most probable rank is from how often that rank is right.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from . import _validation as check

__all__ = ["mae", "cumulative_score", "cs_curve", "pearson", "spearman", "quadratic_weighted_kappa",
           "macro_mae", "maximum_mae", "per_rank_mae", "ranked_probability_score",
           "expected_calibration_error", "reliability_curve", "summarize"]

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
    theta = check.check_nonnegative_float("theta", theta)
    p, t = _as_pair(pred, true)
    return float(100.0 * np.mean(_within(np.abs(p - t), theta)))


def cs_curve(pred: ArrayLike, true: ArrayLike, thetas: Iterable[float]) -> list[float]:
    """Cumulative scores (percent) at each threshold of ``thetas``, in the given order."""
    p, t = _as_pair(pred, true)
    err = np.abs(p - t)
    out = []
    for theta in thetas:
        theta = check.check_nonnegative_float("every theta of thetas", theta)
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


def _quadratic_kappa(p: np.ndarray, t: np.ndarray) -> float:
    """Quadratic weighted kappa of float64 vectors ``[N]``, with weights ``(a - b)^2`` in their own units.

    Cohen's kappa is ``1 - sum_ab w_ab O_ab / sum_ab w_ab E_ab`` with ``O`` the confusion counts and
    ``E`` their expectation under independent margins. With ``w_ab = (a - b)^2`` the numerator is
    ``N * mean((p - t)^2)`` and the denominator ``N * (var p + var t + (mean p - mean t)^2)`` (the mean
    of ``(p_k - t_l)^2`` over all pairs), so no ``K x K`` table is needed, ranks absent from both inputs
    drop out, and the usual ``1 / (K - 1)^2`` normalization of the weights cancels. (On real values this
    is Lin's concordance correlation coefficient.)
    """
    p_const, t_const = p.min() == p.max(), t.min() == t.max()
    if p_const and t_const:
        # Both constant: equal values make O and E the same single cell (0 / 0, undefined); sklearn
        # returns nan there, and so do we, as pearson() does for a constant input. A 1.0 would let a
        # degenerate split pass for perfect agreement. Different values: O = E, kappa 0.
        return float("nan") if p[0] == t[0] else 0.0
    observed = np.mean((p - t) ** 2)
    chance = np.mean((p - p.mean()) ** 2) + np.mean((t - t.mean()) ** 2) + (p.mean() - t.mean()) ** 2
    return float(1.0 - observed / chance)


def _check_ranks(a: np.ndarray, name: str) -> None:
    off = np.flatnonzero((a != np.round(a)) | (a < 0))
    if off.size:
        i = int(off[0])
        raise ValueError(f"{name} must hold integer ranks >= 0 (0 … K-1), got {a[i]} at index {i}; map "
                         f"label values to ranks first (rank = round((value - min) / step))")


def quadratic_weighted_kappa(pred: ArrayLike, true: ArrayLike, num_ranks: int | None = None) -> float:
    """Cohen's kappa with quadratic weights between integer ranks: 1 for perfect agreement, 0 for chance.

    Args:
        pred: ``[N]`` predicted ranks, integer-valued in ``0 … K-1`` (any dtype).
        true: ``[N]`` true ranks, same.
        num_ranks: ``K``; only checked against the inputs (ranks must be ``< K``). It cannot change the
            value: the weights ``(i - j)^2 / (K - 1)^2`` are scaled together, and ranks that occur in
            neither input add nothing. Default ``max(pred, true) + 1``.

    Returns:
        kappa in ``[-1, 1]``; equal to ``sklearn.metrics.cohen_kappa_score(true, pred,
        weights="quadratic", labels=range(K))`` (and without ``labels`` whenever the ranks present in
        either input are consecutive: sklearn numbers the present labels, not their values). NaN when both
        inputs are the same constant (sklearn's nan: agreement by chance is already perfect); 0 when
        both are constant and differ.
    """
    p, t = _as_pair(pred, true)
    _check_ranks(p, "pred")
    _check_ranks(t, "true")
    if num_ranks is not None:
        if not isinstance(num_ranks, (int, np.integer)) or isinstance(num_ranks, bool) or num_ranks < 1:
            raise ValueError(f"num_ranks must be an integer >= 1, got {num_ranks!r}")
        for name, a in (("pred", p), ("true", t)):
            if a.max() >= num_ranks:
                raise ValueError(f"{name} holds rank {int(a.max())}, outside 0 … num_ranks-1 = "
                                 f"0 … {int(num_ranks) - 1}")
    return _quadratic_kappa(p, t)



def _per_value_mae(p: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``t`` (increasing) and the MAE of the samples that have each of them."""
    values, group = np.unique(t, return_inverse=True)
    sums = np.bincount(group, weights=np.abs(p - t), minlength=values.size)
    return values, sums / np.bincount(group, minlength=values.size)


def macro_mae(pred: ArrayLike, true: ArrayLike) -> float:
    """Macro-averaged MAE: the mean over the distinct values of ``true`` of the MAE of their samples.

    Each true rank counts once however many samples it has, so a predictor that ignores rare ranks is
    not hidden by the common ones (Baccianella, Esuli & Sebastiani, 2009). Works in any units.
    """
    _, per_value = _per_value_mae(*_as_pair(pred, true))
    return float(np.mean(per_value))



def maximum_mae(pred: ArrayLike, true: ArrayLike) -> float:
    """The worst per-value MAE: the largest, over the distinct values of ``true``, of the MAE of their
    samples (MMAE, Cruz-Ramírez et al., 2014; dlordinal's ``mmae``). Works in any units.

    A predictor that is good on average but bad on one rank scores that rank's error here.
    """
    _, per_value = _per_value_mae(*_as_pair(pred, true))
    return float(np.max(per_value))



def per_rank_mae(pred: ArrayLike, true: ArrayLike) -> dict[float, float]:
    """``{true value: MAE of the samples with that true value}`` for every distinct value of ``true``.

    Keys are in increasing order, plain Python ``int`` when every true value is integer-valued (ranks,
    integer labels) and ``float`` otherwise; values are ``float``. Ready for ``json.dumps``.
    """
    p, t = _as_pair(pred, true)
    values, per_value = _per_value_mae(p, t)
    key = int if np.all(values == np.round(values)) else float
    return {key(v): float(m) for v, m in zip(values, per_value)}


def ranked_probability_score(probs: ArrayLike, true: ArrayLike) -> float:
    """Ranked probability score of rank probabilities: lower is better, 0 for a sure right answer.

    ``RPS = mean_i sum_k (F_i(k) - [true_i <= k])^2``, with ``F_i(k) = sum_{j <= k} probs[i, j]`` the
    predicted cumulative distribution (Epstein, 1969; the unnormalized sum of Janitza et al., 2016, as
    dlordinal's ``ranked_probability_score``; divide by ``K - 1`` for the version in ``[0, 1]``). Unlike
    a log-loss it counts how far off the probability mass is: mass one rank off costs less than mass
    three ranks off.

    Args:
        probs: ``[N, K]`` probabilities of the ranks ``0 … K-1`` (finite, >= 0, each row summing to 1
            within 1e-3), e.g. :meth:`sol_ext.SOLHead.predict_proba`.
        true: ``[N]`` true integer ranks in ``0 … K-1``.

    Returns:
        the mean over the samples, a float in ``[0, K - 1]``.
    """
    p, t = _as_probabilities(probs, true)
    predicted = np.cumsum(p, axis=1)
    observed = (np.arange(p.shape[1])[None, :] >= t[:, None]).astype(np.float64)
    return float(np.mean(np.sum((predicted - observed) ** 2, axis=1)))



def reliability_curve(probs: ArrayLike, true: ArrayLike, bins: int = 15) -> dict[str, np.ndarray]:
    """The reliability diagram of rank probabilities: rows binned by the probability of their most
    probable rank (the confidence, ``bins`` equal-width bins of ``[0, 1]``), and in each bin the mean
    confidence, the fraction of rows whose most probable rank is the true one (the accuracy), and the
    number of rows. A calibrated model has accuracy = confidence in every bin.

    Args:
        probs, true: as :func:`ranked_probability_score`.
        bins: the number of bins (>= 1).

    Returns:
        ``{"confidence", "accuracy", "count"}``, arrays ``[bins]`` (NaN confidence and accuracy in an
        empty bin).
    """
    p, t = _as_probabilities(probs, true)
    bins = check.check_int("bins", bins, 1)
    confidence = p.max(axis=1)
    correct = (p.argmax(axis=1) == t).astype(np.float64)
    which = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.bincount(which, weights=confidence, minlength=bins) / count
        accuracy = np.bincount(which, weights=correct, minlength=bins) / count
    return {"confidence": mean_confidence, "accuracy": accuracy, "count": count}


def expected_calibration_error(probs: ArrayLike, true: ArrayLike, bins: int = 15) -> float:
    """The expected calibration error (Guo et al., 2017) of rank probabilities: the mean over the rows
    of ``|accuracy - confidence|`` of their bin of :func:`reliability_curve`, in ``[0, 1]``; 0 for a
    calibrated model."""
    curve = reliability_curve(probs, true, bins)
    filled = curve["count"] > 0
    gaps = np.abs(curve["accuracy"][filled] - curve["confidence"][filled])
    return float(np.sum(gaps * curve["count"][filled]) / np.sum(curve["count"]))


def _as_probabilities(probs: ArrayLike, true: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Rank probabilities ``[N, K]`` and true ranks ``[N]`` as float64 numpy arrays, checked."""
    if isinstance(probs, torch.Tensor):
        probs = probs.detach().to("cpu", torch.float64).numpy()
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 1:
        raise ValueError(f"probs must be a 2-D array [N, K] of rank probabilities, got shape {tuple(p.shape)}")
    t = _as_vector(true, "true")
    if t.shape[0] != p.shape[0]:
        raise ValueError(f"probs and true must have the same number of samples, got {p.shape[0]} and {t.shape[0]}")
    if t.size == 0:
        raise ValueError("metrics need at least one sample, got empty probs and true")
    _check_ranks(t, "true")
    if t.max() >= p.shape[1]:
        raise ValueError(f"true holds rank {int(t.max())}, outside the K = {p.shape[1]} columns of probs "
                         f"(ranks 0 … {p.shape[1] - 1})")
    bad_rows = ~np.all(np.isfinite(p) & (p >= 0), axis=1) | (np.abs(p.sum(axis=1) - 1.0) > 1e-3)
    if bad_rows.any():
        i = int(np.flatnonzero(bad_rows)[0])
        raise ValueError(f"probs must hold finite probabilities >= 0 whose rows sum to 1; row {i} is "
                         f"{p[i].tolist()} (pass a softmax, not logits)")
    return p, t


def summarize(pred: ArrayLike, true: ArrayLike, theta: float) -> dict[str, float]:
    """All scalar metrics at once: ``{"mae", "cs", "pearson", "spearman", "macro_mae", "qwk"}``.

    ``cs`` is CS@theta in percent. ``qwk`` is the quadratic weighted kappa computed on ``pred`` and
    ``true`` in their own units: the kappa is unchanged by a common shift and scale, so label values on
    one grid ``min + step * rank`` (decoded predicted ranks against decoded true ranks, as the driver
    passes them) give exactly the kappa of the ranks, with no step to pass. On predictions off the grid
    (e.g. decoded expected ranks) it is Lin's concordance correlation coefficient, the same formula.
    Per-rank MAE is not included, so that every value is one float for tables; see :func:`per_rank_mae`.
    """
    p, t = _as_pair(pred, true)
    return {
        "mae": mae(p, t),
        "cs": cumulative_score(p, t, theta),
        "pearson": pearson(p, t),
        "spearman": spearman(p, t),
        "macro_mae": macro_mae(p, t),
        "qwk": _quadratic_kappa(p, t),
    }
