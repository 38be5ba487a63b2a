"""Find the samples whose ordinal label looks wrong, from any model's class probabilities.

:func:`find_label_issues` has the shape of ``cleanlab.filter.find_label_issues(labels, pred_probs,
return_indices_ranked_by=...)``: integer labels ``0 … n-1`` and ``[N, n]`` probabilities ``p(q | x)`` in
(numpy or torch; any model, out-of-sample ones preferably), the indices of the suspect samples out,
most suspicious first. :func:`label_issue_scores` gives the score of every sample (one per row of an
audit table).

The score is ordinal. For a sample labeled ``r`` it is the probability mass that lies strictly on one
side of ``r``::

    score = max(sum_{q < r} p_q, sum_{q > r} p_q)

the probability that the true rank is below the label, or above it, whichever is larger. A sample is a
suspect when ``score >= min_score`` and the median of ``p`` is not ``r``. With ``min_score = 0.5`` (the
default) that is exactly "the model's median rank differs from the label" (the median condition only
matters at a tie of exactly 0.5 above ``r``, where the lower median is ``r`` itself); a larger
``min_score`` asks for more certainty. Ties in score go to the larger expected distance
``sum_q p_q |q - r|``, then to the smaller index.

How this differs from cleanlab: cleanlab scores a label by its self-confidence ``p[label]`` (or a
normalized margin) and flags it against per-class thresholds, i.e. it treats ranks as unordered
classes. On an ordinal scale a wide posterior puts little mass on any one rank, so ``p[label]`` is small
even for the right label. The one-sided mass of a label at the posterior's median stays below 1/2
however wide the posterior is, and a label one rank off reaches a high ``min_score`` only where the
posterior is narrow enough to be sure of it; the score nears 1 only when the model is sure the true rank
lies on the other side. A confident label three ranks off outranks one a rank off: more of the
posterior lies beyond it, and at equal scores the expected distance decides.

With a ``noise_kernel`` ``P[q, r]`` (the probability that a sample of true rank ``q`` is labeled ``r``,
e.g. :func:`sol_ext.centroids.label_noise_kernel`), ``p`` is first replaced by the posterior of the true
rank given the features and the label, ``p(q | x, r) ∝ p(q | x) P[q, r]``: the label is evidence too, so
a sample is a suspect only where the model outweighs it. This is the rule of
:func:`sol_ext.refine.posterior_relabel`, computed the same way: its ``flagged`` are these suspects at
``min_score = mass``, and its ``confidence`` is this score. Without a kernel the probabilities are used
as they are (the label is not evidence; cleanlab does the same).
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Union

import numpy as np
import torch

__all__ = ["find_label_issues", "label_issue_scores"]

ArrayLike = Any  # torch.Tensor | np.ndarray | nested lists

# How far a row of probabilities (or of the noise kernel) may sum from 1: float32 softmax outputs of a
# few thousand classes are off by ~1e-6; 1e-3 still catches logits, percentages and transposed kernels.
SUM_TOLERANCE = 1e-3
# Scores and distances that agree to this many decimals are ties when ranking.
TIE_DECIMALS = 12


def _as_float64(name: str, x: ArrayLike) -> torch.Tensor:
    """``x`` (torch, numpy or nested lists of real numbers) as a float64 CPU tensor; a ValueError naming
    ``name`` for anything else (text, ragged lists, complex numbers)."""
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise ValueError(f"{name} must hold real numbers, got a complex tensor ({x.dtype})")
        return x.detach().to("cpu", torch.float64)
    try:
        array = np.asarray(x)
        if array.dtype.kind == "c":
            raise TypeError(f"complex dtype {array.dtype}")
        return torch.as_tensor(array.astype(np.float64))
    except (TypeError, ValueError) as err:  # ValueError, as numpy's own conversion error was
        raise ValueError(f"{name} must be an array of real numbers (numpy, torch or nested lists), got "
                        f"{type(x).__name__}: {err}") from None


def _check_rows(name: str, a: torch.Tensor) -> None:
    """Rows of ``a`` [R, n] must be finite, non-negative and sum to 1 (a distribution each)."""
    bad = ~torch.isfinite(a).all(dim=1) | (a < 0).any(dim=1)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ValueError(f"{name} must hold finite, non-negative probabilities; row {i} is "
                         f"{a[i].tolist()[:8]}{' …' if a.shape[1] > 8 else ''}")
    sums = a.sum(dim=1)
    off = (sums - 1.0).abs() > SUM_TOLERANCE
    if bool(off.any()):
        i = int(torch.nonzero(off)[0])
        raise ValueError(f"every row of {name} must sum to 1 (within {SUM_TOLERANCE:g}); row {i} sums to "
                         f"{float(sums[i]):.6g}. Pass probabilities (a softmax), not logits or scores.")


def _validate(labels: ArrayLike, pred_probs: ArrayLike,
              noise_kernel: Optional[ArrayLike]) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """labels as int64 ``[N]``, pred_probs as float64 ``[N, n]`` and the kernel as float64 ``[n, n]``, on the CPU."""
    probs = _as_float64("pred_probs", pred_probs)
    if probs.dim() != 2 or probs.shape[1] < 1:
        raise ValueError(f"pred_probs must be a 2-D array [N, n] of rank probabilities, got shape "
                         f"{tuple(probs.shape)}")
    n = probs.shape[1]
    lab = _as_float64("labels", labels)
    if lab.dim() == 2 and lab.shape[1] == 1:
        lab = lab[:, 0]
    if lab.dim() != 1 or lab.shape[0] != probs.shape[0]:
        raise ValueError(f"labels must be a 1-D vector [N] with one label per row of pred_probs "
                         f"(N = {probs.shape[0]}), got shape {tuple(lab.shape)}")
    off = ~torch.isfinite(lab) | (lab != torch.round(lab)) | (lab < 0) | (lab > n - 1)
    if bool(off.any()):
        i = int(torch.nonzero(off)[0])
        raise ValueError(f"labels must be integer ranks in 0 … n-1 = 0 … {n - 1} (n = pred_probs.shape[1]), "
                         f"got {float(lab[i]):g} at index {i}")
    _check_rows("pred_probs", probs)
    kernel = None
    if noise_kernel is not None:
        kernel = _as_float64("noise_kernel", noise_kernel)
        if tuple(kernel.shape) != (n, n):
            raise ValueError(f"noise_kernel must be [n, n] = [{n}, {n}] (n = pred_probs.shape[1]), got shape "
                             f"{tuple(kernel.shape)}")
        # Row q is the distribution of the label given true rank q.
        _check_rows("noise_kernel", kernel)
    return lab.long(), probs, kernel


def _posterior(labels: torch.Tensor, probs: torch.Tensor, kernel: Optional[torch.Tensor]) -> torch.Tensor:
    """``[N, n]`` float64 distribution of the true rank: ``p(q | x, r)`` with a kernel, else ``p(q | x)``."""
    tiny = torch.finfo(torch.float64).tiny
    if kernel is None:
        # Renormalize: rows are only within SUM_TOLERANCE of 1, and the median compares against 1/2.
        return probs / probs.sum(dim=1, keepdim=True).clamp_min(tiny)
    joint = probs * kernel[:, labels].T          # p(q | x) P[q, r_x], [N, n], as in posterior_relabel
    total = joint.sum(dim=1, keepdim=True)
    post = joint / total.clamp_min(tiny)
    # A label that the kernel rules out for every rank the model allows (P[q, r] underflows to 0 far
    # from r) leaves no posterior; the model's own p(q | x) then says on which side the truth is.
    # (sol_ext.refine.posterior_relabel falls back to p(q | x) there too.)
    return torch.where(total > 0, post, probs / probs.sum(dim=1, keepdim=True).clamp_min(tiny))


def _one_sided(labels: torch.Tensor, post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mass strictly below and strictly above each label ``[N]``, and the (lower) median rank ``[N]``.

    The same operations as :func:`sol_ext.refine.posterior_relabel`, so that the two agree bit for bit.
    """
    n = post.shape[1]
    cum = post.cumsum(dim=1)
    rows = torch.arange(labels.numel())
    below = torch.where(labels > 0, cum[rows, (labels - 1).clamp(min=0)], torch.zeros_like(cum[:, 0]))
    above = 1.0 - cum[rows, labels]
    median = (cum < 0.5).sum(dim=1).clamp(max=n - 1)
    return below, above, median


