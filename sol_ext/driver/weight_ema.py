"""The moving average of a model's weights over the training steps (``--weight-ema``): what a
fit evaluates, selects and saves where the setting asks for one."""

from __future__ import annotations

import copy
from typing import Optional

import torch

from .config import WEIGHT_EMA_SHARE, TrainConfig

__all__ = ["WeightAverage", "weight_average"]


class WeightAverage:
    """An exponential moving average of a model's weights over the training steps (``weight_ema``).

    ``model`` is a copy of the trained model. After ``t`` calls of :meth:`update` its parameters and
    floating-point buffers are ``sum_{s <= t} (1 - d) d^(t-s) w_s / (1 - d^t)`` for the trained
    weights ``w_s`` after step ``s`` and ``d = decay``: the average with Adam's bias correction, so
    the first epochs are averages of what has been trained, not pulled towards the initial weights
    (on small data sets an epoch has few steps: 18 on wine-red, where ``0.99^18 = 0.83`` of an
    uncorrected average would still be the initialization after the first epoch). Other buffers,
    such as batch norm's step count, are copied. Every process of a torchrun run holds the same
    trained weights after each step (DDP), hence the same average.

    With ``share`` instead of ``decay`` (``weight_ema="auto"``) the decay of step ``t`` is
    ``1 - 1 / max(share * t, 1)``: the average spans about the last ``share`` of the steps so far,
    so it follows a network that still learns fast early on and averages longer as training
    settles, whatever the data set's size and the run's length. It depends on the step alone, so
    a resumed run continues the average an unbroken run would have.
    """

    def __init__(self, model: torch.nn.Module, decay: Optional[float] = None, steps: int = 0,
                 share: Optional[float] = None):
        if (decay is None) == (share is None):
            raise ValueError("WeightAverage takes a decay or a share, not both or neither.")
        if decay is not None and not 0.0 < decay < 1.0:
            raise ValueError(f"weight_ema must be in (0, 1) for an average, got {decay}.")
        if share is not None and not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}.")
        self.decay = None if decay is None else float(decay)
        self.share = None if share is None else float(share)
        self.steps = int(steps)  # updates so far (saved in checkpoint.pt for a resumed run)
        self.model = copy.deepcopy(model)
        self.model.requires_grad_(False)

    def _keep(self) -> float:
        """The weight of step ``self.steps`` on the previous average."""
        t = self.steps
        if self.share is not None:
            return 1.0 - 1.0 / max(self.share * t, 1.0)
        d = self.decay
        # the bias-corrected average's: d (1 - d^(t-1)) / (1 - d^t)
        return d * (1.0 - d ** (t - 1)) / (1.0 - d ** t)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.steps += 1
        keep = self._keep()
        for mine, theirs in zip(self.model.parameters(), model.parameters()):
            mine.lerp_(theirs.detach(), 1.0 - keep)
        for mine, theirs in zip(self.model.buffers(), model.buffers()):
            if mine.is_floating_point():
                mine.lerp_(theirs.detach(), 1.0 - keep)
            else:
                mine.copy_(theirs)


def weight_average(config: TrainConfig, model: torch.nn.Module) -> Optional[WeightAverage]:
    """The moving average of ``config.weight_ema`` over ``model``'s weights, or None for none."""
    if config.weight_ema == "auto":
        return WeightAverage(model, share=WEIGHT_EMA_SHARE) if config.uses_centroids else None
    return WeightAverage(model, decay=config.weight_ema) if config.weight_ema > 0 else None
