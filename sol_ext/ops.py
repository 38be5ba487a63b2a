"""The public functional API: validation, then the fused ops or the plain-PyTorch reference.

Data flow of one SOL step (see README):
``h, mu -> stochastic_dissimilarity -> D [B, n] -> order_loss + disc_loss``, the whole of it
:func:`stochastic_order_loss` (what :class:`sol_ext.StochasticOrderLoss` computes).
``D`` is the only tensor passed between ops; everything quadratic in the batch stays inside the
order-loss kernel. The ops ``torch.ops.sol_ext.*`` are differentiable on their own.

Every function takes ``backend``: ``"auto"`` uses the fused kernels where this build has them for the tensors'
device and dtype, and otherwise the reference (:mod:`sol_ext.reference`) with a warning that says why;
``"fused"`` uses the kernels or raises; ``"reference"`` always uses the reference. Floating inputs of mixed
dtypes are promoted to the wider one, and under ``torch.autocast`` the ops compute in float32 at least.
Reduced losses of float16/bfloat16 are float32. Double backward through the fused ops and torch.func
transforms raise clear errors.

``check_values=False`` skips what reads tensor values on the host (NaN/inf inputs, out-of-range labels and
pairs, a loss that overflows): on a GPU each read is a host-device synchronization. Index ranges are then
asserted on the device, and on the CPU the kernels check them (the reference's are still read, where a
negative index would silently wrap around).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import (
    _autograd,  # noqa: F401  the ops' autograd and autocast
    grouped,
    reference,
)
from . import _validation as check
from ._dispatch import computing, prepare, prepare_loss, route
from ._reduction import reduce_losses

__all__ = [
    "stochastic_order_loss",
    "stochastic_dissimilarity",
    "ordering_probabilities",
    "ordering_probability_table",
    "order_loss",
    "order_loss_block",
    "disc_loss",
    "noise_kernel",
]

_ops = torch.ops.sol_ext

# ---------------------------------------------------------------------------------------------
# The fused op or the reference, on checked arguments
# ---------------------------------------------------------------------------------------------


def _dissimilarity(h, mu, sigma, fused: bool):
    if fused:
        return _ops.stochastic_dissimilarity(h, mu, sigma)
    return reference.stochastic_dissimilarity(h, mu, sigma)


def _order_losses(D, labels, pairs, sigma, tau, margin, convention, fused: bool):
    """Per-pair losses ``[M]``."""
    if fused:
        return _ops.order_loss(D, labels, pairs, sigma, tau, margin, convention)
    return reference.order_loss(D, labels, pairs, sigma, tau, margin, convention, reduction="none")


def _order_loss_block_rows(D, labels, D_all, labels_all, offset, sigma, tau, margin, convention, fused: bool):
    """Per-row sums ``[B]`` of the block's pair losses."""
    if fused:
        return _ops.order_loss_block(D, labels, D_all, labels_all, offset, sigma, tau, margin, convention)
    return reference.order_loss_block(D, labels, D_all, labels_all, offset, sigma, tau, margin, convention)


def _disc_losses(D, labels, T, fused: bool):
    """Per-sample losses ``[B]``."""
    if fused:
        return _ops.disc_loss(D, labels, T)
    return reference.disc_loss(D, labels, T, reduction="none")


