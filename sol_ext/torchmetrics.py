"""The metrics of :mod:`sol_ext.metrics` as ``torchmetrics.Metric`` classes, for training loops and
Lightning: accumulate with ``update(pred, true)`` over batches, read with ``compute()``.

::

    from sol_ext.torchmetrics import MAE, CumulativeScore, MacroMAE, QuadraticWeightedKappa

    qwk = QuadraticWeightedKappa(num_ranks=8)
    for x, ranks in loader:
        qwk.update(head.predict(model(x)), ranks)   # [B] predicted ranks, [B] true ranks
    qwk.compute()                                   # tensor(0.83, dtype=torch.float64)

Each metric gives the value of its :mod:`sol_ext.metrics` function on all the samples passed to
``update`` (the same definitions, float64 sums): :class:`MAE` = :func:`~sol_ext.metrics.mae`,
:class:`CumulativeScore` = :func:`~sol_ext.metrics.cumulative_score` (percent within ``theta``),
:class:`MacroMAE` = :func:`~sol_ext.metrics.macro_mae`, :class:`MaximumMAE`
= :func:`~sol_ext.metrics.maximum_mae`, :class:`QuadraticWeightedKappa` =
:func:`~sol_ext.metrics.quadratic_weighted_kappa` and :class:`RankedProbabilityScore`
= :func:`~sol_ext.metrics.ranked_probability_score`, which takes probabilities ``[N, K]`` in place of
predictions. Their states are sums (``dist_reduce_fx="sum"``), so under DDP ``compute()`` gives the
value on the samples of every process together. All but :class:`MAE` and :class:`CumulativeScore` keep
per-rank sums or a ``K x K`` confusion matrix and take ``num_ranks`` ``K``; true values are then
integer ranks ``0 … K-1`` (map labels with :class:`sol_ext.LabelGrid` first).

``pred`` and ``true`` are 1-D tensors ``[N]`` (``[N, 1]`` is accepted) of any real or integer dtype;
they are moved to the metric's device. With ``validate_args=True`` (the default) non-finite values
and ranks out of range are refused with a ``ValueError``; on a GPU that check waits for the batch
(one host-device synchronization per ``update``). ``validate_args=False`` skips the finiteness check;
the ranks are still checked, on the CPU as by default and on a GPU by a device-side assertion (a wrong
rank stops the program at the next synchronization instead of counting in another rank's cell). The
states are float64 or int64, so the metrics run where float64 does (CPU, CUDA); a metric on the
``meta`` device has no values to count and refuses ``update``.

This module needs torchmetrics (``pip install 'sol_ext[torchmetrics]'``); the rest of the package
does not.
"""

from __future__ import annotations

try:
    from torchmetrics import Metric
except ImportError as exc:
    raise ImportError("sol_ext.torchmetrics needs torchmetrics: pip install 'sol_ext[torchmetrics]' "
                      "(or pip install torchmetrics).") from exc

import math
import numbers
from typing import Any

import torch

__all__ = ["MAE", "MacroMAE", "MaximumMAE", "QuadraticWeightedKappa", "CumulativeScore", "RankedProbabilityScore"]


def _check_num_ranks(num_ranks: Any) -> int:
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, numbers.Integral) or num_ranks < 1:
        raise ValueError(f"num_ranks must be an integer >= 1 (the number of ranks K), got {num_ranks!r}")
    return int(num_ranks)


def _check_device(metric: Metric, device: torch.device) -> None:
    """A metric moved to the meta device holds no numbers: counting samples there cannot work."""
    if device.type == "meta":
        raise RuntimeError(f"{type(metric).__name__}.update needs a device that holds data (cpu, cuda), got the "
                           f"meta device; move the metric with .to('cpu') or .to('cuda') before updating it")


def _as_vector(x: Any, name: str, device: torch.device) -> torch.Tensor:
    """``x`` as a float64 vector ``[N]`` on ``device``; ``[N, 1]`` is flattened, other shapes refused."""
    t = torch.as_tensor(x)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
    if t.ndim == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.ndim != 1:
        raise ValueError(f"{name} must be a 1-D vector [N], got shape {tuple(t.shape)}")
    return t.to(device=device, dtype=torch.float64)


