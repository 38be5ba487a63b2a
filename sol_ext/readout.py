"""Rank read-outs: from dissimilarities ``D`` to rank probabilities and ranks (docs/math.md §3, §12).

:class:`sol_ext.SOLHead` is the one way to read ranks out of a trained model (``predict``,
``predict_proba``, ``expected_rank``, ``dissimilarity``); this module holds the functions it is built
on, for a ``D`` of your own:

* :func:`dissimilarities`: ``D`` of a whole set of embeddings, in batches, without gradient;
* :func:`fit_rank_posterior` and :func:`rank_posterior`: ``p(q | x) ∝ freq(q) exp(-D[x, q] / t)``
  (not in the paper), and :func:`median_ranks` / :func:`expected_ranks` of it. The paper's
  nearest read-out (eq. 6) is its limit for equal rank frequencies and ``t -> 0``, ``argmin_q D[x, q]``;
  unlike eq. 6 the median does not hand rare end ranks wide decision regions;
* :func:`fit_rank_cuts` and :func:`cut_ranks`: cuts on the expected rank fitted for least MAE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .ops import stochastic_dissimilarity

__all__ = ["dissimilarities", "RankPosterior", "fit_rank_posterior", "log_posterior", "rank_posterior",
           "median_ranks", "expected_ranks", "CUT_FITS", "fit_rank_cuts", "cut_ranks"]


def dissimilarities(embeddings: torch.Tensor, centroids: torch.Tensor, sigma: float,
                    batch_size: int = 4096, backend: str = "auto") -> torch.Tensor:
    """``D [N, n]`` (docs/math.md §3) of a whole set of embeddings ``[N, d]``, without gradient:
    :func:`sol_ext.stochastic_dissimilarity` in batches of ``batch_size`` rows."""
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
    log_likelihood: float = float("nan")   # mean per-sample log-likelihood of the fit


def log_posterior(d: torch.Tensor, log_prior: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[N, n]`` ``log p(q | x)`` of each row of ``D [N, n]`` for a prior and a temperature."""
    # D is defined up to a per-sample constant for the posterior: shift rows for stability
    d = d - d.min(dim=1, keepdim=True).values
    return torch.log_softmax(-d / temperature + log_prior, dim=1)


def fit_rank_posterior(dissimilarity: torch.Tensor, labels: torch.Tensor, num_ranks: int,
                       smoothing: float = 0.5, noise_kernel: Optional[torch.Tensor] = None,
                       prior_labels: Optional[torch.Tensor] = None) -> RankPosterior:
    """Fit the rank posterior of ``--inference posterior`` (not in the paper).

    The prior is the frequency of ``prior_labels`` (default ``labels``; plus ``smoothing`` per
    rank); the temperature maximizes the mean log-likelihood of ``labels`` over a grid of
    ``mean_x D[x, r_x] * 2**k``, ``k = -12 … 6``. Eq. 6 is the limit ``temperature -> 0`` with a
    uniform prior.

    With ``noise_kernel`` ``P`` the labels are taken as noisy draws ``r ~ P[q, ·]`` of the rank
    ``q`` (docs/math.md §2), and the likelihood is ``sum_q p(q | x) P[q, r_x]``: the posterior then
    describes the rank, not the noisy label, and comes out sharper.

    Args:
        dissimilarity: ``[N, n]`` ``D`` of the samples the temperature is fitted on (held-out
            samples give a calibrated temperature; training samples an over-confident one).
        labels: ``[N]`` their integer ranks.
        num_ranks: ``n``.
        smoothing: pseudo-count added to every rank's count (> 0, so no rank has prior 0).
        noise_kernel: ``[n, n]`` label-noise model, or ``None`` (labels taken as exact).
        prior_labels: ``[N']`` ranks whose frequencies form the prior (e.g. the training set).
    """
    d = dissimilarity.detach().to(torch.float64)
    labels = labels.to(d.device).long()
    prior_from = labels if prior_labels is None else prior_labels.to(d.device).long()
    counts = torch.bincount(prior_from, minlength=num_ranks).to(torch.float64) + smoothing
    log_prior = torch.log(counts / counts.sum())
    rows = torch.arange(labels.numel(), device=d.device)
    shifted = d - d.min(dim=1, keepdim=True).values
    scale = float(shifted[rows, labels].mean()) if labels.numel() else 0.0
    if not scale > 0.0:
        scale = float(shifted.mean()) if shifted.numel() and float(shifted.mean()) > 0 else 1.0
    log_noise = None
    if noise_kernel is not None:  # log P[q, r_x], [N, n]
        log_noise = noise_kernel.to(d).log()[:, labels].T
    best_ll, best_t = -float("inf"), scale
    for k in range(-12, 7):
        t = scale * 2.0 ** k
        logp = log_posterior(d, log_prior, t)
        per_sample = (logp[rows, labels] if log_noise is None
                      else torch.logsumexp(logp + log_noise, dim=1))
        ll = float(per_sample.mean()) if labels.numel() else 0.0
        if ll > best_ll:
            best_ll, best_t = ll, t
    return RankPosterior(log_prior=log_prior.to(dissimilarity.dtype), temperature=best_t,
                         log_likelihood=best_ll)


