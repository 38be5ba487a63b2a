"""Find the samples whose ordinal label looks wrong, from any model's class probabilities.

:func:`find_label_issues` has the shape of ``cleanlab.filter.find_label_issues(labels, pred_probs,
filter_by=..., return_indices_ranked_by=...)``: integer labels ``0 … n-1`` and ``[N, n]`` probabilities
``p(q | x)`` in (numpy or torch; any model, out-of-sample ones preferably), a boolean mask of the suspect
samples out, or their indices, most suspicious first. :func:`get_label_quality_scores` gives every
sample's quality (higher = more likely correct), :func:`label_issue_scores` its ordinal score.

The score is ordinal. For a sample labeled ``r`` it is the probability mass that lies strictly on one
side of ``r``::

    score = max(sum_{q < r} p_q, sum_{q > r} p_q)

the probability that the true rank is below the label, or above it, whichever is larger: what the
flag rules threshold. The quality, which ranks the labels, is the mean of ``1 - score`` (the tail of
``p`` from the label outward, label included) and cleanlab's self-confidence ``p_r``::

    quality = (1 - score + p_r) / 2 = p_r + min(sum_{q < r} p_q, sum_{q > r} p_q) / 2

Of two labels equally far in the tail, the one the model gives less probability to is the more
suspect. On the noisy labels of benchmarks/bench_label_issues.py it ranked wrong labels above right
ones at least as well as ``p_r`` alone on 10 of 14 cells and within the spread over seeds on three; it
ranked them worse where an annotator's error grows with the rank (62 ranks), since ``p_r`` is small
wherever ``p`` is wide, and the wrong labels are where ``p`` is widest (docs/label-issues.md).
Ties in quality go to the larger expected distance ``sum_q p_q |q - r|``, then to the smaller index.

Which samples are flagged (``filter_by``). The default flags a label only where it is implausible
even if all the spread of ``p`` were the features' own: at least ``DEFAULT_MIN_SCORE = 0.9975`` of the
probability lies strictly on one side of it (``"min_score"``), i.e. the label sits in a tail of ``p``
that holds at most 0.25 %. A correct label is a draw from ``p`` when ``p`` is calibrated (out-of-sample
probabilities of a fitted model are, for the labels they were fitted to), and such a draw lands in
one of the two tails at most 0.5 % of the time: the default's false-flag budget. Why not more: from
``(labels, pred_probs)`` alone, a label moved by noise and one that the features do not pin down
look alike. A model trained on noisy labels learns the noisy labels' spread, so its probabilities
are calibrated for them too: labels the features predict loosely (an abalone's age from its shell)
give the same probabilities as labels the features predict well plus added noise. A noise level you
know (``noise_kernel``) settles it; without one, only labels beyond the model's own tails are
flagged: few false flags, and, where the noise is dense, low recall.

``"min_score"`` with another ``min_score`` flags a sample when ``score >= min_score`` and ``r`` is not
a median of ``p``; at ``min_score = 0.5`` that is exactly "the label is not a median rank of the
model" (``"predicted_neq_given"``). A label is a median when at most half of the mass lies on either
side of it, so where the cumulative mass reaches exactly 0.5 at one rank (a 0.5/0.5 row of two ranks)
both that rank and the next are medians and neither is flagged, as cleanlab flags no label at a tied
argmax. ``"prune_by_class"`` takes per-rank thresholds from
the data, as confident learning does (Northcutt et al., 2021): the confident joint counts how many
samples of each given rank the model confidently puts at another rank
(:func:`confident_joint_counts`), and each rank flags that many of its samples, those of largest
score; on an ordinal scale with wide posteriors that count is large (most of a data set whose
labels the features predict loosely). No rule flags a label at the median.

How this differs from cleanlab: cleanlab scores a label by its self-confidence ``p[label]`` (or a
normalized margin) and flags it against per-class thresholds, i.e. it treats ranks as unordered
classes. On an ordinal scale a wide posterior puts little mass on any one rank, so ``p[label]`` is small
even for the right label. The one-sided mass of a label at the posterior's median stays below 1/2
however wide the posterior is, and a label one rank off reaches a high ``min_score`` only where the
posterior is narrow enough to be sure of it; the score nears 1 only when the model is sure the true rank
lies on the other side. A confident label three ranks off outranks one a rank off: more of the
posterior lies beyond it, and at equal scores the expected distance decides.

With a ``noise_kernel`` ``P[q, r]`` (the probability that a sample of true rank ``q`` is labeled ``r``,
e.g. :func:`sol_ext.refine.label_noise_kernel`), ``p`` is first replaced by the posterior of the true
rank given the features and the label, ``p(q | x, r) ∝ p(q | x) P[q, r]``: the label is evidence too, so
a sample is a suspect only where the model outweighs it, and with a kernel the default rule is
``"predicted_neq_given"`` on that posterior. This is the rule of
:func:`sol_ext.refine.posterior_relabel`, computed the same way: its ``flagged`` are the
``"min_score"`` suspects at ``min_score = mass`` (but for an exact tie at ``mass = 0.5``, where it moves
a label at the upper of two medians to the lower one), and its ``confidence`` is this score. Without a kernel the probabilities are used
as they are (the label is not evidence; cleanlab does the same).
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["find_label_issues", "get_label_quality_scores", "label_issue_scores", "confident_joint_counts",
           "sharpen_through_noise"]

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


def _scores(labels: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    below, above, _ = _one_sided(labels, post)
    # 1 - cum can land an ulp outside [0, 1] where a row's sum rounds off 1.
    return torch.maximum(below, above).clamp(0.0, 1.0)


def label_issue_scores(labels: ArrayLike, pred_probs: ArrayLike,
                       noise_kernel: Optional[ArrayLike] = None) -> np.ndarray:
    """The ordinal label-issue score of every sample (see the module docstring): the mass strictly on
    one side of the label, which the flag rules threshold (``min_score``).

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
    score = _scores(lab, _posterior(lab, probs, kernel))
    return score.numpy()


