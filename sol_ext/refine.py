"""Outlier detection and relabeling (SPEC §8; paper eqs. 18–20).

After every epoch each training sample gets a predicted rank; ``dev = r_x - rank_hat(x)``.
Within each label group, samples whose ``|dev|`` reaches ``beta`` times the group's largest
``|dev|`` are outliers, and each outlier moves ``step = 0.5 * mean|dev|`` ranks towards its
prediction. The caller feeds the moved labels back in next epoch, so relabels accumulate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Refinement", "detect_outliers", "relabel_step", "relabel", "refine_labels"]


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
    """Outlier flags of paper eq. 18 (SPEC §8).

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
    """Relabeling distance (paper eq. 19): ``0.5 * mean_x |dev_x|`` over all training samples.

    ``floor=True`` floors it, as the authors' public code does (SPEC §10.5).
    """
    if deviation.numel() == 0:
        return 0.0
    step = 0.5 * float(deviation.abs().to(torch.float64).mean())
    return float(torch.floor(torch.tensor(step))) if floor else step


def relabel(labels: torch.Tensor, deviation: torch.Tensor, outliers: torch.Tensor,
            num_ranks: int, step: float) -> torch.Tensor:
    """Move each outlier ``step`` ranks towards its prediction (paper eq. 20).

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
    """One round of outlier detection and relabeling (SPEC §8).

    Args:
        labels: ``[N]`` current integer ranks of the whole training set.
        predicted: ``[N]`` their predicted ranks (nearest expectation).
        num_ranks: ``n``.
        beta: outlier threshold (SPEC §11: 0.85–0.9).
        floor_step: floor the step as in the authors' code (SPEC §10.5).
    """
    labels = labels.long()
    predicted = predicted.long().to(labels.device)
    outliers = detect_outliers(labels, predicted, num_ranks, beta)
    deviation = labels - predicted
    step = relabel_step(deviation, floor=floor_step)
    new = relabel(labels, deviation, outliers, num_ranks, step)
    return Refinement(labels=new, outliers=outliers, deviation=deviation, step=step,
                      num_outliers=int(outliers.sum()), num_relabeled=int((new != labels).sum()))
