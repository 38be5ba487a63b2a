"""Ctrl-C in a command: the first stops it cleanly, a second one ends it at once.

The first Ctrl-C raises ``KeyboardInterrupt`` where the command is, as Python's own handler does:
the command stops cleanly (a temporary file goes, the run folder's lock is released) and says what
it leaves (:class:`~sol_ext.driver.rundir.RunInterrupted`). A second Ctrl-C (or SIGTERM), pressed
while that clean stop runs, would otherwise raise inside it, in the middle of an ``except`` or
``finally`` block: a traceback, and a temporary or a lock file left behind. Instead it removes the
files being written (:func:`removed_if_stopped`: a checkpoint's temporary, the lock file) and ends
the process at once, with one line and the status of the signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator

__all__ = ["second_interrupt_stops_at_once", "removed_if_stopped", "stopping_in", "signal_arrived"]

# what a stop at once removes: the temporaries being written and the lock files held, as the clean
# stop would have; a folder made for the run is removed too where nothing else was written there
_files: set[Path] = set()
_folders: set[Path] = set()
_state = {"interrupted": False, "pid": None, "folder": None, "resumable": None}


@contextlib.contextmanager
def removed_if_stopped(path: Path, folder: bool = False) -> Iterator[None]:
    """Within the block, a stop at once removes ``path`` (a file; with ``folder``, a folder if it
    is empty)."""
    held = _folders if folder else _files
    held.add(Path(path))
    try:
        yield
    finally:
        held.discard(Path(path))


@contextlib.contextmanager
def stopping_in(folder: Path, resumable: Path) -> Iterator[None]:
    """Within the block, and after it once interrupted (the clean stop goes on outside it), the
    line of a stop at once names ``folder`` (the run's output folder), and says ``--resume``
    continues where the file ``resumable`` (the run's checkpoint) exists."""
    previous = _state["folder"], _state["resumable"]
    _state["folder"], _state["resumable"] = Path(folder), Path(resumable)
    try:
        yield
    finally:
        if not _state["interrupted"]:
            _state["folder"], _state["resumable"] = previous


def signal_arrived(status: int) -> None:
    """Called by a signal handler before it raises: the first Ctrl-C or SIGTERM of the command is
    recorded, and one arriving after it ends the process at once with ``status``."""
    if os.getpid() != _state["pid"]:  # a process forked from the command (a data loader's worker)
        return
    if _state["interrupted"]:
        _stop_at_once(status)
    _state["interrupted"] = True


def _stop_at_once(status: int) -> None:
    """Remove what :func:`removed_if_stopped` holds, say so in one line and end the process."""
    for path in list(_files):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    for path in list(_folders):
        with contextlib.suppress(OSError):  # not empty: the run wrote something there
            path.rmdir()
    folder = _state["folder"]
    where = "" if folder is None else f" in {folder}"
    resumable = _state["resumable"]
    resume = "" if resumable is None or not resumable.is_file() else \
        "; its checkpoint continues with --resume"
    # the streams may be in the middle of a write the signal interrupted: what they hold is
    # flushed where they let it, and the line goes to the descriptor itself
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    line = f"sol-ext: interrupted again; stopped at once, leaving no half-written file{where}{resume}.\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "replace"))
    os._exit(status)


def _on_interrupt(signum, frame) -> None:
    signal_arrived(128 + signal.SIGINT)
    raise KeyboardInterrupt


@contextlib.contextmanager
def second_interrupt_stops_at_once() -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` within the block, and a second one ends the process at
    once (:func:`_stop_at_once`); the main thread only. Python's handler is back after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = dict(_state)
    _state.update(interrupted=False, pid=os.getpid(), folder=None)
    previous = signal.signal(signal.SIGINT, _on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _state.update(saved)