def _check_values_flag(check_values) -> bool:
    if not isinstance(check_values, bool):
        raise TypeError(f"check_values must be True or False, got {check_values!r}")
    return check_values


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def stochastic_order_loss(
    h: torch.Tensor,
    labels: torch.Tensor,
    mu: torch.Tensor,
    pairs: Optional[torch.Tensor] = None,
    sigma: float = 1.0,
    tau: int = 1,
    margin: float = 0.25,
    T: int = 1,
    disc_weight: float = 1.0,
    convention: str = "paper",
    reduction: str = "mean",
    *,
    num_ranks: Optional[int] = None,
    backend: str = "auto",
    algorithm: str = "auto",
    check_values: bool = True,
) -> torch.Tensor:
    """The SOL training objective ``order_loss(D) + disc_weight * disc_loss(D)`` with
    ``D = stochastic_dissimilarity(h, mu, sigma)`` (paper eq. 17 plus lambda times eq. 10, docs/math.md §7).

    Args:
        h: embeddings ``[B, d]``. labels: their noisy 0-based ranks ``[B]``, any integer dtype.
        mu: rank centroids ``[n, d]`` (``n`` ranks); gradients flow to ``h`` and ``mu``, each in its own dtype.
        pairs: ``None`` for all ``B(B-1)/2`` pairs of the batch, or integer ``[M, 2]`` batch indices.
        sigma, tau, margin: noise std in rank units (> 0), ``x ~ y`` threshold in ranks (int >= 0; the
            paper's 3 lumps most pairs together when there are few ranks), hinge margin gamma (>= 0).
        T, disc_weight: neighbour range of the discriminative loss (int >= 1), its weight lambda (>= 0).
        convention: ``"paper"`` or ``"official"`` (the authors' code, docs/math.md §10).
        reduction: ``"mean"`` (each part averaged over its pairs or samples) or ``"sum"``.
        num_ranks: the number of rows ``mu`` must have (default: any).
        backend: as for every op of this module.
        algorithm: how the order loss over all pairs is evaluated: ``"pairwise"`` pair by pair
            (``O(B^2 n)``), ``"grouped"`` by sorting each rank's column of ``D`` (``O(n^2 B + n B log B)``,
            docs/math.md §13; not with explicit ``pairs``), or ``"auto"`` (default): the faster for the batch
            size, the number of ranks and the device (the rule measured in docs/performance.md), pairwise for
            explicit pairs and with ``backend="reference"``. The same value and gradients up to rounding. On
            a GPU, grouped reads one flag per chunk of ranks back to the host (its tie checks), also with
            ``check_values=False``.
        check_values: as for every op of this module; ``True`` also refuses a loss that overflows to inf
            or NaN from finite but huge embeddings.

    Returns a scalar in the wider dtype of ``h`` and ``mu`` (under ``torch.autocast``, float32 at least), or in
    float32 for float16/bfloat16 (reductions accumulate in float32: a float16 sum overflows at 65,504).
    Where the fused kernels run, the whole loss is one op per direction with one autograd node.
    """
    sigma = check.check_positive_float("sigma", sigma)
    tau = check.check_int("tau", tau, 0)
    margin = check.check_nonnegative_float("margin", margin)
    T = check.check_int("T", T, 1)
    disc_weight = check.check_nonnegative_float("disc_weight", disc_weight)
    check.check_choice("convention", convention, check.CONVENTIONS)
    check.check_reduction(reduction, allow_none=False)
    check_values = _check_values_flag(check_values)
    h, labels, mu, pairs, plan = prepare_loss(
        "stochastic_order_loss", h, labels, mu, pairs, num_ranks=num_ranks, backend=backend, algorithm=algorithm,
        reduction=reduction, check_values=check_values,
    )
    fused = plan.backend == "fused"
    read = plan.checks in ("python", "after")
    with computing(h.device):  # one branch per plan.op (the package supports Python 3.9: no match statement)
        if plan.op == "grouped_stochastic_order_loss":  # on the CPU with the value checks inside and no
            # OpenMP team, which on a busy machine waits for a descheduled thread (csrc/stochastic_order_loss.cpp)
            need_grad = torch.is_grad_enabled() and (h.requires_grad or mu.requires_grad)
            loss, D, _ = _ops.grouped_stochastic_order_loss(
                h, mu, labels, sigma, tau, margin, T, disc_weight, convention, reduction, plan.checks == "op",
                need_grad,
            )
        elif plan.op == "stochastic_order_loss":
            loss, D = _ops.stochastic_order_loss(
                h, mu, labels, pairs, sigma, tau, margin, T, disc_weight, convention, reduction
            )
        else:  # the leaf ops; the grouped order term from D by sorting
            D = _dissimilarity(h, mu, sigma, fused)
            if read:  # before the order term, which an inf D would turn into NaN
                check.check_dissimilarities_finite(D, h, mu)
            if plan.algorithm == "grouped":
                order = grouped.grouped_order_loss(D, labels, sigma, tau, margin, convention, reduction)
            else:
                order = reduce_losses(_order_losses(D, labels, pairs, sigma, tau, margin, convention, fused), reduction)
            loss = order + disc_weight * reduce_losses(_disc_losses(D, labels, T, fused), reduction)
    if read:
        if plan.checks == "after":  # h and mu through D
            check.check_inputs_through_dissimilarities(D, h, mu)
        elif plan.op != "leaf_ops":  # the leaf ops' D is checked above
            check.check_dissimilarities_finite(D, h, mu)
        check.check_embedding_loss_finite(loss, h, mu, margin)
    return loss


