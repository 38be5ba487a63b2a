"""Plain-PyTorch reference of every SOL op: the oracle the fused kernels are tested against.

Each function writes the formula of docs/math.md as directly as PyTorch allows, and autograd gives its
gradients. It materializes what the fused kernels avoid: a ``[B, n, d]`` difference tensor for the
dissimilarity and ``[M, n]`` tensors for the order loss, so use it for checking, not for training at
scale. Inputs are not validated here; the public functions in :mod:`sol_ext` validate and then call
either these or the fused ops.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "noise_kernel",
    "stochastic_dissimilarity",
    "ordering_probability_table",
    "ordering_probabilities",
    "all_pairs",
    "order_loss",
    "order_loss_block",
    "disc_loss",
    "reduce_losses",
]


def noise_kernel(
    num_ranks: int, sigma: float = 1.0, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    """``P [n, n]``: row ``q`` is the distribution of the true rank given noisy rank ``q`` (docs/math.md §2).

    A discrete Gaussian cut to ``0 … n-1`` and renormalized; computed in float64, then cast. Any finite
    ``sigma > 0`` works: a tiny one gives the identity (``(j - q) / sigma`` is infinite off the diagonal),
    a huge one the uniform kernel; ``sigma**2`` is never formed, so it cannot overflow.
    """
    ranks = torch.arange(num_ranks, dtype=torch.float64, device=device)
    weights = torch.exp(-0.5 * ((ranks[None, :] - ranks[:, None]) / sigma) ** 2)
    return (weights / weights.sum(dim=1, keepdim=True)).to(dtype)


def stochastic_dissimilarity(h: torch.Tensor, mu: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """``D [B, n]``, ``D[x, q] = sum_j P[q, j] ||h_x - mu_j||^2`` (docs/math.md §3), from the ``[B, n, d]`` differences."""
    P = noise_kernel(mu.shape[0], sigma, dtype=h.dtype, device=h.device)
    squared_distances = ((h[:, None, :] - mu[None, :, :]) ** 2).sum(dim=-1)  # [B, n]
    return squared_distances @ P.T


def ordering_probability_table(
    num_ranks: int, sigma: float = 1.0, tau: int = 3, convention: str = "paper", device=None
) -> torch.Tensor:
    """``[n, n, 3]`` float64: ``table[a, b] = (Pr(x<y), Pr(x~y), Pr(x>y))`` for noisy ranks ``(a, b)``.

    Each entry is the double sum of docs/math.md §5, written as ``P @ mask @ P.T`` over the true ranks
    ``(j, k)``. ``convention="official"`` uses the authors' clamped tail for ``<`` and ``>`` (docs/math.md §10.2).
    True ranks differ by at most ``n - 1``, so every ``tau >= n - 1`` means the same and is clamped
    (``j + tau + 1`` would overflow int64 for a huge ``tau``).
    """
    tau = min(tau, num_ranks - 1)
    P = noise_kernel(num_ranks, sigma, dtype=torch.float64, device=device)
    j = torch.arange(num_ranks, device=device)[:, None]  # true rank of x
    k = torch.arange(num_ranks, device=device)[None, :]  # true rank of y
    if convention == "official":
        start = torch.clamp(j + tau + 1, max=num_ranks - 1)
        y_above = (k >= start).double()  # [j, k]: k >= min(n-1, j+tau+1)
        x_above = y_above.T  # [j, k]: j >= min(n-1, k+tau+1)
    else:
        y_above = (k - j > tau).double()
        x_above = (j - k > tau).double()
    similar = ((k - j).abs() <= tau).double()
    return torch.stack([P @ mask @ P.T for mask in (y_above, similar, x_above)], dim=-1)


def ordering_probabilities(
    r_x: torch.Tensor,
    r_y: torch.Tensor,
    num_ranks: int,
    sigma: float = 1.0,
    tau: int = 3,
    convention: str = "paper",
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``[M, 3] = (lt, eq, gt)`` for each pair of noisy ranks ``(r_x[m], r_y[m])`` (docs/math.md §5)."""
    table = ordering_probability_table(num_ranks, sigma, tau, convention, device=r_x.device)
    return table[r_x.long(), r_y.long()].to(dtype)


def all_pairs(batch_size: int, device=None) -> torch.Tensor:
    """``[B(B-1)/2, 2]`` int64: every unordered pair ``(x, y)``, ``x < y``, in row-major order (docs/math.md §7)."""
    return torch.triu_indices(batch_size, batch_size, offset=1, device=device).T.contiguous()


