"""Errors in the user's input, and the one line the ``sol-ext`` command prints for them.

The library raises ordinary exceptions (``ValueError`` naming the bad argument, ...); the command
turns those that are about its input into ``sol-ext: error: <one line>`` with the command-line
spelling of each argument (``--label-column``, not ``label_column=``). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import zipfile
import zlib
from pathlib import Path
from typing import Iterator, Mapping, Optional

import torch

__all__ = ["UsageError", "DataFileError", "data_file_errors", "user_error_message", "with_flags",
           "command_line_flags"]


class UsageError(Exception):
    """A problem with the user's input; printed as one line, exit status 2."""


class DataFileError(ValueError):
    """A data file that cannot be read: truncated, corrupt, or not in the format its name says."""


@contextlib.contextmanager
def data_file_errors(path: Path | str) -> Iterator[None]:
    """Inside the block, the errors of reading a damaged file become :class:`DataFileError`
    naming ``path``: ``EOFError`` (truncated), ``zlib.error`` (corrupt compressed data),
    ``gzip.BadGzipFile`` (bad checksum or not gzip), ``zipfile.BadZipFile`` (not an ``.npz``), numpy's refusal of pickled data (random bytes read
    as ``.npy``) and ``UnicodeDecodeError`` (a text file that is not UTF-8)."""
    try:
        yield
    except DataFileError:
        raise
    except UnicodeDecodeError as exc:
        raise DataFileError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset "
            f"{exc.start}); save it as UTF-8, or give its encoding= (cp1252 for Windows-1252).") from exc
    except EOFError as exc:
        raise DataFileError(f"{path} is truncated ({exc}); copy or download it again.") from exc
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise DataFileError(f"{path} is corrupt ({exc}); copy or download it again.") from exc
    except zipfile.BadZipFile as exc:
        raise DataFileError(f"{path} is not a readable .npz (zip) archive ({exc}); it is "
                            f"truncated or not an .npz file.") from exc
    except ValueError as exc:
        if "pickle" not in str(exc):
            raise
        # numpy reads a file that is neither a zip archive nor an .npy array as a pickle
        raise DataFileError(f"{path} is not an .npz archive of numeric arrays (numpy: pickled or "
                            f"unknown data); save it with numpy.savez.") from exc


# Exceptions that report bad input: the command prints their message. Others are bugs.
_INPUT_ERRORS = (UsageError, ValueError, FileNotFoundError, ImportError, OSError, EOFError,
                 zlib.error, zipfile.BadZipFile, FloatingPointError)

_ARGUMENT = re.compile(r"(?<![\w-])([A-Za-z_]\w*)=(?=(.?))")


def with_flags(message: str, flags: Mapping[str, str]) -> str:
    """``label_column=`` -> ``--label-column``, ``test_fraction=0.5`` -> ``--test-fraction 0.5``
    for each argument name in ``flags`` (argument name -> command-line flag)."""
    def swap(match: re.Match) -> str:
        flag = flags.get(match.group(1))
        if flag is None:
            return match.group(0)
        followed_by_value = match.group(2) not in ("", " ", ".", ",", ";", ":", ")")
        return flag + " " if followed_by_value else flag

    return _ARGUMENT.sub(swap, message)


def _out_of_memory(exc: BaseException) -> bool:
    # CUDA raises torch.OutOfMemoryError; the CPU allocator a plain RuntimeError
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def user_error_message(exc: BaseException, flags: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The one line to print for ``exc`` when it is about the user's input, else None.

    ``flags`` maps the library's argument names to the command's flags (``{"label_column":
    "--label-column"}``); they replace ``name=`` in the message.
    """
    if _out_of_memory(exc):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        message = (f"out of memory ({first}); lower --batch-size, --embedding-dim or --hidden, "
                   f"or use a machine with more memory.")
    elif isinstance(exc, _INPUT_ERRORS):
        text = str(exc).strip()
        message = text.splitlines()[0] if text else type(exc).__name__
    else:
        return None
    return with_flags(message, flags or {})


def command_line_flags(parser) -> dict[str, str]:
    """Argument name -> flag of every long option of ``parser`` and its subcommands, e.g.
    ``{"label_column": "--label-column", "T": "--T"}``."""
    flags: dict[str, str] = {}
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):  # the subcommands
                stack.extend(c for c in choices.values() if hasattr(c, "_actions"))
            # "--no-normalize" stores normalize=False: not the spelling of "normalize="
            longs = [o for o in action.option_strings
                     if o.startswith("--") and not o.startswith("--no-")]
            if longs and action.dest not in flags and action.dest != "help":
                flags[action.dest] = longs[0]
    return flags
