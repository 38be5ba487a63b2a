"""``StochasticOrderLoss``: the SOL training objective as an ``nn.Module``."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import _validation as check
from ._dispatch import computing, fused_cuda_step, prepare, route
from ._reduction import reduce_losses
from .grouped import grouped_order_loss
from .ops import unchecked_disc_losses, unchecked_dissimilarity, unchecked_order_losses


class StochasticOrderLoss(nn.Module):
    """``L = order_loss(D) + disc_weight * disc_loss(D)`` with ``D = stochastic_dissimilarity(h, mu)``.

    The loss of paper eq. 17 plus lambda times eq. 10 (docs/math.md §7), for one batch::

        criterion = sol_ext.StochasticOrderLoss(num_ranks=62)
        loss = criterion(h, labels, centroids)        # h [B, d], labels [B] int, centroids [n, d]
        loss.backward()

    Args:
        num_ranks: number of ranks ``n`` (>= 1); ``mu`` must have ``n`` rows.
        sigma: std of the label-noise model in rank units (> 0).
        tau: ``x ~ y`` threshold in ranks (int >= 0). margin: hinge margin gamma (>= 0).
        T: neighbour range of the discriminative loss (int >= 1). disc_weight: lambda (>= 0).
        convention: ``"paper"`` (default) or ``"official"`` (the authors' code, docs/math.md §10).
        reduction: ``"mean"`` (each part averaged over its pairs or samples) or ``"sum"``.
        backend: ``"auto"``, ``"fused"`` or ``"reference"`` (see :mod:`sol_ext.ops`).
        algorithm: how the order loss over all pairs is evaluated: ``"pairwise"`` pair by pair
            (``O(B^2 n)``, the fused kernel or the reference), ``"grouped"`` by sorting each rank's column of
            ``D`` (``O(n^2 B + n B log B)``, docs/math.md §13; not with explicit ``pairs``), or ``"auto"``
            (default): the faster for the batch size, the number of ranks and the device
            (:func:`sol_ext._dispatch.grouped_is_faster`); pairwise for explicit pairs and with
            ``backend="reference"``. The same value and gradients up to rounding. On a GPU, grouped reads
            one flag per chunk of ranks back to the host (its tie checks), also with ``check_values=False``.
        check_values: read the inputs' values to refuse NaN/inf embeddings and out-of-range labels or
            pairs with a ``ValueError`` (default), and the loss's to refuse an overflow to inf or NaN from
            finite but huge embeddings. On a GPU that costs host-device synchronizations per
            call; ``False`` skips the finiteness checks and asserts the index ranges on the device
            instead, so that a CUDA training step never waits for the host (see docs/performance.md).

    ``forward(h, labels, mu, pairs=None)``: ``pairs`` is ``None`` for all pairs of the batch, or integer
    ``[M, 2]`` batch indices. Gradients flow to ``h`` and ``mu``, each in its own dtype. ``h`` and ``mu`` of
    different floating dtypes are computed in the wider one, and under ``torch.autocast`` in float32 at
    least (``h`` from an autocast encoder is half, the centroids float32). Returns a scalar in that dtype,
    or in float32 for float16/bfloat16 (reductions accumulate in float32: a float16 sum overflows at 65,504).
    """

    def __init__(
        self,
        num_ranks: int,
        sigma: float = 1.0,
        tau: int = 3,
        margin: float = 0.25,
        T: int = 1,
        disc_weight: float = 1.0,
        convention: str = "paper",
        reduction: str = "mean",
        backend: str = "auto",
        check_values: bool = True,
        algorithm: str = "auto",
    ) -> None:
        super().__init__()
        self.num_ranks = check.check_num_ranks(num_ranks)
        self.sigma = check.check_positive_float("sigma", sigma)
        self.tau = check.check_int("tau", tau, 0)
        self.margin = check.check_nonnegative_float("margin", margin)
        self.T = check.check_int("T", T, 1)
        self.disc_weight = check.check_nonnegative_float("disc_weight", disc_weight)
        self.convention = check.check_choice("convention", convention, check.CONVENTIONS)
        self.reduction = check.check_reduction(reduction, allow_none=False)
        self.backend = check.check_choice("backend", backend, check.BACKENDS)
        self.algorithm = check.check_choice("algorithm", algorithm, check.ALGORITHMS)
        if not isinstance(check_values, bool):
            raise TypeError(f"check_values must be True or False, got {check_values!r}")
        self.check_values = check_values

    def forward(
        self, h: torch.Tensor, labels: torch.Tensor, mu: torch.Tensor, pairs: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        # On the CPU the values are read once the path is known: the grouped op reads them itself.
        on_cpu = isinstance(h, torch.Tensor) and h.device.type == "cpu"
        h, labels, mu, pairs = self._prepare(h, labels, mu, pairs, values=self.check_values and not on_cpu)
        how = route(
            "StochasticOrderLoss", self.backend, h.device, h.dtype, algorithm=self.algorithm, batch_size=h.shape[0],
            num_ranks=self.num_ranks, pairs=pairs, reduction=self.reduction,
        )
        if not (self.check_values or how.fused):
            check.check_indices_on_cpu(labels, self.num_ranks, pairs, h.shape[0])
        with computing(h.device):
            if how.fused and how.algorithm == "grouped" and (on_cpu or fused_cuda_step(h)):
                # one op per direction (csrc/stochastic_order_loss.cpp); on the CPU with the value checks
                # inside and no OpenMP team, which on a busy machine waits for a descheduled thread
                need_grad = torch.is_grad_enabled() and (h.requires_grad or mu.requires_grad)
                loss, D, _ = torch.ops.sol_ext.grouped_stochastic_order_loss(
                    h, mu, labels, self.sigma, self.tau, self.margin, self.T, self.disc_weight, self.convention,
                    self.reduction, self.check_values and on_cpu, need_grad,
                )
                if self.check_values and not on_cpu:
                    check.check_dissimilarities_finite(D, h, mu)
                    self._check_finite(loss, h, mu)
                return loss  # on the CPU the op checked it
            if self.check_values and on_cpu:
                self._check_values(h, labels, mu, pairs)
            if how.fused and how.algorithm == "pairwise":
                # one op per direction and one autograd node (csrc/stochastic_order_loss.cpp): at small
                # batches a step's time is mostly per-call overhead
                loss, D = torch.ops.sol_ext.stochastic_order_loss(
                    h, mu, labels, pairs, self.sigma, self.tau, self.margin, self.T, self.disc_weight,
                    self.convention, self.reduction,
                )
                if self.check_values:
                    check.check_dissimilarities_finite(D, h, mu)
                    self._check_finite(loss, h, mu)
                return loss
            D = self._dissimilarities(h, mu, how.fused)
            if how.algorithm == "grouped":  # D by the kernels (or the reference), the all-pairs sum by sorting
                order = grouped_order_loss(D, labels, self.sigma, self.tau, self.margin, self.convention, self.reduction)
            else:
                order = reduce_losses(
                    unchecked_order_losses(D, labels, pairs, self.sigma, self.tau, self.margin, self.convention, how.fused),
                    self.reduction,
                )
            loss = order + self.disc_weight * self._disc_term(D, labels, how.fused, self.reduction)
            if self.check_values:
                self._check_finite(loss, h, mu)
            return loss

    # The steps of forward, also run by DistributedStochasticOrderLoss on this loss's settings.

    def _prepare(self, h, labels, mu, pairs, values: Optional[bool] = None):
        """The arguments checked and promoted (:mod:`sol_ext._dispatch`); their values read when ``values``
        (default ``check_values``), else left to :meth:`_check_values`."""
        values = self.check_values if values is None else values
        h, mu = prepare({"h": h, "mu": mu}, labels=labels, pairs=pairs)
        check.check_embeddings(h, mu, values=values)
        if mu.shape[0] != self.num_ranks:
            raise ValueError(
                f"mu must have num_ranks={self.num_ranks} rows (one centroid per rank), got shape {tuple(mu.shape)}"
            )
        labels = check.check_ranks("labels", labels, self.num_ranks, length=h.shape[0], values=values)
        pairs = check.check_pairs(pairs, h.shape[0], values=values)
        return h, labels, mu, pairs

    def _check_values(self, h, labels, mu, pairs) -> None:
        """The value checks of :meth:`_prepare`, on its results."""
        check.check_finite("h", h)
        check.check_finite("mu", mu)
        check.check_ranks("labels", labels, self.num_ranks)
        check.check_pairs(pairs, h.shape[0])

    def _check_finite(self, loss: torch.Tensor, h: torch.Tensor, mu: torch.Tensor) -> None:
        """Finite but huge ``h`` and ``mu`` can overflow the loss (the CPU grouped op checks its own)."""
        check.check_loss_finite(loss, h.dtype, "h and mu", lambda: max(h.detach().abs().max().item(),
                                                                       mu.detach().abs().max().item()), self.margin)

    def _dissimilarities(self, h: torch.Tensor, mu: torch.Tensor, fused: bool) -> torch.Tensor:
        D = unchecked_dissimilarity(h, mu, self.sigma, fused)
        if self.check_values:
            check.check_dissimilarities_finite(D, h, mu)
        return D

    def _disc_term(self, D: torch.Tensor, labels: torch.Tensor, fused: bool, reduction: str) -> torch.Tensor:
        return reduce_losses(unchecked_disc_losses(D, labels, self.T, fused), reduction)

    def extra_repr(self) -> str:
        return (
            f"num_ranks={self.num_ranks}, sigma={self.sigma}, tau={self.tau}, margin={self.margin}, T={self.T}, "
            f"disc_weight={self.disc_weight}, convention={self.convention!r}, reduction={self.reduction!r}, "
            f"backend={self.backend!r}" + ("" if self.check_values else ", check_values=False")
            + ("" if self.algorithm == "auto" else f", algorithm={self.algorithm!r}")
        )
