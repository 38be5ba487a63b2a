"""The device a command runs on, from ``--device``: importable without the training loop, so
that ``sol-ext predict`` and :func:`sol_ext.driver.load_run` need none of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from .parallel import Parallel

__all__ = ["resolve_device"]


def resolve_device(name: str, parallel: Optional[Parallel] = None) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else must exist. Under torchrun a GPU
    run uses one GPU per process: ``cuda:LOCAL_RANK``."""
    if parallel is not None and parallel.enabled:
        dev = resolve_device(name)
        if dev.type != "cuda":
            return dev
        if name not in ("auto", "cuda"):
            raise ValueError(f"device={name!r}: under torchrun each process trains on its own GPU, "
                             f"cuda:LOCAL_RANK; pass --device cuda (or auto).")
        if parallel.local_rank >= torch.cuda.device_count():
            raise ValueError(f"process {parallel.local_rank} on this machine has no GPU of its own: "
                             f"{torch.cuda.device_count()} GPU(s) visible; start at most that many "
                             f"processes per machine (torchrun --nproc-per-node).")
        return torch.device("cuda", parallel.local_rank)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={name!r} is not a device; expected cpu, cuda, cuda:N or auto.")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use --device cpu.")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} requested but there are {torch.cuda.device_count()} "
                         f"CUDA devices (cuda:0 … cuda:{torch.cuda.device_count() - 1}).")
    return dev
