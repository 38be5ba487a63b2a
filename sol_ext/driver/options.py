"""The training settings on the command line: ``sol-ext train`` and ``compare`` options generated
from the :class:`~sol_ext.driver.config.TrainConfig` fields (:func:`add_settings`), and the
configuration a command runs with, from the defaults (or ``--paper``), a ``--config`` file and the
options typed (:func:`train_config`), with the checks the two commands share.

Adding a setting is one edit: a field declared with :func:`sol_ext.driver.config.setting`.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Collection

from .config import OPTION_GROUPS, PAPER_SETTINGS, TrainConfig, option_of, setting_kinds
from .errors import UsageError

__all__ = ["add_settings", "train_config", "comma_list", "number_or_auto", "check_threads",
           "set_threads", "check_test_data", "output_folder", "default_output", "data_inputs",
           "run_data", "say", "warn"]

THREADS_PER_CORE = 4  # --threads beyond this many per CPU core is a typo (torch fails on 100000)


def comma_list(kind: Callable[[str], Any] = float) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of ``kind`` (``"128,128"``; empty items skipped)."""
    def parse(text: str) -> list:
        try:
            return [kind(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of numbers, got {text!r}") from None
    return parse


def number_or_auto(text: str) -> float | str:
    """An argparse type: a number, or the word ``auto``."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


# the argparse type of each kind of setting (config.setting_kinds)
_PARSE = {("str",): str, ("int",): int, ("float",): float, ("float", "auto"): number_or_auto,
          ("int list",): comma_list(int)}


class _DeprecatedFlag(argparse.Action):
    """Stores like the option it stands for, and warns that the spelling will go."""

    def __init__(self, *args, new_flag: str, **kwargs):
        self.new_flag = new_flag
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        warnings.warn(f"{option_string} is deprecated and will be removed; use {self.new_flag}",
                      DeprecationWarning, stacklevel=2)
        print(f"sol-ext: warning: {option_string} is deprecated; use {self.new_flag}.",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def _help(option: dict[str, Any]) -> str:
    """The option's help with its default, where it has one (a None default is said in words)."""
    default = option["default"]
    if default is None or isinstance(default, bool):
        return option["help"]
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    return f"{option['help']} (default: {shown})"


def _add_setting(group: argparse._ActionsContainer, name: str, kinds: tuple[str, ...]) -> None:
    """The option(s) of the TrainConfig field ``name`` in ``group``. Every default is None: a setting
    not typed keeps the file's value, --paper's, or the field's default (:func:`train_config`)."""
    option = option_of(name)
    flag, help_text = option["flag"], _help(option)
    if kinds == ("bool",):
        if option["default"] is None:  # --refine / --no-refine: on, off or the method's default
            pair = group.add_mutually_exclusive_group()
            pair.add_argument(flag, dest=name, action="store_true", default=None, help=help_text)
            pair.add_argument("--no-" + flag[2:], dest=name, action="store_false", default=None,
                              help=argparse.SUPPRESS)
        elif option["default"]:  # on by default: --no-normalize turns it off
            group.add_argument("--no-" + flag[2:], dest=name, action="store_false", default=None,
                               help=help_text)
        else:
            group.add_argument(flag, dest=name, action="store_true", default=None, help=help_text)
        return
    parse = _PARSE[kinds]
    group.add_argument(flag, *option["aliases"], dest=name, type=parse, default=None,
                       choices=option["choices"], metavar=option["metavar"], help=help_text)
    for old in option["deprecated"]:
        group.add_argument(old, dest=name, action=_DeprecatedFlag, new_flag=flag, type=parse, default=None, choices=option["choices"], help=argparse.SUPPRESS)


def add_settings(parser: argparse.ArgumentParser,
                 skip: Collection[str] = ()) -> dict[str, argparse._ActionsContainer]:
    """Add an option for every TrainConfig field but those in ``skip``, in the groups of
    :data:`~sol_ext.driver.config.OPTION_GROUPS` (a field of no group goes to ``parser`` itself);
    return the groups by title, for the command's own options."""
    groups: dict[str, argparse._ActionsContainer] = {
        title: parser.add_argument_group(title, description) for title, description in OPTION_GROUPS.items()}
    for name, kinds in setting_kinds().items():
        if name not in skip:
            title = option_of(name)["group"]
            _add_setting(parser if title is None else groups[title], name, kinds)
    groups["SOL settings"].add_argument(
        "--paper", action="store_true",
        help="the published procedure: " + ", ".join(f"{k}={v}" for k, v in PAPER_SETTINGS.items()))
    groups["optimization"].add_argument(
        "--threads", type=int, default=0,
        help="CPU threads of torch; 0: 1 for the MLP encoder (its small products lose more to "
             "thread hand-offs than they gain), torch's default otherwise")
    return groups


# -- the configuration of a command ---------------------------------------------------------------

def train_config(args: argparse.Namespace, **override) -> TrainConfig:
    """The run's configuration: the defaults, or the paper's settings with ``--paper``, then the
    ``--config`` file's settings, then every option given on the command line. The file's
    ``output`` and ``threads`` are set on ``args`` where the command line does not give them."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    from_file = None
    given = None  # without a file, every option that is not None applies
    if getattr(args, "config", None) is not None:
        from .cli import build_parser
        from .config_file import options_given, read_config_file

        from_file = read_config_file(args.config)
        args.paper = from_file.pop("paper", False) or args.paper  # also names the output folder
        given = options_given(build_parser(), args.argv)
        for option in ("output", "threads"):  # options of the command, not of the training
            if option in from_file and option not in given:
                setattr(args, option, from_file[option])
            from_file.pop(option, None)
    values = dict(PAPER_SETTINGS) if getattr(args, "paper", False) else {}
    values.update(from_file or {})
    values.update({k: v for k, v in vars(args).items()
                   if k in names and v is not None and (given is None or k in given)})
    values.update(override)
    try:
        return TrainConfig(**values).validate()
    except ValueError as exc:
        if from_file and _refused(dict(PAPER_SETTINGS) if args.paper else {}, from_file, str(exc)):
            raise ValueError(f"--config {args.config}: {exc}") from None  # the file's own values
        raise


def _refused(base: dict, settings: dict, message: str) -> bool:
    """Whether ``settings`` over ``base``, without the command line, fail with ``message``."""
    try:
        TrainConfig(**{**base, **settings}).validate()
    except ValueError as exc:
        return str(exc) == message
    return False


def check_threads(requested: int) -> None:
    """Refuse a negative ``--threads`` or more than :data:`THREADS_PER_CORE` per CPU core (checked
    before anything loads: torch fails on an absurd count with a MemoryError, then a crash)."""
    if requested < 0:
        raise UsageError(f"--threads must be >= 0, got {requested}.")
    cores = os.cpu_count() or 1
    if requested > THREADS_PER_CORE * cores:
        raise UsageError(f"--threads {requested}: at most {THREADS_PER_CORE * cores} "
                         f"({THREADS_PER_CORE} per core; this machine has {cores} CPU cores); "
                         f"0 picks a good number.")


def set_threads(requested: int, cfg: TrainConfig, kind: str) -> None:
    """Set torch's CPU threads: ``requested`` (checked by :func:`check_threads`), or 1 for the
    MLP encoder when 0."""
    import torch

    from .encoders import default_encoder

    encoder = default_encoder(kind) if cfg.encoder == "auto" else cfg.encoder
    if requested or encoder == "mlp":
        torch.set_num_threads(requested or 1)


def data_kind(cfg: TrainConfig) -> str:
    """Kind of the data set ``cfg.data`` (loads it; used before a comparison)."""
    from .data import load_dataset

    opts = {k: v for k, v in (("label_column", cfg.label_column), ("delimiter", cfg.delimiter))
            if v is not None}
    return load_dataset(cfg.data, **opts).kind


def say(line: str) -> None:
    print(line, flush=True)  # progress lines show up at once, also when piped to a file


def warn(line: str) -> None:
    print(f"sol-ext: warning: {line}", file=sys.stderr, flush=True)


def note(line: str) -> None:
    """A line about what a command left out, not a problem with its input or result."""
    print(f"sol-ext: note: {line}", file=sys.stderr, flush=True)


def default_output(cfg: TrainConfig, paper: bool = False) -> Path:
    """``runs/<data>-<method>[-paper]-<noise><kappa>-seed<k>``: ``sol-paper`` as ``sol-ext
    compare`` names sol with ``--paper``; ``none`` without a kappa where no noise is added."""
    data = Path(cfg.data).name.split(".")[0] or "data"
    method = f"{cfg.method}-paper" if paper else cfg.method
    noise = "none" if cfg.noise == "none" else f"{cfg.noise}{cfg.kappa:g}"
    return Path("runs") / f"{data}-{method}-{noise}-seed{cfg.seed}"


def output_folder(text: str, flag: str = "--output") -> Path:
    """The folder ``text`` of ``flag``; an empty path is refused (it would mean ``.``)."""
    if not text:
        raise UsageError(f"{flag} '': an empty path; expected a folder (e.g. runs/mine).")
    return Path(text)


def data_inputs(cfg: TrainConfig) -> list:
    """``(what, path)`` of the data a run reads: no output may be written over them."""
    return [("the --data file", cfg.data), ("the --test-data file", cfg.test_data)]


def run_data(run_dir: Path, model=None) -> list:
    """The data files the run in ``run_dir`` was trained on (from its loaded ``model`` where given),
    found from any working folder, as inputs no output may replace."""
    from .checkpoint import load_run_state, run_paths

    if model is not None:
        config, read_from = dataclasses.asdict(model.config), model.read_from
    else:
        state = load_run_state(run_dir)
        config, read_from = state.get("config", {}), (state.get("predictor") or {}).get("read_from")
    paths = run_paths(config, read_from)
    return [(f"the training data of {run_dir}", paths["data"]),
            (f"the test data of {run_dir}", paths["test_data"])]


def _same_data(a: str, b: str) -> bool:
    """Whether the data sets ``a`` and ``b`` are one: the same name or path, the same file or
    folder, or two files with the same bytes."""
    if a == b:
        return True
    pa, pb = Path(a), Path(b)
    if not (pa.exists() and pb.exists()):
        return False
    try:
        if os.path.samefile(pa, pb):
            return True
        return pa.is_file() and pb.is_file() and filecmp.cmp(pa, pb, shallow=False)
    except OSError:
        return False


def check_test_data(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """With ``--test-data``: no ``--test-fraction`` (nothing is split), and a test set that is not
    the training set (its score would say nothing)."""
    if cfg.test_data is None:
        return
    if args.test_fraction is not None:
        raise UsageError("--test-fraction applies when --data is split into training and test "
                         "sets; with --test-data the test set is that file: leave --test-fraction "
                         "out, or --test-data.")
    if _same_data(cfg.data, cfg.test_data):
        raise UsageError(f"--test-data {cfg.test_data} holds the same data as the training set "
                         f"(--data {cfg.data}); a test set must be other samples than the "
                         f"training ones.")
