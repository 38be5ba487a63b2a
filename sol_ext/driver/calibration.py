"""The end of a ``sol-ext train`` run: its rank probabilities on the validation split, kept in
``best.pt`` so that rank intervals need no data at prediction time (``sol-ext predict --interval``,
:meth:`sol_ext.driver.model.TrainedModel.predict_interval`; docs/intervals.md).

It runs once the run has finished, from ``best.pt`` (the selected epoch, as :func:`sol_ext.load_run`
reads it), and changes nothing the training wrote but adds the entry
:data:`~sol_ext.driver.model.CALIBRATION_KEY`: the validation rows' probabilities and labels as
given. The training's random state is left as it was (rebuilding the model draws initial weights,
which its saved weights then replace).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .checkpoint import BEST_NAME, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .device import resolve_device
from .model import CALIBRATION_KEY, TrainedModel, model_from_state
from .prepare import PreparedData
from .run import validation_split

__all__ = ["HeldOutProbabilities", "store_validation_calibration"]


@dataclass
class HeldOutProbabilities:
    """The selected model's rank probabilities ``[M, n]`` (float64) on rows it did not fit, with
    their label ranks ``[M]``: the validation split (labels as given) or the test set."""

    probabilities: torch.Tensor
    ranks: torch.Tensor


def store_validation_calibration(out_dir: Path, config: TrainConfig,
                                 data: PreparedData) -> Optional[HeldOutProbabilities]:
    """Add the validation split's rank probabilities and given labels to ``out_dir/best.pt`` and
    return them; ``None`` (and ``best.pt`` untouched) for a run without a validation split."""
    split = validation_split(data.train_given, config.val_fraction, config.seed)
    if split.val is None:
        return None
    path = Path(out_dir) / BEST_NAME
    state = load_checkpoint(path)
    model = _selected_model(state, config)
    probabilities, _ = model.rank_probabilities(model.embed_prepared(data.train_x[split.val]))
    held_out = HeldOutProbabilities(probabilities.cpu().to(torch.float64), data.train_given[split.val].cpu())
    keep = torch.isfinite(held_out.probabilities).all(dim=1)  # a diverged row calibrates nothing
    if not bool(keep.any()):
        return None
    state[CALIBRATION_KEY] = {"probabilities": held_out.probabilities[keep], "ranks": held_out.ranks[keep]}
    state.pop("format_version", None)  # save_checkpoint writes the current one
    save_checkpoint(path, state)
    return held_out


def _selected_model(state: dict, config: TrainConfig) -> TrainedModel:
    """The model of ``best.pt``'s ``state``, on the run's device, built without touching the random
    state the training leaves (its initial weights are drawn, then replaced by the saved ones)."""
    with torch.random.fork_rng(devices=[]):
        return model_from_state(state, resolve_device(config.device), source=BEST_NAME)