def rank_posterior(dissimilarity: torch.Tensor, posterior: RankPosterior) -> torch.Tensor:
    """``[N, n]`` float64 probabilities ``p(q | x)`` of each row of ``D [N, n]``."""
    d = dissimilarity.detach().to(torch.float64)
    return log_posterior(d, posterior.log_prior.to(d), posterior.temperature).exp()


def median_ranks(probabilities: torch.Tensor) -> torch.Tensor:
    """``[N]`` int64 median of each row of ``[N, n]`` rank probabilities: the first ``q`` whose
    cumulative probability reaches 1/2 (the median minimizes the expected absolute error)."""
    below_half = probabilities.cumsum(dim=1) < 0.5
    return below_half.sum(dim=1).clamp(max=probabilities.shape[1] - 1).long()


def expected_ranks(probabilities: torch.Tensor) -> torch.Tensor:
    """``[N]`` mean rank ``sum_q q p(q | x)`` of each row of ``[N, n]`` rank probabilities."""
    return probabilities @ torch.arange(probabilities.shape[1], dtype=probabilities.dtype,
                                        device=probabilities.device)


# How fit_rank_cuts places each cut: at the fewest errors counted on the rows themselves (default),
# or where a logistic fit of P(r > k | score) crosses 1/2.
CUT_FITS = ("count", "logistic")


@torch.no_grad()
def fit_rank_cuts(score: torch.Tensor, labels: torch.Tensor, num_ranks: int,
                  fit: str = "count") -> torch.Tensor:
    """``[n-1]`` float64 cuts ``c_k`` for the read-out ``rank = #{k : score > c_k}`` (:func:`cut_ranks`)
    against ``labels`` ``[N]`` (ranks ``0 … n-1``), from a score ``[N]`` that grows with the rank (the
    expected rank; docs/math.md §12.4a).

    ``|rank - r| = sum_k |[rank > k] - [r > k]|``: the MAE is a sum of the errors of ``n - 1`` yes/no
    questions "is the rank above k?", so each cut is fitted alone, as the score where "yes" becomes
    the likelier answer:

    * ``fit="count"`` (default): between two neighbouring distinct sorted scores (equal scores
      always fall on the same side), where the rows' own ``[r > k]`` are answered wrong fewest times
      (the middle one of equal candidates; errors counted in int64): the least MAE on the rows.
    * ``fit="logistic"``: where ``P(r > k | score) = sigmoid(a_k (score - c_k))``, fitted by maximum
      likelihood (Newton's method on the standardized score), crosses 1/2. Heavy label noise makes
      the error count along the sorted scores flat near its minimum, so that its argmin wanders
      with the noise; the fitted curve uses every row and wanders less, but where the curve is not
      logistic (a sharp score, labels piled up at the scale's ends) its crossing is off. It measured
      better under heavy synthetic noise and no better on real labels (docs/math.md §12.4a).

    A question every label answers alike gets a cut below every score (all "yes") or above every
    one (all "no"); so does one whose fitted slope is not positive, by its majority answer. A cut
    lower than the one before is raised to it, so that the read-out never skips a rank. Without
    rows the cuts are ``k + 1/2`` (the expected rank rounded).
    """
    if fit not in CUT_FITS:
        raise ValueError(f"fit must be one of {', '.join(CUT_FITS)}, got {fit!r}")
    if labels.numel() == 0 or num_ranks <= 1:
        return torch.arange(max(num_ranks - 1, 0), dtype=torch.float64, device=score.device) + 0.5
    s = score.detach().to(torch.float64)
    r = labels.to(s.device).long()
    if s.shape != r.shape:
        raise ValueError(f"score and labels must be [N] each, got {tuple(s.shape)} and {tuple(r.shape)}")
    low, high = int(r.min()), int(r.max())
    if low < 0 or high >= num_ranks:
        raise ValueError(f"labels must be ranks in 0 … {num_ranks - 1}, got values from {low} to {high}")
    cuts = _logistic_cuts(s, r, num_ranks) if fit == "logistic" else _counted_cuts(s, r, num_ranks)
    return torch.cummax(cuts, 0).values


