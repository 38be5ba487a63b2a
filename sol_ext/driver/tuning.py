"""Hyperparameters picked from the data: ``--sigma auto``, one :class:`~sol_ext.driver.run.Fit` per
candidate, trained by the outer loop of :func:`sol_ext.driver.train.train` (:class:`SigmaSearch` says
which fits, records them and makes the winner's the run; :class:`SingleRun` is the plan of one fit).

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

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
from .run import RunOutcome, corrected_labels, run_results

__all__ = ["Trial", "SingleRun", "SigmaSearch", "trial_dir", "trial_config"]


def trial_dir(work_dir: Path, sigma: float) -> Path:
    """Where :class:`SigmaSearch` trains the candidate ``sigma`` inside ``work_dir``."""
    return Path(work_dir) / f"sigma{sigma:g}"


def trial_config(config: TrainConfig, sigma: float) -> TrainConfig:
    """The configuration of the trial of ``sigma`` in a search for ``config``."""
    return dataclasses.replace(config, sigma=float(sigma))


def _trial_log(log: Callable[[str], None], sigma: float, number: int,
               trials: int) -> Callable[[str], None]:
    """``log`` with the trial named before each line of its run (one per epoch): a search trains
    several times over, and without them it would be a long silent wait."""
    return lambda line: log(f"sigma {sigma:g} (trial {number}/{trials}): {line}")


@dataclass
class Trial:
    """One :class:`~sol_ext.driver.run.Fit` of a run: its configuration, its folder (``None``: in
    memory), whether it continues from its checkpoint there, its sigma choice (a run of
    ``sigma="auto"`` that trains one sigma) and where its lines go."""

    config: TrainConfig
    out_dir: Optional[Path]
    resume: bool = False
    sigma_choice: Optional[dict[str, Any]] = None
    log: Callable[[str], None] = print


class SingleRun:
    """The plan of a run that trains once: its one trial's outcome is the run's."""

    def __init__(self, trial: Trial):
        self.trial, self._outcome = trial, None

    def trials(self) -> Iterator[Trial]:
        yield self.trial

    def finished(self, trial: Trial, outcome: RunOutcome) -> None:
        self._outcome = outcome

    def abandon(self) -> None:
        """Nothing to clean: the run's checkpoint, if any, is for --resume."""

    def outcome(self, data: PreparedData, seconds: float) -> RunOutcome:
        return self._outcome


