"""Relabeling of training labels: the paper's outlier rule and a posterior rule.

* The paper's rule (docs/math.md §8; eqs. 19–21; ``relabel="outlier"``): after every epoch each training
  sample gets a predicted rank; ``dev = r_x - rank_hat(x)``. Within each label group, samples
  whose ``|dev|`` reaches ``beta`` times the group's largest ``|dev|`` are outliers, and each
  outlier moves ``step = 0.5 * mean|dev|`` ranks towards its prediction. The caller feeds the
  moved labels back in next epoch, so relabels accumulate. Every label group has outliers by
  construction, so the rule moves labels whether or not they are wrong.
* The posterior rule (:func:`posterior_relabel`, the driver's default; not in the paper): the
  rank of ``x`` given both its features and its given label ``r``,
  ``p(q | x, r) ∝ p(q | x) P[q, r]``, with ``P[q, r]`` the probability that rank ``q`` is
  labeled ``r`` (the driver's is :func:`label_noise_kernel`).
  A label moves, to the median of that posterior, only where the posterior puts at least
  ``mass`` strictly on one side of it (``mass = 1/2``: every label moves to its median). The
  driver applies it to the *given* labels each epoch, so moves never accumulate, with ``P`` of a
  std estimated by :func:`fit_label_noise` and mass 0.98, or of a std the user
  knows and mass 1/2; the corrected labels are its output, not training labels.

The label-noise model of that rule, and its fit by maximum likelihood, are here too:
:func:`label_noise_kernel`, :func:`fit_label_noise`, :func:`fit_through_label_noise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .readout import RankPosterior, fit_rank_posterior

__all__ = ["Refinement", "detect_outliers", "relabel_step", "relabel", "refine_labels",
           "PosteriorRelabel", "posterior_relabel", "label_noise_kernel", "LABEL_NOISE_GRID", "LabelNoiseFit",
           "fit_label_noise", "fit_through_label_noise"]


@dataclass(frozen=True)
class Refinement:
    """Outcome of one round of outlier detection and relabeling.

    Attributes:
        labels: ``[N]`` int64 labels after relabeling.
        outliers: ``[N]`` bool, the flagged samples.
        deviation: ``[N]`` int64 ``r_x - rank_hat(x)`` before relabeling.
        step: the relabeling distance in ranks (before rounding).
        num_outliers: how many samples were flagged.
        num_relabeled: how many labels actually changed (a flagged sample whose move rounds
            to 0, or is clipped at the range end, keeps its label).
    """

    labels: torch.Tensor
    outliers: torch.Tensor
    deviation: torch.Tensor
    step: float
    num_outliers: int
    num_relabeled: int


def _check(labels: torch.Tensor, predicted: torch.Tensor, num_ranks: int) -> None:
    if labels.shape != predicted.shape or labels.dim() != 1:
        raise ValueError(f"expected labels and predicted ranks of the same shape [N], got "
                         f"{tuple(labels.shape)} and {tuple(predicted.shape)}.")
    for name, t in (("labels", labels), ("predicted ranks", predicted)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_ranks):
            raise ValueError(f"{name} must lie in 0..{num_ranks - 1}; got "
                             f"{int(t.min())}..{int(t.max())}.")


def detect_outliers(labels: torch.Tensor, predicted: torch.Tensor, num_ranks: int,
                    beta: float) -> torch.Tensor:
    """Outlier flags of paper eq. 19 (docs/math.md §8).

    ``x`` with label ``q`` is flagged when ``dev_x != 0`` and
    ``|dev_x| >= beta * max_{y: r_y = q} |dev_y|``.

    Args:
        labels: ``[N]`` current integer ranks.
        predicted: ``[N]`` predicted ranks.
        num_ranks: ``n``.
        beta: precision knob in ``(0, 1]``; larger flags fewer samples.

    Returns:
        ``[N]`` bool.
    """
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1], got {beta}. The paper uses 0.85-0.9.")
    _check(labels, predicted, num_ranks)
    absdev = (labels - predicted).abs()
    group_max = torch.zeros(num_ranks, dtype=absdev.dtype, device=absdev.device)
    group_max.scatter_reduce_(0, labels, absdev, reduce="amax", include_self=True)
    # integers times a float: compare in float64 so that |dev| == beta*max counts as reached
    threshold = beta * group_max[labels].to(torch.float64)
    return (absdev != 0) & (absdev.to(torch.float64) >= threshold)


def relabel_step(deviation: torch.Tensor, floor: bool = False) -> float:
    """Relabeling distance (paper eq. 20): ``0.5 * mean_x |dev_x|`` over all training samples.

    ``floor=True`` floors it, as the authors' public code does (docs/math.md §10.5).
    """
    if deviation.numel() == 0:
        return 0.0
    step = 0.5 * float(deviation.abs().to(torch.float64).mean())
    return float(torch.floor(torch.tensor(step))) if floor else step


def relabel(labels: torch.Tensor, deviation: torch.Tensor, outliers: torch.Tensor,
            num_ranks: int, step: float) -> torch.Tensor:
    """Move each outlier ``step`` ranks towards its prediction (paper eq. 21).

    ``r_x <- clip(round(r_x - sign(dev_x) * step), 0, n-1)`` for flagged ``x``; others keep
    their label. ``round`` is half-to-even, as ``numpy.round`` and ``torch.round``.

    Args:
        labels: ``[N]`` int64 current ranks.
        deviation: ``[N]`` ``r_x - rank_hat(x)``.
        outliers: ``[N]`` bool.
        num_ranks: ``n``.
        step: distance in ranks (>= 0).
    Returns:
        ``[N]`` int64 new labels (a new tensor).
    """
    moved = torch.round(labels.to(torch.float64) - deviation.sign().to(torch.float64) * step)
    moved = moved.clamp(0, num_ranks - 1).to(labels.dtype)
    return torch.where(outliers, moved, labels)


def refine_labels(labels: torch.Tensor, predicted: torch.Tensor, num_ranks: int, beta: float,
                  floor_step: bool = False) -> Refinement:
    """One round of outlier detection and relabeling (docs/math.md §8).

    Args:
        labels: ``[N]`` current integer ranks of the whole training set.
        predicted: ``[N]`` their predicted ranks (nearest expectation).
        num_ranks: ``n``.
        beta: outlier threshold (docs/math.md §11: 0.85–0.9).
        floor_step: floor the step as in the authors' code (docs/math.md §10.5).
    """
    labels = labels.long()
    predicted = predicted.long().to(labels.device)
    outliers = detect_outliers(labels, predicted, num_ranks, beta)
    deviation = labels - predicted
    step = relabel_step(deviation, floor=floor_step)
    new = relabel(labels, deviation, outliers, num_ranks, step)
    return Refinement(labels=new, outliers=outliers, deviation=deviation, step=step,
                      num_outliers=int(outliers.sum()), num_relabeled=int((new != labels).sum()))


@dataclass(frozen=True)
class PosteriorRelabel:
    """Outcome of :func:`posterior_relabel`.

    Attributes:
        labels: ``[N]`` int64 labels after relabeling.
        flagged: ``[N]`` bool, the labels that moved.
        confidence: ``[N]`` float64 posterior mass strictly on the far side of the given label
            (below it for labels that move down, above for labels that move up; the larger side
            for the others).
        suggested: ``[N]`` int64 median of ``p(q | x, r)`` (equal to ``labels`` where flagged).
        num_relabeled: how many labels moved.
    """

    labels: torch.Tensor
    flagged: torch.Tensor
    confidence: torch.Tensor
    suggested: torch.Tensor
    num_relabeled: int


def posterior_relabel(labels: torch.Tensor, rank_probabilities: torch.Tensor,
                      noise_kernel: torch.Tensor, mass: float = 0.98) -> PosteriorRelabel:
    """The posterior relabeling rule (not in the paper; see the module docstring).

    Args:
        labels: ``[N]`` given integer ranks ``r_x``.
        rank_probabilities: ``[N, n]`` ``p(q | x)`` from the model (rows sum to 1;
            :func:`sol_ext.readout.rank_posterior`).
        noise_kernel: ``[n, n]`` label-noise model ``P[q, r]``, the probability that rank ``q`` is
            labeled ``r`` (:func:`label_noise_kernel`).
        mass: in ``[0.5, 1)``: how much of ``p(q | x, r)`` must lie strictly on one side of
            ``r`` for the label to move. Larger moves fewer labels.

    Returns:
        A :class:`PosteriorRelabel`; a flagged label moves to the median of ``p(q | x, r)``.
    """
    if not 0.5 <= mass < 1.0:
        raise ValueError(f"mass must be in [0.5, 1), got {mass}.")
    n = noise_kernel.shape[0]
    if rank_probabilities.dim() != 2 or rank_probabilities.shape != (labels.numel(), n):
        raise ValueError(f"expected rank probabilities [N, n] = [{labels.numel()}, {n}], got "
                         f"{tuple(rank_probabilities.shape)}.")
    _check(labels, labels, n)
    labels = labels.long().to(rank_probabilities.device)
    p = rank_probabilities.to(torch.float64)
    joint = p * noise_kernel.to(p)[:, labels].T          # p(q | x) P[q, r_x], [N, n]
    total = joint.sum(dim=1, keepdim=True)
    # A label the noise model rules out for every rank the model allows (P[q, r] = 0 there) tells
    # nothing about the rank: judge it by p(q | x) alone. (An all-zero row would send it to the top
    # rank, wherever the model puts the truth.)
    joint = torch.where(total > 0, joint / total.clamp_min(torch.finfo(torch.float64).tiny), p)
    cum = joint.cumsum(dim=1)
    rows = torch.arange(labels.numel(), device=p.device)
    below = torch.where(labels > 0, cum[rows, (labels - 1).clamp(min=0)], torch.zeros_like(cum[:, 0]))
    above = 1.0 - cum[rows, labels]
    suggested = (cum < 0.5).sum(dim=1).clamp(max=n - 1)
    flagged = ((below >= mass) | (above >= mass)) & (suggested != labels)
    new = torch.where(flagged, suggested, labels)
    return PosteriorRelabel(labels=new, flagged=flagged, confidence=torch.maximum(below, above),
                            suggested=suggested, num_relabeled=int(flagged.sum()))


# --------------------------------------------------------------------------------------------------
# The label-noise model of the posterior rule, and its fit


def label_noise_kernel(num_ranks: int, std: float, dtype: torch.dtype = torch.float64,
                       device=None) -> torch.Tensor:
    """``[n, n]`` model of label noise for relabeling (not in the paper): ``P[q, r]`` is the
    probability that a sample of rank ``q`` is labeled ``r``, when the label is ``q`` plus an error
    ``e ~ N(0, std^2)``, rounded to the nearest rank and clipped to ``0 … n-1``.

    Unlike SOL's kernel (:func:`sol_ext.noise_kernel`, whose rows are renormalized over the ranks),
    an error past an end of the scale lands on the end rank, as on any bounded scale: a rater
    cannot give less than the lowest grade, and noise added to ranks is clipped. A large error
    then piles labels up on the end ranks instead of spreading them over the inner ones. ``std``
    0 gives the identity.
    """
    if std <= 0.0:
        return torch.eye(num_ranks, dtype=dtype, device=device)
    q = torch.arange(num_ranks, dtype=torch.float64, device=device)
    offset = q[None, :] - q[:, None]               # label r minus rank q
    lower, upper = (offset - 0.5) / std, (offset + 0.5) / std  # the bin of label r, in stds
    lower[:, 0], upper[:, -1] = -math.inf, math.inf
    # P(lower <= e/std < upper) from the tail on lower's side: a difference of two tail
    # probabilities keeps far bins small but non-zero where a difference of CDFs near 1 gives 0.
    erfc = torch.special.erfc
    above = 0.5 * (erfc(lower / math.sqrt(2.0)) - erfc(upper / math.sqrt(2.0)))
    below = 0.5 * (erfc(-upper / math.sqrt(2.0)) - erfc(-lower / math.sqrt(2.0)))
    return torch.where(lower >= 0, above, below).to(dtype)


# Candidate label-noise stds of fit_label_noise, as fractions of the labels' own std.
LABEL_NOISE_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)


@dataclass(frozen=True)
class LabelNoiseFit:
    """Outcome of :func:`fit_label_noise`.

    Attributes:
        std: the estimated std of the label error, in ranks (0: the labels look exact).
        posterior: ``p(q | x)`` of the true rank, fitted through that noise.
        kernel: ``[n, n]`` float64 noise model ``P[q, r]`` of that std (the identity for 0).
    """

    std: float
    posterior: RankPosterior
    kernel: torch.Tensor


def fit_label_noise(dissimilarity: torch.Tensor, labels: torch.Tensor, num_ranks: int,
                    prior_labels: Optional[torch.Tensor] = None,
                    grid: tuple[float, ...] = LABEL_NOISE_GRID) -> LabelNoiseFit:
    """Estimate the std of the label noise by maximum likelihood (not in the paper).

    Each label is modeled as a draw ``r ~ P_s[q, ·]`` (:func:`label_noise_kernel`: a Gaussian
    error of std ``s``, rounded and clipped to the scale) around a true rank ``q ~ p(q | x)``, with
    the posterior's temperature and ``s`` fitted together on ``labels``; ``s`` runs over ``grid``
    times the labels' std, and a larger ``s`` must fit strictly better. A posterior can widen by
    its temperature or by ``s``: noise shows as ``s`` only where ``D`` is sharper than the labels'
    spread around it (images of a clear rank: yes; tabular data whose ranks are hard to predict:
    mostly no). So the estimate is a lower bound
    on the noise more often than not; fit it on held-out samples (the encoder has fitted the
    noise of its own training samples).

    Args:
        dissimilarity: ``[N, n]`` ``D`` of the samples (held out, preferably).
        labels: ``[N]`` their given integer ranks.
        num_ranks: ``n``.
        prior_labels: ranks whose frequencies form the prior (default ``labels``).
        grid: candidate stds as fractions of the std of ``labels``.
    """
    labels = labels.long()
    spread = float(labels.double().std(unbiased=False)) if labels.numel() > 1 else 0.0
    best: Optional[LabelNoiseFit] = None
    for fraction in grid:
        fit = fit_through_label_noise(dissimilarity, labels, num_ranks, fraction * spread,
                                      prior_labels)
        if best is None or fit.posterior.log_likelihood > best.posterior.log_likelihood:
            best = fit
    return best


def fit_through_label_noise(dissimilarity: torch.Tensor, labels: torch.Tensor, num_ranks: int,
                            std: float, prior_labels: Optional[torch.Tensor] = None) -> LabelNoiseFit:
    """``p(q | x)`` of the true rank fitted (:func:`fit_rank_posterior`) through label noise of a
    known ``std`` in ranks (:func:`label_noise_kernel`; 0: the labels are taken as exact)."""
    kernel = label_noise_kernel(num_ranks, std, device=dissimilarity.device)
    posterior = fit_rank_posterior(dissimilarity, labels, num_ranks,
                                   noise_kernel=kernel if std > 0.0 else None,
                                   prior_labels=prior_labels)
    return LabelNoiseFit(std=std, posterior=posterior, kernel=kernel)