def stochastic_dissimilarity(
    h: torch.Tensor, mu: torch.Tensor, sigma: float = 1.0, *, backend: str = "auto", check_values: bool = True
) -> torch.Tensor:
    """Stochastic dissimilarities ``D[x, q] = sum_j P[q, j] ||h_x - mu_j||^2`` (docs/math.md §3, paper eq. 3).

    Args:
        h: embeddings ``[B, d]``, float32 or float64 (CUDA also float16/bfloat16).
        mu: rank centroids ``[n, d]`` on ``h``'s device; a different floating dtype is promoted.
        sigma: std of the label-noise model in rank units, > 0 (a tiny one gives the identity kernel,
            a huge one the uniform kernel).
        check_values: refuse NaN/inf in ``h`` and ``mu``, and a ``D`` that overflows (default).

    Returns:
        ``D [B, n]`` in the wider dtype of ``h`` and ``mu`` (float32 at least under autocast).
        Differentiable with respect to ``h`` and ``mu``.
        ``argmin_q D[x, q]`` is the estimated rank of ``x`` (paper eq. 6).

    The fused kernels compute ``D`` about the centroids' center, so embeddings far from the origin
    keep the dtype's precision, and on CUDA their float32 products run in full float32 whatever
    ``torch.backends.cuda.matmul.allow_tf32`` or ``torch.set_float32_matmul_precision`` say (TF32
    would cost ``D`` the precision that the losses' comparisons need).
    """
    check_values = _check_values_flag(check_values)
    h, mu = prepare({"h": h, "mu": mu})
    check.check_embeddings(h, mu, values=check_values)
    sigma = check.check_positive_float("sigma", sigma)
    how = route("stochastic_dissimilarity", backend, h.device, h.dtype)
    with computing(h.device):
        D = _dissimilarity(h, mu, sigma, how.fused)
    if check_values:
        check.check_dissimilarities_finite(D, h, mu)
    return D


def ordering_probabilities(
    r_x: torch.Tensor,
    r_y: torch.Tensor,
    num_ranks: int,
    sigma: float = 1.0,
    tau: int = 3,
    convention: str = "paper",
    *,
    dtype: torch.dtype = torch.float64,
    backend: str = "auto",
) -> torch.Tensor:
    """``[M, 3] = (Pr(x<y), Pr(x~y), Pr(x>y))`` for noisy ranks ``r_x [M]``, ``r_y [M]`` (docs/math.md §5).

    The true ranks are drawn independently from rows ``r_x`` and ``r_y`` of the noise kernel;
    ``x ~ y`` means they differ by at most ``tau``. Under ``convention="paper"`` each row sums to 1;
    ``"official"`` reproduces the authors' code, whose ``<`` and ``>`` carry extra mass near the top rank
    (docs/math.md §10.2). Computed in float64 and returned in ``dtype``; no gradient.
    """
    num_ranks = check.check_num_ranks(num_ranks)
    prepare({}, r_x=r_x, r_y=r_y)
    r_x = check.check_ranks("r_x", r_x, num_ranks)
    r_y = check.check_ranks("r_y", r_y, num_ranks, length=r_x.shape[0])
    sigma = check.check_positive_float("sigma", sigma)
    tau = check.check_int("tau", tau, 0)
    check.check_choice("convention", convention, check.CONVENTIONS)
    check.check_float_dtype(dtype)
    if route("ordering_probabilities", backend, r_x.device, torch.float64).fused:
        return _ops.ordering_probabilities(r_x, r_y, num_ranks, sigma, tau, convention, dtype)
    return reference.ordering_probabilities(r_x, r_y, num_ranks, sigma, tau, convention, dtype)


