"""Pair sets for the stochastic order loss.

Two choices (``--pairs``):

* ``all``: every unordered pair of the batch (docs/math.md §7), the default; the loss builds them.
* ``balanced``: the scheme of the authors' public code (docs/math.md §10.3). Each anchor of a batch
  gets one reference drawn from the training set so that the (noisy) order relation
  ``>``, ``<`` or ``~`` (with ``tau``) is chosen uniformly; the 2B samples are pooled and,
  of all their pairs, at most ``per_class`` per relation are kept.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["PAIR_MODES", "sample_references", "balanced_pairs"]

PAIR_MODES = ("all", "balanced")


def sample_references(anchor_labels: torch.Tensor, train_labels: torch.Tensor, tau: int,
                      generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One reference per anchor, with a uniformly chosen order relation (docs/math.md §10.3).

    For each anchor of rank ``r`` a relation is drawn uniformly: 0 = anchor above
    (reference rank ``< r - tau``), 1 = anchor below (``> r + tau``), 2 = similar
    (``|diff| <= tau``). When no training sample has that relation, the next one (cyclically)
    is used; "similar" always has a candidate if the anchor is in the training set.
    The reference is uniform among the candidates.

    Args:
        anchor_labels: ``[B]`` int64 ranks of the anchors.
        train_labels: ``[N]`` int64 current ranks of the training set.
        tau: similarity threshold in ranks.
        generator: random source (CPU).
    Returns:
        ``[B]`` int64 indices into the training set.
    """
    order = torch.argsort(train_labels.cpu(), stable=True)
    sorted_labels = train_labels.cpu()[order]
    r = anchor_labels.cpu()
    n_train = sorted_labels.numel()
    # [lo, hi) positions in sorted order of each relation's candidates
    below_end = torch.searchsorted(sorted_labels, r - tau, right=False)   # ranks < r - tau
    above_start = torch.searchsorted(sorted_labels, r + tau, right=True)  # ranks > r + tau
    lo = torch.stack([torch.zeros_like(r), above_start, below_end], 1)
    hi = torch.stack([below_end, torch.full_like(r, n_train), above_start], 1)
    relation = torch.randint(0, 3, r.shape, generator=generator)
    for _ in range(3):  # fall through to the next relation when the chosen one is empty
        size = hi.gather(1, relation[:, None]).squeeze(1) - lo.gather(1, relation[:, None]).squeeze(1)
        relation = torch.where(size > 0, relation, (relation + 1) % 3)
    start = lo.gather(1, relation[:, None]).squeeze(1)
    size = hi.gather(1, relation[:, None]).squeeze(1) - start
    if bool((size <= 0).any()):
        raise ValueError("sample_references: an anchor has no candidate reference; the anchors "
                         "must come from the training set.")
    u = torch.rand(r.shape, generator=generator, dtype=torch.float64)
    pick = start + (u * size).long().clamp(max=size - 1)
    return order[pick].to(anchor_labels.device)


def balanced_pairs(labels: torch.Tensor, tau: int, per_class: int = 32,
                   generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """At most ``per_class`` pairs of each noisy order relation (docs/math.md §10.3).

    All unordered pairs ``x < y`` of the pooled batch are classified by their noisy ranks into
    ``r_x > r_y + tau``, ``r_x < r_y - tau`` and ``|r_x - r_y| <= tau``; from each relation
    up to ``per_class`` pairs are kept at random. (The authors also orient each pair at
    random; the loss is symmetric in ``x, y``, so that is not needed.)

    Args:
        labels: ``[B]`` int64 ranks of the pooled batch.
        tau: similarity threshold.
        per_class: pairs kept per relation.
        generator: random source (CPU).
    Returns:
        ``[M, 2]`` int64 batch indices on ``labels.device``, ``M <= 3 * per_class``.
    """
    b = labels.numel()
    idx = torch.triu_indices(b, b, offset=1)                    # [2, B(B-1)/2]
    lab = labels.cpu()
    diff = lab[idx[0]] - lab[idx[1]]
    relation = torch.where(diff > tau, 0, torch.where(diff < -tau, 1, 2))
    keep = []
    for rel in range(3):
        members = torch.nonzero(relation == rel).flatten()
        if members.numel() > per_class:
            members = members[torch.randperm(members.numel(), generator=generator)[:per_class]]
        keep.append(members)
    chosen = torch.sort(torch.cat(keep)).values
    return idx[:, chosen].T.contiguous().to(labels.device)
