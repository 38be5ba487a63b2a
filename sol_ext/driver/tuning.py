"""Hyperparameters picked from the data: ``--sigma auto``, one training run per candidate above
the single run (:func:`sol_ext.driver.run.train_run`).

The noise-model width ``sigma`` (in ranks) says how far a label may lie from the truth; how much
the centroid rule may smooth across ranks depends on the data (how many ranks, how far apart their
embeddings can be pulled), so it is picked, by default, from :data:`sol_ext.driver.config.SIGMA_GRID` by
the best validation MAE (against the noisy validation labels, as the epoch is; never the test set),
one full training run per candidate.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .checkpoint import (
    BEST_NAME,
    CHECKPOINT_NAME,
    SIGMA_SEARCH_NAME,
    SIGMA_SEARCH_RECORD,
    atomic_write_text,
    load_checkpoint,
    read_search_record,
    save_checkpoint,
    sigma_search_progress,
)
from .config import SIGMA_GRID, TrainConfig
from .parallel import Parallel
from .prepare import PreparedData
from .run import FitContext, RunOutcome, corrected_labels, run_results, train_run

__all__ = ["select_sigma", "search_sigma", "search_in_memory", "trial_dir", "trial_config"]


def trial_dir(work_dir: Path, sigma: float) -> Path:
    """Where :func:`select_sigma` trains the candidate ``sigma`` inside ``work_dir``."""
    return Path(work_dir) / f"sigma{sigma:g}"


def trial_config(config: TrainConfig, sigma: float) -> TrainConfig:
    """The configuration of the trial of ``sigma`` in a search for ``config``."""
    return dataclasses.replace(config, sigma=float(sigma))


def _trial_log(log: Callable[[str], None], sigma: float, number: int,
               trials: int) -> Callable[[str], None]:
    """``log`` with the trial named before each line of its run (one per epoch): a search trains
    several times over, and without them it would be a long silent wait."""
    return lambda line: log(f"sigma {sigma:g} (trial {number}/{trials}): {line}")


def select_sigma(config: TrainConfig, data: PreparedData, grid: Sequence[float] = SIGMA_GRID,
                 log: Callable[[str], None] = print, parallel=None,
                 work_dir: Optional[Path] = None, resume: bool = False) -> dict[str, Any]:
    """Train ``config`` once per ``sigma`` in ``grid``; return the one of best validation MAE.

    The trials are written to :func:`trial_dir` of ``work_dir`` (kept, so that the winner's run
    can be used as it is, and an interrupted search resumed), or, without ``work_dir``, trained in
    memory (nothing is written; :func:`search_in_memory` keeps the winner's outcome); each
    finished trial is added to the record ``work_dir/search.json``. With ``resume``, a trial with
    a checkpoint in ``work_dir`` continues from it (a finished one only reports its outcome, or
    trains on to more epochs) and the others train afresh: the outcome is that of an
    uninterrupted search. ``log`` gets each trial's epoch lines, named by the trial's sigma, and
    one line per finished trial.

    Returns:
        ``{"sigma": best, "val_mae": {sigma: MAE, ...}}`` (MAE in ranks, at each run's selected
        epoch). Ties go to the earlier candidate. Under torchrun (``parallel``, a
        :class:`sol_ext.driver.parallel.Parallel`) every trial runs on all processes.
    """
    return _search(config, data, grid, log, parallel, work_dir, resume)[0]


def _search(config: TrainConfig, data: PreparedData, grid: Sequence[float],
            log: Callable[[str], None], parallel, work_dir: Optional[Path],
            resume: bool) -> tuple[dict[str, Any], RunOutcome]:
    """:func:`select_sigma`'s choice, and the outcome of the winner's trial."""
    if not config.selects_model:
        raise ValueError("sigma 'auto' is picked on the validation split; it needs a validation "
                         "fraction > 0.")
    par = parallel or Parallel()
    scores: dict[float, float] = {}
    outcomes: dict[float, RunOutcome] = {}
    resume = resume and work_dir is not None
    record = read_search_record(work_dir) if resume and par.is_main else {"finished": {}}
    record.update(config=config.to_dict(), grid=[float(s) for s in grid])
    for number, sigma in enumerate(grid, start=1):
        trial = trial_config(config, sigma)
        trial.validate()
        where = None if work_dir is None else trial_dir(work_dir, sigma)
        # rank 0 alone reads the folder: every process must take the same branch
        again = resume and par.broadcast_object(
            (where / CHECKPOINT_NAME).is_file() if par.is_main else None)
        outcome = train_run(trial, data, where, resume=again, context=FitContext(
            parallel, _trial_log(log, sigma, number, len(grid))))
        scores[float(sigma)] = float(outcome.results["val_mae"])
        if work_dir is None:  # in memory: the winner's outcome is the run's
            outcomes[float(sigma)] = outcome
        elif par.is_main:
            record["finished"][f"{sigma:g}"] = {
                "val_mae": scores[float(sigma)], "selected_epoch": outcome.results["selected_epoch"],
                "epochs_run": outcome.results["epochs_run"]}
            atomic_write_text(Path(work_dir) / SIGMA_SEARCH_RECORD, json.dumps(record, indent=2) + "\n")
        log(f"sigma {sigma:g}: validation MAE {scores[float(sigma)]:.3f} "
            f"(epoch {outcome.results['selected_epoch']})")
    best = min(scores, key=lambda s: scores[s])
    log(f"sigma auto -> {best:g}")
    choice = {"sigma": best, "val_mae": {f"{s:g}": v for s, v in scores.items()}}
    return choice, outcomes.get(best)


def search_in_memory(config: TrainConfig, data: PreparedData, par: Parallel,
                     log: Callable[[str], None]) -> RunOutcome:
    """The run of ``config`` (``sigma="auto"``) trained in memory: every candidate is trained,
    nothing is written, and the winner's training is the run, relabeled as the run of ``config``
    with its sigma choice (as :func:`search_sigma` adopts the winner's folder)."""
    import time

    started = time.perf_counter()
    sigma_choice, winner = _search(config, data, SIGMA_GRID, log, par, None, False)
    best = {**winner.best_state, "config": config.to_dict(), "sigma_choice": sigma_choice}
    results = run_results(config, data, winner.results["history"], best, sigma_choice,
                          time.perf_counter() - started, par.world_size)
    return RunOutcome(results=results, test_embeddings=best["test_embeddings"],
                      test_pred=best["test_pred"], train_pred=best["train_pred"],
                      labels=corrected_labels(best), best_state=best)


def search_sigma(config: TrainConfig, data: PreparedData, out_dir: Path, par: Parallel,
                 log: Callable[[str], None], seconds_before: float = 0.0,
                 resume: bool = False) -> RunOutcome:
    """The run of ``config`` (``sigma="auto"``) in ``out_dir``: :func:`select_sigma` trains every
    candidate in ``out_dir/sigma-search``, and the winner's training, to the last bit, becomes
    the run (it is kept, not repeated). With ``resume``, the trials of an interrupted search
    there continue.

    On an error or Ctrl-C the trials with a checkpoint stay, for ``--resume``; a search with none
    leaves nothing behind."""
    import time

    started = time.perf_counter()
    search = out_dir / SIGMA_SEARCH_NAME
    if par.is_main and not resume:  # a fresh search: no trial of an earlier one is reused
        shutil.rmtree(search, ignore_errors=True)
    if resume:
        log(f"resuming the sigma search in {search}")
    try:
        sigma_choice = select_sigma(config, data, log=log, parallel=par, work_dir=search,
                                    resume=resume)
    except BaseException:
        if par.is_main and sigma_search_progress(out_dir) is None:
            shutil.rmtree(search, ignore_errors=True)  # nothing to resume: no half-done trials
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
        # best.pt first: checkpoint.pt marks the search as done (a Ctrl-C between the two leaves
        # the search, which --resume adopts again)
        for name in (BEST_NAME, CHECKPOINT_NAME):
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
