"""``train``: the driver's entry point. It checks the configuration, picks sigma where it is
``"auto"`` (:mod:`sol_ext.driver.tuning`: one training run per candidate, the winner's is the run)
and otherwise trains once (:func:`sol_ext.driver.run.train_run`, the epoch loop of Algorithm 1).

Module layers, top to bottom, without an import circle: ``train`` → ``tuning`` → ``run`` (one
run: epochs, read-outs, relabeling) → ``checkpoint`` (the run folder's format) and ``methods``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

from .checkpoint import BEST_NAME, CHECKPOINT_NAME, SIGMA_SEARCH_NAME, load_checkpoint
from .config import FALLBACK_SIGMA, TrainConfig
from .parallel import Parallel
from .prepare import PreparedData
from .run import RunOutcome, cs_theta_of, resolve_device, train_run, validation_split
from .tuning import search_sigma

__all__ = ["train", "RunOutcome", "resolve_device", "cs_theta_of", "validation_split", "BEST_NAME",
           "SIGMA_SEARCH_NAME"]


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
        resume: continue from the checkpoint in ``out_dir`` (same configuration and data, else
            :class:`sol_ext.driver.checkpoint.CheckpointMismatch`); ``config.epochs`` may be larger.
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
    sigma_choice: Optional[dict[str, Any]] = None
    if config.method == "sol" and config.sigma == "auto":  # sol-no-noise has no sigma to pick
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
