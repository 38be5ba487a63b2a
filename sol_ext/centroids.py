"""Centroid rule and rank read-outs (docs/math.md §3, §8; paper eqs. 6 and 17).

The centroid of rank ``q`` is the P-weighted mean of all training embeddings,
``mu_q = sum_x P[r_x, q] h_x / sum_x P[r_x, q]``. It is computed from per-label sums
(``index_add_``) and the kernel ``P`` in ``O(N d + n^2 d)``, never with a loop over samples.

Two read-outs turn ``D`` into ranks:

* :func:`predict_ranks`, the paper's nearest expectation ``argmin_q D[x, q]`` (eq. 6);
* :func:`posterior_median_ranks` (the driver's default, not in the paper): the median of a rank
  posterior ``p(q | x) ∝ freq(q) exp(-D[x, q] / t)``. Eq. 6 is its limit for equal rank
  frequencies and ``t -> 0``; unlike eq. 6 it does not hand rare end ranks wide decision regions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from .ops import stochastic_dissimilarity

__all__ = ["embed", "compute_centroids", "damp_centroids", "centroid_span", "predict_ranks",
           "fill_missing_centroids", "dissimilarities", "RankPosterior", "fit_rank_posterior",
           "rank_posterior", "posterior_median_ranks", "median_ranks", "LABEL_NOISE_GRID",
           "LabelNoiseFit", "fit_label_noise", "fit_through_label_noise", "label_noise_kernel",
           "expected_ranks", "fit_rank_cuts", "cut_ranks"]


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


def predict_ranks(embeddings: torch.Tensor, centroids: torch.Tensor, sigma: float,
                  batch_size: int = 4096, backend: str = "auto") -> torch.Tensor:
    """The paper's read-out (eq. 6, ``--inference nearest``): ``argmin_q D[x, q]``, first
    minimum on ties. It ignores how common each rank is; see :func:`posterior_median_ranks`.

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
    """``D [N, n]`` (docs/math.md §3) of a whole set of embeddings ``[N, d]``, without gradient."""
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


def rank_posterior(dissimilarity: torch.Tensor, posterior: RankPosterior) -> torch.Tensor:
    """``[N, n]`` float64 probabilities ``p(q | x)`` of each row of ``D [N, n]``."""
    d = dissimilarity.detach().to(torch.float64)
    return log_posterior(d, posterior.log_prior.to(d), posterior.temperature).exp()


def median_ranks(probabilities: torch.Tensor) -> torch.Tensor:
    """``[N]`` int64 median of each row of ``[N, n]`` rank probabilities: the first ``q`` whose
    cumulative probability reaches 1/2 (the median minimizes the expected absolute error)."""
    below_half = probabilities.cumsum(dim=1) < 0.5
    return below_half.sum(dim=1).clamp(max=probabilities.shape[1] - 1).long()


def posterior_median_ranks(dissimilarity: torch.Tensor, posterior: RankPosterior) -> torch.Tensor:
    """The driver's ``--inference posterior`` read-out (not in the paper): the median rank of
    ``p(q | x)`` for each row of ``D [N, n]``.

    Returns ``[N]`` int64 ranks in ``0 … n-1``. The paper's read-out is :func:`predict_ranks`.
    """
    return median_ranks(rank_posterior(dissimilarity, posterior))


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
