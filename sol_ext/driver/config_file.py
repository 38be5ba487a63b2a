"""Settings of ``sol-ext train`` in a TOML file: ``--config run.toml`` reads them, ``--print-config``
writes a run's resolved settings in the same form.

The file is flat ``key = value`` lines; a key is a :class:`~sol_ext.driver.config.TrainConfig` field
(``embedding_dim``) or its option's spelling (``embedding-dim``), plus ``paper = true`` for the
paper's settings (``--paper``), ``output`` and ``threads`` (``--output``, ``--threads``)::

    data = "ages.csv"
    label_column = "age"
    epochs = 40
    sigma = "auto"
    hidden = [256, 128]

A run's settings are, from the lowest to the highest priority: the defaults (or the paper's
settings), the file, the options on the command line. A setting left out of the file keeps its
default; there is no TOML value for "unset" (``--print-config`` leaves unset settings out).
A relative path in the file (``data``, ``test_data``, ``weights``, ``output``) is relative to the
folder the file is in, wherever the command runs, so a template printed by ``--print-config`` and
saved beside its data finds that data; paths typed on the command line stay relative to the
working folder. A run's ``config.toml`` names its data by absolute paths, so it repeats the run on
the same files from any folder (as ``predict`` and ``audit`` find them).

The file may start with a UTF-8 byte order mark. Reading TOML needs Python >= 3.11 (``tomllib``)
or the ``tomli`` package; it is written by ``tomli-w``.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from .config import TrainConfig, setting_kinds
from .errors import UsageError

__all__ = ["read_config_file", "config_toml", "FIELD_KINDS", "CONFIG_FILE_NAME"]

# A run folder's copy of its settings (written beside results.json): --config reads it back.
CONFIG_FILE_NAME = "config.toml"

# The file's switch for the paper's settings: a command-line option, not a TrainConfig field.
PAPER_KEY = "paper"
# Keys of the file beside the TrainConfig fields: options of `sol-ext train` that are not settings
# of the training itself; name -> the kinds of value it takes.
OPTION_KINDS: dict[str, tuple[str, ...]] = {PAPER_KEY: ("bool",), "output": ("str",),
                                            "threads": ("int",)}
# Settings that are paths, read from the file's folder: an empty string would silently mean it.
PATH_KEYS = ("data", "test_data", "weights", "output")
# The paths that name a run's data (as predict and audit locate it).
DATA_PATH_KEYS = ("data", "test_data", "weights")
UTF8_BOM = b"\xef\xbb\xbf"


# TrainConfig field -> the kinds of TOML value it takes, from its type hint
FIELD_KINDS = setting_kinds()
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
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file.") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"--config {path}: a folder; expected a TOML file.")
    if not stat.S_ISREG(mode):  # reading a named pipe would wait for a writer, for ever
        raise UsageError(f"--config {path}: not a regular file (a named pipe, socket or device); "
                         f"expected a TOML file saved on disk.")
    try:
        raw = path.read_bytes()
        # a byte order mark (Windows editors write one) is no TOML statement
        text = raw[len(UTF8_BOM):] if raw.startswith(UTF8_BOM) else raw
        return tomllib.loads(text.decode("utf-8"))
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
    """The settings of the TOML file ``path``: ``{TrainConfig field: value}``, and ``"paper": bool``,
    ``"output": str``, ``"threads": int`` where the file sets them. Relative paths are taken from
    the file's folder (:func:`_located`).

    Raises:
        UsageError: one line naming the file, for a file that cannot be read or is not TOML, and
            naming the key too for an unknown key, a key given twice (``embedding_dim`` and
            ``embedding-dim``), a value of the wrong type or an empty path. Values in range are
            checked later, with the command line's (:meth:`TrainConfig.validate`).
    """
    path = Path(path)
    settings: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in _load_toml(path).items():
        name = key.replace("-", "_")
        if name not in FIELD_KINDS and name not in OPTION_KINDS:
            if isinstance(value, dict):
                raise UsageError(f"--config {path}: unknown table [{key}]; the settings are "
                                 f"'key = value' lines at the top of the file, without a [table].")
            close = difflib.get_close_matches(name, [*FIELD_KINDS, *OPTION_KINDS], n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UsageError(f"--config {path}: unknown key '{key}'; {hint}expected the name of a "
                             f"'sol-ext train' option, e.g. epochs, sigma, label_column.")
        if name in spelled:
            raise UsageError(f"--config {path}: '{spelled[name]}' and '{key}' are the same "
                             f"setting; keep one.")
        spelled[name] = key
        kinds = OPTION_KINDS[name] if name in OPTION_KINDS else FIELD_KINDS[name]
        ok, converted = _converted(value, kinds)
        if not ok:
            expected = " or ".join(_WORDS[k] for k in kinds)
            shown = json.dumps(value) if isinstance(value, str) else repr(value)
            raise UsageError(f"--config {path}: key '{key}' must be {expected}, got {shown} "
                             f"({_kind_of(value)}).")
        if name in PATH_KEYS and converted == "":
            raise UsageError(f"--config {path}: key '{key}' is an empty string, which would mean "
                             f"the file's folder; expected a path"
                             + (" or a built-in data set's name." if name == "data" else "."))
        settings[name] = converted
    return _located(settings, path.parent)


def _located(settings: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``settings`` with each relative path taken from ``folder``, the config file's, unless that
    is the working folder (then the path stays as written). The path is taken from there whether or
    not the file is there: a file of the same name in the working folder is other data (a missing one
    is then refused naming where it was looked for)."""
    from .data import is_builtin

    if _same_folder(folder, os.getcwd()):
        return settings
    for key in PATH_KEYS:
        given = settings.get(key)
        if given and not Path(given).is_absolute() and not (key == "data" and is_builtin(given)):
            settings[key] = str(folder / given)
    return settings


