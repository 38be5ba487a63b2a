"""Hyperparameters picked from the data: ``--sigma auto``.

The noise-model width ``sigma`` (in ranks) says how far a label may lie from the truth; how much
the centroid rule may smooth across ranks depends on the data (how many ranks, how far apart their
embeddings can be pulled), so it is picked, by default, from :data:`sol_ext.driver.config.SIGMA_GRID` by
the best validation MAE (against the noisy validation labels, as the epoch is; never the test set),
one full training run per candidate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .config import SIGMA_GRID, TrainConfig
from .prepare import PreparedData

__all__ = ["select_sigma", "trial_dir"]


def trial_dir(work_dir: Path, sigma: float) -> Path:
    """Where :func:`select_sigma` trains the candidate ``sigma`` inside ``work_dir``."""
    return Path(work_dir) / f"sigma{sigma:g}"


def select_sigma(config: TrainConfig, data: PreparedData, grid: Sequence[float] = SIGMA_GRID,
                 log: Callable[[str], None] = print, parallel=None,
                 work_dir: Optional[Path] = None) -> dict[str, Any]:
    """Train ``config`` once per ``sigma`` in ``grid``; return the one of best validation MAE.

    The trials are written to :func:`trial_dir` of ``work_dir`` (kept, so that the winner's run
    can be used as it is), or to a temporary folder.

    Returns:
        ``{"sigma": best, "val_mae": {sigma: MAE, ...}}`` (MAE in ranks, at each run's selected
        epoch). Ties go to the earlier candidate. Under torchrun (``parallel``, a
        :class:`sol_ext.driver.parallel.Parallel`) every trial runs on all processes.
    """
    from .train import train  # train() calls this function for sigma="auto"

    if not config.selects_model:
        raise ValueError("sigma 'auto' is picked on the validation split; it needs a validation "
                         "fraction > 0.")
    scores: dict[float, float] = {}
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sol-ext-sigma-")))
        for sigma in grid:
            trial = dataclasses.replace(config, sigma=float(sigma), patience=config.patience)
            outcome = train(trial, data, trial_dir(work_dir, sigma), log=lambda _line: None,
                            parallel=parallel)
            scores[float(sigma)] = float(outcome.results["val_mae"])
            log(f"sigma {sigma:g}: validation MAE {scores[float(sigma)]:.3f} "
                f"(epoch {outcome.results['selected_epoch']})")
    best = min(scores, key=lambda s: scores[s])
    log(f"sigma auto -> {best:g}")
    return {"sigma": best, "val_mae": {f"{s:g}": v for s, v in scores.items()}}