def ordering_probability_table(
    num_ranks: int,
    sigma: float = 1.0,
    tau: int = 3,
    convention: str = "paper",
    *,
    dtype: torch.dtype = torch.float64,
    device=None,
    backend: str = "auto",
) -> torch.Tensor:
    """The whole ``[n, n, 3]`` table: ``table[a, b] = ordering_probabilities(a, b)``."""
    num_ranks = check.check_num_ranks(num_ranks)
    ranks = torch.arange(num_ranks, device=device)
    r_x, r_y = torch.meshgrid(ranks, ranks, indexing="ij")
    probs = ordering_probabilities(
        r_x.reshape(-1), r_y.reshape(-1), num_ranks, sigma, tau, convention, dtype=dtype, backend=backend
    )
    return probs.reshape(num_ranks, num_ranks, 3)


def order_loss(
    D: torch.Tensor,
    labels: torch.Tensor,
    pairs: Optional[torch.Tensor] = None,
    sigma: float = 1.0,
    tau: int = 3,
    margin: float = 0.25,
    convention: str = "paper",
    reduction: str = "mean",
    *,
    backend: str = "auto",
    algorithm: str = "auto",
    check_values: bool = True,
) -> torch.Tensor:
    """Stochastic order loss (docs/math.md §6, paper eqs. 15–17) over pairs of a batch.

    Args:
        D: stochastic dissimilarities ``[B, n]`` (from :func:`stochastic_dissimilarity`).
        labels: noisy 0-based ranks ``[B]``, any integer dtype.
        pairs: ``None`` for all ``B(B-1)/2`` pairs ``x < y`` in batch order, or integer ``[M, 2]`` rows of
            ``(x, y)`` batch indices (``x == y`` and repeats allowed).
        sigma, tau, margin: noise std (> 0), similarity threshold (int >= 0), hinge margin gamma (>= 0).
        convention: ``"paper"`` or ``"official"`` (the authors' code, docs/math.md §10).
        reduction: ``"mean"`` over pairs, ``"sum"``, or ``"none"`` for the ``[M]`` per-pair losses.
        algorithm: how all pairs (``pairs=None``) are evaluated: ``"pairwise"`` pair by pair (the fused
            kernel or the reference, as ``backend`` says, ``O(B^2 n)``), ``"grouped"`` by sorting each rank's
            column of ``D`` (:mod:`sol_ext.grouped`, docs/math.md §13, ``O(n^2 B + n B log B)``: a fused op on
            the CPU and on CUDA for float32/float64, plain torch operations elsewhere; ``"mean"`` and ``"sum"``
            only, no explicit pairs), or ``"auto"``: the faster of the two for ``(B, n, device)`` (the rule
            measured in docs/performance.md), pairwise for explicit pairs, ``reduction="none"`` and
            ``backend="reference"``. Both give the same value and gradient up to rounding, with the same hinge
            decisions (ties included).
        check_values: refuse NaN/inf in ``D``, out-of-range labels and pairs, and a loss that overflows
            (default).

    Returns a scalar (or ``[M]``) in ``D``'s dtype, except that a reduced float16/bfloat16 loss is summed
    in float32 or wider and returned in float32 (a float16 sum overflows at 65,504); an empty pair set gives 0.
    Differentiable with respect to ``D``.

    Determinism of the fused backward: on the CPU always (each row of ``dD`` is summed by one worker,
    no atomics). On CUDA, all pairs (``pairs=None``): always, bitwise reproducible (one warp owns each
    row of ``dD`` and visits the other rows in a fixed order; no atomics). CUDA with explicit ``pairs``:
    by default ``atomicAdd`` into ``dD`` (fast, last-bit differences between runs); under
    ``torch.use_deterministic_algorithms(True)`` a per-row pair list is built on the device and each row
    is summed in pair order (no atomics, bitwise reproducible). On CUDA, float16/bfloat16 ``D`` is
    supported with float32 accumulation; the result comes back in ``D``'s dtype.
    """
    check_values = _check_values_flag(check_values)
    (D,) = prepare({"D": D}, labels=labels, pairs=pairs)
    largest = check.check_dissimilarities(D, values=check_values)
    batch_size, num_ranks = D.shape
    labels = check.check_ranks("labels", labels, num_ranks, length=batch_size, values=check_values)
    pairs = check.check_pairs(pairs, batch_size, values=check_values)
    sigma = check.check_positive_float("sigma", sigma)
    tau = check.check_int("tau", tau, 0)
    margin = check.check_nonnegative_float("margin", margin)
    check.check_choice("convention", convention, check.CONVENTIONS)
    check.check_reduction(reduction)
    how = route(
        "order_loss", backend, D.device, D.dtype, algorithm=algorithm, batch_size=batch_size, num_ranks=num_ranks,
        pairs=pairs, reduction=reduction, grouped_needs_kernels=False,
    )
    if not (check_values or how.fused):
        check.check_indices_on_cpu(labels, num_ranks, pairs, batch_size)
    with computing(D.device):
        if how.algorithm == "grouped":
            loss = grouped.grouped_order_loss(D, labels, sigma, tau, margin, convention, reduction)
        else:
            loss = reduce_losses(_order_losses(D, labels, pairs, sigma, tau, margin, convention, how.fused), reduction)
    if check_values:
        check.check_loss_finite(loss, D.dtype, "D", lambda: largest, margin)
    return loss


