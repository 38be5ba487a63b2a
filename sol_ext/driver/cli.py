"""The ``sol-ext`` command: ``train``, ``predict``, ``export``, ``audit`` and ``compare``.

Errors in the input (a bad data file, an unknown option value, a checkpoint of another run)
print one line ``sol-ext: error: ...`` and exit with status 2; ``--traceback`` (or the environment
variable ``SOL_EXT_TRACEBACK=1``) prints the full traceback above it. Every output path is checked by
:mod:`sol_ext.driver.outputs` before anything is computed; Ctrl-C prints ``sol-ext: interrupted``
and exits with status 130, leaving no partial file; a second one, during that clean stop, ends the
command at once (:mod:`sol_ext.driver.interrupts`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Optional, Sequence

from .config import COMPARE_METHODS
from .errors import UsageError, command_line_flags, user_error_message, with_flags
from .interrupts import second_interrupt_stops_at_once
from .options import add_settings, comma_list

__all__ = ["main", "build_parser", "end_process"]

EXIT_USAGE = 2
# The environment variable that shows the traceback behind an error line, as --traceback does.
TRACEBACK_VARIABLE = "SOL_EXT_TRACEBACK"
TRACEBACK_HELP = (f"print the full traceback above an error's one line (also "
                  f"{TRACEBACK_VARIABLE}=1): for debugging your data or the package")
# Each command's handler, in the module of its command (imported when the command runs).
HANDLERS = {"train": "train:train_command", "predict": "predict:predict_command",
            "export": "export:export_command", "audit": "audit:audit_command",
            "compare": "compare:compare_command"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sol-ext", description="Stochastic Order Learning: rank estimation from noisy labels.")
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--traceback", action="store_true", default=False, help=TRACEBACK_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_train, _add_predict, _add_export, _add_audit, _add_compare):
        command = add(sub)
        # also after the command's name; SUPPRESS keeps one given before it
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                             help=TRACEBACK_HELP)
    return parser


def _add_train(sub) -> argparse.ArgumentParser:
    t = sub.add_parser("train", help="train one model and report test MAE/CS",
                       description="Train SOL or a baseline. With no option: abalone, Gaussian "
                                   "label noise at kappa 0.3, SOL. Data-parallel under torchrun: "
                                   "torchrun --nproc-per-node N -m sol_ext.driver train ... (--batch-size "
                                   "is then per process).")
    add_settings(t)  # every TrainConfig field (sol_ext.driver.config.setting)
    t.add_argument("--output", default=None,
                   help="output folder: new, empty, or a run's (default: "
                        "runs/<data>-<method>[-paper]-<noise><kappa>-seed<k>, <noise> 'none' "
                        "without added noise)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --output from its last checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="start afresh even if --output holds a run (the files sol-ext wrote there "
                        "are deleted: checkpoints, results, plots, predictions, exports; your own stay)")
    t.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    t.add_argument("--quiet", action="store_true", help="no per-epoch lines, no progress bar")
    t.add_argument("--config", default=None, metavar="FILE", action=_OneFile,
                   help="TOML file of settings, one 'key = value' line each, keys as the options "
                        "above (epochs = 40, label_column = \"age\"); options given here override it. "
                        "Relative paths in the file are read from the file's folder; a run's "
                        "config.toml repeats it from any folder (Python < 3.11 needs the tomli "
                        "package)")
    t.add_argument("--print-config", action="store_true",
                   help="print the run's settings as TOML (what --config reads) and exit without "
                        "training")

    return t


class _OneFile(argparse.Action):
    """An option naming one file, refused when given twice: the last one would win without a word."""

    def __call__(self, parser, namespace, value, option_string=None):
        earlier = getattr(namespace, self.dest, None)
        if earlier is not None:
            parser.error(f"{option_string} given twice ({earlier}, {value}); pass one file: put the "
                         f"settings of both in it, or give a setting as its option to override the file")
        setattr(namespace, self.dest, value)


def _add_predict(sub) -> argparse.ArgumentParser:
    pr = sub.add_parser("predict", help="predict labels for new data with a trained run",
                        description="One CSV row per input: id (data row from 0, or image path), "
                                    "prediction and expected value in label units, and one "
                                    "probability column per label value. If the data have the "
                                    "label column, prints MAE, QWK and macro-MAE against it.")
    pr.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output folder of 'sol-ext train'")
    pr.add_argument("--data", required=True,
                    help="a CSV/TSV (also gzipped), Parquet, Feather/Arrow or .npz file, an image "
                         "folder, or a built-in name, with the training data's columns (the label "
                         "column is optional)")
    pr.add_argument("--delimiter", default=None,
                    help="cell separator of a CSV file (default: the training file's, else sniffed)")
    pr.add_argument("--encoding", default=None,
                    help="text encoding of a CSV file, e.g. cp1252 (default: the training file's, else UTF-8)")
    pr.add_argument("--output", default=None,
                    help="where to write the CSV (default: RUN_DIR/predictions.csv, replaced by a "
                         "rerun; '-' for stdout). Never the input file or a file sol-ext wrote into "
                         "a run folder; another existing file needs --overwrite")
    pr.add_argument("--overwrite", action="store_true",
                    help="replace an existing --output file that is neither an input nor sol-ext's")
    pr.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto (default: %(default)s)")
    pr.add_argument("--missing", choices=("empty", "skip", "impute", "error"), default=None,
                    help="rows with a missing feature value: written with empty predictions (empty), left "
                         "out of the CSV (skip), filled with the training file's median or most common "
                         "category and predicted (impute), or refused (error). Default: impute for a run "
                         "trained with --missing impute, else empty")
    pr.add_argument("--handle-unknown", choices=("error", "ignore"), default="error",
                    help="a category of a text column that training did not see: refused (error, the "
                         "default) or encoded as none of the column's categories (ignore)")
    pr.add_argument("--workers", type=int, default=None,
                    help="DataLoader processes decoding image files; 0: this process (default: the "
                         "free CPU cores, at most 8)")
    _add_interval_options(pr, "add columns lower and upper (label units): an interval per row that holds "
                              "its label with this probability, e.g. 0.9")

    return pr


def _add_export(sub) -> argparse.ArgumentParser:
    ex = sub.add_parser("export", help="write a trained run as a torch.export (.pt2) or ONNX (.onnx) program",
                        description="A torch.export program that loads and predicts with plain "
                                    "torch (torch.export.load(PATH).module()(x)), without sol_ext, "
                                    "or with --format onnx an ONNX model that onnxruntime runs; "
                                    "x is float32 or float64 [N, F] raw features in the training "
                                    "column order (one-hot columns included) or images [N, C, H, W] "
                                    "in [0, 1]; a row with NaN or inf gets NaN outputs. Beside it, "
                                    "PATH.json (model.pt2.json) names the columns and label values.")
    ex.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output folder of 'sol-ext train'")
    ex.add_argument("--output", default=None,
                    help="the program's path; its sidecar is the same path with .json added "
                         "(default: RUN_DIR/model.pt2 and RUN_DIR/model.pt2.json, or with --format onnx "
                         "RUN_DIR/model.onnx and RUN_DIR/model.onnx.json, replaced by a rerun). "
                         "Never a file sol-ext wrote into a run folder; another existing file needs "
                         "--overwrite")
    ex.add_argument("--overwrite", action="store_true",
                    help="replace an existing program or sidecar that is not sol-ext's run files")
    ex.add_argument("--format", choices=("pt2", "onnx"), default=None,
                    help="pt2: a torch.export program; onnx: an ONNX model that onnxruntime runs without "
                         "torch (input x, outputs prediction, expected, probabilities; needs the extra "
                         "onnx). Default: onnx when --output ends in .onnx, else pt2")
    _add_interval_options(ex, "the program also returns lower and upper: rank intervals at this coverage")

    return ex


def _add_interval_options(parser: argparse.ArgumentParser, what: str):
    """The interval options of predict and export, in their group: ``--interval``, ``--calibration``,
    ``--interval-score``, and the clean target's ``--interval-target``, ``--label-noise`` and
    ``--no-deconvolve``."""
    group = parser.add_argument_group("rank intervals (split conformal; docs/intervals.md)")
    group.add_argument("--interval", type=float, default=None, metavar="COVERAGE",
                       help=f"{what}; calibrated on the run's validation split, or on --calibration")
    group.add_argument("--calibration", default=None, metavar="FILE",
                       help="held-out rows with labels, which the run did not train on, to calibrate --interval "
                            "on instead of the validation split the run stored")
    group.add_argument("--interval-score", choices=("hpd", "cumulative", "absolute"), default=None,
                       help="the nonconformity score (default: cumulative)")
    group.add_argument("--interval-target", choices=("labels", "clean"), default=None,
                       help="cover the labels as given, or the clean label behind noisy ones (needs "
                            "--label-noise; default: labels)")
    group.add_argument("--label-noise", type=float, default=None, metavar="STD",
                       help="the std of the calibration labels' noise, in label units, for --interval-target clean")
    group.add_argument("--no-deconvolve", dest="deconvolve", action="store_false",
                       help="--interval-target clean: read the run's probabilities as the clean rank's as they "
                            "are, rather than deconvolving them through the noise as far as the labels say "
                            "(docs/intervals.md: safer where the noise std is a guess)")
    return group


def _add_audit(sub) -> argparse.ArgumentParser:
    a = sub.add_parser("audit", help="list the training labels that look wrong, as CSV",
                       description="One row per training sample of a trained run, suspects "
                                   "first: index, given label, current label, predicted label, "
                                   "deviation, outlier flag, score (how likely the label is wrong), "
                                   "suggested label.")
    a.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output folder of 'sol-ext train'")
    a.add_argument("--csv", default=None,
                   help="where to write the CSV (default: RUN_DIR/audit.csv, replaced by a rerun; "
                        "'-' for stdout). Never a file sol-ext wrote into a run folder; another "
                        "existing file needs --overwrite")
    a.add_argument("--overwrite", action="store_true",
                   help="replace an existing --csv file that is not one of sol-ext's run files")
    a.add_argument("--folds", type=int, default=None, metavar="K",
                   help="judge every training row by a model trained without it: the run's settings "
                        "trained K times, each without one of K folds (default 3; costs about K-1 runs)")
    a.add_argument("--in-sample", action="store_true",
                   help="judge the labels by the run's own model, which trained on them (no training; "
                        "finds few: a model agrees with the labels it fitted)")
    a.add_argument("--label-noise", type=float, default=None, metavar="STD",
                   help="the std of the label error in ranks, if you know it: a label is flagged where "
                        "the median of p(rank | x, label) is another rank (default: the run's "
                        "--label-noise when it is a number, else only labels in a 0.25%% tail of "
                        "p(rank | x): few flags, rarely wrong)")
    a.add_argument("--threads", type=int, default=0,
                   help="CPU threads of torch for the fold trainings; 0: as sol-ext train picks them "
                        "(1 for the MLP encoder)")

    return a


def _add_compare(sub) -> argparse.ArgumentParser:
    c = sub.add_parser("compare", help="SOL against the baselines under label noise",
                       description="Train every method at Gaussian kappa in {0, 0.2, 0.3, 0.4} "
                                   "and Laplacian, uniform, skewed at 0.3, over 3 seeds; print "
                                   "markdown tables of mean ± std test MAE and CS.")
    c.add_argument("--methods", type=comma_list(str),
                   default=None, help="comma list of " + ", ".join(COMPARE_METHODS) + " (sol-paper: "
                                      "sol with --paper; default: all but sol-paper, corn where "
                                      "coral-pytorch is installed)")
    c.add_argument("--kappas", type=comma_list(float), default=None,
                   help="Gaussian noise ratios (default: 0,0.2,0.3,0.4)")
    c.add_argument("--noises", type=comma_list(str),
                   default=None, help="other noise types at kappa 0.3 (default: "
                                      "laplacian,uniform,skewed; '' for none)")
    c.add_argument("--seeds", type=comma_list(int), default=[0, 1, 2],
                   help="comma list (default: 0,1,2)")
    # every setting but those a comparison varies itself
    add_settings(c, skip=("method", "seed", "noise", "kappa", "noise_fraction"))
    c.add_argument("--output", default="runs/compare",
                   help="folder of the runs and of compare.md (default: %(default)s)")
    return c


def _version() -> str:
    from .. import __version__

    return __version__


def _process_label() -> str:
    """``" (rank 1 of 4)"`` under torchrun (every process reports its own failure), else ``""``."""
    from .parallel import Parallel

    try:
        par = Parallel.from_environment()
    except ValueError:
        return ""
    return f" (rank {par.rank} of {par.world_size})" if par.enabled else ""


def end_process(status: int) -> None:
    """End the command's process now with ``status``, without the interpreter's shutdown.

    Tearing down torch's modules and libraries takes about 0.3 s: a sixth of a 200,000-row
    ``sol-ext predict``. The exit handlers still run first (the DataLoader workers' cleanup among
    them) and the output streams are flushed. Under torchrun they are skipped too: after
    DistributedDataParallel, torch's gloo can abort in the shutdown ("terminate called without an
    active exception"), which would report a finished run as failed.
    """
    # the command's outcome is known (and said): a Ctrl-C while the exit handlers run ends the
    # process at once with it, not with a traceback of the handler it interrupted
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(status))
    world_size = os.environ.get("WORLD_SIZE", "1")
    if not (world_size.isdigit() and int(world_size) > 1):
        atexit._run_exitfuncs()  # what the shutdown would run first; documented since Python 2
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`) has nothing to flush to
            stream.flush()
    os._exit(status)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``sol-ext``; returns the exit status."""
    parser = build_parser()
    # argparse exits with status 2 on bad syntax; every setting's option defaults to None, so
    # those not None are the ones typed (options.train_config lets them override a --config file)
    args = parser.parse_args(argv)
    # a second Ctrl-C, pressed while the first stops the command cleanly, ends it at once
    with second_interrupt_stops_at_once():
        return _run_command(parser, args)


