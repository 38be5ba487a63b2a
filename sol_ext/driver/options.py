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
from pathlib import Path
from typing import Any, Callable, Collection

from .config import OPTION_GROUPS, PAPER_SETTINGS, TrainConfig, option_of, setting_kinds
from .errors import UsageError

__all__ = ["add_settings", "train_config", "comma_list", "number_or_auto", "check_threads",
           "set_threads", "check_test_data", "output_folder", "data_inputs"]

THREADS_PER_CORE = 4  # --threads beyond this many per CPU core is a typo (torch fails on 100000)


def comma_list(kind: Callable[[str], Any] = float) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of ``kind`` (``"128,128"``; ``""`` is the empty
    list). An empty entry (``"128,,128"``, a trailing comma) is refused: it is a typo or a lost value."""
    what = "names" if kind is str else "numbers"

    def parse(text: str) -> list:
        if not text.strip():
            return []
        entries = [t.strip() for t in text.split(",")]
        if "" in entries:
            raise argparse.ArgumentTypeError(
                f"{text!r} has an empty entry (entry {entries.index('') + 1} of {len(entries)}); give "
                f"comma-separated {what} with one between each pair of commas")
        try:
            return [kind(t) for t in entries]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {what}, got {text!r}") from None
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


def _help(option: dict[str, Any]) -> str:
    """The option's help with its default, where it has one (a None default is said in words)."""
    default = option["default"]
    if default is None or isinstance(default, bool):
        return option["help"]
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    return f"{option['help']} (default: {shown})"


def _add_setting(group, name: str, kinds: tuple[str, ...]) -> None:
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
    group.add_argument(flag, *option["aliases"], dest=name, type=_PARSE[kinds], default=None,
                       choices=option["choices"], metavar=option["metavar"], help=help_text)


def add_settings(parser: argparse.ArgumentParser, skip: Collection[str] = ()) -> dict[str, Any]:
    """Add an option for every TrainConfig field but those in ``skip``, in the groups of
    :data:`~sol_ext.driver.config.OPTION_GROUPS` (a field of no group goes to ``parser`` itself);
    return the argument groups by title, for the command's own options."""
    groups = {
        title: parser.add_argument_group(title, description) for title, description in OPTION_GROUPS.items()}
    for name, kinds in setting_kinds().items():
        if name not in skip:
            title = option_of(name)["group"]
            _add_setting(parser if title is None else groups[title], name, kinds)
    groups["SOL settings"].add_argument(
        "--paper", action="store_true",
        help="the published procedure: " + ", ".join(f"{k}={v}" for k, v in PAPER_SETTINGS.items()))
    groups["optimization"].add_argument(  # None: not typed (a --config file may set it), else 0
        "--threads", type=int, default=None,
        help="CPU threads of torch; 0 (default): 1 for the MLP encoder (its small products lose "
             "more to thread hand-offs than they gain), torch's default otherwise")
    return groups


# -- the configuration of a command ---------------------------------------------------------------

def train_config(args: argparse.Namespace, **override) -> TrainConfig:
    """The run's configuration: the defaults, or the paper's settings with ``--paper``, then the
    ``--config`` file's settings, then every option typed on the command line (every setting's
    option defaults to None: one not None was typed, even one equal to its default). The file's
    ``output`` and ``threads`` are set on ``args`` where the command line does not give them;
    ``threads`` not given at all is 0."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    typed = {k: v for k, v in vars(args).items() if k in names and v is not None}
    from_file = {}
    if getattr(args, "config", None) is not None:
        from .config_file import read_config_file

        from_file = read_config_file(args.config)
        args.paper = from_file.pop("paper", False) or args.paper  # also names the output folder
        for option in ("output", "threads"):  # options of the command, not of the training
            if option in from_file and getattr(args, option) is None:
                setattr(args, option, from_file[option])
            from_file.pop(option, None)
    if getattr(args, "threads", 0) is None:
        args.threads = 0
    values = {**(PAPER_SETTINGS if getattr(args, "paper", False) else {}), **from_file, **typed, **override}
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


def output_folder(text: str, flag: str = "--output") -> Path:
    """The folder ``text`` of ``flag``; an empty path is refused (it would mean ``.``)."""
    if not text:
        raise UsageError(f"{flag} '': an empty path; expected a folder (e.g. runs/mine).")
    return Path(text)


def data_inputs(cfg: TrainConfig) -> list:
    """``(what, path)`` of the data a run reads: no output may be written over them."""
    return [("the --data file", cfg.data), ("the --test-data file", cfg.test_data),
            ("the --text-encoder folder", cfg.text_encoder)]


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
