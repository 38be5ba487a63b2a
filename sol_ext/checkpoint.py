"""Checkpoints of a training run: save atomically, load with a configuration check.

A checkpoint holds the model, the optimizer, the centroids, the epoch, the current (relabeled)
training labels next to the given and clean ones, the history, the random states and the
configuration, so a stopped run resumes exactly where it stopped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .config import TrainConfig, config_mismatches

__all__ = ["CHECKPOINT_NAME", "CheckpointMismatch", "save_checkpoint", "load_checkpoint",
           "atomic_write_bytes", "atomic_write_text"]

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


class CheckpointMismatch(ValueError):
    """A checkpoint was written by a run with another configuration or other data."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so that a reader never
    sees a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Save ``state`` (tensors, plain Python values) atomically to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"format_version": FORMAT_VERSION, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, config: TrainConfig | None = None,
                    fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load a checkpoint; with ``config``/``fingerprint`` given, check that it belongs to them.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        CheckpointMismatch: the checkpoint's configuration or data differ.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}; expected the output folder of a "
                                f"'sol-ext train' run.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
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