def _scores(labels: torch.Tensor, post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    below, above, median = _one_sided(labels, post)
    # 1 - cum can land an ulp outside [0, 1] where a row's sum rounds off 1.
    return torch.maximum(below, above).clamp(0.0, 1.0), median


def label_issue_scores(labels: ArrayLike, pred_probs: ArrayLike,
                       noise_kernel: Optional[ArrayLike] = None) -> np.ndarray:
    """The ordinal label-issue score of every sample (see the module docstring).

    Args:
        labels: ``[N]`` given integer ranks in ``0 … n-1`` (numpy, torch or a list; integer-valued floats
            are accepted).
        pred_probs: ``[N, n]`` ``p(q | x)`` from any model: finite, non-negative, each row summing to 1
            within 1e-3.
        noise_kernel: optional ``[n, n]`` ``P[q, r]``, rows summing to 1; turns ``pred_probs`` into the
            posterior ``p(q | x, r)`` first.

    Returns:
        ``[N]`` float64 in ``[0, 1]``: the posterior mass strictly on the more likely side of each label
        (0: the model is sure the label is right; near 1: sure it is wrong).
    """
    lab, probs, kernel = _validate(labels, pred_probs, noise_kernel)
    score, _ = _scores(lab, _posterior(lab, probs, kernel))
    return score.numpy()


def find_label_issues(labels: ArrayLike, pred_probs: ArrayLike, *, noise_kernel: Optional[ArrayLike] = None,
                      min_score: float = 0.5,
                      return_scores: bool = True) -> Union[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Indices of the samples whose label looks wrong, most suspicious first.

    Args:
        labels: ``[N]`` given integer ranks in ``0 … n-1``.
        pred_probs: ``[N, n]`` ``p(q | x)`` from any model (numpy or torch; rows non-negative, summing to 1
            within 1e-3). Out-of-sample probabilities (cross-validation) find more: a model that
            has fitted a wrong label agrees with it.
        noise_kernel: optional ``[n, n]`` label-noise model ``P[q, r]`` (rows summing to 1), as in
            :func:`sol_ext.refine.posterior_relabel`.
        min_score: in ``[0.5, 1)``: how much probability must lie strictly on one side of the label.
            0.5 flags every label that is not the median rank; below 0.5 both sides could qualify.
        return_scores: also return the flagged samples' scores.

    Returns:
        ``indices`` (int64 ``[M]``) of the flagged samples, by decreasing score, then decreasing expected
        distance ``sum_q p_q |q - r|`` to the label (both compared to 12 decimals, so that rounding
        error does not break exact ties), then increasing index; with ``return_scores``,
        ``(indices, scores)`` with ``scores`` the float64 ``[M]`` scores in the same order.
    """
    if isinstance(min_score, (bool, np.bool_)) or not isinstance(min_score, numbers.Real) \
            or not 0.5 <= min_score < 1.0:
        raise ValueError(f"min_score must be a number in [0.5, 1), got {min_score!r}; below 0.5 the mass on "
                         f"both sides of a label could reach it")
    if not isinstance(return_scores, (bool, np.bool_)):
        raise TypeError(f"return_scores must be True or False, got {return_scores!r}")
    lab, probs, kernel = _validate(labels, pred_probs, noise_kernel)
    post = _posterior(lab, probs, kernel)
    score, median = _scores(lab, post)
    flagged = (score >= min_score) & (median != lab)
    distance = (post * (torch.arange(post.shape[1], dtype=torch.float64)[None, :]
                        - lab[:, None].to(torch.float64)).abs()).sum(dim=1)
    idx = np.flatnonzero(flagged.numpy())
    # Sort keys rounded to TIE_DECIMALS: a tie in exact arithmetic (e.g. 1 - 0.35 above one label and
    # 0.65 below another) should not be decided by rounding error. lexsort sorts by the last key first
    # and is stable, so equal (score, distance) keep index order.
    s = np.round(score.numpy()[idx], TIE_DECIMALS)
    d = np.round(distance.numpy()[idx], TIE_DECIMALS)
    order = idx[np.lexsort((-d, -s))].astype(np.int64)
    if return_scores:
        return order, score.numpy()[order]
    return order
