"""Data-parallel runs of ``sol-ext train`` under ``torchrun``: which process this is, and the few
collectives Algorithm 1 needs beyond DDP's gradient averaging.

``torchrun --nproc-per-node W -m sol_ext.driver train ...`` starts ``W`` processes with ``WORLD_SIZE``,
``RANK`` and ``LOCAL_RANK`` in their environment; :meth:`Parallel.from_environment` reads them, and
:meth:`Parallel.start` joins the process group (``nccl`` for GPUs, one per process, ``gloo`` on CPUs).
Without torchrun, :class:`Parallel` is the single process and every collective returns its input.

The driver runs one process's share of each step and of each whole-training-set pass (embedding,
the head's update), and combines the shares with the library's own helpers
(:func:`sol_ext.distributed.shard`, :func:`~sol_ext.distributed.gather_all`,
:func:`~sol_ext.distributed.all_reduce_sum`, :func:`~sol_ext.distributed.update_head`); rank 0's
labels and decisions are broadcast here, so every process holds the same centroids, labels and
decisions after every epoch.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

__all__ = ["Parallel", "TORCHRUN_VARIABLES", "state_digest"]

TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def _environment_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer; it is set by torchrun "
                         f"(unset it to train in one process).") from None


@dataclass(frozen=True)
class Parallel:
    """This process's place in a data-parallel run: ``rank`` of ``world_size`` (``local_rank`` on its
    machine). The default is a single process."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> "Parallel":
        """From torchrun's ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; a single process without them."""
        world = _environment_int("WORLD_SIZE", 1)
        rank = _environment_int("RANK", 0)
        local = _environment_int("LOCAL_RANK", rank)
        if world < 1 or not 0 <= rank < world or local < 0:
            raise ValueError(f"inconsistent torchrun environment: WORLD_SIZE={world}, RANK={rank}, "
                             f"LOCAL_RANK={local}; expected 0 <= RANK < WORLD_SIZE.")
        return cls(world_size=world, rank=rank, local_rank=local)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the outputs and prints the progress."""
        return self.rank == 0

    def start(self, device: torch.device, timeout_s: float = 1800.0) -> None:
        """Join the process group: ``nccl`` when this process trains on a GPU, ``gloo`` otherwise."""
        if not self.enabled or dist.is_initialized():
            return
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)

    def stop(self) -> None:
        if self.enabled and dist.is_initialized():
            # DistributedDataParallel keeps the process group alive from inside reference cycles;
            # collected at interpreter exit instead, the group's gloo threads were torn down there
            # and a process sometimes aborted ("terminate called without an active exception")
            gc.collect()
            dist.destroy_process_group()

    # ---- collectives (identity on one process); shards, gathers and sums are the library's
    # (sol_ext.distributed.shard, gather_all, all_reduce_sum) --------------------------------------

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``t`` on every process (in place)."""
        if self.enabled:
            dist.broadcast(t, src=0)
        return t

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's picklable ``obj`` on every process (tensors come back on the CPU)."""
        if not self.enabled:
            return obj
        holder = [obj if self.is_main else None]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def agree(self, flag: bool, device: torch.device) -> bool:
        """Rank 0's decision on every process: branches that lead to collectives must not diverge."""
        if not self.enabled:
            return flag
        return bool(self.broadcast(torch.tensor([int(flag)], device=device)).item())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def check_same_state(self, epoch: int, labels: torch.Tensor,
                         centroids: Optional[torch.Tensor]) -> None:
        """Every process must hold rank 0's labels and centroids after an epoch (broadcast and
        all-reduced, so equal by construction); a difference would let the processes drift apart
        silently, so it stops the run."""
        if not self.enabled:
            return
        mine = state_digest(labels, centroids)
        theirs = self.broadcast(mine.clone())
        if not torch.equal(mine, theirs):
            raise RuntimeError(f"process {self.rank} holds other labels or centroids than rank 0 after "
                               f"epoch {epoch}; the data-parallel run is out of step.")


def state_digest(labels: torch.Tensor, centroids: Optional[torch.Tensor]) -> torch.Tensor:
    """A few float64 numbers that change with any label or centroid value (position-weighted sums)."""
    weights = torch.arange(1, labels.numel() + 1, dtype=torch.float64, device=labels.device)
    digest = [labels.double().sum(), (labels.double() * weights).sum()]
    if centroids is not None:
        c = centroids.detach().double().flatten()
        digest += [c.sum(), (c * torch.arange(1, c.numel() + 1, dtype=torch.float64, device=c.device)).sum()]
    return torch.stack(digest)
