"""``train``: the driver's entry point. It checks the configuration, picks sigma where it is
``"auto"`` (:mod:`sol_ext.driver.tuning`: one training run per candidate, the winner's is the run)
and otherwise trains once (:func:`sol_ext.driver.run.train_run`, the epoch loop of Algorithm 1).

Module layers, top to bottom, without an import circle: ``train`` → ``tuning`` → ``run`` (one
run: epochs, read-outs, relabeling) → ``checkpoint`` (the run folder's format) and ``methods``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .checkpoint import (
    BEST_NAME,
    CHECKPOINT_NAME,
    SIGMA_SEARCH_NAME,
    check_resumable,
    load_checkpoint,
    sigma_search_progress,
)
from .config import FALLBACK_SIGMA, SIGMA_GRID, TrainConfig
from .parallel import Parallel
from .prepare import PreparedData
from .run import RunOutcome, cs_theta_of, resolve_device, train_run, validation_split
from .tuning import search_sigma, trial_config, trial_dir

__all__ = ["train", "RunOutcome", "resolve_device", "cs_theta_of", "validation_split", "BEST_NAME",
           "SIGMA_SEARCH_NAME", "fitted_samples", "check_resume", "searches_sigma"]


def searches_sigma(config: TrainConfig) -> bool:
    """Whether a run of ``config`` picks sigma by a search (one training per candidate)."""
    return config.method == "sol" and config.sigma == "auto" and config.selects_model


def fitted_samples(config: TrainConfig, data: PreparedData) -> int:
    """How many training samples the encoder fits: those the validation split leaves.

    Raises:
        ValueError: naming ``val_fraction=``: the split leaves an empty part (too few samples).
    """
    try:
        split = validation_split(data.train_given, config.val_fraction, config.seed)
    except ValueError as exc:
        n = int(data.train_given.numel())
        raise ValueError(
            f"the validation split (val_fraction={config.val_fraction:g}) of the {n} training "
            f"samples leaves an empty part; use more data, another val_fraction=, or "
            f"val_fraction=0 (no split: the last epoch is the model).") from exc
    return int(split.fit.numel())


def check_resume(out_dir: Path, config: TrainConfig, fingerprint: dict[str, Any]) -> int:
    """Check, without changing anything, that the run in ``out_dir`` (its checkpoint, or the
    trials of its interrupted sigma search) can continue as a run of ``config`` on data with
    ``fingerprint``; return the epochs it has run.

    Raises:
        FileNotFoundError: nothing to resume in ``out_dir``.
        CheckpointMismatch: another configuration or other data.
        ValueError: naming ``epochs=``: fewer epochs than the run has already run.
    """
    out_dir = Path(out_dir)
    search = None
    if not (out_dir / CHECKPOINT_NAME).is_file() and searches_sigma(config):
        search = sigma_search_progress(out_dir)
    if search is None:
        done = check_resumable(out_dir / CHECKPOINT_NAME, config, fingerprint)
    else:
        done = 0
        for sigma in SIGMA_GRID:
            path = trial_dir(out_dir / SIGMA_SEARCH_NAME, sigma) / CHECKPOINT_NAME
            if path.is_file():
                done = max(done, check_resumable(path, trial_config(config, sigma), fingerprint))
    if config.epochs < done:
        raise ValueError(f"epochs={config.epochs} is fewer than the {done} epochs the run in "
                         f"{out_dir} has already run; resume with epochs={done} or more.")
    return done


def train(config: TrainConfig, data: PreparedData, out_dir: Path, resume: bool = False,
          progress: bool = False, log: Callable[[str], None] = print,
          parallel: Optional[Parallel] = None) -> RunOutcome:
    """Train ``config.method`` on ``data``; checkpoint to ``out_dir/checkpoint.pt`` every epoch
    and the best epoch so far to ``out_dir/best.pt``.

    Args:
        config: the run's settings (validated here). ``sigma="auto"`` is resolved first by
            :func:`sol_ext.driver.tuning.select_sigma` on the validation split.
        data: from :func:`sol_ext.driver.prepare.prepare_data`.
        out_dir: folder of the checkpoints (created).
        resume: continue from the checkpoint in ``out_dir``, or the trials of an interrupted sigma
            search there (same configuration and data, else
            :class:`sol_ext.driver.checkpoint.CheckpointMismatch`); ``config.epochs`` may be
            larger, not smaller than the epochs already run (:func:`check_resume`).
        progress: show a progress bar per epoch.
        log: receives one line per epoch.
        parallel: this process's place in a torchrun run (its process group started); default one
            process. ``config.batch_size`` is then per process, the global batch ``W`` times it.

    Returns:
        The outcome of the selected epoch (the best validation MAE against the noisy
        validation labels, or the last epoch without a validation split).
    """
    started = time.perf_counter()
    config.validate()
    par = parallel or Parallel()
    if par.enabled and config.pairs == "balanced":
        raise ValueError("--pairs balanced is not supported under torchrun: the distributed loss "
                         "covers all pairs of the global batch (--pairs all).")
    if not par.is_main:  # rank 0 speaks for the run
        log, progress = (lambda _line: None), False
    config.check_ranks(data.num_ranks)  # tau and sigma against the data's ranks
    fitted_samples(config, data)  # a validation split too small for the data says so here
    if resume and par.is_main:
        check_resume(out_dir, config, data.fingerprint())
    sigma_choice: Optional[dict[str, Any]] = None
    if config.method == "sol" and config.sigma == "auto":  # sol-no-noise has no sigma to pick
        # interrupted in the search: its trials continue
        if resume and searches_sigma(config) and par.broadcast_object(
                not (out_dir / CHECKPOINT_NAME).is_file() if par.is_main else None):
            return search_sigma(config, data, out_dir, par, log, time.perf_counter() - started,
                                resume=True)
        if resume and par.is_main:  # the search was adopted (checkpoint.pt is written last)
            shutil.rmtree(out_dir / SIGMA_SEARCH_NAME, ignore_errors=True)
        if resume:  # a resumed run keeps its pick
            saved = par.broadcast_object(load_checkpoint(out_dir / CHECKPOINT_NAME, config)
                                         if par.is_main else None)
            sigma_choice = saved["sigma_choice"]
        elif not config.selects_model:
            sigma_choice = {"sigma": FALLBACK_SIGMA, "val_mae": None}
            log(f"sigma auto needs a validation split (--val-fraction > 0); using sigma "
                f"{FALLBACK_SIGMA:g}, the paper's")
        else:
            return search_sigma(config, data, out_dir, par, log, time.perf_counter() - started)
    return train_run(config, data, out_dir, resume=resume, progress=progress, log=log,
                     parallel=par, sigma_choice=sigma_choice)