def order_loss(
    D: torch.Tensor,
    labels: torch.Tensor,
    pairs: Optional[torch.Tensor] = None,
    sigma: float = 1.0,
    tau: int = 3,
    margin: float = 0.25,
    convention: str = "paper",
    reduction: str = "mean",
) -> torch.Tensor:
    """Stochastic order loss (docs/math.md §6) of the pairs; ``"none"`` gives the ``[M]`` per-pair losses."""
    num_ranks = D.shape[1]
    if pairs is None:
        pairs = all_pairs(D.shape[0], device=D.device)
    x, y = pairs[:, 0], pairs[:, 1]
    r_x, r_y = labels[x][:, None], labels[y][:, None]  # [M, 1]
    probs = ordering_probabilities(labels[x], labels[y], num_ranks, sigma, tau, convention, dtype=D.dtype)
    p_lt, p_eq, p_gt = probs[:, 0], probs[:, 1], probs[:, 2]

    delta = D[x] - D[y]  # [M, n]
    q = torch.arange(num_ranks, device=D.device)[None, :]
    above = torch.relu(delta + margin)  # [delta_q + gamma]+
    below = torch.relu(margin - delta)  # [gamma - delta_q]+
    if convention == "official":  # exclusive lower sums (docs/math.md §10.1)
        lower_x, lower_y = q < r_x, q < r_y
    else:
        lower_x, lower_y = q <= r_x, q <= r_y
    loss_lt = (above * lower_x).sum(1) + (below * (q >= r_y)).sum(1)
    loss_gt = (below * lower_y).sum(1) + (above * (q >= r_x)).sum(1)
    loss_eq = torch.relu(delta.abs() - margin).sum(1)
    losses = p_gt * loss_gt + p_eq * loss_eq + p_lt * loss_lt
    return reduce_losses(losses, reduction)


def disc_loss(D: torch.Tensor, labels: torch.Tensor, T: int = 1, reduction: str = "mean") -> torch.Tensor:
    """Discriminative loss (docs/math.md §4); ``"none"`` gives the ``[B]`` per-sample losses.

    Every ``t >= n`` has both neighbours out of range and adds the same term, so those terms are added
    once, times their count: any ``T`` costs what ``T = n - 1`` costs.
    """
    num_ranks = D.shape[1]
    rows = torch.arange(D.shape[0], device=D.device)
    D0 = D[rows, labels]
    losses = torch.zeros_like(D0)
    looped = min(T, num_ranks - 1)
    for t in range(1, looped + 1):
        lo, hi = labels - t, labels + t
        lo_in, hi_in = lo >= 0, hi <= num_ranks - 1
        D_lo = D[rows, lo.clamp(min=0)]
        D_hi = D[rows, hi.clamp(max=num_ranks - 1)]
        both = 2 * D0 - D_lo - D_hi
        only_hi = 2 * (D0 - D_hi)
        only_lo = 2 * (D0 - D_lo)
        neither = 2 * (D0 - D_lo) + 2 * (D0 - D_hi)  # lo, hi clamped to 0 and n-1
        losses = losses + torch.where(
            lo_in & hi_in, both, torch.where(hi_in, only_hi, torch.where(lo_in, only_lo, neither))
        )
    if T > looped:
        losses = losses + (T - looped) * (2 * (D0 - D[:, 0]) + 2 * (D0 - D[:, -1]))
    return reduce_losses(losses, reduction)


def order_loss_block(
    D: torch.Tensor,
    labels: torch.Tensor,
    D_all: torch.Tensor,
    labels_all: torch.Tensor,
    offset: int,
    sigma: float = 1.0,
    tau: int = 3,
    margin: float = 0.25,
    convention: str = "paper",
) -> torch.Tensor:
    """Per-row sums ``[B]`` of the order loss over the pairs ``(D[i], D_all[j])`` with ``j > offset + i``.

    The pairs run through :func:`order_loss` with explicit pairs on ``cat([D, D_all])``: an ``[M, n]``
    intermediate, fine for an oracle.
    """
    B, N = D.shape[0], D_all.shape[0]
    i, j = torch.meshgrid(torch.arange(B, device=D.device), torch.arange(N, device=D.device), indexing="ij")
    owned = j > offset + i
    pairs = torch.stack([i[owned], B + j[owned]], dim=1)
    losses = order_loss(
        torch.cat([D, D_all]), torch.cat([labels, labels_all]), pairs, sigma, tau, margin, convention, reduction="none"
    )
    return torch.zeros(B, dtype=losses.dtype, device=D.device).index_add(0, pairs[:, 0], losses)


def reduce_losses(losses: torch.Tensor, reduction: str) -> torch.Tensor:
    """``"none"``: as is; ``"sum"``; ``"mean"``, where an empty set gives 0 rather than NaN (docs/math.md §7).

    The oracle's own reduction, written plainly: the sum is accumulated in float64 and returned in float32
    for float16/bfloat16 losses, in their dtype otherwise. The reductions of the fused ops give the same
    value up to the order of the additions.
    """
    if reduction == "none":
        return losses
    total = losses.sum(dtype=torch.float64)
    if reduction == "mean":
        total = total / max(losses.shape[0], 1)
    return total.to(torch.promote_types(losses.dtype, torch.float32))