def _same_folder(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def _toml_line(name: str, value: Any) -> str:
    """``name = value`` as TOML (``tomli-w``: any string, every Unicode plane, escaped as TOML
    escapes it; a float read back exactly); a list of integers on one line."""
    import tomli_w

    if isinstance(value, (list, tuple)):
        return f"{name} = [" + ", ".join(str(int(v)) for v in value) + "]"
    return tomli_w.dumps({name: value}).rstrip("\n")


def _absolute_data_paths(config: TrainConfig, read_from: str) -> dict[str, str]:
    """``{key: absolute path}`` of ``config``'s relative data paths, taken from ``read_from``, the
    working folder they were given in."""
    from .data import is_builtin

    return {key: str(Path(read_from) / value) for key, value in
            ((k, getattr(config, k)) for k in DATA_PATH_KEYS)
            if value and not Path(value).is_absolute() and not (key == "data" and is_builtin(value))}


def config_toml(config: TrainConfig, paper: bool = False, output: Optional[str] = None,
                threads: int = 0, read_from: Optional[str] = None) -> str:
    """``config`` as the TOML text that :func:`read_config_file` reads back to the same
    configuration: one ``key = value`` line per setting, in TrainConfig's order; unset (None)
    settings are left out, and ``paper = true`` comes first where the run has ``--paper`` (its
    settings are written out too; it also names the default output folder). ``output`` and
    ``threads`` (where not the default 0) follow the settings.

    Paths are written as given: the reader takes a relative one from the file's folder. With
    ``read_from``, the working folder the relative data paths were given in, they are written as
    absolute paths instead (a run's ``config.toml``, which finds the run's data from any folder)."""
    located = _absolute_data_paths(config, read_from) if read_from is not None else {}
    lines = ["# sol-ext train settings; sol-ext train --config FILE reads them back; relative "
             "paths are read from the folder of the file"]
    if paper:
        lines.append(_toml_line(PAPER_KEY, True))
    for name, value in {**config.to_dict(), **located}.items():
        if name == "noise" and config.noise_automatic:
            value = "auto"  # resolved again by the data the file names
        if value is not None:
            lines.append(_toml_line(name, value))
    if output is not None:
        lines.append(_toml_line("output", output))
    if threads:
        lines.append(_toml_line("threads", threads))
    return "\n".join(lines) + "\n"
