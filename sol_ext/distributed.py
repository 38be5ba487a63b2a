"""The SOL loss over the global batch of data-parallel training (``torch.distributed``, DDP).

With ``DistributedDataParallel`` every process sees its own batch of ``B`` samples, but SOL's order loss
is all-pairs: a plain :class:`~sol_ext.StochasticOrderLoss` on each process would miss every pair whose
members live on different processes. :class:`DistributedStochasticOrderLoss` wraps the loss (the
convention of pytorch-metric-learning's ``DistributedLossWrapper``) so that one step on ``W`` processes
gives the loss value and, after DDP's gradient averaging, the parameter gradients of one process on
the concatenated batch of ``W·B`` samples::

    criterion = DistributedStochasticOrderLoss(sol_ext.StochasticOrderLoss(num_ranks=62))
    loss = criterion(ddp_model(x), labels, centroids)   # every process, every step
    loss.backward()                                     # DDP averages the parameter gradients

How: the dissimilarities ``D [B, n]`` (not the embeddings: ``n`` is usually smaller than ``d``) are
all-gathered with an autograd-aware gather, so the gradient of each gathered row flows back to the process
that owns it. The global rows are put in a zigzag order: every process splits its rows in two halves, the
first halves go in rank order, then the second halves in reverse rank order (process ``r``'s halves sit at
chunk positions ``r`` and ``2W-1-r``). Process ``r`` computes only the pairs of each of its halves against
the global rows after it (:func:`sol_ext.ops.order_loss_block`, once per half), so every global pair is
counted once, and every process evaluates about ``N·B/2`` of the ``N(N-1)/2`` pairs: the work is balanced
(pairing each process's rows with the later ones in rank order would give the first process almost twice
its share). No process forms a pair list or a ``[pairs, n]`` tensor: extra memory ``O(W·B·n)``. Batches
may differ in size (a last batch, an empty one): the sizes are gathered first and the rows padded for the
gather.

The returned value is the global loss on every process. Its gradient is that of ``W`` times the process's
own share (its pairs and its samples' discriminative terms), which DDP's averaging over ``W`` processes
turns into the gradient of the global loss. ``mu``'s gradient, where ``mu`` requires one, follows the same
rule: averaged over the processes (as DDP does when ``mu`` is a parameter of the wrapped module) it is the
single-process gradient.

With ``algorithm="grouped"`` (or ``"auto"`` where it picks grouped for the global batch size ``N = W·B``)
the order loss is computed by sorting (:mod:`sol_ext.grouped`, docs/math.md §13) on the gathered
``D [N, n]`` instead: it is a sum over the ranks ``q``, and process ``r`` takes the ranks
``r·n/W … (r+1)·n/W - 1`` of every pair of the global batch, so the work is split as well
(``O(n^2 N / W + n N log N / W)`` per process). The gradients follow the same rule as above.

Every process must call the loss at every step, also with an empty batch: the gathers are collectives.

SOL's state, :class:`~sol_ext.SOLHead`, is updated at the end of every epoch over the whole training set.
:func:`update_head` (and :func:`update_centroids` for the first centroids) do it across the processes:
each process embeds its :func:`shard` of the training set, the centroid rule all-reduces its per-label
sums and counts, and the read-out is fitted on the gathered embeddings, so every process ends with the
same head, the head one process would compute on the whole training set::

    head.update(h_all, labels_all)                       # one process
    update_head(head, h_local, labels_local)             # W processes, each with its shard
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from . import _validation as check
from ._dispatch import computing, prepare_loss, route
from ._reduction import reduce_losses
from .grouped import grouped_order_loss
from .head import SOLHead
from .loss import StochasticOrderLoss
from .ops import disc_loss, order_loss_block, stochastic_dissimilarity

__all__ = ["DistributedStochasticOrderLoss", "gather_rows", "zigzag_layout", "gather_all", "shard",
           "all_reduce_sum", "update_centroids", "update_head"]


class _GlobalValue(torch.autograd.Function):
    """Returns ``value`` (the global loss, no graph) with the gradient of ``share`` (this process's part)."""

    @staticmethod
    def forward(ctx, share: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return value.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _AllGather(torch.autograd.Function):
    """``[W, *shape]``: the equal-shaped ``local`` of every process. In backward, each process gets the
    sum over the processes of their gradients of its copy (an all-reduce, then its own slice: every
    backend has one, and the gathered rows are small, ``W·B·n`` values)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        total = grad.contiguous().clone()  # all_reduce works in place; the incoming gradient is not ours
        dist.all_reduce(total, group=ctx.group)
        return total[ctx.rank], None


def _group_size_and_rank(group, what: str = "DistributedStochasticOrderLoss") -> tuple:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what} needs an initialized torch.distributed process group; call "
            "torch.distributed.init_process_group(...) first (torchrun sets up its environment), or use "
            "sol_ext.StochasticOrderLoss in a single process"
        )
    return dist.get_world_size(group), dist.get_rank(group)


def gather_rows(local: torch.Tensor, labels: torch.Tensor, group=None) -> tuple:
    """All-gathers the rows of every process, of any (also zero) number per process.

    Args:
        local: this process's rows ``[B, n]`` (``B`` may differ between processes and be 0).
        labels: their integer labels ``[B]``.
        group: the process group (default: the world).

    Returns ``(rows [N, n], labels [N], offset, sizes)``: the rows of all processes in rank order,
    ``N = sum(sizes)``, and ``offset`` the index of this process's first row. ``rows`` is differentiable:
    the gradient of each row flows back to the process that owns it (summed over the processes that
    use it). Three collectives: the sizes, the padded rows, the padded labels.
    """
    world, rank = _group_size_and_rank(group)
    size = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    sizes_t = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes_t, size, group=group)
    sizes = [int(s.item()) for s in sizes_t]
    padded = max(max(sizes), 1)  # at least one row: no collective on empty tensors
    pad = padded - local.shape[0]
    rows = torch.cat([local, local.new_zeros((pad, local.shape[1]))]) if pad else local
    gathered = _AllGather.apply(rows, group)
    labels_padded = torch.cat([labels, labels.new_zeros((pad,))]) if pad else labels
    labels_gathered = [torch.empty_like(labels_padded) for _ in range(world)]
    dist.all_gather(labels_gathered, labels_padded.contiguous(), group=group)
    rows_all = torch.cat([g[:s] for g, s in zip(gathered, sizes)])
    labels_all = torch.cat([g[:s] for g, s in zip(labels_gathered, sizes)])
    return rows_all, labels_all, sum(sizes[:rank]), sizes


def zigzag_layout(sizes: list, rank: int) -> tuple:
    """The balanced global row order of :class:`DistributedStochasticOrderLoss`.

    Args:
        sizes: the batch size of every process, in rank order.
        rank: this process.

    Returns ``(segments, split, offsets)``: the zigzag order as ``(start, stop)`` row ranges of the
    rank-order concatenation (the first halves in rank order, then the second halves in reverse rank
    order); this process's rows ``[:split]`` and ``[split:]`` sit at positions ``offsets[0]`` and
    ``offsets[1]`` onwards of that order.
    """
    starts = [sum(sizes[:q]) for q in range(len(sizes))]
    firsts = [(b + 1) // 2 for b in sizes]
    segments = [(starts[q], starts[q] + firsts[q]) for q in range(len(sizes))]
    segments += [(starts[q] + firsts[q], starts[q] + sizes[q]) for q in reversed(range(len(sizes)))]
    second = sum(firsts) + sum(b - f for b, f in zip(sizes[rank + 1:], firsts[rank + 1:]))
    return segments, firsts[rank], (sum(firsts[:rank]), second)


class DistributedStochasticOrderLoss(nn.Module):
    """A :class:`~sol_ext.StochasticOrderLoss` over the global batch of all processes of a process group.

    Args:
        loss: the single-process loss whose settings (``num_ranks``, ``sigma``, ``tau``, ``margin``, ``T``,
            ``disc_weight``, ``convention``, ``reduction`` ``"mean"`` or ``"sum"``, ``backend``, ``algorithm``)
            apply; ``algorithm="auto"`` decides by the global batch size (the same on every process).
        group: the ``torch.distributed`` process group (default: the world).

    ``forward(h, labels, mu)``: ``h [B, d]`` this process's embeddings (``B`` may differ between processes
    and be 0), ``labels [B]``, ``mu [n, d]`` the same centroids on every process. Returns the loss of the
    concatenated batch of all processes (the same scalar on every process); after ``backward`` and DDP's
    averaging, the parameter gradients equal those of one process on that batch. Explicit ``pairs`` are
    not supported. Collectives per call: three gathers (sizes, ``D``, labels) and one all-reduce of the
    loss value; in backward, an all-reduce of the gathered rows' gradient ``dD``.
    """

    def __init__(self, loss: StochasticOrderLoss, group=None) -> None:
        super().__init__()
        if not isinstance(loss, StochasticOrderLoss):
            raise TypeError(
                f"loss must be a sol_ext.StochasticOrderLoss, got {type(loss).__name__}; wrap it as "
                "DistributedStochasticOrderLoss(sol_ext.StochasticOrderLoss(num_ranks=...))"
            )
        self.loss = loss
        self.group = group

    def forward(
        self, h: torch.Tensor, labels: torch.Tensor, mu: torch.Tensor, pairs: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        if pairs is not None:
            raise ValueError(
                "DistributedStochasticOrderLoss covers all pairs of the global batch; explicit pairs are not "
                "supported (pass pairs=None, or use sol_ext.StochasticOrderLoss on one process)"
            )
        world, rank = _group_size_and_rank(self.group)
        c = self.loss  # its settings and checks; D and the discriminative term here, the order term over all processes
        where = "DistributedStochasticOrderLoss"
        h, labels, mu, _, plan = prepare_loss(
            where, h, labels, mu, num_ranks=c.num_ranks, backend=c.backend, reduction=c.reduction,
            check_values=c.check_values, leaf_ops=True,
        )
        # the inputs are checked: the ops below run on plan.backend without reading values again
        with computing(h.device):
            D = stochastic_dissimilarity(h, mu, c.sigma, backend=plan.backend, check_values=False)
            if plan.checks == "python":
                check.check_dissimilarities_finite(D, h, mu)
            D_cat, labels_cat, _, sizes = gather_rows(D, labels, self.group)
            total = sum(sizes)
            how = route(  # by the global batch size, the same on every process
                where, c.backend, h.device, h.dtype, algorithm=c.algorithm, batch_size=total,
                num_ranks=c.num_ranks, reduction=c.reduction,
            ).algorithm
            if how == "grouped":  # this process's share of the ranks, over all pairs of the global batch
                ranks = (rank * c.num_ranks // world, (rank + 1) * c.num_ranks // world)
                order = grouped_order_loss(
                    D_cat, labels_cat, c.sigma, c.tau, c.margin, c.convention, "sum", ranks=ranks
                )
            else:
                segments, split, offsets = zigzag_layout(sizes, rank)
                D_all = torch.cat([D_cat[a:b] for a, b in segments])
                labels_all = torch.cat([labels_cat[a:b] for a, b in segments])
                rows = torch.cat([
                    order_loss_block(D[part], labels[part], D_all, labels_all, offset, c.sigma, c.tau, c.margin,
                                     c.convention, backend=plan.backend, check_values=False)
                    for part, offset in ((slice(0, split), offsets[0]), (slice(split, None), offsets[1]))
                ])
                order = reduce_losses(rows, "sum")
            disc = disc_loss(D, labels, c.T, "sum", backend=plan.backend, check_values=False)
            if c.reduction == "mean":  # the global counts: N(N-1)/2 pairs, N samples (an empty set gives 0)
                order = order / max(total * (total - 1) // 2, 1)
                disc = disc / max(total, 1)
            share = order + c.disc_weight * disc
            value = share.detach().clone()
            dist.all_reduce(value, group=self.group)
            if c.check_values:  # on the global value: every process raises, none waits in a collective
                check.check_embedding_loss_finite(value, h, mu, c.margin)
            return _GlobalValue.apply(share * world, value)

    def extra_repr(self) -> str:
        return "group=default" if self.group is None else f"group={self.group!r}"


# ------------------------------------------------------------------------------------------------
# SOL's end-of-epoch step across processes
# ------------------------------------------------------------------------------------------------


def is_distributed(group) -> bool:
    """Whether a process group of more than one process is running (else everything is local)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def shard(count: int, group=None) -> slice:
    """This process's contiguous share of ``range(count)`` (the shares differ by at most one item,
    the first ones larger; the whole range without a process group).

    Use it for the end-of-epoch pass over the training set: unlike a ``DistributedSampler``, the
    shares cover every sample exactly once (no padding with repeated samples)."""
    if not is_distributed(group):
        return slice(0, count)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def all_reduce_sum(group=None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function that sums a tensor over the processes of ``group`` in place and returns it: the
    ``all_reduce`` of :meth:`sol_ext.SOLHead.update_centroids` and
    :func:`sol_ext.centroids.compute_centroids`. Without a process group it returns its input."""

    def reduce(t: torch.Tensor) -> torch.Tensor:
        if is_distributed(group):
            dist.all_reduce(t, group=group)
        return t

    return reduce


@torch.no_grad()
def gather_all(local: torch.Tensor, group=None) -> torch.Tensor:
    """The rows of ``local [B, ...]`` of every process, in rank order: ``[sum of B, ...]``.

    ``B`` may differ between processes and be 0; the other dimensions and the dtype must agree. No
    gradient (:func:`gather_rows` has one). Without a process group it returns ``local``."""
    if not is_distributed(group):
        return local
    world = dist.get_world_size(group)
    size = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    sizes_t = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes_t, size, group=group)
    sizes = [int(s.item()) for s in sizes_t]
    padded = max(max(sizes), 1)  # at least one row: no collective on empty tensors
    rows = local.detach()
    if rows.shape[0] < padded:
        rows = torch.cat([rows, rows.new_zeros((padded - rows.shape[0], *rows.shape[1:]))])
    parts = [torch.empty_like(rows) for _ in range(world)]
    dist.all_gather(parts, rows.contiguous(), group=group)
    return torch.cat([p[:s] for p, s in zip(parts, sizes)])


@torch.no_grad()
def update_centroids(head: "SOLHead", h: torch.Tensor, labels, group=None) -> torch.Tensor:
    """:meth:`SOLHead.update_centroids <sol_ext.SOLHead.update_centroids>` over the training set
    split between the processes of ``group`` (default: the world).

    Args:
        head: the same :class:`~sol_ext.SOLHead` on every process.
        h: ``[N_r, d]`` this process's share of the training embeddings (any share: every sample on
            exactly one process, e.g. its :func:`shard`; ``N_r`` may be 0).
        labels: ``[N_r]`` their integer ranks.
        group: the ``torch.distributed`` process group; without an initialized one, this process alone.

    Returns the new centroids ``[n, d]``, the same on every process: those of one process on the
    whole training set (to the rounding of the sums). Every process must call it (an all-reduce); the
    arguments are checked before it."""
    return head.update_centroids(h, labels, all_reduce=all_reduce_sum(group))


@torch.no_grad()
def update_head(head: "SOLHead", h: torch.Tensor, labels, val_h: Optional[torch.Tensor] = None,
                val_labels=None, group=None) -> None:
    """:meth:`SOLHead.update <sol_ext.SOLHead.update>` (the end of an epoch: centroid rule, then the
    read-out) over the training set split between the processes of ``group`` (default: the world).

    Args:
        head: the same :class:`~sol_ext.SOLHead` on every process.
        h: ``[N_r, d]`` this process's share of the training embeddings (every sample on exactly one
            process, e.g. its :func:`shard`; ``N_r`` may be 0).
        labels: ``[N_r]`` their integer ranks.
        val_h, val_labels: this process's share of a validation split, or ``None`` (then the read-out
            is fitted on the training set).
        group: the ``torch.distributed`` process group; without an initialized one, this process alone
            (the same as ``head.update``).

    The centroid rule all-reduces the per-label sums and counts; the read-out is fitted on the
    embeddings and labels gathered from every process (``N × d`` values on each process, as the
    single-process ``head.update`` holds them). Every process ends with the same head. Every process
    must call it: the arguments are checked before the first collective, so that bad input raises
    on the process that has it (the others then wait in the collective until the group's timeout).
    """
    if not is_distributed(group):
        head.update(h, labels, val_h, val_labels)
        return
    head.update(h, labels, val_h, val_labels, all_reduce=all_reduce_sum(group),
                gather=lambda t: gather_all(t, group))
