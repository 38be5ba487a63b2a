"""The output folder of a run: one run at a time, what an interrupted run leaves in it, and
never a folder that is not a run's.

Two runs writing into one folder would overwrite each other's checkpoint and results, so a run
holds an exclusive lock on ``<folder>/.lock`` (``flock``, released by the kernel even when the
process dies) and a second run is refused at once with :class:`OutputFolderBusy`.

A run writes into a new folder, an empty one, or a run folder: one whose ``checkpoint.pt`` or
``best.pt`` is a sol-ext checkpoint (read, not taken by its name), or that holds the
``sigma-search/`` folder of a sigma search (:func:`check_output_folder`). Any other folder
(``--output .`` in a project, a folder of one's own files, one with another program's
``checkpoint.pt``) is refused before anything in it changes, so a run never deletes or overwrites
a file it did not write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS: no locking
    fcntl = None

from .checkpoint import BEST_NAME, CHECKPOINT_NAME, SIGMA_SEARCH_NAME, checkpoint_epoch, sigma_search_progress
from .errors import UsageError
from .interrupts import removed_if_stopped, signal_arrived, stopping_in

__all__ = ["LOCK_NAME", "OutputFolderBusy", "RunInterrupted", "lock_output_folder",
           "interruption_note", "run_folder", "make_output_folder", "check_output_folder",
           "is_run_folder"]

LOCK_NAME = ".lock"

# the temporaries of checkpoint._replace_atomically (".results.json.<pid>.<hex>.tmp"): a run's own
TEMPORARY_NAME = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}\.tmp$")


class OutputFolderBusy(UsageError):
    """Another process holds the lock of the output folder."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a run; the message says what the output folder holds now.
    ``terminated``: it was SIGTERM (a scheduler's or ``kill``'s), whose exit status is 143."""

    terminated = False


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, so that it ends as a Ctrl-C does."""


def _raise_terminated(signum, frame) -> None:
    signal_arrived(128 + signal.SIGTERM)  # a second signal, during the clean stop, ends it at once
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block (main thread only; Python's default is to
    die at once, leaving no word of what the folder holds)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _holder(fd: int) -> str:
    """``" (process N)"`` from the lock file's content, or ``""``."""
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (process {pid})" if pid.isdigit() else ""


def _reason(exc: OSError, folder: Path) -> str:
    """Why the folder ``folder`` could not be made or written, in words."""
    if isinstance(exc, PermissionError):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    parent = next((p for p in folder.parents if p.exists()), None)
    if exc.errno == errno.ENOENT and parent is not None and parent.is_dir():
        return f"{parent} takes no new folders"  # /proc, /sys
    return (exc.strerror or type(exc).__name__).lower()


def check_no_file_above(path: Path, flag: str) -> None:
    """Refuse ``path`` when the nearest existing folder above it is a file (``x.csv/sub``)."""
    for parent in Path(path).parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is a file, expected a folder.")
            return


def make_output_folder(out_dir: Path, flag: str = "--output") -> None:
    """Create the folder ``out_dir`` (and its parents) if needed.

    Raises:
        UsageError: naming ``flag``: ``out_dir`` or a folder above it is a file, or the folder
            cannot be made (permission denied, read-only, ...).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{flag} {out_dir}: is a file, expected a folder.")
    check_no_file_above(out_dir, flag)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {out_dir}: cannot create the folder "
                         f"({_reason(exc, out_dir)}).") from None


def is_run_folder(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a run: a ``checkpoint.pt`` or ``best.pt`` that reads as a sol-ext
    checkpoint (a file of that name written by another program does not count), or the trials of
    a sigma search."""
    out_dir = Path(out_dir)
    return any(checkpoint_epoch(out_dir / name) is not None for name in (CHECKPOINT_NAME, BEST_NAME)) \
        or (out_dir / SIGMA_SEARCH_NAME).is_dir()