def _run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The command of ``args``; its exit status, a line for an error or a Ctrl-C."""
    try:
        from .parallel import Parallel

        par = Parallel.from_environment()
        if par.enabled and args.command != "train":
            raise UsageError(f"'sol-ext {args.command}' runs in one process; of the commands only "
                             f"'train' runs under torchrun.")
        module, name = HANDLERS[args.command].split(":")
        with _own_warnings_as_lines(command_line_flags(parser)):
            return getattr(importlib.import_module(f".{module}", __package__), name)(args)
    except KeyboardInterrupt as exc:
        # a run says what its output folder holds (rundir.RunInterrupted); elsewhere, nothing
        # was written
        # (a bare KeyboardInterrupt has an empty message, but is true as an object)
        _print_traceback_if_asked(args)
        print(f"sol-ext: {str(exc) or 'interrupted; nothing was written.'}", file=sys.stderr)
        return 143 if getattr(exc, "terminated", False) else 130  # 128 + SIGTERM, 128 + SIGINT
    except Exception as exc:
        # bad input: the message says what and how to fix it, with the command's flags; no
        # traceback unless asked for. Anything else is a bug and keeps its traceback.
        message = user_error_message(exc, command_line_flags(parser))
        if message is None:
            raise
        _print_traceback_if_asked(args)
        where = _process_label()
        print(f"sol-ext: error{where}: {message}", file=sys.stderr)
        return EXIT_USAGE


# Library argument names in sol_ext's warnings -> the flags that set them on the command line.
_WARNING_FLAGS = {"step": "--label-step", "min_value": "--label-min", "max_value": "--label-max",
                  "coverage": "--interval"}


@contextlib.contextmanager
def _own_warnings_as_lines(flags: dict[str, str]):
    """Show sol_ext's own warnings (a label scale resting on a typo, an id-like text column) as one
    line ``sol-ext: warning: ...`` naming the command's flags, not as Python's two-line warning;
    other warnings keep Python's form. They are the command's output: shown whatever Python's
    warning filters say (PYTHONWARNINGS=ignore, common in CI, or =error)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("default", module=r"sol_ext(\.|$)")
        python_form = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if category.__module__.split(".")[0] != "sol_ext":
                return python_form(message, category, filename, lineno, file, line)
            text = with_flags(str(message), {**flags, **_WARNING_FLAGS})
            print(f"sol-ext: warning: {text}", file=sys.stderr, flush=True)

        warnings.showwarning = show
        yield


def traceback_asked(args: argparse.Namespace) -> bool:
    """Whether ``--traceback`` was given or ``SOL_EXT_TRACEBACK`` is set to a true value."""
    value = os.environ.get(TRACEBACK_VARIABLE, "").strip().lower()
    return bool(getattr(args, "traceback", False)) or value not in ("", "0", "false", "no", "off")


def _print_traceback_if_asked(args: argparse.Namespace) -> None:
    """The traceback of the exception being handled, on stderr, where :func:`traceback_asked`."""
    if traceback_asked(args):
        import traceback

        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    _status = main()
    end_process(_status)