class SigmaSearch:
    """The plan of a run of ``config`` (``sigma="auto"``): one trial per candidate of ``grid``, in
    ``out_dir/sigma-search`` (or in memory without ``out_dir``); the winner's training, to the last
    bit, becomes the run (kept, not repeated). With ``resume``, a trial with a checkpoint there
    continues from it (a finished one only reports its outcome, or trains on to more epochs) and the
    others train afresh: the outcome is that of an uninterrupted search. Each finished trial is added
    to the record ``sigma-search/search.json``; on an error or Ctrl-C the trials with a checkpoint
    stay, for ``--resume``, and a search with none leaves nothing behind (:meth:`abandon`).

    The choice is ``{"sigma": best, "val_mae": {sigma: MAE, ...}}`` (MAE in ranks at each trial's
    selected epoch; ties go to the earlier candidate). Under torchrun every trial runs on all
    processes; rank 0 alone reads and writes the folder."""

    def __init__(self, config: TrainConfig, out_dir: Optional[Path], par: Parallel,
                 log: Callable[[str], None], resume: bool = False, grid: Sequence[float] = SIGMA_GRID):
        self.config, self.out_dir, self.par, self.log, self.grid = config, out_dir, par, log, tuple(grid)
        self.work = None if out_dir is None else out_dir / SIGMA_SEARCH_NAME
        self.resume = resume and self.work is not None
        if self.work is not None and par.is_main and not self.resume:
            shutil.rmtree(self.work, ignore_errors=True)  # a fresh search reuses no earlier trial
        if self.resume:
            log(f"resuming the sigma search in {self.work}")
        self.record = read_search_record(self.work) if self.resume and par.is_main else {"finished": {}}
        self.record.update(config=config.to_dict(), grid=[float(s) for s in self.grid])
        self.scores: dict[float, float] = {}
        self.outcomes: dict[float, RunOutcome] = {}
        self.started = time.perf_counter()

    def trials(self) -> Iterator[Trial]:
        for number, sigma in enumerate(self.grid, start=1):
            where = None if self.work is None else trial_dir(self.work, sigma)
            # rank 0 alone reads the folder: every process must take the same branch
            again = self.resume and self.par.broadcast_object(
                (where / CHECKPOINT_NAME).is_file() if self.par.is_main else None)
            yield Trial(trial_config(self.config, sigma), where, again,
                        log=_trial_log(self.log, sigma, number, len(self.grid)))

    def finished(self, trial: Trial, outcome: RunOutcome) -> None:
        sigma = float(trial.config.sigma)
        self.scores[sigma] = float(outcome.results["val_mae"])
        if self.work is None:  # in memory: the winner's outcome is the run's
            self.outcomes[sigma] = outcome
        elif self.par.is_main:
            self.record["finished"][f"{sigma:g}"] = {
                "val_mae": self.scores[sigma], "selected_epoch": outcome.results["selected_epoch"],
                "epochs_run": outcome.results["epochs_run"]}
            atomic_write_text(self.work / SIGMA_SEARCH_RECORD, json.dumps(self.record, indent=2) + "\n")
        self.log(f"sigma {sigma:g}: validation MAE {self.scores[sigma]:.3f} "
                 f"(epoch {outcome.results['selected_epoch']})")

    def abandon(self) -> None:
        if self.work is not None and self.par.is_main and sigma_search_progress(self.out_dir) is None:
            shutil.rmtree(self.work, ignore_errors=True)  # nothing to resume: no half-done trials

    def outcome(self, data: PreparedData, seconds: float) -> RunOutcome:
        """The winner's training as the run of ``config``, with its sigma choice."""
        best = min(self.scores, key=lambda s: self.scores[s])
        self.log(f"sigma auto -> {best:g}")
        choice = {"sigma": best, "val_mae": {f"{s:g}": v for s, v in self.scores.items()}}
        if self.work is not None:
            return self._adopt(data, choice, seconds)
        winner = self.outcomes[best]
        state = {**winner.best_state, "config": self.config.to_dict(), "sigma_choice": choice}
        results = run_results(self.config, data, winner.results["history"], state, choice, seconds)
        return RunOutcome(results=results, test_embeddings=state["test_embeddings"],
                          test_pred=state["test_pred"], train_pred=state["train_pred"],
                          labels=corrected_labels(state), best_state=state)

    def _adopt(self, data: PreparedData, sigma_choice: dict[str, Any], seconds: float) -> RunOutcome:
        """The run of the picked sigma from the search folder as this run's: its checkpoints,
        relabeled as the run of ``config`` (``sigma="auto"``) with its ``sigma_choice``, move into
        ``out_dir``."""
        config, par, states = self.config, self.par, None
        if par.is_main:
            winner = trial_dir(self.work, sigma_choice["sigma"])
            states = {}
            # best.pt first: checkpoint.pt marks the search as done (a Ctrl-C between the two
            # leaves the search, which --resume adopts again)
            for name in (BEST_NAME, CHECKPOINT_NAME):
                state = load_checkpoint(winner / name)
                state.update(config=config.to_dict(), sigma_choice=sigma_choice)
                save_checkpoint(self.out_dir / name, state)
                states[name] = state
            shutil.rmtree(self.work, ignore_errors=True)
        states = par.broadcast_object(states)
        best, history = states[BEST_NAME], states[CHECKPOINT_NAME]["history"]
        results = run_results(config, data, history, best, sigma_choice, seconds)
        return RunOutcome(results=results, test_embeddings=best["test_embeddings"],
                          test_pred=best["test_pred"], train_pred=best["train_pred"],
                          labels=corrected_labels(best))
