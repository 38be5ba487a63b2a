"""The training methods behind one interface, sharing the encoder and the budget.

* ``sol``: the stochastic order loss (order + discriminative) with the noise kernel ``P``,
  centroid rule, a rank read-out and label refinement (SPEC §3–§8).
* ``sol-no-noise``: the same loss with ``P`` = identity (plain order learning), no refinement.
* ``l1``: a linear head regressing the rank (scaled to [0, 1]) with the L1 loss.
* ``ce``: a linear head over the ranks, cross-entropy; prediction by argmax.
* ``corn``: CORN ordinal regression (Shi et al. 2021), ``n - 1`` conditional binary tasks, from
  the ``coral-pytorch`` package (``pip install sol_ext[baselines]``).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..centroids import RankPosterior, dissimilarities, posterior_median_ranks, predict_ranks
from ..loss import StochasticOrderLoss
from .config import TrainConfig
from .encoders import build_encoder, default_encoder

__all__ = ["RankModel", "build_model", "training_loss", "predict", "require_coral"]


def require_coral():
    """The ``coral_pytorch`` package of ``--method corn``, or an ImportError saying how to get it."""
    try:
        import coral_pytorch.dataset
        import coral_pytorch.losses
    except ImportError as exc:
        raise ImportError("--method corn needs the coral-pytorch package: "
                          "pip install 'sol_ext[baselines]' (or pip install coral-pytorch).") from exc
    return coral_pytorch


class RankModel(nn.Module):
    """Encoder plus the method's output head.

    ``forward(x)`` gives the embeddings ``[B, d]`` (L2-normalized when ``normalize``);
    ``head`` maps them to the baselines' outputs (``[B, 1]`` for ``l1``, ``[B, n]`` for
    ``ce``) and is the identity for SOL.
    """

    def __init__(self, encoder: nn.Module, head: nn.Module, normalize: bool):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return F.normalize(h, dim=1) if self.normalize else h


def build_model(config: TrainConfig, input_shape: tuple[int, ...], kind: str,
                num_ranks: int) -> RankModel:
    """Encoder (``config.encoder``, ``auto`` picked from the data ``kind``) and head for
    ``config.method``. Embeddings are normalized for the SOL methods only, when asked."""
    name = default_encoder(kind) if config.encoder == "auto" else config.encoder
    encoder = build_encoder(name, input_shape, config.embedding_dim, config.hidden,
                            config.vgg_weights)
    d = config.embedding_dim
    head: nn.Module = {"l1": lambda: nn.Linear(d, 1), "ce": lambda: nn.Linear(d, num_ranks),
                       "corn": lambda: nn.Linear(d, max(num_ranks - 1, 1))}.get(
        config.method, nn.Identity)()
    return RankModel(encoder, head, normalize=config.normalize and config.uses_centroids)


def make_sol_loss(config: TrainConfig, num_ranks: int) -> nn.Module:
    """``StochasticOrderLoss`` for ``config`` (``P`` = identity for ``sol-no-noise``)."""
    return StochasticOrderLoss(num_ranks, sigma=config.kernel_sigma, tau=config.tau,
                               margin=config.margin, T=config.T, disc_weight=config.disc_weight,
                               convention=config.convention, backend=config.backend)


def training_loss(config: TrainConfig, model: RankModel, embeddings: torch.Tensor,
                  labels: torch.Tensor, num_ranks: int, centroids: Optional[torch.Tensor],
                  sol_loss: Optional[nn.Module], pairs: Optional[torch.Tensor] = None
                  ) -> torch.Tensor:
    """Scalar loss of one batch.

    Args:
        embeddings: ``[B, d]`` from ``model(x)``.
        labels: ``[B]`` int64 current (noisy) ranks.
        centroids: ``[n, d]`` (SOL methods; fixed during the epoch).
        sol_loss: from :func:`make_sol_loss` (SOL methods).
        pairs: ``[M, 2]`` batch indices, or ``None`` for all pairs.
    """
    if config.method == "l1":
        target = labels.to(embeddings.dtype) / max(num_ranks - 1, 1)
        return F.l1_loss(model.head(embeddings).squeeze(1), target)
    if config.method == "ce":
        return F.cross_entropy(model.head(embeddings), labels)
    if config.method == "corn":
        return require_coral().losses.corn_loss(model.head(embeddings), labels, num_ranks)
    return sol_loss(embeddings, labels, centroids, pairs=pairs)


@torch.no_grad()
def predict(config: TrainConfig, model: RankModel, embeddings: torch.Tensor, num_ranks: int,
            centroids: Optional[torch.Tensor],
            posterior: Optional[RankPosterior] = None) -> torch.Tensor:
    """Predicted ranks ``[N]`` int64 in ``0 … n-1`` from embeddings ``[N, d]``.

    SOL methods: given ``posterior``, its median rank (the default read-out); without it the
    paper's nearest expectation ``argmin_q D[x, q]`` (eq. 6)."""
    if config.method == "l1":
        scaled = model.head(embeddings).squeeze(1) * max(num_ranks - 1, 1)
        return scaled.round().clamp(0, num_ranks - 1).long()
    if config.method == "ce":
        return model.head(embeddings).argmax(dim=1)
    if config.method == "corn":
        return require_coral().dataset.corn_label_from_logits(model.head(embeddings)).long()
    if posterior is not None:
        d = dissimilarities(embeddings, centroids, config.kernel_sigma, backend=config.backend)
        return posterior_median_ranks(d, posterior)
    return predict_ranks(embeddings, centroids, config.kernel_sigma, backend=config.backend)
