"""``StochasticOrderLoss``: the SOL training objective as an ``nn.Module``."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import _validation as check
from .ops import stochastic_order_loss


class StochasticOrderLoss(nn.Module):
    """``L = order_loss(D) + disc_weight * disc_loss(D)`` with ``D = stochastic_dissimilarity(h, mu)``.

    The loss of paper eq. 17 plus lambda times eq. 10 (docs/math.md §7), for one batch, with its settings
    checked once; :func:`sol_ext.ops.stochastic_order_loss` is the same loss as a function::

        criterion = sol_ext.StochasticOrderLoss(num_ranks=62)
        loss = criterion(h, labels, centroids)        # h [B, d], labels [B] int, centroids [n, d]
        loss.backward()

    The loss does not make the centroids: :class:`sol_ext.SOLHead` keeps them and refreshes them by the
    closed-form rule (:func:`sol_ext.centroids.compute_centroids`) between epochs (docs/loop.md).

    Args:
        num_ranks: number of ranks ``n`` (>= 1); ``mu`` must have ``n`` rows.
        sigma: std of the label-noise model in rank units (> 0).
        tau: ``x ~ y`` threshold in ranks (int >= 0); 1 by default, as for :class:`sol_ext.SOLHead` (the
            paper's 3 lumps most pairs together when there are few ranks). margin: hinge margin gamma (>= 0).
        T: neighbour range of the discriminative loss (int >= 1). disc_weight: lambda (>= 0).
        convention: ``"paper"`` (default) or ``"official"`` (the authors' code, docs/math.md §10).
        reduction: ``"mean"`` (each part averaged over its pairs or samples) or ``"sum"``.
        backend: ``"auto"``, ``"fused"`` or ``"reference"`` (see :mod:`sol_ext.ops`).
        algorithm: how the order loss over all pairs is evaluated: ``"pairwise"`` pair by pair
            (``O(B^2 n)``, the fused kernel or the reference), ``"grouped"`` by sorting each rank's column of
            ``D`` (``O(n^2 B + n B log B)``, docs/math.md §13; not with explicit ``pairs``), or ``"auto"``
            (default): the faster for the batch size, the number of ranks and the device (the rule measured
            in docs/performance.md); pairwise for explicit pairs and with ``backend="reference"``. The same
            value and gradients up to rounding. On a GPU, grouped reads one flag per chunk of ranks back to
            the host (its tie checks), also with ``check_values=False``.
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
        tau: int = 1,
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
        return stochastic_order_loss(
            h, labels, mu, pairs, self.sigma, self.tau, self.margin, self.T, self.disc_weight, self.convention,
            self.reduction, num_ranks=self.num_ranks, backend=self.backend, algorithm=self.algorithm,
            check_values=self.check_values,
        )

    def extra_repr(self) -> str:
        return (
            f"num_ranks={self.num_ranks}, sigma={self.sigma}, tau={self.tau}, margin={self.margin}, T={self.T}, "
            f"disc_weight={self.disc_weight}, convention={self.convention!r}, reduction={self.reduction!r}, "
            f"backend={self.backend!r}" + ("" if self.check_values else ", check_values=False")
            + ("" if self.algorithm == "auto" else f", algorithm={self.algorithm!r}")
        )
