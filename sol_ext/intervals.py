"""Rank intervals with a coverage guarantee: split conformal prediction on rank probabilities.

A model's rank probabilities ``p [N, n]`` become contiguous rank intervals ``[lower, upper]`` that hold
the label with a requested probability (the coverage), calibrated on data the model did not train on
(docs/intervals.md). Split conformal: each calibration row gets a nonconformity score ``s(x, y)``, an
interval is every rank whose score is at most a threshold, and the threshold is the
``ceil((M + 1) * coverage)``-th smallest of the ``M`` calibration scores, which guarantees the coverage
on new rows drawn as the calibration rows were (exchangeable), whatever the model.

Three scores, each giving nested contiguous intervals:

- ``"hpd"``: the highest-posterior contiguous set (COPOC-style). From the most probable rank the set
  grows one rank at a time towards the more probable neighbour; a rank's score is the probability mass
  of the first set that holds it.
- ``"cumulative"``: central intervals of the cumulative distribution ``F`` (median-centred, as the
  ranked probability score reads ``F``): a rank's score is ``max(1 - 2 F(y), 2 F(y - 1) - 1)``.
- ``"absolute"``: the distance ``|y - E[rank]|`` to the expected rank.

Clean-rank target: labels that are themselves noisy make the guarantee about the *noisy* label. With the
label noise known (``label_noise``: the std of a discrete Gaussian on the ranks, SOL's noise model, or a
matrix ``L [n, n]`` whose row ``c`` is the distribution of a label given clean rank ``c``), the
calibration weighs every rank ``c`` of a calibration row by the clean-rank posterior
``q(c) ∝ π(c | x) L[c, y]`` instead of counting the label alone. ``π`` is the model's distribution of the
clean rank. A model trained on noisy labels may learn anything between the clean rank's distribution and
the noisy label's (``p = π L``), so by default (``deconvolve=True``) ``π`` is fitted: Richardson–Lucy
iterations (a multiplicative fixed-point iteration that keeps every iterate a distribution) deconvolve
``p`` through ``L`` starting from ``p`` itself, and the iterate kept is the one under which the
calibration rows' noisy labels are most likely, ``mean log (π L)[i, y_i]`` (maximum likelihood over the
iterations): no iteration when ``p`` already reads as the clean rank's, many when ``p`` is the noisy
labels'. Where that likelihood is flat, the iteration it picks varies from one calibration set to the
next, and so does the coverage. ``deconvolve=False`` takes ``π = p`` as it is. With the noise as given
and ``π`` right, the intervals cover the clean rank at the requested rate in expectation; on real models
``π`` is an estimate, which benchmarks/bench_intervals.py measures (docs/intervals.md).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Union

import torch

from . import _validation as check
from .ops import noise_kernel

__all__ = ["SCORES", "DEFAULT_SCORE", "TARGETS", "IntervalCalibration", "CalibrationSizeWarning",
           "calibrate_intervals", "minimum_calibration_rows", "nonconformity_scores", "rank_intervals",
           "intervals_at", "fitted_deconvolution", "noise_std_from_pairs"]

SCORES = ("hpd", "cumulative", "absolute")
# The narrowest intervals at the coverage asked in benchmarks/bench_intervals.py: on 13 of its 18 cells and
# coverages (the real VADER ratings among them), where "hpd" was narrowest on 2 (docs/intervals.md)
DEFAULT_SCORE = "cumulative"
TARGETS = ("labels", "clean")
# The clean-rank deconvolution looks for the best fit among up to this many Richardson–Lucy iterations,
# and stops early once the calibration labels' likelihood has not grown for DECONVOLUTION_PATIENCE of them
# (it rises, then falls or levels off).
MAX_DECONVOLUTION_ITERATIONS = 500
DECONVOLUTION_PATIENCE = 50

LabelNoise = Union[float, torch.Tensor, None]


class CalibrationSizeWarning(UserWarning):
    """Too few calibration rows for the coverage asked: every interval is then the whole scale."""


def minimum_calibration_rows(coverage: float) -> int:
    """The fewest calibration rows that can calibrate ``coverage``: the conformal threshold is the
    ``ceil((M + 1) * coverage)``-th smallest of ``M`` scores, which exists once ``M >= coverage /
    (1 - coverage)`` (9 rows for 0.9, 19 for 0.95)."""
    coverage = _check_coverage(coverage)
    return math.ceil(round(coverage / (1 - coverage), 9))  # 0.9 / 0.1 is 9.000000000000002


# --------------------------------------------------------------------------------------------------
# Scores: s[i, k] for every rank k of every row (smaller = more conforming)


def _hpd_scores(p: torch.Tensor) -> torch.Tensor:
    """The mass of the first growing set (from the mode, towards the more probable neighbour) that
    holds each rank; ties go left."""
    rows, n = p.shape
    index = torch.arange(rows, device=p.device)
    lo = hi = p.argmax(dim=1)
    scores = torch.empty_like(p)
    mass = p[index, lo]
    scores[index, lo] = mass
    for _ in range(n - 1):
        left = torch.where(lo > 0, p[index, (lo - 1).clamp(min=0)], p.new_full((rows,), -1.0))
        right = torch.where(hi < n - 1, p[index, (hi + 1).clamp(max=n - 1)], p.new_full((rows,), -1.0))
        go_left = left >= right
        lo = torch.where(go_left, lo - 1, lo)
        hi = torch.where(go_left, hi, hi + 1)
        added = torch.where(go_left, lo, hi)
        mass = mass + p[index, added]
        scores[index, added] = mass
    return scores


def _cumulative_scores(p: torch.Tensor) -> torch.Tensor:
    upto = p.cumsum(dim=1)  # F(k)
    below = upto - p  # F(k - 1)
    return torch.maximum(1 - 2 * upto, 2 * below - 1).clamp(min=0)


def _absolute_scores(p: torch.Tensor) -> torch.Tensor:
    ranks = torch.arange(p.shape[1], dtype=p.dtype, device=p.device)
    expected = p @ ranks
    return (ranks[None, :] - expected[:, None]).abs()


_SCORE_FUNCTIONS = {"hpd": _hpd_scores, "cumulative": _cumulative_scores, "absolute": _absolute_scores}


def nonconformity_scores(probabilities: torch.Tensor, score: str = DEFAULT_SCORE) -> torch.Tensor:
    """``[N, n]`` float64: the nonconformity score of every rank of every row of ``probabilities
    [N, n]`` (rows summing to 1); an interval at threshold ``t`` is the ranks whose score is ``<= t``,
    always contiguous."""
    score = check.check_choice("score", score, SCORES)
    return _SCORE_FUNCTIONS[score](_checked_probabilities(probabilities))


# --------------------------------------------------------------------------------------------------
# Calibration


@dataclass(frozen=True)
class IntervalCalibration:
    """What prediction needs of a calibration set: its scores, sorted, with the cumulative weight of
    each (1 a row for the labels target; the clean-rank posterior's mass for the clean target), the
    number of calibration rows ``count``, and the number of ranks ``num_ranks`` of the probabilities
    it was made on (:func:`rank_intervals` refuses others). Any coverage is read from it at
    prediction time."""

    score: str
    target: str
    scores: torch.Tensor  # [M] float64, ascending
    cumulative_weights: torch.Tensor  # [M] float64, ascending, the last = count
    count: int
    num_ranks: int

    def threshold(self, coverage: float) -> float:
        """The conformal threshold: the smallest score ``t`` whose calibration weight at or below it
        reaches ``coverage * (count + 1)``; ``inf``, every rank, when no score does, with a
        :class:`CalibrationSizeWarning` (fewer rows than :func:`minimum_calibration_rows`)."""
        coverage = _check_coverage(coverage)
        needed = coverage * (self.count + 1)
        if needed > self.count * (1 + 1e-12):
            # warned from this line whichever path asks, so that Python (and sol-ext) say it once
            warnings.warn(f"coverage={coverage:g}: {self.count} calibration row{'s' if self.count != 1 else ''} "
                          f"cannot calibrate {coverage:.0%} (it needs at least "
                          f"{minimum_calibration_rows(coverage)}); every interval is the whole scale: calibrate "
                          f"on more held-out rows.", CalibrationSizeWarning, stacklevel=1)
            return math.inf
        k = int(torch.searchsorted(self.cumulative_weights, torch.tensor([needed * (1 - 1e-12)],
                                                                        dtype=torch.float64)))
        return float(self.scores[min(k, self.scores.numel() - 1)])

    def to_state(self) -> dict[str, Any]:
        """A state of tensors and plain values (``torch.save``, ``weights_only=True``)."""
        return {"score": self.score, "target": self.target, "scores": self.scores,
                "cumulative_weights": self.cumulative_weights, "count": self.count, "num_ranks": self.num_ranks}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "IntervalCalibration":
        return cls(score=check.check_choice("score", state["score"], SCORES),
                   target=check.check_choice("target", state["target"], TARGETS),
                   scores=state["scores"].to(torch.float64).cpu(),
                   cumulative_weights=state["cumulative_weights"].to(torch.float64).cpu(),
                   count=int(state["count"]), num_ranks=int(state["num_ranks"]))


def calibrate_intervals(probabilities: torch.Tensor, ranks: torch.Tensor, *, score: str = DEFAULT_SCORE,
                        target: str = "labels", label_noise: LabelNoise = None,
                        deconvolve: bool = True) -> IntervalCalibration:
    """Calibrate rank intervals on held-out rows: ``probabilities [M, n]`` of a model that did not
    train on them, and their labels as ranks ``[M]`` in ``0 … n-1``.

    ``target="clean"`` aims the coverage at the clean rank behind noisy labels and needs
    ``label_noise``; by default (``deconvolve=True``) the clean rank's distribution is the model's
    probabilities deconvolved through the noise as far as the calibration labels say (module
    docstring), ``deconvolve=False`` takes the probabilities as the clean rank's.
    ``target="labels"`` covers the labels as given.
    """
    p = _checked_probabilities(probabilities)
    score = check.check_choice("score", score, SCORES)
    target = check.check_choice("target", target, TARGETS)
    n = p.shape[1]
    ranks = check.check_ranks("ranks", torch.as_tensor(ranks, device=p.device), n, length=p.shape[0])
    if p.shape[0] == 0:
        raise ValueError("probabilities: no calibration rows; calibrate on at least one held-out row")
    all_scores = _SCORE_FUNCTIONS[score](p)
    if target == "labels":
        if label_noise is not None:
            raise ValueError("label_noise applies to target='clean' only; leave it out for target='labels'")
        scores = all_scores.gather(1, ranks[:, None].long())[:, 0]
        weights = torch.ones_like(scores)
    else:
        if not isinstance(deconvolve, bool):
            raise TypeError(f"deconvolve must be True or False, got {deconvolve!r}")
        likelihood = _label_likelihood(label_noise, n).to(p.device)
        clean = _fitted_deconvolution(p, likelihood, ranks)[0] if deconvolve else p
        posterior = clean * likelihood[:, ranks.long()].T  # q(c) ∝ π(c | x) L[c, y]
        total = posterior.sum(dim=1, keepdim=True)
        if bool((total <= 0).any()):
            i = int((total[:, 0] <= 0).nonzero()[0])
            raise ValueError(f"row {i}: the model gives no probability to any clean rank that could give its "
                             f"label {int(ranks[i])} under label_noise; the noise given is too narrow")
        scores, weights = all_scores.flatten(), (posterior / total).flatten()
    order = torch.argsort(scores, stable=True)
    return IntervalCalibration(score=score, target=target, scores=scores[order].cpu(),
                               cumulative_weights=weights[order].cumsum(0).cpu(), count=int(p.shape[0]),
                               num_ranks=n)


def fitted_deconvolution(probabilities: torch.Tensor, ranks: torch.Tensor,
                         label_noise: LabelNoise) -> tuple[torch.Tensor, int]:
    """``(π [M, n] float64, iterations)``: the clean rank's distribution that ``target="clean"``
    calibrates with, from a model's ``probabilities [M, n]`` on rows with noisy labels ``ranks [M]``
    and the labels' noise (``label_noise`` as :func:`calibrate_intervals`). Richardson–Lucy
    iterations deconvolve the probabilities through the noise ``L``, starting from them, and stop at
    the iteration (0 … at most :data:`MAX_DECONVOLUTION_ITERATIONS`) under which the labels are most
    likely, ``mean log (π L)[i, ranks_i]``. Every row of ``π`` is non-negative and sums to 1; a rank
    the probabilities give 0 keeps 0 (each iteration multiplies)."""
    p = _checked_probabilities(probabilities)
    ranks = check.check_ranks("ranks", torch.as_tensor(ranks, device=p.device), p.shape[1], length=p.shape[0])
    if p.shape[0] == 0:
        raise ValueError("probabilities: no rows; deconvolve the probabilities of at least one labelled row")
    return _fitted_deconvolution(p, _label_likelihood(label_noise, p.shape[1]).to(p.device), ranks)


def _fitted_deconvolution(p: torch.Tensor, likelihood: torch.Tensor,
                          ranks: torch.Tensor) -> tuple[torch.Tensor, int]:
    """:func:`fitted_deconvolution` of checked float64 ``p [M, n]``, the noise's ``likelihood [n, n]``
    and the labels' ranks ``[M]``."""
    rows = torch.arange(p.shape[0], device=p.device)
    ranks = ranks.long()

    def label_log_likelihood(blurred: torch.Tensor) -> float:  # blurred = π L, the labels' distribution
        return float(blurred[rows, ranks].clamp_min(1e-300).log().mean())

    p = p / p.sum(dim=1, keepdim=True)  # rows summing to 1 within rounding, exactly
    clean, blurred = p, p @ likelihood
    best, best_fit, best_iterations = p, label_log_likelihood(blurred), 0
    for iteration in range(1, MAX_DECONVOLUTION_ITERATIONS + 1):
        clean = clean * ((p / blurred.clamp_min(1e-300)) @ likelihood.T)
        clean = clean / clean.sum(dim=1, keepdim=True)
        blurred = clean @ likelihood
        fit = label_log_likelihood(blurred)
        if fit > best_fit:
            best, best_fit, best_iterations = clean, fit, iteration
        elif iteration - best_iterations >= DECONVOLUTION_PATIENCE:
            break
    return best, best_iterations


def rank_intervals(probabilities: torch.Tensor, calibration: IntervalCalibration,
                   coverage: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lower, upper)`` int64 ranks ``[N]``: the contiguous interval of each row of ``probabilities
    [N, n]`` at ``coverage``, by the calibration's score and threshold. An interval is never empty:
    where no rank scores under the threshold (``"absolute"`` at small thresholds) it is the rank
    nearest the expected rank."""
    if not isinstance(calibration, IntervalCalibration):
        raise TypeError(f"calibration must be an IntervalCalibration (calibrate_intervals), got "
                        f"{type(calibration).__name__}")
    p = _checked_probabilities(probabilities)
    if p.shape[1] != calibration.num_ranks:
        raise ValueError(f"probabilities have {p.shape[1]} ranks, but the calibration was made on "
                         f"{calibration.num_ranks}; calibrate on held-out probabilities of the model that "
                         f"gives these")
    return intervals_at(p, calibration.score, calibration.threshold(coverage))


def intervals_at(p: torch.Tensor, score: str, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rank_intervals` of checked float64 probabilities at a given threshold: plain torch
    operations without data-dependent branches, so that an exported program can hold it."""
    inside = _SCORE_FUNCTIONS[score](p) <= threshold
    n = p.shape[1]
    ranks = torch.arange(n, device=p.device)
    fallback = _absolute_scores(p).argmin(dim=1)
    lower = torch.where(inside, ranks, n).min(dim=1).values
    upper = torch.where(inside, ranks, -1).max(dim=1).values
    empty = upper < 0
    return torch.where(empty, fallback, lower), torch.where(empty, fallback, upper)


def noise_std_from_pairs(first: Any, second: Any) -> float:
    """The std of the labels' noise, from items labelled twice: ``first [K]`` and ``second [K]`` are two
    labels of the same ``K`` items, given independently (two raters, two readings). With each label the
    clean value plus its own zero-mean noise of std ``s``, ``first - second`` has mean square ``2 s^2``;
    the estimate is ``sqrt(mean((first - second)^2) / 2)``, in the labels' units: what a run's
    ``calibrate_intervals(..., label_noise=)`` and ``sol-ext predict``/``export --label-noise`` take
    (:func:`calibrate_intervals` takes ranks: divide by the grid's step). A rater's constant bias
    counts as noise too (the mean square keeps it); labels that are not independent (one rater twice)
    make the estimate too small."""
    labels = []
    for name, values in (("first", first), ("second", second)):
        if isinstance(values, torch.Tensor):
            values = values.detach().cpu()
        try:
            array = torch.as_tensor(values, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{name} must be numbers, one label per item, got {type(values).__name__}") from error
        if array.dim() != 1:
            raise ValueError(f"{name} must be 1-D, one label per item, got shape {tuple(array.shape)}")
        if not bool(torch.isfinite(array).all()):
            raise ValueError(f"{name}: every label must be a finite number (no NaN or inf)")
        labels.append(array)
    if labels[0].numel() != labels[1].numel():
        raise ValueError(f"first and second must label the same items: got {labels[0].numel()} and "
                         f"{labels[1].numel()} labels")
    if labels[0].numel() < 2:
        raise ValueError(f"first and second: at least 2 items labelled twice are needed, got {labels[0].numel()}")
    return math.sqrt(float((labels[0] - labels[1]).square().mean()) / 2)


# --------------------------------------------------------------------------------------------------
# Checks


def _check_coverage(coverage: Any) -> float:
    # any real number, numpy's float32 among them
    if not check._is_real(coverage) or not 0 < float(coverage) < 1:
        raise ValueError(f"coverage must be a probability strictly between 0 and 1 (e.g. 0.9), got {coverage!r}")
    return float(coverage)


def _checked_probabilities(probabilities: Any) -> torch.Tensor:
    if not isinstance(probabilities, torch.Tensor):
        raise TypeError(f"probabilities must be a torch.Tensor [N, n] of rank probabilities, got "
                        f"{type(probabilities).__name__}")
    if probabilities.dim() != 2 or probabilities.shape[1] < 1:
        raise ValueError(f"probabilities must be [N, n] (one row of rank probabilities per sample), got "
                         f"{tuple(probabilities.shape)}")
    p = probabilities.detach().to(torch.float64)
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any()):
        raise ValueError("probabilities must be finite and non-negative")
    if p.shape[0] and not torch.allclose(p.sum(dim=1), torch.ones((), dtype=torch.float64), atol=1e-4):
        raise ValueError("probabilities: every row must sum to 1 (rank probabilities, e.g. predict_proba)")
    return p


def _label_likelihood(label_noise: LabelNoise, n: int) -> torch.Tensor:
    """``L [n, n]``: row ``c`` the distribution of a label given clean rank ``c``."""
    if label_noise is None:
        raise ValueError("label_noise is needed (target='clean'): the std of the labels' noise in ranks (SOL's "
                         "sigma), or a matrix [n, n] whose row c is the distribution of a label given clean rank c")
    if isinstance(label_noise, torch.Tensor) and label_noise.dim() == 0:
        label_noise = label_noise.item()  # a std held in a tensor
    if isinstance(label_noise, torch.Tensor):
        if label_noise.shape != (n, n):
            raise ValueError(f"label_noise must be a number (the noise std in ranks) or a matrix [n, n] = "
                             f"[{n}, {n}], got a tensor of shape {tuple(label_noise.shape)}")
        likelihood = label_noise.detach().to(torch.float64).cpu()
        if (not bool(torch.isfinite(likelihood).all()) or bool((likelihood < 0).any())
                or not torch.allclose(likelihood.sum(dim=1), torch.ones((), dtype=torch.float64), atol=1e-6)):
            raise ValueError("label_noise as a matrix must hold finite non-negative rows that sum to 1")
        return likelihood
    if isinstance(label_noise, (int, float)) and not isinstance(label_noise, bool) and label_noise == 0:
        # e.g. noise_std_from_pairs of two labellings that agree on every item
        raise ValueError("label_noise=0: with no noise in the labels the clean rank is the label; calibrate "
                         "with target='labels' (the default), or give the noise's std (> 0)")
    sigma = check.check_positive_float("label_noise", label_noise)
    # SOL's discrete Gaussian: the kernel is symmetric in form, row c normalized over the labels
    return noise_kernel(n, sigma)