def get_label_quality_scores(labels: ArrayLike, pred_probs: ArrayLike, *,
                             noise_kernel: Optional[ArrayLike] = None) -> np.ndarray:
    """``[N]`` float64 quality of each label in ``[0, 1]``, higher = more likely correct (cleanlab's
    ``cleanlab.rank.get_label_quality_scores``): ``p[label] + min(mass below, mass above) / 2``, the
    mean of ``p[label]`` and ``1 -`` :func:`label_issue_scores` (see the module docstring).

    With two ranks this is cleanlab's default ``self_confidence`` ``p[label]``. Arguments as
    :func:`label_issue_scores`.
    """
    lab, probs, kernel = _validate(labels, pred_probs, noise_kernel)
    return _quality(lab, _posterior(lab, probs, kernel)).numpy()


def _quality(labels: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """``[N]`` quality of each label under ``post`` ``[N, n]``."""
    below, above, _ = _one_sided(labels, post)
    own = post[torch.arange(labels.numel()), labels]
    return (own + 0.5 * torch.minimum(below, above).clamp_min(0.0)).clamp(0.0, 1.0)


# Temperatures tried by sharpen_through_noise: 1 (as given) down to 1/20, evenly in log.
SHARPEN_TEMPERATURES = tuple(float(t) for t in np.geomspace(1.0, 0.05, 40))


def sharpen_through_noise(labels: ArrayLike, pred_probs: ArrayLike, noise_kernel: ArrayLike) -> np.ndarray:
    """``[N, n]`` float64 ``p(q | x)`` of the true rank, from a model's ``p(label | x)`` and a known noise.

    Out-of-sample probabilities of a model trained on noisy labels describe the noisy label: they are
    about as wide as the true rank's spread and the noise together. Through the noise kernel ``P``
    (rows ``q``: the law of the label given true rank ``q``) the true rank's own distribution is
    sharper; this returns ``p(q | x) ** (1 / T)``, renormalized, with ``T`` in ``(0, 1]`` maximizing
    the likelihood of the given labels ``sum_x log sum_q p_T(q | x) P[q, r_x]`` (the training run's
    rank posterior is fitted through the noise the same way, :func:`sol_ext.readout.fit_rank_posterior`).
    Pass the result with the same ``noise_kernel`` to :func:`find_label_issues`, as ``sol-ext audit
    --label-noise STD`` does: without it the posterior counts the noise twice, and flags few labels.

    Args:
        labels: ``[N]`` given integer ranks in ``0 … n-1``.
        pred_probs: ``[N, n]`` ``p(label | x)`` (rows summing to 1 within 1e-3).
        noise_kernel: ``[n, n]`` ``P[q, r]``, rows summing to 1 (e.g.
            :func:`sol_ext.refine.label_noise_kernel`).
    """
    if noise_kernel is None:
        raise ValueError("noise_kernel must be an [n, n] label-noise model P[q, r] (e.g. "
                         "sol_ext.refine.label_noise_kernel(n, std)), got None: sharpening needs the noise")
    lab, probs, kernel = _validate(labels, pred_probs, noise_kernel)
    log_p = torch.log(probs.clamp_min(torch.finfo(torch.float64).tiny))
    log_p = log_p - log_p.max(dim=1, keepdim=True).values
    of_label = kernel[:, lab].T                      # P[q, r_x], [N, n]
    best, best_ll = probs, -float("inf")
    for t in SHARPEN_TEMPERATURES:
        p_t = torch.softmax(log_p / t, dim=1)
        ll = float(torch.log((p_t * of_label).sum(dim=1).clamp_min(torch.finfo(torch.float64).tiny)).mean()) \
            if lab.numel() else 0.0
        if ll > best_ll:  # ties keep the larger temperature: the probabilities as given
            best, best_ll = p_t, ll
    return best.numpy()


def confident_joint_counts(labels: ArrayLike, pred_probs: ArrayLike) -> np.ndarray:
    """``[n]`` int64: how many samples of each given rank the confident joint counts off its diagonal.

    Confident learning's count (Northcutt et al., 2021), as cleanlab's ``compute_confident_joint``
    computes it before its calibration: rank ``j``'s threshold ``t_j`` is the mean ``p_j`` over the
    samples labeled ``j``; a sample with one rank at ``p_j >= t_j`` counts toward that rank, one with
    several toward the rank of largest ``p`` overall (cleanlab's rule, which may differ from the
    largest among those above their thresholds), and off the diagonal when that rank is not its label.
    The thresholds come from the data, so the count follows how well the model fits each rank.
    """
    lab, probs, _ = _validate(labels, pred_probs, None)
    return _off_diagonal(lab, probs)[1]


def _off_diagonal(labels: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """``[N]`` bool: the sample lies off the confident joint's diagonal; ``[n]`` counts per given rank."""
    n = probs.shape[1]
    sums = torch.zeros(n, dtype=torch.float64).index_add_(0, labels, probs[torch.arange(labels.numel()), labels])
    counts = torch.bincount(labels, minlength=n).to(torch.float64)
    # A rank nobody carries has no threshold: no sample counts toward it (cleanlab: the same).
    threshold = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, 2.0))
    above = probs >= threshold[None, :] - CONFIDENT_SLACK
    confident = above.sum(dim=1)
    # one rank above its threshold: that one; several: the largest p of all (both first on ties, as numpy)
    best = torch.where(confident > 1, probs.argmax(dim=1), above.to(torch.uint8).argmax(dim=1))
    off = (confident > 0) & (best != labels)
    return off, np.bincount(labels[off].numpy(), minlength=n).astype(np.int64)