class _PairMetric(Metric):
    """Shared input handling: ``update(pred [N], true [N])`` with the checks of :mod:`sol_ext.metrics`."""

    is_differentiable = False
    full_state_update = False

    def __init__(self, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validate_args = bool(validate_args)

    def _pair(self, pred: Any, true: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        _check_device(self, device)
        p = _as_vector(pred, "pred", device)
        t = _as_vector(true, "true", device)
        if p.shape != t.shape:
            raise ValueError(f"pred and true must have the same length, got {p.shape[0]} and {t.shape[0]}")
        if self.validate_args:
            for name, a in (("pred", p), ("true", t)):
                bad = torch.nonzero(~torch.isfinite(a))
                if bad.numel():
                    i = int(bad[0, 0])
                    raise ValueError(f"{name} contains a non-finite value ({float(a[i])}) at index {i}")
        return p, t

    def _check_ranks(self, a: torch.Tensor, name: str, num_ranks: int) -> None:
        """Refuse values of ``a`` that are not integer ranks ``0 … num_ranks-1``: they would land in
        another rank's cell. Without ``validate_args`` on a GPU the device asserts it (no waiting for
        the batch); on the CPU there is no synchronization to save, so it is always checked."""
        wrong = (a != torch.round(a)) | (a < 0) | (a >= num_ranks)
        if not self.validate_args and a.device.type != "cpu":
            torch._assert_async(~wrong.any(), f"{name} must hold integer ranks 0 … {num_ranks - 1}")
            return
        off = torch.nonzero(wrong)
        if off.numel():
            i = int(off[0, 0])
            raise ValueError(f"{name} must hold integer ranks 0 … num_ranks-1 = 0 … {num_ranks - 1}, "
                             f"got {float(a[i])} at index {i}; map label values to ranks first "
                             f"(rank = round((value - min) / step))")

    def forward(self, pred: Any, true: Any) -> torch.Tensor:
        """The value on this batch alone, the batch also added to the state (torchmetrics' ``forward``).
        A batch without samples has no value: refused before the state is touched (torchmetrics would
        reset the state for the batch and lose it when ``compute`` raised); ``update`` takes it."""
        if torch.as_tensor(pred).numel() == 0:
            raise ValueError("forward(pred, true) got a batch without samples, which has no value of its own; "
                             "add it with update(pred, true) (a no-op) and read compute() for the samples so far")
        return super().forward(pred, true)

    @staticmethod
    def _need_samples(count: torch.Tensor) -> None:
        if int(count) == 0:
            raise ValueError("no samples: call update(pred, true) with at least one sample before compute()")


class MAE(_PairMetric):
    """Mean absolute error ``mean |pred - true|``, in the units of the inputs (= :func:`sol_ext.metrics.mae`).

    States: ``sum_abs_error`` (float64) and ``count`` (int64), summed over processes.
    """

    higher_is_better = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("sum_abs_error", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, true: torch.Tensor) -> None:
        """Add the samples ``pred [N]``, ``true [N]`` (N may be 0)."""
        p, t = self._pair(pred, true, self.sum_abs_error.device)
        self.sum_abs_error += (p - t).abs().sum()
        self.count += p.numel()

    def compute(self) -> torch.Tensor:
        """The MAE of every sample so far, a float64 scalar tensor."""
        self._need_samples(self.count)
        return self.sum_abs_error / self.count


class CumulativeScore(_PairMetric):
    """CS@theta, the accuracy within ``theta``: the percentage (0–100) of samples with
    ``|pred - true| <= theta`` (= :func:`sol_ext.metrics.cumulative_score`, with its relative slack
    of 1e-9 so that decimal thresholds count exactly).

    Args:
        theta: the threshold, finite and >= 0, in the units of the inputs (e.g. 1 for "within one rank").

    States: ``within`` and ``count`` (int64), summed over processes, and ``threshold`` (``theta``).
    """

    higher_is_better = True

    def __init__(self, theta: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not math.isfinite(theta) \
                or theta < 0:
            raise ValueError(f"theta must be a finite number >= 0, got {theta!r}")
        self.theta = float(theta)
        # the same limit as sol_ext.metrics: 0.55 - 0.30 must count as within 0.25
        self._limit = self.theta + 1e-9 * max(1.0, abs(self.theta))
        self.add_state("within", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        # theta as a state too: a MetricCollection shares one compute group between metrics whose states
        # are equal after the first update, whatever their arguments, and two thresholds that counted
        # alike on that batch would then report one value for good
        self.add_state("threshold", default=torch.tensor(self.theta, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, pred: torch.Tensor, true: torch.Tensor) -> None:
        """Add the samples ``pred [N]``, ``true [N]`` (N may be 0)."""
        p, t = self._pair(pred, true, self.within.device)
        self.within += ((p - t).abs() <= self._limit).sum()
        self.count += p.numel()

    def compute(self) -> torch.Tensor:
        """CS@theta in percent of every sample so far, a float64 scalar tensor."""
        self._need_samples(self.count)
        return 100.0 * self.within.double() / self.count


class MacroMAE(_PairMetric):
    """Macro-averaged MAE: the mean over the true ranks present of the MAE of their samples, so a
    rare rank weighs as much as a common one (= :func:`sol_ext.metrics.macro_mae`).

    Args:
        num_ranks: ``K``; true values must be integer ranks ``0 … K-1``. Predictions may be any real
            numbers in rank units (predicted ranks, expected ranks).

    States: ``sum_abs_error [K]`` (float64) and ``count [K]`` (int64) per true rank, summed over
    processes; :meth:`per_rank` gives the MAE of each rank.
    """

    higher_is_better = False

    def __init__(self, num_ranks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_ranks = _check_num_ranks(num_ranks)
        self.add_state("sum_abs_error", default=torch.zeros(num_ranks, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros(num_ranks, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, true: torch.Tensor) -> None:
        """Add the samples ``pred [N]``, ``true [N]`` (integer ranks; N may be 0)."""
        p, t = self._pair(pred, true, self.count.device)
        self._check_ranks(t, "true", self.num_ranks)
        ranks = t.long()
        self.sum_abs_error.index_add_(0, ranks, (p - t).abs())
        self.count += torch.bincount(ranks, minlength=self.num_ranks)

    def per_rank(self) -> torch.Tensor:
        """``[K]`` float64: the MAE of the samples of each true rank, NaN for a rank with none."""
        return torch.where(self.count > 0, self.sum_abs_error / self.count.clamp(min=1),
                           torch.full_like(self.sum_abs_error, float("nan")))

    def compute(self) -> torch.Tensor:
        """The macro-MAE of every sample so far, a float64 scalar tensor."""
        self._need_samples(self.count.sum())
        present = self.count > 0
        return (self.sum_abs_error[present] / self.count[present]).mean()



class MaximumMAE(MacroMAE):
    """The worst per-rank MAE (MMAE): the largest, over the true ranks present, of the MAE of their
    samples (= :func:`sol_ext.metrics.maximum_mae`).

    Args:
        num_ranks: ``K``; true values must be integer ranks ``0 … K-1``. Predictions may be any real
            numbers in rank units.

    States: those of :class:`MacroMAE`, per true rank.
    """

    def compute(self) -> torch.Tensor:
        """The largest per-rank MAE of every sample so far, a float64 scalar tensor."""
        self._need_samples(self.count.sum())
        present = self.count > 0
        return (self.sum_abs_error[present] / self.count[present]).max()



class QuadraticWeightedKappa(_PairMetric):
    """Cohen's kappa with quadratic weights between integer ranks: 1 for perfect agreement, 0 for
    chance (= :func:`sol_ext.metrics.quadratic_weighted_kappa`, and so scikit-learn's
    ``cohen_kappa_score(true, pred, weights="quadratic", labels=range(K))``).

    Args:
        num_ranks: ``K``; predictions and true values must both be integer ranks ``0 … K-1``.

    State: ``confusion [K, K]`` (int64; rows the true rank, columns the predicted one), summed over
    processes. ``compute()`` is NaN when both inputs are the same constant (agreement by chance is
    already perfect) and 0 when both are constant and differ, as in :mod:`sol_ext.metrics`.
    """

    higher_is_better = True

    def __init__(self, num_ranks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_ranks = _check_num_ranks(num_ranks)
        self.add_state("confusion", default=torch.zeros(num_ranks, num_ranks, dtype=torch.int64),
                       dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, true: torch.Tensor) -> None:
        """Add the samples ``pred [N]``, ``true [N]`` (integer ranks; N may be 0)."""
        p, t = self._pair(pred, true, self.confusion.device)
        self._check_ranks(p, "pred", self.num_ranks)
        self._check_ranks(t, "true", self.num_ranks)
        cells = t.long() * self.num_ranks + p.long()
        self.confusion += torch.bincount(cells, minlength=self.num_ranks ** 2).view(self.num_ranks, -1)

    def compute(self) -> torch.Tensor:
        """The kappa of every sample so far, a float64 scalar tensor.

        The same closed form as :mod:`sol_ext.metrics`: ``1 - mean((p - t)^2) / (var p + var t +
        (mean p - mean t)^2)``, here with every moment read from the confusion matrix.
        """
        counts = self.confusion.double()
        n = counts.sum()
        self._need_samples(n)
        ranks = torch.arange(self.num_ranks, dtype=torch.float64, device=counts.device)
        true_share, pred_share = counts.sum(1) / n, counts.sum(0) / n
        if int((true_share > 0).sum()) == 1 and int((pred_share > 0).sum()) == 1:
            same = bool(torch.equal(true_share, pred_share))
            return torch.tensor(float("nan") if same else 0.0, dtype=torch.float64, device=counts.device)
        observed = (counts * (ranks[:, None] - ranks[None, :]) ** 2).sum() / n
        mean_t, mean_p = (true_share * ranks).sum(), (pred_share * ranks).sum()
        chance = ((true_share * (ranks - mean_t) ** 2).sum() + (pred_share * (ranks - mean_p) ** 2).sum()
                  + (mean_p - mean_t) ** 2)
        return 1.0 - observed / chance



class RankedProbabilityScore(_PairMetric):
    """The ranked probability score of rank probabilities, lower is better (=
    :func:`sol_ext.metrics.ranked_probability_score`): the mean over the samples of
    ``sum_k (F(k) - [true <= k])^2``, ``F`` the predicted cumulative distribution.

    Args:
        num_ranks: ``K``; ``update(probs [N, K], true [N])`` with true integer ranks ``0 … K-1``.

    States: ``sum_score`` (float64) and ``count`` (int64), summed over processes.
    """

    higher_is_better = False

    def __init__(self, num_ranks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_ranks = _check_num_ranks(num_ranks)
        self.add_state("sum_score", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, probs: torch.Tensor, true: torch.Tensor) -> None:
        """Add the samples ``probs [N, K]`` (rows of probabilities) and ``true [N]`` (integer ranks)."""
        device = self.count.device
        _check_device(self, device)
        p = torch.as_tensor(probs)
        if p.dtype == torch.bool or p.is_complex() or p.ndim != 2 or p.shape[1] != self.num_ranks:
            raise ValueError(f"probs must be rank probabilities [N, num_ranks] = [N, {self.num_ranks}] of a "
                             f"real dtype, got shape {tuple(p.shape)} and dtype {p.dtype}")
        p = p.to(device=device, dtype=torch.float64)
        t = _as_vector(true, "true", device)
        if t.shape[0] != p.shape[0]:
            raise ValueError(f"probs and true must have the same number of samples, got {p.shape[0]} and "
                             f"{t.shape[0]}")
        self._check_ranks(t, "true", self.num_ranks)
        if self.validate_args:
            bad = torch.nonzero(~(torch.isfinite(p) & (p >= 0)).all(dim=1) | ((p.sum(dim=1) - 1.0).abs() > 1e-3))
            if bad.numel():
                i = int(bad[0, 0])
                raise ValueError(f"probs must hold finite probabilities >= 0 whose rows sum to 1; row {i} is "
                                 f"{p[i].tolist()} (pass a softmax, not logits)")
        ranks = torch.arange(self.num_ranks, device=device, dtype=torch.float64)
        observed = (ranks[None, :] >= t[:, None]).to(torch.float64)
        self.sum_score += ((p.cumsum(dim=1) - observed) ** 2).sum()
        self.count += p.shape[0]

    def compute(self) -> torch.Tensor:
        """The mean ranked probability score of every sample so far, a float64 scalar tensor."""
        self._need_samples(self.count)
        return self.sum_score / self.count
