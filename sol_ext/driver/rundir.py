"""The output folder of a run: one run at a time, and what an interrupted run leaves in it.

Two runs writing into one folder would overwrite each other's checkpoint and results, so a run
holds an exclusive lock on ``<folder>/.lock`` (``flock``, released by the kernel even when the
process dies) and a second run is refused at once with :class:`OutputFolderBusy`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS: no locking
    fcntl = None

from .checkpoint import CHECKPOINT_NAME, checkpoint_epoch
from .errors import UsageError

__all__ = ["LOCK_NAME", "OutputFolderBusy", "RunInterrupted", "lock_output_folder",
           "interruption_note", "run_folder"]

LOCK_NAME = ".lock"


class OutputFolderBusy(UsageError):
    """Another process holds the lock of the output folder."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says what the output folder holds now."""


def _holder(fd: int) -> str:
    """``" (process N)"`` from the lock file's content, or ``""``."""
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (process {pid})" if pid.isdigit() else ""


@contextlib.contextmanager
def lock_output_folder(out_dir: Path) -> Iterator[Path]:
    """Create ``out_dir`` if needed and hold its lock for the ``with`` block; yield ``out_dir``.

    On leaving, the lock file is removed, and so is ``out_dir`` when this call created it and
    nothing else was written there (a run refused for bad input leaves no empty folder).

    Raises:
        OutputFolderBusy: another process holds the lock.
    """
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover
        yield out_dir
        return
    path = out_dir / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
    if epoch is None:
        return f"interrupted before the first epoch was checkpointed; nothing to resume in {out_dir}."
    return (f"interrupted; {out_dir} holds the checkpoint of epoch {epoch} "
            f"(continue with --resume).")


@contextlib.contextmanager
def run_folder(out_dir: Path, note: Optional[Callable[[], str]] = None) -> Iterator[Path]:
    """:func:`lock_output_folder`, and a Ctrl-C inside the block becomes :class:`RunInterrupted`
    with ``note()`` (default: :func:`interruption_note`) as its message."""
    with lock_output_folder(out_dir) as folder:
        try:
            yield folder
        except RunInterrupted:
            raise
        except KeyboardInterrupt:
            raise RunInterrupted(note() if note is not None else interruption_note(folder)) from None
