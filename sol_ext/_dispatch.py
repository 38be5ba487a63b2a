"""One way into the kernels: argument preparation, the choice of backend and algorithm, and the compute context.

Every entry point (the functional ops of :mod:`sol_ext.ops`, :class:`~sol_ext.StochasticOrderLoss`,
:class:`~sol_ext.distributed.DistributedStochasticOrderLoss`) runs the same three steps::

    h, mu = prepare({"h": h, "mu": mu}, labels=labels)      # func transforms, one device, promotion
    ...                                                      # the op's own argument checks
    how = route("order_loss", backend, D.device, D.dtype, algorithm=..., ...)
    with computing(D.device):                                # autocast off: the dtype is chosen
        ...                                                  # fused kernels, reference or grouped

The whole loss (:func:`sol_ext.ops.stochastic_order_loss`) takes its plan from :func:`plan_loss`: which op runs
(a one-op step or the leaf ops), pairwise or grouped, and where its value checks run.

Backends: ``"auto"`` uses the fused kernels when this build has them for the tensors' device and dtype,
and otherwise the plain-PyTorch reference with a warning that says why (once per cause); ``"fused"``
uses the kernels or raises; ``"reference"`` always uses :mod:`sol_ext.reference`. Meta tensors run the
fake kernels. Algorithms of the all-pairs order loss: :func:`choose_algorithm` (``"auto"``:
:func:`grouped_is_faster`); the grouped algorithm's fused op or torch operations: :func:`grouped_op_runs`;
its one-op step on CUDA (``SOL_EXT_CUDA_GROUPED=fused``): :func:`fused_cuda_step`. These are the Python
side's decisions; the CUDA kernels still choose between implementations of their own by environment
variables (``SOL_EXT_CUDA_DISSIMILARITY``, ``SOL_EXT_CUDA_ALL_PAIRS_BACKWARD``, ``SOL_EXT_CUDA_GROUPED``,
csrc/cuda/), of which Python reads only ``SOL_EXT_CUDA_GROUPED``, here. :mod:`sol_ext.grouped` is the
algorithm alone.

Mixed precision, as PyTorch's own losses do it: floating inputs of mixed dtypes are promoted to the wider
one, and under ``torch.autocast`` the ops compute in float32 (float64 stays float64). The casts are
differentiable, so each gradient comes back in its input's dtype.
"""
from __future__ import annotations

import contextlib
import functools
import os
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from . import _validation as check
from ._extension import cuda_kernels_available

__all__ = [
    "prepare", "prepare_loss", "route", "Route", "plan_loss", "LossPlan", "computing", "choose_algorithm",
    "grouped_is_faster", "grouped_op_runs", "fused_cuda_step", "cuda_kernels_available",
]

_CPU_DTYPES = (torch.float32, torch.float64)
_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_warned: set = set()


# ---------------------------------------------------------------------------------------------
# Preparation
# ---------------------------------------------------------------------------------------------


def prepare(floating: dict, **others) -> tuple:
    """The first step of every entry point. Refuses tensors of torch.func transforms, requires every tensor
    (``floating`` and ``others``; ``None`` is skipped) on one device, and returns the ``floating`` tensors
    cast to one compute dtype (:func:`_promote`), in their order."""
    _refuse_func_transforms(**floating, **others)
    check.check_same_device(**floating, **others)
    return _promote(*floating.values()) if floating else ()


def _autocast_enabled(device: torch.device) -> bool:
    return device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type)


def _promote(*tensors):
    """Floating inputs cast to one compute dtype: the widest of theirs, and under autocast at least float32.

    The casts are differentiable, so each input's gradient comes back in its own dtype. Anything that is
    not a floating tensor is returned as is, for the checks to name.
    """
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors):
        return tensors
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    # autocast widens only dtypes narrower than float32: float32 and float64 skip its query (µs per step)
    if dtype not in (torch.float32, torch.float64) and _autocast_enabled(tensors[0].device):
        dtype = torch.promote_types(dtype, torch.float32)
    return tuple(t if t.dtype == dtype else t.to(dtype) for t in tensors)  # even a no-op .to() costs µs per step


def computing(device: torch.device):
    """The context the ops compute in: autocast off, since :func:`prepare` chose the dtype (autocast would
    run the reference's matmuls in half again after promotion to float32)."""
    return torch.autocast(device.type, enabled=False) if _autocast_enabled(device) else contextlib.nullcontext()


