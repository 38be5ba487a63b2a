"""Settings of ``sol-ext train`` in a TOML file: ``--config run.toml`` reads them, ``--print-config``
writes a run's resolved settings in the same form.

The file is flat ``key = value`` lines; a key is a :class:`~sol_ext.driver.config.TrainConfig` field
(``embedding_dim``) or its option's spelling (``embedding-dim``), plus ``paper = true`` for the
paper's settings (``--paper``)::

    data = "ages.csv"
    label_column = "age"
    epochs = 40
    sigma = "auto"
    hidden = [256, 128]

A run's settings are, from the lowest to the highest priority: the defaults (or the paper's
settings), the file, the options on the command line. A setting left out of the file keeps its
default; there is no TOML value for "unset" (``--print-config`` leaves unset settings out).
Relative paths are relative to the working folder, as on the command line.

Reading TOML needs Python >= 3.11 (``tomllib``) or the ``tomli`` package.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from .config import TrainConfig
from .errors import UsageError

__all__ = ["read_config_file", "config_toml", "options_given", "FIELD_KINDS", "CONFIG_FILE_NAME"]

# A run folder's copy of its settings (written beside results.json): --config reads it back.
CONFIG_FILE_NAME = "config.toml"

# The file's switch for the paper's settings: a command-line option, not a TrainConfig field.
PAPER_KEY = "paper"


def _field_kinds() -> dict[str, tuple[str, ...]]:
    """TrainConfig field -> the kinds of value it takes, read from its annotation: ``"str"``,
    ``"int"``, ``"float"`` (an integer is taken as a float), ``"bool"``, ``"int list"``, ``"auto"``
    (the string "auto"), or ``"any"`` for an annotation not listed here (the value is then checked
    by :meth:`TrainConfig.validate` alone; a test asks for every field to have a kind)."""
    named = {"str": "str", "int": "int", "float": "float", "bool": "bool", "tuple[int, ...]": "int list"}
    kinds = {}
    for f in dataclasses.fields(TrainConfig):
        annotation = str(f.type)
        if annotation.startswith("Optional[") and annotation.endswith("]"):
            annotation = annotation[len("Optional["):-1]
        parts = [p.strip() for p in annotation.split("|")]
        if parts == ["float", "str"]:  # a number or "auto" (sigma, label_noise, weight_decay, ...)
            kinds[f.name] = ("float", "auto")
        elif len(parts) == 1 and parts[0] in named:
            kinds[f.name] = (named[parts[0]],)
        else:
            kinds[f.name] = ("any",)
    return kinds


# TrainConfig field -> the kinds of TOML value it takes (see _field_kinds)
FIELD_KINDS = _field_kinds()
_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
          "int list": "a list of integers, e.g. [128, 128]", "auto": '"auto"'}


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # tomllib is Python 3.11's
        try:
            import tomli as tomllib
        except ImportError:
            raise UsageError(f"--config {path}: reading TOML on Python "
                             f"{sys.version_info[0]}.{sys.version_info[1]} needs the tomli "
                             f"package (pip install tomli); Python >= 3.11 has it built in.") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file.") from None
    except IsADirectoryError:
        raise UsageError(f"--config {path}: a folder; expected a TOML file.") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--config {path}: not UTF-8 text ({exc.reason}); save it as UTF-8.") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--config {path}: not valid TOML ({exc}).") from None


def _kind_of(value: Any) -> str:
    """How an error names the kind of a TOML value."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__  # dates and times


def _converted(value: Any, kinds: Sequence[str]) -> tuple[bool, Any]:
    """``(True, value as TrainConfig holds it)`` when ``value`` is of one of ``kinds``, else ``(False, None)``."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    for kind in kinds:
        if kind == "any":
            return True, value
        if kind == "str" and isinstance(value, str):
            return True, value
        if kind == "auto" and value == "auto":
            return True, value
        if kind == "bool" and isinstance(value, bool):
            return True, value
        if kind == "int" and is_int:
            return True, value
        if kind == "float" and (is_int or isinstance(value, float)):
            return True, float(value)  # as the command line gives it: 1 and 1.0 are one setting
        if kind == "int list" and isinstance(value, list) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            return True, list(value)
    return False, None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings of the TOML file ``path``: ``{TrainConfig field: value}``, and ``"paper": bool``
    where the file sets it.

    Raises:
        UsageError: one line naming the file, for a file that cannot be read or is not TOML, and
            naming the key too for an unknown key, a key given twice (``embedding_dim`` and
            ``embedding-dim``) or a value of the wrong type. Values in range are checked later, with
            the command line's (:meth:`TrainConfig.validate`).
    """
    path = Path(path)
    settings: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in _load_toml(path).items():
        name = key.replace("-", "_")
        if name not in FIELD_KINDS and name != PAPER_KEY:
            if isinstance(value, dict):
                raise UsageError(f"--config {path}: unknown table [{key}]; the settings are "
                                 f"'key = value' lines at the top of the file, without a [table].")
            close = difflib.get_close_matches(name, [*FIELD_KINDS, PAPER_KEY], n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UsageError(f"--config {path}: unknown key '{key}'; {hint}expected the name of a "
                             f"'sol-ext train' option, e.g. epochs, sigma, label_column.")
        if name in spelled:
            raise UsageError(f"--config {path}: '{spelled[name]}' and '{key}' are the same "
                             f"setting; keep one.")
        spelled[name] = key
        kinds = ("bool",) if name == PAPER_KEY else FIELD_KINDS[name]
        ok, converted = _converted(value, kinds)
        if not ok:
            expected = " or ".join(_WORDS[k] for k in kinds)
            shown = json.dumps(value) if isinstance(value, str) else repr(value)
            raise UsageError(f"--config {path}: key '{key}' must be {expected}, got {shown} "
                             f"({_kind_of(value)}).")
        settings[name] = converted
    return settings


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, float):
        return repr(value)  # "0.001", "1e-05", "inf": the float itself, read back exactly
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")  # pragma: no cover - FIELD_KINDS rules it out


def config_toml(config: TrainConfig, paper: bool = False) -> str:
    """``config`` as the TOML text that :func:`read_config_file` reads back to the same
    configuration: one ``key = value`` line per setting, in TrainConfig's order; unset (None)
    settings are left out, and ``paper = true`` comes first where the run has ``--paper`` (its
    settings are written out too; it also names the default output folder)."""
    lines = ["# sol-ext train settings; sol-ext train --config FILE reads them back"]
    if paper:
        lines.append(f"{PAPER_KEY} = true")
    for name, value in config.to_dict().items():
        if value is not None:
            lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def options_given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The destinations of the options that ``argv`` gives, not those set by a default (so that a
    file's value is overridden only by an option the user typed, even one equal to its default).

    ``parser`` is changed (every default suppressed): pass a fresh one, built as the one that
    parsed ``argv``."""
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if isinstance(action.choices, dict):  # the subcommands
                stack.extend(c for c in action.choices.values() if isinstance(c, argparse.ArgumentParser))
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(list(argv))))