def check_output_folder(out_dir: Path, flag: str = "--output") -> None:
    """Refuse an existing ``out_dir`` that is neither empty nor a run folder (:func:`is_run_folder`),
    before anything in it changes. The lock file and a run's temporaries do not count.

    Raises:
        UsageError: naming ``flag`` and a few of the files found.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or is_run_folder(out_dir):
        return  # made by the run (make_output_folder says what is wrong with a file there)
    try:
        others = sorted(p.name for p in out_dir.iterdir()
                        if p.name != LOCK_NAME and not TEMPORARY_NAME.match(p.name))
    except OSError as exc:
        raise UsageError(f"{flag} {out_dir}: cannot read the folder ({_reason(exc, out_dir)}).") from None
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        foreign = [name for name in (CHECKPOINT_NAME, BEST_NAME) if (out_dir / name).exists()]
        why = (f"its {' and '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} no sol-ext checkpoint, "
               f"but another program's or damaged" if foreign else f"no {CHECKPOINT_NAME}")
        raise UsageError(
            f"{flag} {out_dir}: the folder holds other files ({shown}) and is not a sol-ext run "
            f"folder ({why}); a run writes into a new or empty folder or continues "
            f"its own, and --overwrite replaces only a run's files: choose another {flag}.")


@contextlib.contextmanager
def lock_output_folder(out_dir: Path, flag: str = "--output") -> Iterator[Path]:
    """Create ``out_dir`` if needed (:func:`make_output_folder`, whose errors name ``flag``) and
    hold its lock for the ``with`` block; yield ``out_dir``.

    On leaving, the lock file is removed, and so is ``out_dir`` when this call created it and
    nothing else was written there (a run refused for bad input leaves no empty folder).

    Raises:
        OutputFolderBusy: another process holds the lock.
        UsageError: the folder cannot be made or written.
    """
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    make_output_folder(out_dir, flag)
    if fcntl is None:  # pragma: no cover
        yield out_dir
        return
    path = out_dir / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if created:
                with contextlib.suppress(OSError):
                    out_dir.rmdir()
            raise UsageError(f"{flag} {out_dir}: cannot write in the folder "
                             f"({_reason(exc, out_dir)}).") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputFolderBusy(
                f"{out_dir} is in use by another sol-ext run{holder}; wait for it to finish, or "
                f"choose another --output.") from None
        # The previous holder removes the file on release: a lock taken on a file that is no
        # longer at `path` protects nothing, so take it again on the new file.
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    # a second Ctrl-C, which ends the command at once, removes them too
    with removed_if_stopped(out_dir, folder=True) if created else contextlib.nullcontext(), \
            removed_if_stopped(path):
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
            yield out_dir
        finally:
            path.unlink(missing_ok=True)  # while still locked: see the check above
            if created:
                with contextlib.suppress(OSError):  # not empty: the run wrote something
                    out_dir.rmdir()
            os.close(fd)


def interruption_note(out_dir: Path) -> str:
    """One line saying what an interrupted training run leaves in ``out_dir``."""
    epoch = checkpoint_epoch(Path(out_dir) / CHECKPOINT_NAME)
    search = None if epoch is not None else sigma_search_progress(out_dir)
    if search is not None:
        trials = ", ".join(f"sigma {s} finished" if s in search["finished"] else
                           f"sigma {s} at epoch {e}" for s, e in search["epochs"].items())
        return (f"interrupted during the sigma search (--sigma auto); {out_dir} holds its trials, "
                f"{trials} (continue with --resume).")
    if epoch is None:
        return f"interrupted before the first epoch was checkpointed; nothing to resume in {out_dir}."
    return (f"interrupted; {out_dir} holds the checkpoint of epoch {epoch} "
            f"(continue with --resume).")


@contextlib.contextmanager
def run_folder(out_dir: Path, note: Optional[Callable[[], str]] = None,
               flag: str = "--output") -> Iterator[Path]:
    """:func:`lock_output_folder`, and a Ctrl-C inside the block becomes :class:`RunInterrupted`
    with ``note()`` (default: :func:`interruption_note`) as its message."""
    with lock_output_folder(out_dir, flag) as folder, _sigterm_as_interrupt(), \
            stopping_in(folder, folder / CHECKPOINT_NAME):
        try:
            yield folder
        except RunInterrupted:
            raise
        except KeyboardInterrupt as exc:
            interrupted = RunInterrupted(note() if note is not None else interruption_note(folder))
            interrupted.terminated = isinstance(exc, Terminated)
            raise interrupted from None
