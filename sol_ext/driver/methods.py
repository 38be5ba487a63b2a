"""The training methods behind one interface, sharing the encoder and the budget.

* ``sol``: the stochastic order loss (order + discriminative) with the noise kernel ``P``,
  centroid rule, a rank read-out and label refinement (docs/math.md §3–§8).
* ``sol-no-noise``: the same loss with ``P`` = identity (plain order learning), no refinement.
* ``l1``: a linear head regressing the rank (scaled to [0, 1]) with the L1 loss.
* ``ce``: a linear head over the ranks, cross-entropy; prediction by argmax.
* ``corn``: CORN ordinal regression (Shi et al. 2021), ``n - 1`` conditional binary tasks, from
  the ``coral-pytorch`` package (``pip install sol_ext[baselines]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..head import SOLHead
from .config import TrainConfig
from .encoders import build_encoder, default_encoder

__all__ = ["RankModel", "build_model", "encoder_name", "make_sol_head", "head_loss", "head_ranks",
           "head_probabilities", "require_coral"]


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # TextRows for a text encoder
        h = self.encoder(x)
        return F.normalize(h, dim=1) if self.normalize else h


def encoder_name(config: TrainConfig, kind: str) -> str:
    """The encoder a run builds: ``config.encoder``, with ``auto`` picked from the data ``kind``."""
    return default_encoder(kind) if config.encoder == "auto" else config.encoder


def build_model(config: TrainConfig, input_shape: tuple[int, ...], kind: str,
                num_ranks: int, text_encoder: Optional[str | Path] = None) -> RankModel:
    """Encoder (``config.encoder``, ``auto`` picked from the data ``kind``) and head for
    ``config.method``. Embeddings are normalized for the SOL methods only, when asked. A text run's
    encoder is loaded from ``text_encoder`` (default ``config.text_encoder``: a run folder's
    ``text_encoder/`` holds the fine-tuned one)."""
    if encoder_name(config, kind) == "text":
        from .text import build_text_encoder

        folder = config.text_encoder if text_encoder is None else text_encoder
        encoder: nn.Module = build_text_encoder(
            folder, input_shape, config.embedding_dim, config.hidden, config.max_length, config.train_layers,
            flag="--text-encoder" if text_encoder is None else "the run's")
    else:
        encoder = build_encoder(encoder_name(config, kind), input_shape, config.embedding_dim, config.hidden,
                                config.weights)
    d = config.embedding_dim
    head: nn.Module = {"l1": lambda: nn.Linear(d, 1), "ce": lambda: nn.Linear(d, num_ranks),
                       "corn": lambda: nn.Linear(d, max(num_ranks - 1, 1))}.get(
        config.method, nn.Identity)()
    return RankModel(encoder, head, normalize=config.normalize and config.uses_centroids)


def make_sol_head(config: TrainConfig, num_ranks: int) -> SOLHead:
    """The :class:`sol_ext.SOLHead` of ``config``: its loss (``P`` = identity for ``sol-no-noise``),
    damped centroid rule and read-out. ``config.sigma`` must be resolved (not ``"auto"``)."""
    return SOLHead(num_ranks, config.embedding_dim, sigma=config.kernel_sigma, tau=config.tau,
                   margin=config.margin, T=config.T, disc_weight=config.disc_weight,
                   convention=config.convention, momentum=config.momentum,
                   normalize=config.normalize, readout=config.readout, backend=config.backend)


def head_loss(method: str, model: RankModel, embeddings: torch.Tensor, labels: torch.Tensor,
              num_ranks: int) -> torch.Tensor:
    """Scalar loss of one batch of a baseline with an output head (``l1``, ``ce``, ``corn``); the
    SOL methods' loss is their head's (:attr:`sol_ext.SOLHead.criterion`).

    Args:
        embeddings: ``[B, d]`` from ``model(x)``.
        labels: ``[B]`` int64 current (noisy) ranks.
    """
    if method == "l1":
        target = labels.to(embeddings.dtype) / max(num_ranks - 1, 1)
        return F.l1_loss(model.head(embeddings).squeeze(1), target)
    if method == "ce":
        return F.cross_entropy(model.head(embeddings), labels)
    if method == "corn":
        return require_coral().losses.corn_loss(model.head(embeddings), labels, num_ranks)
    raise ValueError(f"method {method!r} has no output head: its loss is the SOL head's.")


@torch.no_grad()
def head_ranks(method: str, model: RankModel, embeddings: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """Predicted ranks ``[N]`` int64 in ``0 … n-1`` of a baseline (``l1``, ``ce``, ``corn``) from
    embeddings ``[N, d]``: the rounded regression, the most probable rank, CORN's count of
    conditional probabilities above 1/2."""
    out = model.head(embeddings)
    if method == "l1":
        scaled = out.squeeze(1) * max(num_ranks - 1, 1)
        return scaled.round().clamp(0, num_ranks - 1).long()
    if method == "ce":
        return out.argmax(dim=1)
    if method == "corn":
        # coral_pytorch.dataset.corn_label_from_logits, without the package (prediction needs no
        # training dependency): P(y > k) = prod_{j <= k} sigmoid(logit_j)
        return (torch.sigmoid(out).cumprod(dim=1) > 0.5).sum(dim=1).long()
    raise ValueError(f"method {method!r} has no output head; expected l1, ce or corn.")


@torch.no_grad()
def head_probabilities(method: str, model: RankModel, embeddings: torch.Tensor,
                       num_ranks: int) -> torch.Tensor:
    """``[N, n]`` float64 rank probabilities of a baseline: softmax (``ce``); the differences of
    CORN's ``P(y > k)`` (``corn``); for ``l1``, whose regression gives no distribution, the two ranks
    around the clamped prediction ``v`` with weights that make the mean ``v`` (so the expected rank is
    the regression's output and the more probable rank is the rounded prediction)."""
    out = model.head(embeddings).to(torch.float64)
    if method == "ce":
        return torch.softmax(out, dim=1)
    if method == "corn":
        above = torch.sigmoid(out).cumprod(dim=1)                     # P(y > k), k = 0 … n-2
        ones = torch.ones_like(above[:, :1])
        survival = torch.cat([ones, above, torch.zeros_like(ones)], dim=1)  # P(y > k - 1), k = 0 … n
        return (survival[:, :-1] - survival[:, 1:]).clamp_min(0.0)[:, :num_ranks]
    if method == "l1":
        v = (out.squeeze(1) * max(num_ranks - 1, 1)).clamp(0, num_ranks - 1)
        low = v.floor().long().clamp(max=num_ranks - 1)
        high = (low + 1).clamp(max=num_ranks - 1)
        frac = v - low.to(v.dtype)
        p = torch.zeros(v.shape[0], num_ranks, dtype=torch.float64, device=v.device)
        p.scatter_add_(1, low[:, None], (1.0 - frac)[:, None])
        p.scatter_add_(1, high[:, None], frac[:, None])
        return p
    raise ValueError(f"method {method!r} has no output head; expected l1, ce or corn.")
