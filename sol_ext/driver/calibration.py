"""The end of a ``sol-ext train`` run: how well its rank probabilities are calibrated, and the rows its
rank intervals are calibrated on by default (docs/intervals.md).

It runs once the run has finished, from ``best.pt`` (the selected epoch, as :func:`sol_ext.driver.load_run`
reads it):

* the validation split's rank probabilities and labels as given go into ``best.pt``
  (:data:`~sol_ext.driver.model.CALIBRATION_KEY`), so that ``sol-ext predict --interval``, ``sol-ext
  export --interval`` and
  :meth:`sol_ext.driver.model.TrainedModel.predict_interval` need no data;
* the expected calibration error and the reliability curve of the validation split (against its
  labels as given) and of the test set (against its labels) go into ``results.json``
  (``calibration``), and the curves into ``reliability.png`` (:mod:`sol_ext.driver.report`).

Nothing the training wrote changes but for the entry added to ``best.pt``, and the training's random
state is left as it was (rebuilding the model draws initial weights, which its saved weights then
replace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ..metrics import expected_calibration_error, reliability_curve
from .checkpoint import BEST_NAME, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .fit import FitContext
from .model import CALIBRATION_KEY, TrainedModel, model_from_state
from .prepare import PreparedData

__all__ = ["RELIABILITY_BINS", "HeldOutProbabilities", "calibrate_run", "calibration_summary",
           "validation_probabilities", "store_validation_calibration"]

RELIABILITY_BINS = 15  # the bins of the reliability curve and of the ECE (sol_ext.metrics' default)


@dataclass
class HeldOutProbabilities:
    """The selected model's rank probabilities ``[M, n]`` (float64) on rows it did not fit, with
    their label ranks ``[M]``: the validation split (labels as given) or the test set."""

    probabilities: torch.Tensor
    ranks: torch.Tensor

    def finite(self) -> "HeldOutProbabilities":
        """The rows with finite probabilities (a diverged row has none to score)."""
        keep = torch.isfinite(self.probabilities).all(dim=1)
        return HeldOutProbabilities(self.probabilities[keep], self.ranks[keep])


def calibrate_run(out_dir: Path, config: TrainConfig, data: PreparedData,
                  results: Optional[dict[str, Any]] = None, *, context: FitContext,
                  ) -> Optional[HeldOutProbabilities]:
    """Add the validation split's rank probabilities and given labels to ``out_dir/best.pt`` (a run
    without a validation split: ``best.pt`` is left untouched) and, given the run's ``results``, put
    the calibration's figures into them (``results["calibration"]``, :func:`calibration_summary`).
    ``context``: the device and validation split the run's checks decided.
    Returns the validation split's probabilities, or ``None``."""
    path = Path(out_dir) / BEST_NAME
    state = load_checkpoint(path)
    model = _selected_model(state, context.device, Path(out_dir))
    validation = validation_probabilities(model, data, context.split.val)
    if validation is not None:
        state[CALIBRATION_KEY] = {"probabilities": validation.probabilities, "ranks": validation.ranks}
        state.pop("format_version", None)  # save_checkpoint writes the current one
        save_checkpoint(path, state)
    if results is not None:
        test = None
        if data.test_ranks.numel() > 0:  # the selected epoch's test embeddings are in best.pt
            probabilities, _ = model.rank_probabilities(state["test_embeddings"])
            test = HeldOutProbabilities(probabilities.cpu().to(torch.float64), data.test_ranks.cpu()).finite()
        results["calibration"] = calibration_summary(validation, test)
    return validation


def validation_probabilities(model: TrainedModel, data: PreparedData,
                             rows: Optional[torch.Tensor]) -> Optional[HeldOutProbabilities]:
    """The rank probabilities of ``model`` on the training rows ``rows`` of ``data`` (the validation
    split) with their labels as given, the rows with finite probabilities; ``None`` without rows."""
    if rows is None:
        return None
    probabilities, _ = model.rank_probabilities(model.embed_prepared(data.train_x[rows]))
    validation = HeldOutProbabilities(probabilities.cpu().to(torch.float64), data.train_given[rows].cpu()).finite()
    return validation if validation.ranks.numel() > 0 else None


def store_validation_calibration(model: TrainedModel, validation: Optional[HeldOutProbabilities]) -> None:
    """Keep ``validation`` on ``model`` as the rows its intervals are calibrated on (as :func:`load_run`
    does with a run's ``best.pt``) and calibrate them with the default score; nothing without rows."""
    if validation is None:
        return
    model.stored_calibration = {"probabilities": validation.probabilities, "ranks": validation.ranks.to(torch.int64)}
    model.calibrate_intervals_on_validation()


def calibration_summary(validation: Optional[HeldOutProbabilities],
                        test: Optional[HeldOutProbabilities]) -> dict[str, Any]:
    """``results.json``'s ``calibration``: for the validation split (its labels as given) and the
    test set, the rows, the expected calibration error and the reliability curve
    (:func:`sol_ext.metrics.reliability_curve`: ``confidence``, ``accuracy`` and ``count`` per bin,
    ``null`` in an empty bin); ``null`` for a part the run does not have. ``intervals`` names the
    rows the run's intervals are calibrated on by default (``null``: none; ``--calibration`` then)."""
    summary: dict[str, Any] = {"bins": RELIABILITY_BINS,
                               "intervals": None if validation is None else "validation"}
    for name, part in (("validation", validation), ("test", test)):
        if part is None or part.ranks.numel() == 0:
            summary[name] = None
            continue
        p, y = part.probabilities.numpy(), part.ranks.numpy()
        curve = reliability_curve(p, y, RELIABILITY_BINS)
        summary[name] = {"rows": int(y.size), "ece": expected_calibration_error(p, y, RELIABILITY_BINS),
                         "reliability": {k: [None if math.isnan(v) else v for v in map(float, values)]
                                         if k != "count" else [int(v) for v in values]
                                         for k, values in curve.items()}}
    return summary


def _selected_model(state: dict[str, Any], device: torch.device, run_dir: Path) -> TrainedModel:
    """The model of ``best.pt``'s ``state``, on the run's device, built without touching the random
    state the training leaves (its initial weights are drawn, then replaced by the saved ones)."""
    with torch.random.fork_rng(devices=[]):
        return model_from_state(state, device, source=BEST_NAME, run_dir=run_dir)
