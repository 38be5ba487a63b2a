"""``SOLHead``: SOL's state beside an encoder — centroids, the loss against them, and a read-out.

A training loop of one's own keeps one :class:`SOLHead` next to the encoder::

    head = sol_ext.SOLHead(num_ranks=62, embedding_dim=512)
    head.update_centroids(embed_all(encoder), all_labels)      # once, before the first epoch
    for epoch in range(epochs):
        for x, y in loader:
            loss = head.loss(encoder(x), y)                      # the stochastic order loss
            ...
        head.update(embed_all(encoder), all_labels)              # centroid rule + read-out
    ranks = head.predict(encoder(x_new))                         # posterior median (default)

It holds everything a prediction needs as buffers, so ``state_dict()``/``load_state_dict()`` save
and restore it with the encoder; the state dict also carries the settings the head was built with
(``sigma``, ``tau``, …), and ``load_state_dict`` refuses a state saved by a head built otherwise
(:meth:`SOLHead.from_state_dict` builds the head a state dict was saved from). The math is in
docs/math.md: the loss §3–§7, the centroid rule §8, the damped centroids, the rank posterior and
its median read-out §12.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from . import _validation as check
from .centroids import compute_centroids, damp_centroids
from .intervals import DEFAULT_SCORE, IntervalCalibration, LabelNoise, calibrate_intervals, rank_intervals
from .intervals import SCORES as INTERVAL_SCORES
from .intervals import TARGETS as INTERVAL_TARGETS
from .loss import StochasticOrderLoss
from .ops import noise_kernel
from .readout import (
    RankPosterior,
    cut_ranks,
    dissimilarities,
    expected_ranks,
    fit_rank_cuts,
    fit_rank_posterior,
    median_ranks,
    rank_posterior,
)

__all__ = ["SOLHead", "READOUTS", "SETTINGS"]

# "posterior": the median of p(q | x) ∝ freq(q) exp(-D[x, q] / t) (the default; not in the paper);
# "nearest": argmin_q D[x, q] (the paper's eq. 6); "cuts": the expected rank under p(q | x) against
# a cut per rank boundary fitted to labeled rows for least MAE (not in the paper).
READOUTS = ("posterior", "nearest", "cuts")

# The constructor arguments a head's state is saved with (all but backend and check_values, which
# choose how it computes, not what). The centroids and the read-out mean something only under the
# noise kernel (sigma) and normalization they were computed with, so a state is loaded only into a
# head built with the same settings.
SETTINGS = ("num_ranks", "embedding_dim", "sigma", "tau", "margin", "T", "disc_weight", "convention",
            "momentum", "normalize", "readout")
# nn.Module's key of get_extra_state() in a state dict
_EXTRA_STATE = "_extra_state"
# The buffers of a calibration of predict_interval, present once calibrate_intervals ran: the sorted
# scores, their cumulative weights, and (score, target, count) as int64 codes.
_INTERVAL_BUFFERS = ("interval_scores", "interval_weights", "interval_codes")


class SOLHead(nn.Module):
    """SOL's rank centroids, loss and read-out for embeddings of size ``embedding_dim``.

    Args:
        num_ranks: ``n`` (>= 1).
        embedding_dim: ``d`` of the embeddings ``h [B, d]`` (>= 1).
        sigma, tau, margin, T, disc_weight, convention: the loss's settings
            (:class:`sol_ext.StochasticOrderLoss`); ``tau`` defaults to 1, the driver's default
            (the paper's 3 lumps most pairs together on few ranks).
        momentum: centroid damping ``m``: after each :meth:`update_centroids` the centroids are
            ``normalize(m * old + (1 - m) * rule)``; 0 is the paper's wholesale replacement.
        normalize: L2-normalize the centroids (do so when the encoder's embeddings are).
        readout: what :meth:`predict` uses: ``"posterior"`` (default), ``"nearest"`` (eq. 6) or
            ``"cuts"`` (:meth:`fit_cuts`).
        backend, check_values: as for :class:`sol_ext.StochasticOrderLoss`.

    Buffers (all in ``state_dict()``): ``centroids [n, d]``, ``log_prior [n]`` and ``temperature``
    of the rank posterior, the ``cuts [n-1]`` of the ``"cuts"`` read-out, and the flags
    ``has_centroids``/``has_readout``. The state dict's
    ``_extra_state`` holds the :data:`SETTINGS` (:meth:`settings`, as JSON text in a uint8 tensor:
    a tensor, so that code that moves every entry with ``.cpu()`` and ``torch.load(...,
    weights_only=True)`` keep working); :meth:`load_state_dict` refuses a state whose settings
    differ from this head's, naming them, and loads state dicts saved without settings (by
    sol_ext before they were saved) unchecked.

    Labels are integer ranks in ``0 … n-1``, one per row of the embeddings they come with, as torch
    tensors or numpy arrays (converted); anything else is refused with an error naming the argument.
    """

    def __init__(self, num_ranks: int, embedding_dim: int, *, sigma: float = 1.0, tau: int = 1,
                 margin: float = 0.25, T: int = 1, disc_weight: float = 1.0,
                 convention: str = "paper", momentum: float = 0.5, normalize: bool = True,
                 readout: str = "posterior", backend: str = "auto", check_values: bool = True):
        super().__init__()
        self.criterion = StochasticOrderLoss(
            num_ranks, sigma=sigma, tau=tau, margin=margin, T=T, disc_weight=disc_weight,
            convention=convention, backend=backend, check_values=check_values)
        self.num_ranks = self.criterion.num_ranks
        self.embedding_dim = check.check_int("embedding_dim", embedding_dim, 1)
        self.momentum = check.check_nonnegative_float("momentum", momentum)
        if self.momentum >= 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be True or False, got {normalize!r}")
        self.normalize = normalize
        self.readout = check.check_choice("readout", readout, READOUTS)
        n, d = self.num_ranks, self.embedding_dim
        self.register_buffer("centroids", torch.zeros(n, d))
        # float64: the posterior is evaluated in float64 (see sol_ext.readout.rank_posterior)
        self.register_buffer("log_prior", torch.full((n,), -math.log(n), dtype=torch.float64))
        self.register_buffer("temperature", torch.ones((), dtype=torch.float64))
        # until fitted: the expected rank rounded
        self.register_buffer("cuts", torch.arange(max(n - 1, 0), dtype=torch.float64) + 0.5)
        self.register_buffer("has_centroids", torch.zeros((), dtype=torch.bool))
        self.register_buffer("has_readout", torch.zeros((), dtype=torch.bool))
        # has_centroids as a Python flag, for loss(): checked without reading the buffer (a host-device
        # synchronization on a GPU, and a graph break under torch.compile). Kept in step with the buffer
        # by update_centroids and load_state_dict.
        self._centroids_known = False

    # -- settings ----------------------------------------------------------------------------
    @property
    def sigma(self) -> float:
        return self.criterion.sigma

    @property
    def backend(self) -> str:
        return self.criterion.backend

    def settings(self) -> dict[str, Any]:
        """The :data:`SETTINGS` this head was built with (what :meth:`state_dict` saves)."""
        c = self.criterion
        return {"num_ranks": self.num_ranks, "embedding_dim": self.embedding_dim, "sigma": c.sigma,
                "tau": c.tau, "margin": c.margin, "T": c.T, "disc_weight": c.disc_weight,
                "convention": c.convention, "momentum": self.momentum, "normalize": self.normalize,
                "readout": self.readout}

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any], *, backend: str = "auto",
                        check_values: bool = True) -> "SOLHead":
        """The head a :meth:`state_dict` was saved from: built with its settings, then loaded."""
        if _EXTRA_STATE not in state_dict:
            raise ValueError("state_dict has no saved settings (it was saved by an earlier version of "
                             "sol_ext); build SOLHead(...) with the settings it was trained with and "
                             "call load_state_dict on it.")
        settings = _decode_settings(state_dict[_EXTRA_STATE])
        missing = [name for name in SETTINGS if name not in settings]
        if missing:
            raise ValueError(f"state_dict's saved settings lack {', '.join(missing)}; build SOLHead(...) "
                             f"with the settings it was trained with and call load_state_dict on it.")
        kwargs = {name: settings[name] for name in SETTINGS[2:]}
        head = cls(settings["num_ranks"], settings["embedding_dim"], backend=backend,
                   check_values=check_values, **kwargs)
        head.load_state_dict(state_dict)
        return head

    def kernel(self) -> torch.Tensor:
        """The noise kernel ``P [n, n]`` (float64) of the centroid rule and the loss."""
        return noise_kernel(self.num_ranks, self.sigma, dtype=torch.float64,
                            device=self.centroids.device)

    # -- training ----------------------------------------------------------------------------
    def loss(self, h: torch.Tensor, labels: torch.Tensor,
             pairs: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The stochastic order loss of a batch against the current centroids (fixed: no
        gradient reaches them). ``h [B, d]``, ``labels [B]`` int ranks, ``pairs`` as for
        :class:`sol_ext.StochasticOrderLoss`."""
        self._require("centroids", "loss")
        if not isinstance(labels, torch.Tensor) and isinstance(h, torch.Tensor):
            labels = _as_tensor("labels", labels, h.device)  # the loss checks them
        return self.criterion(h, labels, self.centroids.detach().to(h.dtype), pairs=pairs)

    forward = loss

    @torch.no_grad()
    def update_centroids(self, h: torch.Tensor, labels: torch.Tensor,
                         all_reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                         ) -> torch.Tensor:
        """The centroid rule over the whole training set, damped with the current centroids
        (none before the first call: then the rule's centroids as they are).

        Args:
            h: ``[N, d]`` embeddings of every training sample (encoder in eval mode).
            labels: ``[N]`` their integer ranks.
            all_reduce: in data-parallel training, sums a tensor over the processes; ``h`` and
                ``labels`` are then this process's share (see :func:`sol_ext.centroids.compute_centroids`).

        Returns:
            the new centroids ``[n, d]`` (also stored in the buffer).
        """
        self._check_embeddings("h", h)
        check.check_finite("h", h)  # a NaN would spread to every centroid its label weights
        labels = self._check_labels("labels", labels, "h", h)
        previous = self.centroids.to(h.device) if bool(self.has_centroids) else None
        rule = compute_centroids(h, labels, self.kernel().to(h.device), previous=previous,
                                 all_reduce=all_reduce)
        self.centroids = damp_centroids(previous, rule, self.momentum, normalize=self.normalize)
        self.has_centroids.fill_(True)
        self._centroids_known = True
        return self.centroids

    @torch.no_grad()
    def fit_readout(self, h: torch.Tensor, labels: torch.Tensor,
                    prior_labels: Optional[torch.Tensor] = None, *, cuts: bool = True) -> RankPosterior:
        """Fit the rank posterior ``p(q | x) ∝ freq(q) exp(-D[x, q] / t)`` of :meth:`predict_proba`,
        then (``cuts=True``) the cuts of the ``"cuts"`` read-out on the same rows (:meth:`fit_cuts`).
        :meth:`update` fits the posterior on a validation split with ``cuts=False`` and the cuts
        on the training rows, which measured better than a validation split's.

        Args:
            h: ``[M, d]`` embeddings the temperature ``t`` is fitted on: held-out samples give a
                calibrated ``t``; the samples the encoder was fitted to an over-confident one.
            labels: ``[M]`` their integer ranks.
            prior_labels: ranks whose frequencies form the prior ``freq(q)`` (default ``labels``;
                pass the training labels when ``h`` is a validation split).
        """
        self._require("centroids", "fit_readout")
        self._check_embeddings("h", h)
        labels = self._check_labels("labels", labels, "h", h)
        if prior_labels is not None:
            prior_labels = _as_tensor("prior_labels", prior_labels, h.device)
            prior_labels = check.check_ranks("prior_labels", prior_labels, self.num_ranks)
        d = self.dissimilarity(h)
        posterior = fit_rank_posterior(d, labels, self.num_ranks, prior_labels=prior_labels)
        self.log_prior = posterior.log_prior.to(torch.float64)
        self.temperature = torch.tensor(posterior.temperature, dtype=torch.float64,
                                        device=self.log_prior.device)
        self.has_readout.fill_(True)
        if cuts:
            self.fit_cuts(h, labels, probabilities=self.probabilities(d))  # D of these rows once
        return posterior

    @torch.no_grad()
    def fit_cuts(self, h: torch.Tensor, labels: torch.Tensor,
                 probabilities: Optional[torch.Tensor] = None, fit: str = "count") -> torch.Tensor:
        """Fit the ``"cuts"`` read-out to labeled rows: ``rank = #{k : E[q | x] > c_k}``, each cut
        ``c_k`` placed where "is the rank above k?" is answered wrong for fewest of ``labels``
        (:func:`sol_ext.readout.fit_rank_cuts`). The MAE is the sum of those errors, so this
        is the read-out of least MAE on the rows among all that threshold the expected rank; the
        prior pulls the posterior median toward the common ranks, the cuts do not.

        :meth:`fit_readout` fits the cuts on its rows; :meth:`update` fits them on the training
        rows. Needs the rank posterior (:meth:`fit_readout`) first. ``probabilities``:
        :meth:`predict_proba` of ``h`` where already computed. ``fit="logistic"`` places each cut
        where a logistic curve of the answers crosses 1/2 instead (``fit_rank_cuts``; better under
        heavy label noise on tabular data, docs/math.md §12.4a; :meth:`update` and :meth:`fit_readout`
        refit with the count, so call it after them). Returns the cuts ``[n-1]``.
        """
        self._require("readout", "fit_cuts")
        self._check_embeddings("h", h)
        check.check_finite("h", h)  # one NaN row would make every cut above it NaN
        labels = self._check_labels("labels", labels, "h", h)
        if probabilities is None:
            probabilities = self.predict_proba(h)
        elif probabilities.shape != (h.shape[0], self.num_ranks):
            raise ValueError(f"probabilities must be predict_proba(h) [{h.shape[0]}, {self.num_ranks}], got "
                             f"{tuple(probabilities.shape)}")
        self.cuts = fit_rank_cuts(expected_ranks(probabilities), labels, self.num_ranks,
                                  fit=fit).to(self.log_prior.device)
        return self.cuts

    def update(self, h: torch.Tensor, labels: torch.Tensor, val_h: Optional[torch.Tensor] = None,
               val_labels: Optional[torch.Tensor] = None, *,
               all_reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
               gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        """End of an epoch: :meth:`update_centroids` on the training set ``(h, labels)``, then
        :meth:`fit_readout` on the validation split ``(val_h, val_labels)`` when given (better
        calibrated), else on the training set; the prior is the training labels' frequency, and
        the cuts (:meth:`fit_cuts`) are fitted on the training set.

        In data-parallel training each process passes its share of the rows, with ``all_reduce`` (sums
        a tensor over the processes, for the centroid rule) and ``gather`` (concatenates a tensor's rows
        over the processes, for the read-out); :func:`sol_ext.distributed.update_head` passes both.
        Every argument is checked before the first of them runs."""
        if (val_h is None) != (val_labels is None):
            raise ValueError("pass val_h and val_labels together, or neither.")
        # every argument is checked before the centroids change: a refused update leaves the head as it was
        self._check_embeddings("h", h)
        labels = self._check_labels("labels", labels, "h", h)
        if val_h is not None:
            self._check_embeddings("val_h", val_h)
            val_labels = self._check_labels("val_labels", val_labels, "val_h", val_h)
        self.update_centroids(h, labels, all_reduce=all_reduce)
        if gather is not None:  # the read-out is fitted on every process's rows
            h, labels = gather(h), gather(labels)
            if val_h is not None:
                val_h, val_labels = gather(val_h), gather(val_labels)
        if val_h is None:
            self.fit_readout(h, labels)
        else:
            self.fit_readout(val_h, val_labels, prior_labels=labels, cuts=False)
            self.fit_cuts(h, labels)

    # -- prediction --------------------------------------------------------------------------
    def dissimilarity(self, h: torch.Tensor) -> torch.Tensor:
        """``D [B, n]`` of embeddings ``h [B, d]`` to the head's centroids (no gradient): the read-outs'
        input. For ``D`` with gradient against centroids of your own, :func:`sol_ext.stochastic_dissimilarity`."""
        self._require("centroids", "dissimilarity")
        self._check_embeddings("h", h)
        return dissimilarities(h, self.centroids.to(h.device, h.dtype), self.sigma,
                               backend=self.backend)

    @property
    def posterior(self) -> RankPosterior:
        """The fitted rank posterior (after :meth:`fit_readout` or :meth:`update`)."""
        self._require("readout", "posterior")
        return RankPosterior(log_prior=self.log_prior, temperature=float(self.temperature))

    def probabilities(self, dissimilarity: torch.Tensor) -> torch.Tensor:
        """``p(q | x)`` ``[B, n]`` float64 from ``D [B, n]`` (see :meth:`predict_proba`)."""
        return rank_posterior(dissimilarity, self.posterior)

    def predict_proba(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` float64 rank probabilities ``p(q | x)`` of embeddings ``h [B, d]``."""
        return self.probabilities(self.dissimilarity(h))

    def predict(self, h: torch.Tensor, readout: Optional[str] = None) -> torch.Tensor:
        """``[B]`` int64 ranks of embeddings ``h [B, d]``: the median of :meth:`predict_proba`
        (``readout="posterior"``), ``argmin_q D[x, q]`` (``"nearest"``, eq. 6; the first
        minimum on ties), or the expected rank against the fitted cuts (``"cuts"``,
        :meth:`fit_cuts`). Default: the head's ``readout``."""
        return self.ranks(self.dissimilarity(h), readout=readout)

    def ranks(self, dissimilarity: torch.Tensor, probabilities: Optional[torch.Tensor] = None,
              readout: Optional[str] = None) -> torch.Tensor:
        """:meth:`predict` from ``D [B, n]``; ``probabilities``, :meth:`probabilities` of that
        ``D``, are reused when given (the posterior read-out needs them)."""
        readout = self.readout if readout is None else check.check_choice("readout", readout, READOUTS)
        if readout == "nearest":
            return torch.argmin(dissimilarity, dim=1)  # the first minimum on ties
        if probabilities is None:
            probabilities = self.probabilities(dissimilarity)
        if readout == "cuts":
            return cut_ranks(expected_ranks(probabilities), self.cuts)
        return median_ranks(probabilities)

    def expected_rank(self, h: torch.Tensor) -> torch.Tensor:
        """``[B]`` float64 mean rank ``sum_q q p(q | x)``."""
        return expected_ranks(self.predict_proba(h))

    # -- intervals -----------------------------------------------------------------------------
    @torch.no_grad()
    def calibrate_intervals(self, h: torch.Tensor, labels: torch.Tensor, *, score: str = DEFAULT_SCORE,
                            target: str = "labels", label_noise: LabelNoise = None,
                            deconvolve: bool = True) -> IntervalCalibration:
        """Calibrate :meth:`predict_interval` by split conformal prediction on held-out embeddings
        ``h [M, d]`` (rows the encoder and the head did not train on) and their labels as ranks ``[M]``.
        The calibration is kept in the head's buffers, so it is saved with ``state_dict()``.

        ``score``: ``"hpd"``, ``"cumulative"`` or ``"absolute"``; ``target="clean"`` with ``label_noise``
        (the labels' noise std in ranks, or a matrix) aims the coverage at the clean rank, deconvolving
        the head's probabilities through that noise as far as the labels say (``deconvolve=False``:
        not at all; :mod:`sol_ext.intervals`, docs/intervals.md).
        """
        labels = self._check_labels("labels", labels, "h", h)
        calibration = calibrate_intervals(self.predict_proba(h), labels, score=score, target=target,
                                          label_noise=label_noise, deconvolve=deconvolve)
        codes = torch.tensor([INTERVAL_SCORES.index(calibration.score), INTERVAL_TARGETS.index(calibration.target),
                              calibration.count])
        device = self.centroids.device
        for name, value in zip(_INTERVAL_BUFFERS, (calibration.scores, calibration.cumulative_weights, codes)):
            self.register_buffer(name, value.to(device))
        return calibration

    @property
    def interval_calibration(self) -> Optional[IntervalCalibration]:
        """The calibration of :meth:`predict_interval` (None before :meth:`calibrate_intervals`)."""
        if not hasattr(self, "interval_codes"):
            return None
        score, target, count = (int(c) for c in self.interval_codes)
        return IntervalCalibration(score=INTERVAL_SCORES[score], target=INTERVAL_TARGETS[target],
                                   scores=self.interval_scores.cpu(), cumulative_weights=self.interval_weights.cpu(),
                                   count=count, num_ranks=self.num_ranks)

    @torch.no_grad()
    def predict_interval(self, h: torch.Tensor, coverage: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lower, upper)``: ``[B]`` int64 ranks of a contiguous interval per row of embeddings
        ``h [B, d]`` that holds the label (or the clean rank, by the calibration's target) with
        probability ``coverage``, after :meth:`calibrate_intervals`. A calibration of too few rows for
        ``coverage`` makes every interval the whole scale, with a
        :class:`~sol_ext.intervals.CalibrationSizeWarning`."""
        calibration = self.interval_calibration
        if calibration is None:
            raise RuntimeError("SOLHead.predict_interval: the head has no interval calibration yet; call "
                               "calibrate_intervals() on held-out embeddings and labels first.")
        return rank_intervals(self.predict_proba(h), calibration, coverage)

    # -- saving --------------------------------------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        """The :meth:`settings` as JSON text in a uint8 tensor (the state dict's ``_extra_state``)."""
        return torch.tensor(list(json.dumps(self.settings(), sort_keys=True).encode()), dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        """Check saved settings against this head's (they are fixed at construction)."""
        problem = self._settings_problem(state)
        if problem:
            raise ValueError(problem)

    def _settings_problem(self, saved: Any) -> str:
        """Why a state with the saved settings ``saved`` cannot load into this head ('' if it can)."""
        try:
            settings = _decode_settings(saved)
        except ValueError as err:
            return str(err)
        mine = self.settings()
        differ = [f"{name} {settings[name]!r} saved, {mine[name]!r} here" for name in SETTINGS
                  if name in settings and settings[name] != mine[name]]
        if not differ:
            return ""
        return (f"the state was saved by a SOLHead with other settings ({'; '.join(differ)}); build this "
                f"head with the saved settings, or load it with SOLHead.from_state_dict(state_dict)")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        settings_key = prefix + _EXTRA_STATE
        if settings_key in state_dict:
            problem = self._settings_problem(state_dict[settings_key])
            if problem:  # load nothing: torch raises every collected error after the whole model
                error_msgs.append(problem)
                return
        # keep the saved centroids' dtype (float64 embeddings give float64 centroids): loading
        # would otherwise copy them into this head's float32 buffer
        saved = state_dict.get(prefix + "centroids")
        if isinstance(saved, torch.Tensor) and saved.shape == self.centroids.shape:
            self.centroids = torch.empty_like(saved, device=self.centroids.device)
        # an interval calibration is part of the state it was saved with: take it, or drop this head's
        for name in _INTERVAL_BUFFERS:
            saved = state_dict.get(prefix + name)
            if isinstance(saved, torch.Tensor):
                self.register_buffer(name, torch.empty_like(saved, device=self.centroids.device))
            elif hasattr(self, name):
                delattr(self, name)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._centroids_known = bool(self.has_centroids)
        if settings_key not in state_dict and settings_key in missing_keys:
            missing_keys.remove(settings_key)  # saved before heads saved their settings: load unchecked
        if prefix + "cuts" in missing_keys and self.readout != "cuts":
            missing_keys.remove(prefix + "cuts")  # saved before the cuts read-out, which it does not use

    # -- checks ------------------------------------------------------------------------------
    def _require(self, what: str, caller: str) -> None:
        if what == "centroids" and self._centroids_known:  # no read of the buffer (see __init__)
            return
        if what == "centroids" and check.tracing():  # torch.compile cannot branch on the buffer's value
            ready = False
        else:
            ready = bool(self.has_centroids if what == "centroids" else self.has_readout)
        if what == "centroids":
            self._centroids_known = ready
        if not ready:
            first = "update_centroids() or update()" if what == "centroids" else "fit_readout() or update()"
            raise RuntimeError(f"SOLHead.{caller}: the head has no {what} yet; call {first} on the "
                               f"training embeddings first (or load_state_dict of a trained head).")

    def _check_embeddings(self, name: str, h: torch.Tensor) -> None:
        if not isinstance(h, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of embeddings [N, {self.embedding_dim}], got "
                            f"{type(h).__name__}")
        if h.dim() != 2 or h.shape[1] != self.embedding_dim:
            raise ValueError(f"{name} must be embeddings [N, {self.embedding_dim}] (embedding_dim), got "
                             f"{tuple(h.shape)}")
        if not h.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor of embeddings, got {h.dtype}")

    def _check_labels(self, name: str, labels: Any, rows_name: str, rows: torch.Tensor) -> torch.Tensor:
        """``labels`` as int64 ranks ``[N]`` in ``0 … n-1``, one per row of embeddings ``rows [N, d]``."""
        labels = _as_tensor(name, labels, rows.device)
        if labels.dim() == 1 and labels.shape[0] != rows.shape[0]:
            raise ValueError(f"{name} must hold one rank per row of {rows_name}: {rows_name} has "
                             f"{rows.shape[0]} rows, {name} has {labels.shape[0]} values")
        return check.check_ranks(name, labels, self.num_ranks, length=rows.shape[0]).to(rows.device)

    def extra_repr(self) -> str:
        return (f"num_ranks={self.num_ranks}, embedding_dim={self.embedding_dim}, "
                f"momentum={self.momentum}, normalize={self.normalize}, readout={self.readout!r}")


def _as_tensor(name: str, labels: Any, device: torch.device) -> torch.Tensor:
    """Integer ranks as a tensor: a tensor as it is, a numpy array or sequence converted onto ``device``."""
    if isinstance(labels, torch.Tensor):
        return labels
    array = np.asarray(labels)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be integer ranks (a torch.Tensor or numpy array of integers), got "
                        f"{type(labels).__name__} of dtype {array.dtype}")
    return torch.as_tensor(np.ascontiguousarray(array), device=device)


def _decode_settings(saved: Any) -> dict[str, Any]:
    """The settings dict of :meth:`SOLHead.get_extra_state`'s tensor."""
    if isinstance(saved, torch.Tensor) and saved.dtype == torch.uint8 and saved.dim() == 1:
        try:
            settings = json.loads(bytes(saved.tolist()).decode())
        except (UnicodeDecodeError, ValueError):
            settings = None
        if isinstance(settings, dict):
            return settings
    raise ValueError(f"the state dict's {_EXTRA_STATE} is not the settings of a SOLHead (JSON text in a "
                     f"uint8 tensor), got {type(saved).__name__}")
