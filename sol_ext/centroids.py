"""Centroid rule and nearest-expectation inference (SPEC §3, §8; paper eqs. 6 and 17).

The centroid of rank ``q`` is the P-weighted mean of all training embeddings,
``mu_q = sum_x P[r_x, q] h_x / sum_x P[r_x, q]``. It is computed from per-label sums
(``index_add_``) and the kernel ``P`` in ``O(N d + n^2 d)``, never with a loop over samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .ops import stochastic_dissimilarity

__all__ = ["embed", "compute_centroids", "predict_ranks", "fill_missing_centroids",
           "dissimilarities", "RankPosterior", "fit_rank_posterior", "posterior_median_ranks"]


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
                      previous: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rank centroids by the centroid rule (SPEC §8, paper eq. 17).

    Args:
        embeddings: ``[N, d]`` embeddings ``h_x`` of the whole training set.
        labels: ``[N]`` integer (noisy, current) ranks ``r_x`` in ``0 … n-1``.
        kernel: ``[n, n]`` noise kernel ``P`` (``sol_ext.noise_kernel``); row ``r`` weights
            the centroids that a sample labelled ``r`` contributes to.
        previous: ``[n, d]`` centroids of the previous round, or ``None``.

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


def predict_ranks(embeddings: torch.Tensor, centroids: torch.Tensor, sigma: float,
                  batch_size: int = 4096, backend: str = "auto") -> torch.Tensor:
    """Nearest-expectation inference (paper eq. 6): ``argmin_q D[x, q]``, first minimum on ties.

    Args:
        embeddings: ``[N, d]``.
        centroids: ``[n, d]``.
        sigma: noise-kernel std in rank units (the one used in training).
        batch_size: rows of ``D`` computed at once (``D`` is ``[batch, n]``).
        backend: ``"auto"``, ``"fused"`` or ``"reference"``.

    Returns:
        ``[N]`` int64 predicted ranks in ``0 … n-1``.
    """
    out = []
    with torch.no_grad():
        for i in range(0, embeddings.shape[0], batch_size):
            d = stochastic_dissimilarity(embeddings[i:i + batch_size], centroids, sigma=sigma,
                                         backend=backend)
            out.append(torch.argmin(d, dim=1))  # torch.argmin returns the first minimum
    if not out:
        return torch.zeros(0, dtype=torch.long, device=embeddings.device)
    return torch.cat(out)


def dissimilarities(embeddings: torch.Tensor, centroids: torch.Tensor, sigma: float,
                    batch_size: int = 4096, backend: str = "auto") -> torch.Tensor:
    """``D [N, n]`` (SPEC §3) of a whole set of embeddings ``[N, d]``, without gradient."""
    with torch.no_grad():
        chunks = [stochastic_dissimilarity(embeddings[i:i + batch_size], centroids, sigma=sigma,
                                           backend=backend)
                  for i in range(0, embeddings.shape[0], batch_size)]
    if not chunks:
        return torch.zeros(0, centroids.shape[0], dtype=centroids.dtype, device=embeddings.device)
    return torch.cat(chunks)


@dataclass(frozen=True)
class RankPosterior:
    """``p(q | x) ∝ prior_q * exp(-D[x, q] / temperature)``, fitted by :func:`fit_rank_posterior`.

    Attributes:
        log_prior: ``[n]`` log label frequencies of the training set (add-``smoothing``).
        temperature: scale of ``D`` (> 0).
    """

    log_prior: torch.Tensor
    temperature: float


def fit_rank_posterior(dissimilarity: torch.Tensor, labels: torch.Tensor, num_ranks: int,
                       smoothing: float = 0.5) -> RankPosterior:
    """Fit the rank posterior of ``--inference posterior`` on the training set.

    Not in the paper (its eq. 6 is the limit ``temperature -> 0`` with a uniform prior). The
    prior is the frequency of the current training ranks (plus ``smoothing`` per rank); the
    temperature maximizes the mean log-likelihood of those ranks over a grid of
    ``mean_x D[x, r_x] * 2**k``, ``k = -12 … 6``.

    Args:
        dissimilarity: ``[N, n]`` ``D`` of the training samples.
        labels: ``[N]`` their current integer ranks.
        num_ranks: ``n``.
        smoothing: pseudo-count added to every rank's count (> 0, so no rank has prior 0).
    """
    d = dissimilarity.detach().to(torch.float64)
    labels = labels.to(d.device).long()
    counts = torch.bincount(labels, minlength=num_ranks).to(torch.float64) + smoothing
    log_prior = torch.log(counts / counts.sum())
    rows = torch.arange(labels.numel(), device=d.device)
    # D is defined up to a per-sample constant for the posterior: shift rows for stability
    d = d - d.min(dim=1, keepdim=True).values
    scale = float(d[rows, labels].mean()) if labels.numel() else 0.0
    if not scale > 0.0:
        scale = float(d.mean()) if d.numel() and float(d.mean()) > 0 else 1.0
    best_ll, best_t = -float("inf"), scale
    for k in range(-12, 7):
        t = scale * 2.0 ** k
        ll = float(torch.log_softmax(-d / t + log_prior, dim=1)[rows, labels].mean())
        if ll > best_ll:
            best_ll, best_t = ll, t
    return RankPosterior(log_prior=log_prior.to(dissimilarity.dtype), temperature=best_t)


def posterior_median_ranks(dissimilarity: torch.Tensor, posterior: RankPosterior) -> torch.Tensor:
    """Posterior median rank (it minimizes the expected absolute error) of each row of ``D [N, n]``.

    Returns ``[N]`` int64 ranks in ``0 … n-1``: the first ``q`` whose cumulative posterior
    reaches 1/2.
    """
    d = dissimilarity.detach().to(torch.float64)
    logits = -(d - d.min(dim=1, keepdim=True).values) / posterior.temperature
    post = torch.softmax(logits + posterior.log_prior.to(d), dim=1)
    below_half = post.cumsum(dim=1) < 0.5
    return below_half.sum(dim=1).clamp(max=d.shape[1] - 1).long()
