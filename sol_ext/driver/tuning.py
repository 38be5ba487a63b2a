"""Hyperparameters picked from the data: ``--sigma auto``, one training run per candidate above
the single run (:func:`sol_ext.driver.run.train_run`).

The noise-model width ``sigma`` (in ranks) says how far a label may lie from the truth; how much
the centroid rule may smooth across ranks depends on the data (how many ranks, how far apart their
embeddings can be pulled), so it is picked, by default, from :data:`sol_ext.driver.config.SIGMA_GRID` by
the best validation MAE (against the noisy validation labels, as the epoch is; never the test set),
one full training run per candidate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .checkpoint import BEST_NAME, CHECKPOINT_NAME, SIGMA_SEARCH_NAME, load_checkpoint, save_checkpoint
from .config import SIGMA_GRID, TrainConfig
from .parallel import Parallel
from .prepare import PreparedData
from .run import RunOutcome, corrected_labels, run_results, train_run

__all__ = ["select_sigma", "search_sigma", "trial_dir"]


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
    if not config.selects_model:
        raise ValueError("sigma 'auto' is picked on the validation split; it needs a validation "
                         "fraction > 0.")
    scores: dict[float, float] = {}
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sol-ext-sigma-")))
        for sigma in grid:
            trial = dataclasses.replace(config, sigma=float(sigma), patience=config.patience)
            trial.validate()
            outcome = train_run(trial, data, trial_dir(work_dir, sigma), log=lambda _line: None,
                                parallel=parallel)
            scores[float(sigma)] = float(outcome.results["val_mae"])
            log(f"sigma {sigma:g}: validation MAE {scores[float(sigma)]:.3f} "
                f"(epoch {outcome.results['selected_epoch']})")
    best = min(scores, key=lambda s: scores[s])
    log(f"sigma auto -> {best:g}")
    return {"sigma": best, "val_mae": {f"{s:g}": v for s, v in scores.items()}}


def search_sigma(config: TrainConfig, data: PreparedData, out_dir: Path, par: Parallel,
                 log: Callable[[str], None], seconds_before: float = 0.0) -> RunOutcome:
    """The run of ``config`` (``sigma="auto"``) in ``out_dir``: :func:`select_sigma` trains every
    candidate in ``out_dir/.sigma-search``, and the winner's training, to the last bit, becomes
    the run (it is kept, not repeated)."""
    import time

    started = time.perf_counter()
    search = out_dir / SIGMA_SEARCH_NAME
    try:
        sigma_choice = select_sigma(config, data, log=log, parallel=par, work_dir=search)
    except BaseException:  # an error or Ctrl-C: no half-done trials left in the folder
        if par.is_main:
            shutil.rmtree(search, ignore_errors=True)
        raise
    return _adopt_trial(config, data, out_dir, search, sigma_choice, par,
                        seconds_before + time.perf_counter() - started)


def _adopt_trial(config: TrainConfig, data: PreparedData, out_dir: Path, search: Path,
                 sigma_choice: dict[str, Any], par: Parallel, seconds: float) -> RunOutcome:
    """The run of the picked sigma from ``search`` as this run's: its checkpoints, relabeled as the
    run of ``config`` (``sigma="auto"``) with its ``sigma_choice``, move into ``out_dir``."""
    states = None
    if par.is_main:
        winner = trial_dir(search, sigma_choice["sigma"])
        states = {}
        for name in (CHECKPOINT_NAME, BEST_NAME):
            state = load_checkpoint(winner / name)
            state.update(config=config.to_dict(), sigma_choice=sigma_choice)
            save_checkpoint(out_dir / name, state)
            states[name] = state
        shutil.rmtree(search, ignore_errors=True)
    states = par.broadcast_object(states)
    best, history = states[BEST_NAME], states[CHECKPOINT_NAME]["history"]
    results = run_results(config, data, history, best, sigma_choice, seconds, par.world_size)
    return RunOutcome(results=results, test_embeddings=best["test_embeddings"],
                      test_pred=best["test_pred"], train_pred=best["train_pred"],
                      labels=corrected_labels(best))
