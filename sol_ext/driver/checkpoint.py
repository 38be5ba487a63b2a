"""Checkpoints of a training run: save atomically, load with a configuration check.

A checkpoint holds the model, the optimizer, the centroids, the epoch, the current (relabeled)
training labels next to the given and clean ones, the history, the random states and the
configuration, so a stopped run resumes exactly where it stopped.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

from .config import TrainConfig, config_mismatches

__all__ = ["CHECKPOINT_NAME", "BEST_NAME", "CheckpointMismatch", "save_checkpoint", "load_checkpoint",
           "check_resumable", "checkpoint_epoch", "atomic_write_bytes", "atomic_write_text"]

CHECKPOINT_NAME = "checkpoint.pt"  # the last epoch: what --resume continues
BEST_NAME = "best.pt"              # the selected epoch: the run's model (sol_ext.load_run)
FORMAT_VERSION = 1


class CheckpointMismatch(ValueError):
    """A checkpoint was written by a run with another configuration or other data."""


def _temporary_name(path: Path) -> Path:
    """A name beside ``path`` that no other process or call uses: two runs writing the same
    file never share a half-written temporary."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _replace_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a fresh temporary file, flush it to disk and rename it to ``path``; a
    reader sees the old file or the new one, never a part. The temporary goes on failure."""
    tmp = _temporary_name(path)
    try:
        # O_EXCL: never write through a file someone else made; the umask sets the mode
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # also Ctrl-C: leave no temporary behind
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so that a reader never
    sees a half-written file."""
    _replace_atomically(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Save ``state`` (tensors, plain Python values) atomically to ``path``."""
    _replace_atomically(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, f))


def load_checkpoint(path: Path, config: TrainConfig | None = None,
                    fingerprint: dict[str, Any] | None = None, *,
                    mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint; with ``config``/``fingerprint`` given, check that it belongs to them.

    ``mmap=True`` maps the tensors from the file instead of reading them (fast for a check).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        CheckpointMismatch: the checkpoint's configuration or data differ.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}; expected the output folder of a "
                                f"'sol-ext train' run.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # a truncated or foreign file: say which file, not the pickle detail
        raise CheckpointMismatch(f"cannot read checkpoint {str(path)!r} ({type(exc).__name__}); "
                                 f"it is damaged or not a sol_ext checkpoint.") from exc
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointMismatch(f"{str(path)!r} is not a sol_ext checkpoint of format "
                                 f"{FORMAT_VERSION}.")
    if config is not None:
        saved = TrainConfig.from_dict(state["config"])
        diff = config_mismatches(saved, config)
        if diff:
            raise CheckpointMismatch(
                f"checkpoint {str(path)!r} was written with another configuration "
                f"({'; '.join(diff)}). Resume with the same options, or choose another --output.")
    if fingerprint is not None and state.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} was trained on other data (saved {state.get('fingerprint')}, "
            f"now {fingerprint}). Resume with the same data, or choose another --output.")
    return state


def check_resumable(path: Path, config: TrainConfig, fingerprint: dict[str, Any]) -> int:
    """Check that the checkpoint at ``path`` can continue a run of ``config`` on data with
    ``fingerprint``, without reading its tensors; return its epoch. Call it before changing
    anything in the output folder, so that a refused ``--resume`` leaves the folder as it was.

    Raises:
        FileNotFoundError, CheckpointMismatch: as :func:`load_checkpoint`.
    """
    return int(load_checkpoint(path, config, fingerprint, mmap=True)["epoch"])


def checkpoint_epoch(path: Path) -> int | None:
    """The epoch of the checkpoint at ``path``, or None when there is none or it is unreadable."""
    try:
        return int(load_checkpoint(path, mmap=True)["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