# Newton's method of the logistic cuts: at most this many steps; a threshold stops when its step
# moves no parameter by more than this fraction of its size, or no longer lowers its loss by more
# than rounding (relative to the loss). The slope carries a ridge this small (per row), so that
# answers the score separates perfectly keep finite parameters.
_NEWTON_STEPS = 100
_NEWTON_TOLERANCE = 1e-9
_LOSS_ROUNDING = 1e-13
_SLOPE_RIDGE = 1e-8
_STEP_HALVINGS = 50  # a step still raising the loss after this many halvings is not taken
# Above this many rows the curves are fitted to this many rows spread evenly over the sorted scores:
# the cuts then move by a small fraction of the curve's width, and a fit costs the same for any N.
_LOGISTIC_ROWS = 1 << 16


def _logistic_cuts(s: torch.Tensor, r: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """Cut of each threshold ``k``: the crossing of the maximum-likelihood logistic curve of
    ``[r > k]`` on the score (:func:`fit_rank_cuts`)."""
    cuts = torch.where(_share_above(r, num_ranks) > 0.5, -math.inf, math.inf).to(s)  # the majority answer
    if r.numel() > _LOGISTIC_ROWS:
        order = torch.argsort(s, stable=True)
        picked = order[((torch.arange(_LOGISTIC_ROWS, dtype=torch.float64, device=s.device) + 0.5)
                        * (r.numel() / _LOGISTIC_ROWS)).long()]
        s, r = s[picked], r[picked]
    share = _share_above(r, num_ranks)  # of the rows the curves are fitted to
    fitted = torch.nonzero((share > 0) & (share < 1)).flatten()
    center, spread = s.mean(), s.std(unbiased=False)
    if not spread > 0 or fitted.numel() == 0:  # one score for every row, or no question to fit
        return cuts
    z = (s - center) / spread
    # [r > k] enters the likelihood only through the share of rows above k and the sum of their z
    # (over N): suffix sums over the ranks, in a fixed order (sorted by rank, then cumsum)
    by_rank = torch.argsort(r, stable=True)
    z_through = torch.cat([z.new_zeros(1), z[by_rank].cumsum(0)])  # sum of z over the i lowest ranks
    at_most = torch.bincount(r, minlength=num_ranks).cumsum(0)[:-1]  # rows of rank <= k
    z_share_above = (z_through[-1] - z_through[at_most]) / r.numel()
    slope, intercept = _fit_logistic(z, share[fitted], z_share_above[fitted])
    rising = slope > 0
    cuts[fitted] = torch.where(rising, center - spread * intercept / slope.where(rising, 1.0), cuts[fitted])
    return cuts


def _share_above(r: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """``[n-1]`` float64 share of ``r`` above each rank ``k = 0 … n-2``."""
    at_most = torch.bincount(r, minlength=num_ranks).cumsum(0)[:-1]
    return 1.0 - at_most.double() / r.numel()


def _fit_logistic(z: torch.Tensor, share: torch.Tensor,
                  z_share: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slope and intercept ``[K]`` of ``P(y = 1) = sigmoid(a z + b)``, one curve per threshold, from the
    scores ``z [N]`` and, per threshold, the share of rows with ``y = 1`` and the sum of their ``z``
    over ``N``: damped Newton steps on the mean negative log-likelihood plus ``_SLOPE_RIDGE a^2 / 2``,
    each threshold's step halved while its loss rises."""
    a = torch.ones_like(share)
    b = torch.log(share / (1 - share))  # 0 < share < 1: the curve of a flat score

    def loss(a_, b_, rows):
        logit = a_[:, None] * z[None, :] + b_[:, None]
        return (torch.nn.functional.softplus(logit).mean(dim=1) - a_ * z_share[rows] - b_ * share[rows]
                + 0.5 * _SLOPE_RIDGE * a_ * a_)

    active = torch.arange(a.numel(), device=a.device)  # thresholds still moving
    current = loss(a, b, active)
    for _ in range(_NEWTON_STEPS):
        a_k, b_k = a[active], b[active]
        p = torch.sigmoid(a_k[:, None] * z[None, :] + b_k[:, None])
        weight = p * (1 - p)
        g_a = (p * z).mean(dim=1) - z_share[active] + _SLOPE_RIDGE * a_k
        g_b = p.mean(dim=1) - share[active]
        h_aa = (weight * z * z).mean(dim=1) + _SLOPE_RIDGE
        h_ab = (weight * z).mean(dim=1)
        h_bb = weight.mean(dim=1)
        det = (h_aa * h_bb - h_ab * h_ab).clamp_min(torch.finfo(z.dtype).tiny)
        step_a = (h_bb * g_a - h_ab * g_b) / det
        step_b = (h_aa * g_b - h_ab * g_a) / det
        allowed = current[active] + _LOSS_ROUNDING * (1.0 + current[active].abs())
        scale = torch.ones_like(a_k)
        trial = loss(a_k - step_a, b_k - step_b, active)
        for _halving in range(_STEP_HALVINGS):
            worse = trial > allowed
            if not bool(worse.any()):
                break
            scale = torch.where(worse, scale / 2, scale)
            trial = torch.where(worse, loss(a_k - scale * step_a, b_k - scale * step_b, active), trial)
        taken = trial <= allowed
        scale = torch.where(taken, scale, 0.0)
        lowered = current[active] - trial > _LOSS_ROUNDING * (1.0 + current[active].abs())
        a[active], b[active] = a_k - scale * step_a, b_k - scale * step_b
        current[active] = torch.where(taken, trial, current[active])
        moved = torch.maximum((scale * step_a).abs() / (1.0 + a_k.abs()),
                              (scale * step_b).abs() / (1.0 + b_k.abs())) > _NEWTON_TOLERANCE
        active = active[taken & moved & lowered]
        if active.numel() == 0:
            break
    return a, b


def _counted_cuts(s: torch.Tensor, r: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """Cut of each threshold ``k`` at the fewest errors of ``[r > k]`` on the rows (:func:`fit_rank_cuts`)."""
    order = torch.argsort(s, stable=True)
    s, r = s[order], r[order]
    # candidate i puts the i lowest scores below the cut: possible only between distinct scores
    inf = torch.full((1,), math.inf, dtype=torch.float64, device=s.device)
    middle = (s[1:] + s[:-1]) / 2
    between = torch.cat([-inf, torch.where(middle < s[1:], middle, s[:-1]), inf])  # s[i-1] <= cut < s[i]
    possible = torch.cat([torch.ones(1, dtype=torch.bool, device=s.device), s[1:] > s[:-1],
                          torch.ones(1, dtype=torch.bool, device=s.device)])
    zero = torch.zeros(1, dtype=torch.int64, device=s.device)
    cuts = torch.empty(num_ranks - 1, dtype=torch.float64, device=s.device)
    for k in range(num_ranks - 1):
        above = (r > k).long()
        # "above" answered "no" below the cut, plus "not above" answered "yes" from the cut on
        below = 1 - above
        errors = torch.cat([zero, above.cumsum(0)]) + below.sum() - torch.cat([zero, below.cumsum(0)])
        errors = errors.masked_fill(~possible, r.numel() + 1)
        best = torch.nonzero(errors == errors.min()).flatten()
        cuts[k] = between[best[len(best) // 2]]
    return cuts


def cut_ranks(score: torch.Tensor, cuts: torch.Tensor) -> torch.Tensor:
    """``[N]`` int64 ranks ``#{k : score > cuts[k]}`` (see :func:`fit_rank_cuts`)."""
    return (score.to(torch.float64)[:, None] > cuts.to(score.device)[None, :]).sum(dim=1)