def _refuse_func_transforms(**tensors) -> None:
    """A clear error for tensors of torch.func transforms, which the validation and the kernels cannot read.

    vmap's batched tensors have no storage ("Cannot access data pointer"), and the autograd wrappers
    have no vmap or forward-mode rules.
    """
    if check.tracing():
        return
    for name, t in tensors.items():
        if not (isinstance(t, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(t)):
            continue
        how = (
            "batched by torch.func.vmap"
            if torch._C._functorch.is_batchedtensor(t)
            else "wrapped by a torch.func transform (grad, jacrev, jvp, ...)"
        )
        raise TypeError(
            f"{name} is {how}; sol_ext does not support torch.func transforms. Per-example losses come "
            "from reduction='none' of sol_ext.order_loss and sol_ext.disc_loss, per-example gradients from "
            "a loop over examples, gradients from torch.autograd."
        )


# ---------------------------------------------------------------------------------------------
# Backend and algorithm
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """How one call runs. ``fused``: the fused kernels (else the plain-PyTorch reference) for the pairwise
    ops and ``D``; ``algorithm``: ``"pairwise"`` or ``"grouped"`` for the all-pairs order loss."""

    fused: bool
    algorithm: str = "pairwise"


def route(
    where: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    *,
    algorithm: str = "pairwise",
    batch_size: int = 0,
    num_ranks: int = 0,
    pairs: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    grouped_needs_kernels: bool = True,
) -> Route:
    """The backend and algorithm of one call of ``sol_ext.<where>``; warns or raises as the module says.

    ``grouped_needs_kernels``: whether the call still runs kernels when the grouped algorithm is chosen
    (the loss computes ``D`` and the discriminative loss with them; :func:`sol_ext.order_loss` does not, so
    choosing grouped there neither warns nor raises about missing kernels).
    """
    check.check_choice("backend", backend, check.BACKENDS)
    why = None if backend == "reference" else _fused_unavailable_reason(device, dtype)
    how = choose_algorithm(
        algorithm, batch_size, num_ranks, device, fused=backend != "reference" and why is None, backend=backend,
        pairs=pairs, reduction=reduction, where=where,
    )
    if how == "grouped" and not grouped_needs_kernels:
        return Route(fused=False, algorithm=how)
    return Route(fused=_use_fused(backend, where, why), algorithm=how)


def _fused_unavailable_reason(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    if device.type == "cpu":
        if dtype not in _CPU_DTYPES:
            return f"the CPU kernels take float32 or float64, got {dtype} (convert with .float() or .double())"
        return None
    if device.type == "cuda":
        if not cuda_kernels_available():
            return "this build of sol_ext has no CUDA kernels (rebuild with a CUDA toolkit; see docs/getting-started.md)"
        if dtype not in _CUDA_DTYPES:
            return f"the CUDA kernels take float16, bfloat16, float32 or float64, got {dtype}"
        return None
    if device.type == "meta":  # shapes and dtypes only: the fake kernels (_fake.py) serve every dtype
        return None if dtype in _CUDA_DTYPES else f"sol_ext's kernels take no {dtype}"
    return f"sol_ext has no kernels for device type {device.type!r}"


def _use_fused(backend: str, where: str, why: Optional[str]) -> bool:
    """Whether to run the fused kernels, given ``why`` they are unavailable (``None``: they are)."""
    if backend == "reference":
        return False
    if why is None:
        return True
    if backend == "fused":
        raise RuntimeError(f"sol_ext.{where}(backend='fused'): {why}")
    if (where, why) not in _warned:  # warn once per cause, not every step
        _warned.add((where, why))
        warnings.warn(f"sol_ext.{where}: using the plain PyTorch reference because {why}", stacklevel=4)
    return False


def choose_algorithm(
    algorithm: str,
    batch_size: int,
    num_ranks: int,
    device: torch.device,
    *,
    fused: bool,
    backend: str = "auto",
    pairs: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    where: str = "order_loss",
) -> str:
    """``"pairwise"`` or ``"grouped"`` for ``algorithm`` in ``("auto", "pairwise", "grouped")``; a
    ``ValueError`` for a bad value or a combination the grouped algorithm does not cover.

    ``"auto"`` keeps pairwise for explicit ``pairs``, for ``reduction="none"`` (per-pair losses), for
    ``backend="reference"`` (the oracle stays the plain formulas, which also support double backward
    through ``D``'s kernels), while ``torch.compile`` traces and on meta tensors (the fused ops have fake
    kernels); otherwise it applies :func:`grouped_is_faster` (the measured rule, docs/performance.md).
    """
    check.check_choice("algorithm", algorithm, check.ALGORITHMS)
    if algorithm == "grouped":
        if pairs is not None:
            raise ValueError(
                f"sol_ext.{where}: algorithm='grouped' computes the loss of all pairs of the batch; explicit "
                "pairs are evaluated pair by pair: pass pairs=None, or algorithm='pairwise' (or 'auto')"
            )
        if reduction == "none":
            raise ValueError(
                f"sol_ext.{where}: algorithm='grouped' gives the reduced loss ('mean' or 'sum') without forming "
                "the B(B-1)/2 per-pair losses; reduction='none' needs algorithm='pairwise' (or 'auto')"
            )
        return "grouped"
    if algorithm == "pairwise":
        return "pairwise"
    if pairs is not None or reduction == "none" or backend == "reference":
        return "pairwise"
    if check.tracing() or device.type == "meta":
        return "pairwise"
    return "grouped" if grouped_is_faster(batch_size, num_ranks, device, fused) else "pairwise"


def grouped_is_faster(batch_size: int, num_ranks: int, device: torch.device, fused: bool = True) -> bool:
    """The rule of ``algorithm="auto"``: whether the grouped algorithm beats the pairwise one at this size.

    ``fused``: whether pairwise would run the fused kernels (else the plain-PyTorch reference). Grouped costs
    about ``n^2 B`` (plus ``n B log B``), pairwise ``B^2 n / 2``, so grouped wins from some ``B``
    proportional to ``n`` on. Crossovers measured (StochasticOrderLoss forward+backward, float32, d = 64) on a
    2-core x86 CPU shared with other jobs, at torch's default thread count (2) unless said:

    - CPU, both fused (the grouped op, csrc/cpu/grouped_order_loss_kernel.cpp; the pairwise kernels at the
      CPU's vector width): on one thread, by CPU time (the machine was too busy, load average about 10, for
      wall times to tell), ``B`` of about 40 for ``n = 5``, 110 for ``n = 20``, 280 for ``n = 60``, 600 for
      ``n = 101`` and 1000-1300 for ``n = 217``. Rule: ``B >= max(64, 5.5 n)``.
    - plain-PyTorch reference (no fused kernels for this device or dtype; it forms ``[B(B-1)/2, n]``
      tensors; load average 4-5): ``B`` of 32-64 for ``n <= 40``, about 150 for ``n = 101``. Rule:
      ``B >= max(48, 1.5 n)``.
    - CUDA, both fused (the CUDA op, csrc/cuda/grouped_order_loss_kernel.cu), on an H100 (torch 2.11,
      ``benchmarks/results/gpu/h100-algorithms.json``): pairwise is faster at ``B = 1024`` (by 1.4x to 2x for
      ``n`` of 5 to 60), the two are level at ``B = 4096`` (within 10 %), and grouped is 6.7x, 14x and 13x
      faster at ``B = 16384`` for ``n`` = 5, 20, 60; ``B = 65536, n = 7`` takes 3.3 ms (pairwise 619 ms) and
      ``B = 10^6, n = 5`` 8.0 ms. Rule: ``B >= 8192`` and ``n <= B / 64`` (grouped's ``n^2 B`` term beyond
      the measured range is not assumed to win).
    """
    B, n = batch_size, num_ranks
    if B < 2:
        return False
    if not fused:
        return B >= max(48, 1.5 * n)
    if device.type == "cpu":
        return B >= max(64, 5.5 * n)
    return B >= 8192 and n <= B / 64


# ---------------------------------------------------------------------------------------------
# The grouped algorithm's implementations (sol_ext/grouped.py)
# ---------------------------------------------------------------------------------------------

# Whether CPU / CUDA float32/float64 inputs go to the grouped op (tests turn them off to check the torch path).
_GROUPED_CPU_OP = True
_GROUPED_CUDA_OP = True


def grouped_op_runs(D: torch.Tensor) -> bool:
    """Whether the grouped sum of ``D`` runs the fused op ``torch.ops.sol_ext.grouped_order_sum`` (CPU and CUDA,
    float32/float64), else plain torch operations (:mod:`sol_ext.grouped`)."""
    if D.dtype not in (torch.float32, torch.float64):
        return False
    if D.device.type == "cpu":
        return _GROUPED_CPU_OP
    return _GROUPED_CUDA_OP and D.device.type == "cuda" and cuda_kernels_available()


def fused_cuda_step(h: torch.Tensor) -> bool:
    """Whether :class:`sol_ext.StochasticOrderLoss` runs its grouped step on ``h`` (CUDA) as one op per
    direction with the fused kernels of the CUDA op: only with ``SOL_EXT_CUDA_GROUPED=fused`` until that
    path has run on a GPU (csrc/cuda/grouped_order_loss_kernel.cu says what differs)."""
    return os.environ.get("SOL_EXT_CUDA_GROUPED") == "fused" and h.device.type == "cuda" and grouped_op_runs(h)


# ---------------------------------------------------------------------------------------------
# The whole loss: its plan and its inputs
# ---------------------------------------------------------------------------------------------

# The ops a plan names: one op per direction (csrc/stochastic_order_loss.cpp), or the leaf ops one by one.
GROUPED_STEP, PAIRWISE_STEP, LEAF_OPS = "grouped_stochastic_order_loss", "stochastic_order_loss", "leaf_ops"


@dataclass(frozen=True)
class LossPlan:
    """How one call of the whole loss (:func:`sol_ext.ops.stochastic_order_loss`) runs.

    ``op``: :data:`GROUPED_STEP` or :data:`PAIRWISE_STEP`, the loss as one op per direction with one
    autograd node (at small batches a step's time is mostly per-call overhead), or :data:`LEAF_OPS`: ``D``,
    then the order and discriminative terms. ``algorithm``: ``"pairwise"`` or ``"grouped"``, for the order
    term over all pairs. ``backend``: ``"fused"`` or ``"reference"``, what the leaf ops run. ``checks``: where
    the value checks run: ``"op"`` inside the CPU grouped op (which reads its inputs and its loss itself),
    ``"python"`` on the inputs before the op and on ``D`` and the loss after it, ``"after"`` (the CPU pairwise
    step) on the labels and pairs before the op and on ``D`` and the loss after it, ``h`` and ``mu`` only
    where ``D`` is not finite (:func:`sol_ext._validation.check_inputs_through_dissimilarities`: reading
    ``h`` before the op took an OpenMP team, whose spinning threads then slowed the op's helpers), ``"indices"``
    (``check_values=False`` on a CPU path in plain torch operations, where a negative index would silently
    wrap around) only the ranges of ``labels`` and ``pairs``, or ``"none"``.
    """

    op: str
    algorithm: str
    backend: str
    checks: str


def plan_loss(
    where: str,
    backend: str,
    h: torch.Tensor,
    num_ranks: int,
    *,
    algorithm: str = "auto",
    pairs: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    check_values: bool = True,
    leaf_ops: bool = False,
) -> LossPlan:
    """The :class:`LossPlan` of one call of ``sol_ext.<where>`` on embeddings ``h`` (checked and promoted).
    ``leaf_ops``: the caller runs the leaf ops itself (the distributed loss, which gathers ``D``)."""
    how = route(where, backend, h.device, h.dtype, algorithm=algorithm, batch_size=h.shape[0], num_ranks=num_ranks,
                pairs=pairs, reduction=reduction)
    on_cpu = h.device.type == "cpu"
    if leaf_ops:
        op = LEAF_OPS
    elif how.fused and how.algorithm == "grouped" and (on_cpu or fused_cuda_step(h)):
        op = GROUPED_STEP
    elif how.fused and how.algorithm == "pairwise":
        op = PAIRWISE_STEP
    else:
        op = LEAF_OPS
    if check_values:
        checks = ("op" if op == GROUPED_STEP else "after" if op == PAIRWISE_STEP else "python") if on_cpu else "python"
    else:  # the kernels check their indices themselves; a GPU asserts them on the device (check_ranks)
        checks = "indices" if on_cpu and not how.fused else "none"
    return LossPlan(op=op, algorithm=how.algorithm, backend="fused" if how.fused else "reference", checks=checks)


def prepare_loss(
    where: str,
    h: torch.Tensor,
    labels: torch.Tensor,
    mu: torch.Tensor,
    pairs: Optional[torch.Tensor] = None,
    *,
    num_ranks: Optional[int] = None,
    backend: str = "auto",
    algorithm: str = "auto",
    reduction: str = "mean",
    check_values: bool = True,
    leaf_ops: bool = False,
) -> tuple:
    """``(h, labels, mu, pairs, plan)``: the arguments of the whole loss checked and promoted (:func:`prepare`),
    its :class:`LossPlan`, and the inputs' values read where the plan says (``plan.checks == "python"``:
    NaN/inf embeddings and out-of-range labels and pairs are refused here). ``num_ranks``: the rows ``mu``
    must have (default: whatever it has)."""
    h, mu = prepare({"h": h, "mu": mu}, labels=labels, pairs=pairs)
    check.check_embeddings(h, mu, values=False)
    if num_ranks is not None and mu.shape[0] != num_ranks:
        raise ValueError(
            f"mu must have num_ranks={num_ranks} rows (one centroid per rank), got shape {tuple(mu.shape)}"
        )
    plan = plan_loss(where, backend, h, mu.shape[0], algorithm=algorithm, pairs=pairs, reduction=reduction,
                     check_values=check_values, leaf_ops=leaf_ops)
    read = plan.checks in ("python", "after", "indices")
    labels = check.check_ranks("labels", labels, mu.shape[0], length=h.shape[0], values=read)
    pairs = check.check_pairs(pairs, h.shape[0], values=read)
    if plan.checks == "python":
        check.check_finite("h", h)
        check.check_finite("mu", mu)
    return h, labels, mu, pairs, plan
