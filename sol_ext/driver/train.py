"""``train`` and the ``sol-ext train`` command: the driver's entry point. It checks the settings
once, decides the plan once (one :class:`~sol_ext.driver.run.Fit`, or one per sigma candidate where
sigma is ``"auto"``: :class:`sol_ext.driver.tuning.SigmaSearch`, the winner's is the run; resumed or
not), and trains every fit of the plan, epoch by epoch, in its own loop.

Module layers, top to bottom, without an import circle: ``train`` → ``tuning`` (the plans) → ``run``
(:class:`~sol_ext.driver.run.Fit`: epochs, read-outs, relabeling) → ``checkpoint`` (the run folder's
format) and ``methods``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .checkpoint import (
    BEST_NAME,
    CHECKPOINT_NAME,
    SIGMA_SEARCH_NAME,
    atomic_write_text,
    check_resumable,
    load_checkpoint,
    sigma_search_progress,
)
from .config import FALLBACK_SIGMA, SIGMA_GRID, TrainConfig
from .config_file import CONFIG_FILE_NAME, config_toml
from .errors import UsageError
from .options import (
    check_test_data,
    check_threads,
    data_inputs,
    default_output,
    output_folder,
    say,
    set_threads,
    train_config,
    warn,
)
from .outputs import check_run_inputs
from .parallel import Parallel
from .prepare import PreparedData, prepare_data
from .report import clear_results, format_table, noise_label, write_outputs
from .run import Fit, FitContext, RunOutcome, cs_theta_of, resolve_device, validation_split
from .rundir import check_output_folder, run_folder
from .tuning import SigmaSearch, SingleRun, Trial, trial_config, trial_dir

__all__ = ["train", "check_run", "plan_run", "train_command", "RunOutcome", "resolve_device", "cs_theta_of", "validation_split",
           "BEST_NAME", "SIGMA_SEARCH_NAME", "fitted_samples", "check_resume", "searches_sigma"]


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


def train(config: TrainConfig, data: PreparedData, out_dir: Optional[Path], resume: bool = False,
          progress: bool = False, log: Callable[[str], None] = print,
          parallel: Optional[Parallel] = None) -> RunOutcome:
    """Train ``config.method`` on ``data``; checkpoint to ``out_dir/checkpoint.pt`` every epoch
    and the best epoch so far to ``out_dir/best.pt``.

    The settings are checked once, here (:func:`check_run`), and the plan decided once
    (:func:`plan_run`: one fit, or one per sigma candidate with ``sigma="auto"``; resumed or not);
    then every :class:`~sol_ext.driver.run.Fit` of the plan trains, epoch by epoch, in this loop.

    Args:
        config: the run's settings. ``sigma="auto"`` is picked on the validation split
            (:class:`sol_ext.driver.tuning.SigmaSearch`).
        data: from :func:`sol_ext.driver.prepare.prepare_data`.
        out_dir: folder of the checkpoints (created); ``None``: train in memory, write nothing
            (the outcome's ``best_state`` is the selected epoch's state, ``best.pt``'s content).
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
    par = parallel or Parallel()
    if not par.is_main:  # rank 0 speaks for the run
        log, progress = (lambda _line: None), False
    check_run(config, data, out_dir, resume, par)
    plan = plan_run(config, out_dir, resume, par, log)
    try:
        for trial in plan.trials():
            fit = Fit(trial.config, data, trial.out_dir, trial.sigma_choice,
                      FitContext(par, trial.log, progress))
            fit.start(trial.resume)
            for epoch in fit.epochs():
                fit.end_of_epoch(epoch, fit.train_one_epoch(epoch))
            plan.finished(trial, fit.outcome())
    except BaseException:
        plan.abandon()
        raise
    return plan.outcome(data, time.perf_counter() - started)


def check_run(config: TrainConfig, data: PreparedData, out_dir: Optional[Path], resume: bool,
              par: Parallel) -> None:
    """Every check of a run's settings against the data, the processes and (resuming) the run in
    ``out_dir``, before anything trains."""
    if resume and out_dir is None:
        raise ValueError("a run trained in memory (no output folder) has no checkpoint to resume.")
    config.validate()
    if par.enabled and config.pairs == "balanced":
        raise ValueError("--pairs balanced is not supported under torchrun: the distributed loss "
                         "covers all pairs of the global batch (--pairs all).")
    config.check_ranks(data.num_ranks)  # tau and sigma against the data's ranks
    fitted_samples(config, data)  # a validation split too small for the data says so here
    if resume and par.is_main:
        check_resume(out_dir, config, data.fingerprint())


def plan_run(config: TrainConfig, out_dir: Optional[Path], resume: bool, par: Parallel,
             log: Callable[[str], None]):
    """What the run trains, decided once: a sigma search (fresh, resumed, or in memory), or one fit
    (resumed or not) with the sigma it keeps: a resumed run keeps its pick, a run without a
    validation split the paper's."""
    if not (config.method == "sol" and config.sigma == "auto"):  # sol-no-noise has no sigma to pick
        return SingleRun(Trial(config, out_dir, resume, log=log))
    # interrupted in the search: its trials continue (checkpoint.pt is written last, on adoption)
    if resume and searches_sigma(config) and par.broadcast_object(
            not (out_dir / CHECKPOINT_NAME).is_file() if par.is_main else None):
        return SigmaSearch(config, out_dir, par, log, resume=True)
    if resume:
        if par.is_main:  # the search was adopted
            shutil.rmtree(out_dir / SIGMA_SEARCH_NAME, ignore_errors=True)
        saved = par.broadcast_object(load_checkpoint(out_dir / CHECKPOINT_NAME, config)
                                     if par.is_main else None)
        return SingleRun(Trial(config, out_dir, True, saved["sigma_choice"], log))
    if not config.selects_model:
        log(f"sigma auto needs a validation split (--val-fraction > 0); using sigma "
            f"{FALLBACK_SIGMA:g}, the paper's")
        return SingleRun(Trial(config, out_dir, False, {"sigma": FALLBACK_SIGMA, "val_mae": None}, log))
    return SigmaSearch(config, out_dir, par, log)


# -- the `sol-ext train` command -------------------------------------------------------------------

def train_command(args: argparse.Namespace) -> int:
    """``sol-ext train``: resolve the configuration, check the output folder, train, write the
    run's files (``config.toml`` and the results last). Under torchrun rank 0 checks and writes."""
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other: --resume continues the run "
                         "in --output, --overwrite discards it; pass one of them.")
    cfg = train_config(args)  # without --noise: gaussian on a built-in set, else none (TrainConfig)
    check_threads(args.threads)  # after the --config file, which may set it
    check_test_data(args, cfg)
    if args.print_config:
        sys.stdout.write(config_toml(cfg, paper=args.paper, output=args.output, threads=args.threads))
        return 0
    par = Parallel.from_environment()  # torchrun: one of several processes
    device = resolve_device(cfg.device, par)
    out = (output_folder(args.output) if args.output is not None
           else default_output(cfg, paper=args.paper))
    par.start(device)
    try:
        if par.is_main:  # before the lock file: a folder that is not a run's stays untouched
            check_output_folder(out)
            check_run_inputs(out, "--output", data_inputs(cfg))
        # one run at a time in `out` (rank 0 holds it for all); a Ctrl-C says what it holds
        with run_folder(out) if par.is_main else contextlib.nullcontext(out):
            if par.is_main:
                _check_run_folder(args, cfg, out)
            data, say_line, start = _prepare_run(args, cfg, out, par)
            outcome = train(cfg, data, out, resume=args.resume,
                            progress=not args.quiet and sys.stdout.isatty(), log=say_line, parallel=par)
            if par.is_main:
                _write_run(args, cfg, data, outcome, out, start)
            # every process leaves the group together: one that tore its gloo connections down
            # while rank 0 still wrote the outputs sometimes aborted ("terminate called without
            # an active exception")
            par.barrier()
            return 0
    finally:
        par.stop()


