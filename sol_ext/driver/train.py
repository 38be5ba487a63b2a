"""``train`` and the ``sol-ext train`` command: the driver's entry point, in the order a run takes.

1. :func:`check_run`: every check of the settings against the data, the processes and (resuming)
   the run folder, once; the device and the validation split it decides go to every fit.
2. :func:`plan_run`: what trains, decided once: one :class:`~sol_ext.driver.fit.Fit`
   (:class:`SingleRun`), or one per sigma candidate where sigma is ``"auto"`` (:class:`SigmaSearch`,
   whose winner's training is the run); resumed or not.
3. :func:`fit_run`: every fit of the plan, epoch by epoch, in one loop.

Module layers, top to bottom, without an import circle: ``train`` (checks, plans, the loop and the
command) → ``fit`` (:class:`~sol_ext.driver.fit.Fit`: epochs, read-outs, relabeling) → ``report``
(the outcome and results), ``checkpoint`` (the run folder's format) and ``methods``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from .. import cpu_capability
from .checkpoint import (
    BEST_NAME,
    CHECKPOINT_NAME,
    SIGMA_SEARCH_NAME,
    SIGMA_SEARCH_RECORD,
    atomic_write_text,
    check_resume,
    default_output,
    load_checkpoint,
    read_search_record,
    save_checkpoint,
    sigma_search_progress,
    trial_dir,
)
from .config import FALLBACK_SIGMA, SIGMA_GRID, TrainConfig
from .config_file import CONFIG_FILE_NAME, config_toml
from .console import say, warn
from .device import resolve_device
from .errors import UsageError
from .fit import Fit, FitContext, validation_split
from .options import check_test_data, check_threads, data_inputs, output_folder, set_threads, train_config
from .outputs import check_run_inputs, run_outputs
from .parallel import Parallel
from .prepare import PreparedData, prepare_data
from .report import RunOutcome, format_table, noise_label, write_outputs
from .rundir import check_output_folder, run_folder
from .text import TEXT_ENCODER_DIR, require_transformers

__all__ = ["train", "check_run", "fit_run", "CheckedRun", "plan_run", "train_command", "validation_split",
           "BEST_NAME", "SIGMA_SEARCH_NAME", "Trial", "SingleRun", "SigmaSearch", "trial_config"]


def _checked_split(config: TrainConfig, data: PreparedData):
    """The run's validation split of the training rows (:func:`validation_split`).

    Raises:
        ValueError: naming ``val_fraction=``: the split leaves an empty part (too few samples).
    """
    try:
        return validation_split(data.train_given, config.val_fraction, config.seed)
    except ValueError as exc:
        n = int(data.train_given.numel())
        raise ValueError(
            f"the validation split (val_fraction={config.val_fraction:g}) of the {n} training "
            f"samples leaves an empty part; use more data, another val_fraction=, or "
            f"val_fraction=0 (no split: the last epoch is the model).") from exc


@dataclass
class CheckedRun:
    """A run whose settings :func:`check_run` has checked against its data, its processes and
    (resuming) its folder: what :func:`fit_run` trains. ``context`` holds what the checks decided
    (the device, the validation split), which every fit of the run takes as it is."""

    config: TrainConfig
    data: PreparedData
    out_dir: Optional[Path]
    resume: bool
    context: FitContext


def train(config: TrainConfig, data: PreparedData, out_dir: Optional[Path], resume: bool = False,
          log: Callable[[str], None] = print, parallel: Optional[Parallel] = None) -> RunOutcome:
    """Train ``config.method`` on ``data``; checkpoint to ``out_dir/checkpoint.pt`` every epoch
    and the best epoch so far to ``out_dir/best.pt``.

    The settings are checked once, here (:meth:`TrainConfig.validate` and :func:`check_run`), and
    the plan decided once (:func:`plan_run`: one fit, or one per sigma candidate with
    ``sigma="auto"``; resumed or not); then every :class:`~sol_ext.driver.fit.Fit` of the plan
    trains, epoch by epoch, in :func:`fit_run`.

    Args:
        config: the run's settings. ``sigma="auto"`` is picked on the validation split
            (:class:`SigmaSearch`).
        data: from :func:`sol_ext.driver.prepare.prepare_data`.
        out_dir: folder of the checkpoints (created); ``None``: train in memory, write nothing
            (the outcome's ``best_state`` is the selected epoch's state, ``best.pt``'s content).
        resume: continue from the checkpoint in ``out_dir``, or the trials of an interrupted sigma
            search there (same configuration and data, else
            :class:`~sol_ext.driver.checkpoint.CheckpointMismatch`); ``config.epochs`` may be larger,
            not smaller than the epochs already run (:func:`~sol_ext.driver.checkpoint.check_resume`).
        log: receives one line per epoch.
        parallel: this process's place in a torchrun run (its process group started); default one
            process. ``config.batch_size`` is then per process, the global batch ``W`` times it.

    Returns:
        The outcome of the selected epoch (the best validation MAE against the noisy
        validation labels, or the last epoch without a validation split).
    """
    config.validate()  # a call from Python; `sol-ext train` validates as it reads the options
    return fit_run(check_run(config, data, out_dir, resume, parallel=parallel, log=log))


def check_run(config: TrainConfig, data: PreparedData, out_dir: Optional[Path], resume: bool, *,
              parallel: Optional[Parallel] = None, log: Callable[[str], None] = print,
              progress: bool = False) -> CheckedRun:
    """Every check of a run's settings (already valid on their own) against the data, the
    processes (``parallel``, default one) and (resuming) the run in ``out_dir``, before anything
    trains; the run, with what these checks decided once for all its fits in its context: the
    device, the validation split, and where its lines (``log``, and a progress bar with
    ``progress``) go: rank 0 speaks for the run."""
    par = parallel or Parallel()
    if resume and out_dir is None:
        raise ValueError("a run trained in memory (no output folder) has no checkpoint to resume.")
    if par.enabled and config.pairs == "balanced":
        raise ValueError("--pairs balanced is not supported under torchrun: the distributed loss "
                         "covers all pairs of the global batch (--pairs all).")
    config.check_ranks(data.num_ranks)  # tau and sigma against the data's ranks
    split = _checked_split(config, data)  # a validation split too small for the data says so
    if resume and par.is_main:
        check_resume(out_dir, config, data.fingerprint())
    context = FitContext(par, log if par.is_main else (lambda _line: None), progress and par.is_main,
                         resolve_device(config.device, par), split)
    return CheckedRun(config, data, out_dir, resume, context)


def fit_run(run: CheckedRun) -> RunOutcome:
    """Train every :class:`~sol_ext.driver.fit.Fit` of the plan of the checked ``run``, epoch by
    epoch; the outcome of the run (a sigma search's: its winner's)."""
    started = time.perf_counter()
    context = run.context
    plan = plan_run(run.config, run.out_dir, run.resume, context.parallel, context.log)
    try:
        for trial in plan.trials():
            fit = Fit(trial.config, run.data, trial.out_dir, dataclasses.replace(context, log=trial.log),
                      trial.sigma_choice)
            fit.start(trial.resume)
            for epoch in fit.epochs():
                fit.end_of_epoch(epoch, fit.train_one_epoch(epoch))
            plan.finished(trial, fit.outcome())
    except BaseException:
        plan.abandon()
        raise
    return plan.outcome(time.perf_counter() - started)


def plan_run(config: TrainConfig, out_dir: Optional[Path], resume: bool, par: Parallel,
             log: Callable[[str], None]):
    """What the run trains, decided once: a sigma search (fresh, resumed, or in memory), or one fit
    (resumed or not) with the sigma it keeps: a resumed run keeps its pick, a run without a
    validation split the paper's. Every fit of the plan trains with its sigma resolved."""
    if not (config.method == "sol" and config.sigma == "auto"):  # sol-no-noise has no sigma to pick
        return SingleRun(Trial(config, out_dir, resume, log=log))
    # interrupted in the search: its trials continue (checkpoint.pt is written last, on adoption)
    if resume and config.searches_sigma and par.broadcast_object(
            not (out_dir / CHECKPOINT_NAME).is_file() if par.is_main else None):
        return SigmaSearch(config, out_dir, par, log, resume=True)
    if resume:
        if par.is_main:  # the search was adopted
            shutil.rmtree(out_dir / SIGMA_SEARCH_NAME, ignore_errors=True)
        choice = par.broadcast_object(load_checkpoint(out_dir / CHECKPOINT_NAME, config)["sigma_choice"]
                                      if par.is_main else None)
        return SingleRun(Trial(trial_config(config, choice["sigma"]), out_dir, True, choice, log))
    if not config.selects_model:
        log(f"sigma auto needs a validation split (--val-fraction > 0); using sigma "
            f"{FALLBACK_SIGMA:g}, the paper's")
        choice = {"sigma": FALLBACK_SIGMA, "val_mae": None}
        return SingleRun(Trial(trial_config(config, FALLBACK_SIGMA), out_dir, False, choice, log))
    return SigmaSearch(config, out_dir, par, log)


# -- the plans: one fit, or a sigma search over fits ----------------------------------------------
#
# The noise-model width ``sigma`` (in ranks) says how far a label may lie from the truth; how much the
# centroid rule may smooth across ranks depends on the data (how many ranks, how far apart their
# embeddings can be pulled), so it is picked, by default, from SIGMA_GRID by the best validation MAE
# (against the noisy validation labels, as the epoch is; never the test set), one full training run
# per candidate: one Fit each, trained by the loop of fit_run.

def trial_config(config: TrainConfig, sigma: float) -> TrainConfig:
    """The configuration of the trial of ``sigma`` in a search for ``config``."""
    return dataclasses.replace(config, sigma=float(sigma))


@dataclass
class Trial:
    """One :class:`~sol_ext.driver.fit.Fit` of a run: its configuration (sigma resolved), its folder
    (``None``: in memory), whether it continues from its checkpoint there, its sigma choice (a run
    of ``sigma="auto"`` that trains one sigma) and where its lines go."""

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

    def outcome(self, seconds: float) -> RunOutcome:
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

    def trials(self) -> Iterator[Trial]:
        for number, sigma in enumerate(self.grid, start=1):
            where = None if self.work is None else trial_dir(self.work, sigma)
            # rank 0 alone reads the folder: every process must take the same branch
            again = self.resume and self.par.broadcast_object(
                (where / CHECKPOINT_NAME).is_file() if self.par.is_main else None)
            # each line of the trial's run names it: a search trains several times over, and
            # without them it would be a long silent wait
            yield Trial(trial_config(self.config, sigma), where, again, log=lambda line, s=sigma, k=number:
                        self.log(f"sigma {s:g} (trial {k}/{len(self.grid)}): {line}"))

    def finished(self, trial: Trial, outcome: RunOutcome) -> None:
        sigma = float(trial.config.sigma)
        self.scores[sigma] = float(outcome.results["val_mae"])
        self.outcomes[sigma] = outcome  # the winner's becomes the run's
        if self.work is not None and self.par.is_main:
            self.record["finished"][f"{sigma:g}"] = {
                "val_mae": self.scores[sigma], "selected_epoch": outcome.results["selected_epoch"],
                "epochs_run": outcome.results["epochs_run"]}
            atomic_write_text(self.work / SIGMA_SEARCH_RECORD, json.dumps(self.record, indent=2) + "\n")
        self.log(f"sigma {sigma:g}: validation MAE {self.scores[sigma]:.3f} "
                 f"(epoch {outcome.results['selected_epoch']})")

    def abandon(self) -> None:
        if self.work is not None and self.par.is_main and sigma_search_progress(self.out_dir) is None:
            shutil.rmtree(self.work, ignore_errors=True)  # nothing to resume: no half-done trials

    def outcome(self, seconds: float) -> RunOutcome:
        """The winner's training as the run of ``config``, with its sigma choice: its outcome, and
        (with a folder) its checkpoints, which move into ``out_dir``."""
        best = min(self.scores, key=lambda s: self.scores[s])
        self.log(f"sigma auto -> {best:g}")
        choice = {"sigma": best, "val_mae": {f"{s:g}": v for s, v in self.scores.items()}}
        if self.work is not None and self.par.is_main:
            self._adopt(choice)
        self.par.barrier()  # the run's files are in place before any process goes on
        return self.outcomes[best].adopted(self.config, choice, seconds)

    def _adopt(self, sigma_choice: dict[str, Any]) -> None:
        """The checkpoints of the picked sigma, relabeled as the run of ``config`` (``sigma="auto"``)
        with its ``sigma_choice``, move from the search folder into ``out_dir``."""
        winner = trial_dir(self.work, sigma_choice["sigma"])
        if (winner / TEXT_ENCODER_DIR).is_dir():  # a text run's encoder, which best.pt's checksums cover
            shutil.rmtree(self.out_dir / TEXT_ENCODER_DIR, ignore_errors=True)
            shutil.move(str(winner / TEXT_ENCODER_DIR), str(self.out_dir / TEXT_ENCODER_DIR))
        # best.pt first: checkpoint.pt marks the search as done (a Ctrl-C between the two leaves
        # the search, which --resume adopts again)
        for name in (BEST_NAME, CHECKPOINT_NAME):
            state = load_checkpoint(winner / name)
            state.update(config=self.config.to_dict(), sigma_choice=sigma_choice)
            save_checkpoint(self.out_dir / name, state)
        shutil.rmtree(self.work, ignore_errors=True)


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
    if cfg.reads_text:  # before any data are read: one line with the install command
        require_transformers()
    if args.print_config:
        sys.stdout.write(config_toml(cfg, paper=args.paper, output=args.output, threads=args.threads))
        return 0
    par = Parallel.from_environment()  # torchrun: one of several processes
    out = (output_folder(args.output) if args.output is not None
           else default_output(cfg, paper=args.paper))
    par.start(resolve_device(cfg.device, par))  # the process group's backend: nccl for GPUs
    try:
        if par.is_main:  # before the lock file: a folder that is not a run's stays untouched
            check_output_folder(out)
            check_run_inputs(out, "--output", data_inputs(cfg), overwrite=args.overwrite)
        # one run at a time in `out` (rank 0 holds it for all); a Ctrl-C says what it holds
        with run_folder(out) if par.is_main else contextlib.nullcontext(out):
            if par.is_main:
                _check_run_folder(args, cfg, out)
            run, start = _prepare_run(args, cfg, out, par)
            outcome = fit_run(run)
            if par.is_main:
                _write_run(args, run, outcome, start)
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
    if args.resume and search and not cfg.searches_sigma:
        raise UsageError(f"--resume: {out} holds an unfinished sigma search, which "
                         f"continues with the options it started with (--sigma auto); "
                         f"or pass --overwrite to start afresh.")
    if args.resume and not (has_run or search):
        raise UsageError(f"--resume: no checkpoint in {out}; train without --resume first.")


def _prepare_run(args: argparse.Namespace, cfg: TrainConfig, out: Path,
                 par: Parallel) -> tuple[CheckedRun, float]:
    """Load the data, check the run against them (a resume before anything changes), say what
    trains, or clear an overwritten run; returns the checked run and the start time."""
    start = time.perf_counter()
    data = prepare_data(cfg)
    # the settings were validated as the options were read; a too small validation split names
    # --val-fraction, a resume with other settings or data is refused (the last results stay
    # until the resumed run writes its own)
    run = check_run(cfg, data, out, args.resume, parallel=par, log=(lambda _line: None) if args.quiet else say,
                    progress=not args.quiet and sys.stdout.isatty())
    if par.is_main:
        _warn_if_few_fitted(cfg, int(data.train_given.numel()), int(run.context.split.fit.numel()),
                            par.world_size)
    set_threads(args.threads, cfg, data.kind)
    processes = f", {par.world_size} processes x batch {cfg.batch_size}" if par.enabled else ""
    # the CPU kernels that run (sol_ext.cpu_capability()): `sol-ext --version` answers without torch
    kernels = f" ({cpu_capability()} kernels)" if run.context.device.type == "cpu" else ""
    run.context.log(f"{data.name}: {data.train_x.shape[0]} training / {data.test_x.shape[0]} test "
                    f"samples, {data.num_ranks} ranks; {cfg.method} on {run.context.device}{kernels}, noise "
                    f"{noise_label(cfg.noise, cfg.kappa)}{processes} -> {out}")
    if par.is_main and args.overwrite:
        # the old run goes: predict/export/audit must not find its model, results, predictions
        # or exports (the user's own files there stay)
        for path in run_outputs(out):
            path.unlink(missing_ok=True)
        shutil.rmtree(out / SIGMA_SEARCH_NAME, ignore_errors=True)
        shutil.rmtree(out / TEXT_ENCODER_DIR, ignore_errors=True)
    return run, start


def _write_run(args: argparse.Namespace, run: CheckedRun, outcome: RunOutcome, start: float) -> None:
    """The settings as --config reads them, the calibration (the validation split's probabilities
    into best.pt, ECE into the results), then the results (written last) and plots; the table."""
    from .calibration import calibrate_run

    out = run.out_dir
    calibrate_run(out, run.config, run.data, outcome.results, context=run.context)
    atomic_write_text(out / CONFIG_FILE_NAME, config_toml(
        run.config, paper=args.paper, threads=args.threads, read_from=run.data.read_from))
    path = write_outputs(outcome, run.data, out, plots=args.plots)
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