# cleanlab's slack on the confident-joint thresholds (its compute_confident_joint: p >= t - 1e-6).
CONFIDENT_SLACK = 1e-6
# The default rule's one-sided mass: a label in a tail of p holding at most 0.25 %. A correct label
# drawn from a calibrated p lands in one of the two tails at most 0.5 % of the time. The margin
# below 1 % is for out-of-sample tails a little too light: at 0.995 (1 %), clean abalone labels
# were flagged 0.87-1.05 % of the time (benchmarks/bench_label_issues.py).
DEFAULT_MIN_SCORE = 0.9975
FILTERS = ("prune_by_class", "confident_learning", "predicted_neq_given", "min_score")
RANKINGS = ("label_quality", "self_confidence")


def find_label_issues(labels: ArrayLike, pred_probs: ArrayLike, *, filter_by: Optional[str] = None,
                      return_indices_ranked_by: Optional[str] = None, noise_kernel: Optional[ArrayLike] = None,
                      min_score: Optional[float] = None) -> np.ndarray:
    """Which labels look wrong, in the shape of ``cleanlab.filter.find_label_issues``.

    Args:
        labels: ``[N]`` given integer ranks in ``0 … n-1``.
        pred_probs: ``[N, n]`` ``p(q | x)`` from any model (numpy or torch; rows non-negative, summing to 1
            within 1e-3). Out-of-sample ones (:func:`sol_ext.driver.audit.cross_validated_probabilities`,
            or ``cross_val_predict(..., method="predict_proba")``): a model that has fitted a wrong label
            agrees with it.
        filter_by: which samples are flagged (``None``: ``"min_score"`` at ``min_score = 0.9975``, or
            ``"predicted_neq_given"`` with a ``noise_kernel``):

            - ``"min_score"``: at least ``min_score`` of the probability lies strictly on one side of
              the label (and the label is not a median). At the default 0.9975, at most 0.5 % of
              correct labels are flagged where ``p`` is calibrated (see the module docstring).
            - ``"predicted_neq_given"``: the label is not a median rank of ``p`` (more than half of
              the mass lies on one side of it; cleanlab: not an argmax). With a ``noise_kernel``, of ``p(q | x, r)``: the rule of
              :func:`sol_ext.refine.posterior_relabel` for a known noise.
            - ``"prune_by_class"``: in each given rank, the ``k`` samples of largest ordinal score, ``k``
              the rank's count off the confident joint's diagonal (:func:`confident_joint_counts`:
              per-rank thresholds from the data). cleanlab picks them by smallest ``p[label]``.
            - ``"confident_learning"``: the samples off the confident joint's diagonal.
        return_indices_ranked_by: ``None``: a boolean mask ``[N]``. ``"label_quality"``: the flagged
            indices, lowest :func:`get_label_quality_scores` first (ties: larger expected distance
            ``sum_q p_q |q - r|``, then smaller index). ``"self_confidence"``: lowest ``p[label]`` first
            (cleanlab's ordering, ties to the smaller index).
        noise_kernel: optional ``[n, n]`` label-noise model ``P[q, r]`` (rows summing to 1), as in
            :func:`sol_ext.refine.posterior_relabel`: scores are then of ``p(q | x, r)``.
        min_score: in ``[0.5, 1)``, for ``filter_by="min_score"`` (``None``: 0.9975): how much
            probability must lie strictly on one side of the label; given with ``filter_by=None``, it
            selects that rule (with a ``noise_kernel`` too).

    Returns:
        bool ``[N]`` (``True``: the label looks wrong), or int64 ``[M]`` indices of the flagged samples,
        most suspicious first, when ``return_indices_ranked_by`` is given.
    """
    if min_score is not None and (isinstance(min_score, (bool, np.bool_)) or not isinstance(min_score, numbers.Real)
                                  or not 0.5 <= min_score < 1.0):
        raise ValueError(f"min_score must be a number in [0.5, 1), got {min_score!r}; below 0.5 the mass on "
                         f"both sides of a label could reach it")
    if filter_by is not None and filter_by not in FILTERS:
        raise ValueError(f"filter_by must be one of {', '.join(map(repr, FILTERS))} (or None: the default), "
                         f"got {filter_by!r}; cleanlab's other filters treat ranks as unordered classes")
    if min_score is not None and filter_by not in (None, "min_score"):
        raise ValueError(f"min_score applies to filter_by='min_score' only, got filter_by={filter_by!r}")
    if return_indices_ranked_by is not None and return_indices_ranked_by not in RANKINGS:
        raise ValueError(f"return_indices_ranked_by must be None (a boolean mask) or one of "
                         f"{', '.join(map(repr, RANKINGS))}, got {return_indices_ranked_by!r}")
    lab, probs, kernel = _validate(labels, pred_probs, noise_kernel)
    if filter_by is None:
        filter_by = "predicted_neq_given" if kernel is not None and min_score is None else "min_score"
    if min_score is None:
        min_score = DEFAULT_MIN_SCORE
    post = _posterior(lab, probs, kernel)
    score = _scores(lab, post)
    distance = (post * (torch.arange(post.shape[1], dtype=torch.float64)[None, :]
                        - lab[:, None].to(torch.float64)).abs()).sum(dim=1)
    flagged = _flags(filter_by, lab, post, score, distance, min_score)
    if return_indices_ranked_by is None:
        return flagged
    idx = np.flatnonzero(flagged)
    if return_indices_ranked_by == "self_confidence":
        confidence = post[torch.arange(lab.numel()), lab].numpy()[idx]
        return idx[np.argsort(confidence, kind="stable")].astype(np.int64)
    quality = _quality(lab, post).numpy()
    return idx[_suspicious_first(1.0 - quality[idx], distance.numpy()[idx])].astype(np.int64)