def _check_run_folder(args: argparse.Namespace, cfg: TrainConfig, out: Path) -> None:
    """A folder holding a run (or an unfinished sigma search) needs --resume or --overwrite;
    --resume needs something to continue."""
    has_run = (out / CHECKPOINT_NAME).exists()
    search = None if has_run else sigma_search_progress(out)
    if (has_run or search) and not (args.resume or args.overwrite):
        what = "a run" if has_run else "an unfinished sigma search (--sigma auto)"
        raise UsageError(f"{out} already holds {what}; pass --resume to continue it, "
                         f"--overwrite to start afresh, or another --output.")
    if args.resume and search and not searches_sigma(cfg):
        raise UsageError(f"--resume: {out} holds an unfinished sigma search, which "
                         f"continues with the options it started with (--sigma auto); "
                         f"or pass --overwrite to start afresh.")
    if args.resume and not (has_run or search):
        raise UsageError(f"--resume: no checkpoint in {out}; train without --resume first.")


def _prepare_run(args: argparse.Namespace, cfg: TrainConfig, out: Path, par: Parallel):
    """Load the data, say what trains, and check a resume or clear an overwritten run; returns the
    data, the per-epoch log and the start time."""
    say_line = (lambda _line: None) if args.quiet or not par.is_main else say
    start = time.perf_counter()
    data = prepare_data(cfg)
    n_fit = fitted_samples(cfg, data)  # a too small validation split names --val-fraction
    if par.is_main:
        _warn_if_few_fitted(cfg, int(data.train_given.numel()), n_fit, par.world_size)
    set_threads(args.threads, cfg, data.kind)
    processes = f", {par.world_size} processes x batch {cfg.batch_size}" if par.enabled else ""
    say_line(f"{data.name}: {data.train_x.shape[0]} training / {data.test_x.shape[0]} test "
             f"samples, {data.num_ranks} ranks; {cfg.method} on {resolve_device(cfg.device, par)}, noise "
             f"{noise_label(cfg.noise, cfg.kappa)}{processes} -> {out}")
    if par.is_main and args.resume:
        # refuse other settings or data, or fewer epochs, before anything changes; the last
        # results stay until the resumed run writes its own
        check_resume(out, cfg, data.fingerprint())
    elif par.is_main and args.overwrite:
        # the old run goes: predict/export/audit must not find its model or results
        clear_results(out)
        for name in (CHECKPOINT_NAME, BEST_NAME, CONFIG_FILE_NAME):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / SIGMA_SEARCH_NAME, ignore_errors=True)
    return data, say_line, start