def order_loss_block(
    D: torch.Tensor,
    labels: torch.Tensor,
    D_all: torch.Tensor,
    labels_all: torch.Tensor,
    offset: int,
    sigma: float = 1.0,
    tau: int = 3,
    margin: float = 0.25,
    convention: str = "paper",
    *,
    backend: str = "auto",
    check_values: bool = True,
) -> torch.Tensor:
    """Order loss of a rectangular block of pairs, local rows x all rows, summed per local row (docs/math.md §6, §7).

    The building block of data-parallel training (:mod:`sol_ext.distributed`): a process holds its rows
    ``D`` of the global batch ``D_all`` (``D`` is ``D_all[offset:offset + B]``) and owns the pairs
    ``(D[i], D_all[j])`` with ``j > offset + i``, so that every pair ``x < y`` of the global batch belongs
    to exactly one process and the pair losses equal those of :func:`order_loss` on ``D_all``.

    Args:
        D: local dissimilarities ``[B, n]``.
        labels: their ranks ``[B]``, any integer dtype.
        D_all: dissimilarities of the whole batch ``[N, n]``, same dtype and device.
        labels_all: the ranks of the whole batch ``[N]``.
        offset: index of ``D``'s first row in ``D_all``, ``0 <= offset <= N - B``.
        sigma, tau, margin, convention, check_values: as in :func:`order_loss`.

    Returns ``[B]``: ``out[i] = sum_{j > offset + i} l_order(D[i], D_all[j])`` in ``D``'s dtype.
    Differentiable with respect to ``D`` and ``D_all``. Extra memory ``O((B + N) n)``: no pair list and
    no ``[M, n]`` tensor. The fused backward is deterministic on the CPU and on CUDA (each gradient row
    is summed by one worker in a fixed order, no atomics).
    """
    check_values = _check_values_flag(check_values)
    D, D_all = prepare({"D": D, "D_all": D_all}, labels=labels, labels_all=labels_all)
    largest = max(check.check_dissimilarities(D, values=check_values),
                  check.check_dissimilarities(D_all, "D_all", values=check_values))
    batch_size, num_ranks = D.shape
    if D_all.shape[1] != num_ranks:
        raise ValueError(f"D_all must have {num_ranks} rank columns like D, got shape {tuple(D_all.shape)}")
    labels = check.check_ranks("labels", labels, num_ranks, length=batch_size, values=check_values)
    labels_all = check.check_ranks("labels_all", labels_all, num_ranks, length=D_all.shape[0], values=check_values)
    offset = check.check_int("offset", offset, 0)
    if offset + batch_size > D_all.shape[0]:
        raise ValueError(
            f"offset must lie in 0..{D_all.shape[0] - batch_size}: D's {batch_size} rows are rows "
            f"offset..offset+{batch_size - 1} of D_all's {D_all.shape[0]}, got offset={offset}"
        )
    sigma = check.check_positive_float("sigma", sigma)
    tau = check.check_int("tau", tau, 0)
    margin = check.check_nonnegative_float("margin", margin)
    check.check_choice("convention", convention, check.CONVENTIONS)
    how = route("order_loss_block", backend, D.device, D.dtype)
    if not (check_values or how.fused):
        check.check_indices_on_cpu(labels, num_ranks)
        check.check_indices_on_cpu(labels_all, num_ranks)
    with computing(D.device):
        rows = _order_loss_block_rows(D, labels, D_all, labels_all, offset, sigma, tau, margin, convention, how.fused)
    if check_values:
        check.check_loss_finite(rows, D.dtype, "D and D_all", lambda: largest, margin)
    return rows