def _suspicious_first(score: np.ndarray, distance: np.ndarray) -> np.ndarray:
    """Order of decreasing score, then decreasing distance, then position. Keys are rounded to
    TIE_DECIMALS: a tie in exact arithmetic (e.g. 1 - 0.35 above one label and 0.65 below another)
    should not be decided by rounding error. lexsort sorts by the last key first and is stable."""
    return np.lexsort((-np.round(distance, TIE_DECIMALS), -np.round(score, TIE_DECIMALS)))


def _flags(filter_by: str, labels: torch.Tensor, post: torch.Tensor, score: torch.Tensor,
           distance: torch.Tensor, min_score: float) -> np.ndarray:
    """``[N]`` bool flags of one ``filter_by`` rule (see :func:`find_label_issues`)."""
    # A label at a median of the model is never flagged (cleanlab: never one at an argmax). More than
    # half of the mass on one side is what puts r off every median: exactly half (a tie between r and
    # its neighbour) leaves r a median, where the lower median alone would be the neighbour.
    off_median = (score > 0.5).numpy()
    if filter_by == "predicted_neq_given":
        return off_median
    if filter_by == "min_score":
        return (score >= min_score).numpy() & off_median
    off, counts = _off_diagonal(labels, post)
    if filter_by == "confident_learning":
        return off.numpy() & off_median
    flagged = np.zeros(labels.numel(), dtype=bool)  # prune_by_class
    lab, s, d = labels.numpy(), score.numpy(), distance.numpy()
    for rank in np.flatnonzero(counts):
        rows = np.flatnonzero(lab == rank)
        flagged[rows[_suspicious_first(s[rows], d[rows])[:counts[rank]]]] = True
    return flagged & off_median