def _write_run(args: argparse.Namespace, cfg: TrainConfig, data: PreparedData, outcome: RunOutcome,
               out: Path, start: float) -> None:
    """The settings as --config reads them, the calibration (the validation split's probabilities
    into best.pt, ECE into the results), then the results (written last) and plots; the table."""
    from .calibration import calibrate_run

    calibrate_run(out, cfg, data, outcome.results)
    atomic_write_text(out / CONFIG_FILE_NAME, config_toml(
        cfg, paper=args.paper, threads=args.threads, relative_to=data.read_from))
    path = write_outputs(outcome, data, out, plots=args.plots)
    print(format_table([outcome.results]))
    print(f"{time.perf_counter() - start:.1f} s; results in {path}")


def _warn_if_few_fitted(cfg: TrainConfig, n_train: int, n_fit: int, world_size: int) -> None:
    """One warning line when the encoder fits fewer than two (global) batches of samples."""
    batch = cfg.batch_size * world_size
    if n_fit >= 2 * batch:
        return
    held = (f" (--val-fraction {cfg.val_fraction:g} holds out {n_train - n_fit} of {n_train})"
            if n_fit < n_train else "")
    samples = "sample" if n_fit == 1 else "samples"
    warn(f"the encoder fits only {n_fit} training {samples}{held}, fewer than two batches of "
         f"{batch}: its results mean little; lower --val-fraction or --batch-size, or use more "
         f"data.")
