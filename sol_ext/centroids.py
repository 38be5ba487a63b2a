"""The centroid rule (docs/math.md §3, §8; paper eq. 17).

The centroid of rank ``q`` is the P-weighted mean of all training embeddings,
``mu_q = sum_x P[r_x, q] h_x / sum_x P[r_x, q]``. It is computed from per-label sums
(``index_add_``) and the kernel ``P`` in ``O(N d + n^2 d)``, never with a loop over samples.

Read-outs (from ``D`` to ranks) are in :mod:`sol_ext.readout`, the label-noise fit in :mod:`sol_ext.refine`.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

__all__ = ["embed", "compute_centroids", "damp_centroids", "centroid_span", "fill_missing_centroids"]


@torch.no_grad()
def embed(model: nn.Module, features: torch.Tensor, batch_size: int = 512,
          device: Optional[torch.device | str] = None) -> torch.Tensor:
    """Embeddings of a whole data set, in eval mode and without gradient.

    Args:
        model: maps a batch ``[b, ...]`` to embeddings ``[b, d]``.
        features: ``[N, ...]`` inputs (on any device).
        batch_size: rows per forward pass.
        device: where the model runs; defaults to the device of its first parameter.

    Returns:
        ``[N, d]`` embeddings on ``device``. The model's train/eval mode is restored afterwards.
    """
    if device is None:
        device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        chunks = [model(features[i:i + batch_size].to(device))
                  for i in range(0, features.shape[0], batch_size)]
    finally:
        model.train(was_training)
    if not chunks:
        raise ValueError("embed: got an empty data set (0 rows); expected at least one sample.")
    return torch.cat(chunks)


def compute_centroids(embeddings: torch.Tensor, labels: torch.Tensor, kernel: torch.Tensor,
                      previous: Optional[torch.Tensor] = None,
                      all_reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                      ) -> torch.Tensor:
    """Rank centroids by the centroid rule (docs/math.md §8, paper eq. 18).

    Args:
        embeddings: ``[N, d]`` embeddings ``h_x`` of the whole training set (with ``all_reduce``:
            this process's share of it).
        labels: ``[N]`` integer (noisy, current) ranks ``r_x`` in ``0 … n-1``.
        kernel: ``[n, n]`` noise kernel ``P`` (``sol_ext.noise_kernel``); row ``r`` weights
            the centroids that a sample labelled ``r`` contributes to.
        previous: ``[n, d]`` centroids of the previous round, or ``None``.
        all_reduce: in data-parallel training, sums a tensor over the processes (in place, the
            result on every process, e.g. :meth:`sol_ext.driver.parallel.Parallel.sum`); it is applied to
            the per-label sums ``S_j`` and counts ``c_j``, so every process gets the centroids of the
            whole training set.

    Returns:
        ``[n, d]`` centroids in the dtype of ``embeddings``. A rank whose total weight is 0
        keeps its ``previous`` centroid; without ``previous`` it is interpolated from the
        nearest ranks that have weight (see :func:`fill_missing_centroids`).
    """
    if embeddings.dim() != 2 or labels.shape != embeddings.shape[:1]:
        raise ValueError(
            f"compute_centroids: expected embeddings [N, d] and labels [N], got "
            f"{tuple(embeddings.shape)} and {tuple(labels.shape)}.")
    n = kernel.shape[0]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= n):
        raise ValueError(f"compute_centroids: labels must lie in 0..{n - 1} (the kernel is "
                         f"{n}x{n}); got range {int(labels.min())}..{int(labels.max())}.")
    # float64 sums: N can be large and the weights of far ranks tiny.
    h = embeddings.detach().to(torch.float64)
    p = kernel.to(device=h.device, dtype=torch.float64)
    sums = torch.zeros(n, h.shape[1], dtype=torch.float64, device=h.device)
    sums.index_add_(0, labels.to(h.device), h)
    counts = torch.bincount(labels.to(h.device), minlength=n).to(torch.float64)
    if all_reduce is not None:
        sums, counts = all_reduce(sums), all_reduce(counts)
    weight = p.T @ counts                     # [n]: sum_x P[r_x, q]
    numer = p.T @ sums                        # [n, d]: sum_x P[r_x, q] h_x
    # "Zero weight" up to float64 underflow: a subnormal weight would give a meaningless ratio.
    has_weight = weight > torch.finfo(torch.float64).tiny
    mu = numer / weight.clamp_min(torch.finfo(torch.float64).tiny).unsqueeze(1)
    if previous is not None:
        mu = torch.where(has_weight.unsqueeze(1), mu, previous.to(mu))
    else:
        mu = fill_missing_centroids(mu, has_weight)
    return mu.to(embeddings.dtype)


def damp_centroids(previous: Optional[torch.Tensor], rule: torch.Tensor, momentum: float,
                   normalize: bool) -> torch.Tensor:
    """Damped centroid update ``normalize(momentum * previous + (1 - momentum) * rule)``.

    The paper replaces the centroids wholesale each epoch (``momentum = 0``). With a margin in
    absolute ``D`` units that can settle into a period-2 cycle: the encoder adapts its spread to
    the current centroids within an epoch, the next centroid rule follows that spread, and so on.
    Averaging with the previous centroids damps the cycle.

    Args:
        previous: ``[n, d]`` centroids of the previous round, or ``None`` (then ``rule`` is used).
        rule: ``[n, d]`` centroids from :func:`compute_centroids`.
        momentum: weight of ``previous`` in ``[0, 1)``.
        normalize: L2-normalize the rows of the result (as the embeddings are).
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
    mu = rule if previous is None or momentum == 0 else (
        momentum * previous.to(rule) + (1.0 - momentum) * rule)
    return torch.nn.functional.normalize(mu, dim=1) if normalize else mu


def centroid_span(centroids: torch.Tensor) -> float:
    """``||mu_{n-1} - mu_0||``: the distance between the end-rank centroids (a scale of ``D``)."""
    return float((centroids[-1] - centroids[0]).to(torch.float64).norm()) if len(centroids) else 0.0


def fill_missing_centroids(mu: torch.Tensor, defined: torch.Tensor) -> torch.Tensor:
    """Fill the centroids of ranks that have no training weight and no earlier value.

    Linear interpolation between the nearest defined ranks below and above; beyond the ends
    the nearest defined centroid is copied. Ranks are ordered, so this keeps the centroids
    ordered as well, unlike a zero vector that inference could pick by accident.

    Args:
        mu: ``[n, d]`` centroids; rows where ``defined`` is False are ignored.
        defined: ``[n]`` bool.
    Returns:
        ``[n, d]`` centroids with every row defined.
    """
    if bool(defined.all()):
        return mu
    idx = torch.nonzero(defined).flatten()
    if idx.numel() == 0:
        raise ValueError("compute_centroids: no rank has any training weight; the training set "
                         "is empty. Expected at least one labelled sample.")
    ranks = torch.arange(mu.shape[0], device=mu.device)
    # position of the first defined rank >= q (clamped), and the one before it
    hi_pos = torch.searchsorted(idx, ranks).clamp(max=idx.numel() - 1)
    lo_pos = (hi_pos - (idx[hi_pos] > ranks).long()).clamp(min=0)
    lo, hi = idx[lo_pos], idx[hi_pos]
    span = (hi - lo).clamp(min=1).to(mu.dtype)
    w = ((ranks - lo).to(mu.dtype) / span).clamp(0, 1).unsqueeze(1)
    filled = mu[lo] * (1 - w) + mu[hi] * w
    return torch.where(defined.unsqueeze(1), mu, filled)
