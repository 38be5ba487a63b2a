"""The one check every file the ``sol-ext`` commands write goes through: nothing a user keeps is
written over.

A command's output file (``predict --output``, ``export --output`` and its ``.json`` sidecar,
``audit --csv``, ``compare``'s tables, ``train``'s run files) is refused, with one line naming the
flag and the file, when it would replace

* an input of the command (``--data``, ``--test-data``, or the training data a run was made from,
  found from any working folder), or a file of an input folder (an image folder's ``labels.csv``
  and images), always;
* a file sol-ext wrote into a run folder (``best.pt``, ``checkpoint.pt``, ``results.json``,
  ``config.toml``, the plots, ``predictions.csv``, ``audit.csv``, the exports ``model.pt2``,
  ``model.onnx`` and their sidecars ``model.pt2.json``, ``model.onnx.json``, an export of another name
  there (recognised by its sidecar's content), anything under ``sigma-search/`` and, of a text run,
  ``text_encoder/``) or a comparison's
  ``compare.json``/``compare.md``, always, unless it is
  the command's own default output (a rerun of ``sol-ext predict RUN`` replaces
  ``RUN/predictions.csv``, as one expects);
* any other existing file, unless ``--overwrite`` is given.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple

from .checkpoint import BEST_NAME, CHECKPOINT_NAME, SIGMA_SEARCH_NAME
from .config_file import CONFIG_FILE_NAME
from .errors import UsageError
from .report import PLOT_NAMES, RESULTS_NAME
from .text import TEXT_ENCODER_DIR

__all__ = ["RUN_FILE_NAMES", "COMPARE_FILE_NAMES", "Input", "check_output", "check_inputs_kept",
           "check_run_inputs", "check_compare_folder", "package_file_owner", "run_outputs",
           "exported_program_format"]

# What sol-ext writes into a run folder (the lock and the temporaries are the run's too).
RUN_FILE_NAMES = frozenset({CHECKPOINT_NAME, BEST_NAME, RESULTS_NAME, CONFIG_FILE_NAME, *PLOT_NAMES,
                            "predictions.csv", "audit.csv", "model.pt2", "model.pt2.json",
                            "model.onnx", "model.onnx.json", ".lock"})
SIDECAR_FORMAT = "sol_ext exported model"  # an export's sidecar says so: how it is recognised
COMPARE_FILE_NAMES = frozenset({"compare.json", "compare.md"})

# what an input is ("the --data file") and its path, a built-in data set's name, or None
Input = Tuple[str, Optional[str]]


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def _holds_run(folder: Path) -> bool:
    return (folder / CHECKPOINT_NAME).is_file() or (folder / BEST_NAME).is_file() \
        or (folder / SIGMA_SEARCH_NAME).is_dir()


def _is_sidecar(path: Path) -> bool:
    """Whether ``path`` is the JSON sidecar of an exported program (read by content, not name)."""
    try:
        if not path.is_file() or path.stat().st_size > 10_000_000:
            return False
        return json.loads(path.read_text(encoding="utf-8")).get("format") == SIDECAR_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _is_export(real: Path) -> bool:
    """Whether ``real`` is a program sol-ext exported (its sidecar beside it) or such a sidecar."""
    return _is_sidecar(real.with_name(real.name + ".json")) or \
        (real.suffix == ".json" and real.with_suffix("").is_file() and _is_sidecar(real))


def exported_program_format(path: Path | str) -> Optional[str]:
    """``"pt2"`` or ``"onnx"`` when ``path`` is a program sol-ext exported (its sidecar beside it),
    read by content (a ``.pt2`` is a zip archive, an ONNX model is not); None otherwise."""
    real = _real(Path(path))
    if not real.is_file() or real.suffix == ".json" or not _is_export(real):
        return None
    return "pt2" if zipfile.is_zipfile(real) else "onnx"


def run_outputs(folder: Path | str) -> list[Path]:
    """The files sol-ext wrote into the run folder ``folder``, which ``train --overwrite`` removes:
    the run's files (:data:`RUN_FILE_NAMES` but the lock) and exports of any name with their
    sidecars (recognised by the sidecar's content). A file of one's own there is not among them."""
    folder = Path(folder)
    found = [folder / name for name in sorted(RUN_FILE_NAMES - {".lock"})
             if (folder / name).is_file() or (folder / name).is_symlink()]
    try:
        others = sorted(p for p in folder.iterdir() if p.name not in RUN_FILE_NAMES)
    except OSError:
        return found
    return found + [p for p in others if p.is_file() and _is_export(_real(p))]


def package_file_owner(path: Path | str) -> Optional[str]:
    """The folder whose sol-ext output ``path`` is (a run folder or a comparison's), or None
    when ``path`` is not a file sol-ext wrote there."""
    real = _real(path)
    folder = real.parent
    if (real.name in RUN_FILE_NAMES or _is_export(real)) and _holds_run(folder):
        return f"the run folder {folder}"
    if real.name in COMPARE_FILE_NAMES and any((folder / n).is_file() for n in COMPARE_FILE_NAMES):
        return f"the comparison folder {folder}"
    for above in real.parents:  # the trials of a sigma search: RUN/sigma-search/...
        if above.name == SIGMA_SEARCH_NAME and _holds_run(above.parent):
            return f"the sigma search of the run folder {above.parent}"
        if above.name == TEXT_ENCODER_DIR and _holds_run(above.parent):  # RUN/text_encoder/...
            return f"the text encoder of the run folder {above.parent}"
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return _real(a) == _real(b)


def _input_holding(path: Path, inputs: Iterable[Input]) -> Optional[Tuple[str, str, bool]]:
    """``(what, path given, inside)`` of the entry of ``inputs`` that is the file ``path`` or, for an
    input folder (an image folder), holds it as data: its ``labels.csv``, or any existing file there
    that sol-ext did not write (the images); None if none does (built-in names never do). A new file,
    or a run folder kept inside the data folder, changes no data."""
    for what, given in inputs:
        if not given or not Path(given).exists():
            continue
        if _same_file(path, Path(given)):
            return what, given, False
        folder = Path(given)
        if folder.is_dir() and _real(folder) in _real(path).parents:
            listing = _real(path) == _real(folder / "labels.csv")
            if listing or ((path.exists() or path.is_symlink()) and package_file_owner(path) is None):
                return what, given, True
    return None


def check_inputs_kept(path: Path | str, flag: str, inputs: Iterable[Input]) -> None:
    """Refuse ``path`` (an output of ``flag``) when it is one of ``inputs`` or a file of an input folder.

    Raises:
        UsageError: naming ``flag``, the file and the input's flag.
    """
    hit = _input_holding(Path(path), inputs)
    if hit is None:
        return
    what, given, inside = hit
    if inside:
        raise UsageError(f"{flag} {path}: is a file of {what} ({given}), a folder of data; writing there would "
                         f"change the data: choose another file.")
    raise UsageError(f"{flag} {path}: is {what} ({given}); writing there would replace it: choose another file.")


def check_output(text: str, flag: str, *, inputs: Sequence[Input] = (),
                 replaceable: Sequence[Path] = (), overwrite: bool = False,
                 stdout_ok: bool = True) -> Path:
    """The file path ``text`` of ``flag``, checked before anything is computed.

    It must be a file path in an existing folder, not an input (``inputs``: ``(flag, path)``
    pairs), not a file sol-ext wrote (:func:`package_file_owner`) and not an existing file unless
    ``overwrite`` — except the paths in ``replaceable`` (the command's own default output), which
    may be replaced.

    Raises:
        UsageError: one line naming ``flag``, the file and what to do instead.
    """
    from .rundir import check_no_file_above

    if not text:
        hint = ", or '-' for stdout" if stdout_ok else ""
        raise UsageError(f"{flag} '': an empty path; expected a file path{hint}.")
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"{flag} {text}: is a folder, expected a file path.")
    check_no_file_above(path, flag)
    if not path.parent.is_dir():
        raise UsageError(f"{flag} {text}: the folder {path.parent} does not exist; create it first.")
    check_inputs_kept(path, flag, inputs)
    if any(_real(path) == _real(own) for own in replaceable):
        return path
    owner = package_file_owner(path)
    if owner is not None and (path.exists() or path.is_symlink()):
        raise UsageError(f"{flag} {text}: is {path.name} of {owner}, written by sol-ext; "
                         f"choose another file.")
    if not overwrite and (path.exists() or path.is_symlink()):
        raise UsageError(f"{flag} {text}: the file exists; pass --overwrite to replace it, or "
                         f"choose another file.")
    return path


def check_run_inputs(out: Path, flag: str, inputs: Sequence[Input], overwrite: bool = False) -> None:
    """Refuse training inputs that ``train`` would write over or, with ``--overwrite``, delete in
    its output folder ``out``: its checkpoints, results and plots, the sigma search's trials, a text
    run's ``text_encoder/``, and with ``overwrite`` every file of :func:`run_outputs` (the old run's
    predictions and exports).

    Raises:
        UsageError: naming ``flag``, the file and the input's flag.
    """
    out = Path(out)
    for name in (CHECKPOINT_NAME, BEST_NAME, RESULTS_NAME, *PLOT_NAMES):
        check_inputs_kept(out / name, flag, inputs)
    for path in run_outputs(out) if overwrite else ():
        check_inputs_kept(path, flag, inputs)
    for folder in (SIGMA_SEARCH_NAME, TEXT_ENCODER_DIR):
        written = _real(out / folder)
        for what, given in inputs:
            if given and Path(given).exists() and (written == _real(given) or written in _real(given).parents):
                raise UsageError(f"{flag} {out}: {what} ({given}) is inside {out / folder}, which the run "
                                 f"writes and removes: copy it out of there, or choose another {flag}.")


def check_compare_folder(out: Path, flag: str, inputs: Sequence[Input] = ()) -> None:
    """Refuse a ``compare --output`` folder that holds other files and no comparison (its tables
    would land among the user's files), and inputs that are its tables.

    Raises:
        UsageError: naming ``flag`` and a few of the files found.
    """
    from .rundir import LOCK_NAME, TEMPORARY_NAME

    out = Path(out)
    for name in sorted(COMPARE_FILE_NAMES):
        check_inputs_kept(out / name, flag, inputs)
    if not out.is_dir() or any((out / n).is_file() for n in COMPARE_FILE_NAMES) \
            or any(out.glob(f"*/*/seed*/{CHECKPOINT_NAME}")):
        return
    others = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME and not TEMPORARY_NAME.match(p.name))
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UsageError(f"{flag} {out}: the folder holds other files ({shown}) and no comparison "
                         f"(no compare.json); a comparison writes into a new or empty folder or "
                         f"its own: choose another {flag}.")