def disc_loss(
    D: torch.Tensor,
    labels: torch.Tensor,
    T: int = 1,
    reduction: str = "mean",
    *,
    backend: str = "auto",
    check_values: bool = True,
) -> torch.Tensor:
    """Discriminative loss (docs/math.md §4, paper eqs. 8–10): pulls each ``D[x, r_x]`` below its ``T`` neighbours.

    Args:
        D: ``[B, n]`` stochastic dissimilarities. labels: ``[B]`` 0-based integer ranks.
        T: neighbour range, int >= 1. reduction: ``"mean"`` over samples, ``"sum"`` or ``"none"`` (``[B]``).
        check_values: refuse NaN/inf in ``D`` and out-of-range labels (default).

    Linear in ``D`` and possibly negative; an empty batch gives 0. Reduced in float32 for float16/bfloat16 ``D``.
    """
    check_values = _check_values_flag(check_values)
    (D,) = prepare({"D": D}, labels=labels)
    check.check_dissimilarities(D, values=check_values)
    batch_size, num_ranks = D.shape
    labels = check.check_ranks("labels", labels, num_ranks, length=batch_size, values=check_values)
    T = check.check_int("T", T, 1)
    check.check_reduction(reduction)
    how = route("disc_loss", backend, D.device, D.dtype)
    if not (check_values or how.fused):
        check.check_indices_on_cpu(labels, num_ranks)
    with computing(D.device):
        return reduce_losses(_disc_losses(D, labels, T, how.fused), reduction)


def noise_kernel(
    num_ranks: int, sigma: float = 1.0, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    """The noise kernel ``P [n, n]`` (docs/math.md §2): row ``q`` is the distribution of the true rank given noisy rank ``q``."""
    num_ranks = check.check_num_ranks(num_ranks)
    sigma = check.check_positive_float("sigma", sigma)
    check.check_float_dtype(dtype)
    return reference.noise_kernel(num_ranks, sigma, dtype=dtype, device=device)

