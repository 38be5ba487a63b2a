"""The exact all-pairs order loss by sorting: ``O(n^2 B + n B log B)`` instead of ``O(B^2 n)``.

The pairwise kernels evaluate every pair of the batch. This module computes the same sum (docs/math.md
§6, §7) per rank from one sort of that rank's column of ``D`` and prefix counts of the labels along it
(docs/math.md §13). For float32 and float64 one fused op does it, ``torch.ops.sol_ext.grouped_order_sum``: on
the CPU csrc/cpu/grouped_order_loss_kernel.cpp (the ranks in parallel, each rank one sort and a few linear
sweeps), on CUDA csrc/cuda/grouped_order_loss_kernel.cu (one segmented sort, prefix counts and binary searches,
no host synchronization). Elsewhere (MPS, half precision, a build without CUDA kernels) plain torch
operations (sort, searchsorted, cumsum, index_add) do, so it runs on every device torch runs on. The result and the gradient equal the pairwise ones up to rounding;
the hinges' decisions (which pairs contribute, ties included) are the same (docs/math.md §13.4).

On the CPU, :func:`sol_ext.ops.stochastic_order_loss` (and so :class:`sol_ext.StochasticOrderLoss`) runs its
whole step with this algorithm as one op per direction, ``torch.ops.sol_ext.grouped_stochastic_order_loss``
(csrc/stochastic_order_loss.cpp), so that a busy machine does not stall it (docs/math.md §13.6); on CUDA too
with ``SOL_EXT_CUDA_GROUPED=fused`` (off by default until that path has run on a GPU).

This module is the algorithm alone. Which path runs is decided with the rest of the dispatch:
``algorithm`` of :func:`sol_ext.ops.stochastic_order_loss` and :func:`sol_ext.order_loss` picks between
pairwise and grouped (``"auto"``: the rule measured in docs/performance.md), and the fused op runs for CPU
and CUDA float32/float64, the torch operations elsewhere.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import _validation as check
from ._autograd import grouped_sum_backward, setup_grouped_sum
from ._dispatch import grouped_op_runs
from ._reduction import reduced_dtype
from ._rows import deterministic_sum, searchsorted_rows, sort_rows

__all__ = ["ALGORITHMS", "grouped_order_loss", "grouped_order_sum"]

ALGORITHMS = check.ALGORITHMS

# Memory: ranks are processed in chunks of K, with K * B * n at most this many values (or K = 1). A chunk
# holds a few float64 tensors of K * B * n values (label counts, and for n <= 48 and K > 1 the weighted
# tables), several of K * B, and blocks of a few hundred KB; plus the gradient, B * n. So the extra memory
# is O(n B) and about 50 MB for any n at B = 4096; about 250 MB at B = 1,000,000, n = 5 (measured).
_CHUNK_VALUES = 2**21


@functools.lru_cache(maxsize=16)
def _pair_weights(num_ranks: int, sigma: float, tau: int, convention: str, device: torch.device):
    """``(L, U, E2)``, ``[n, n]`` (float64; float32 on MPS): the weights of the ordered-pair hinges (docs/math.md §13.1).

    With ``(lt, eq, gt)`` the ordering probabilities of labels ``(a, b)``: ``L = lt + gt^T`` (on the ranks of
    ``x``'s lower sums), ``U = gt + lt^T`` (on ``q >= a``), ``E2 = eq + eq^T`` (the ``[|delta| - gamma]+`` term).
    """
    ranks = torch.arange(num_ranks)
    r_x, r_y = (r.reshape(-1) for r in torch.meshgrid(ranks, ranks, indexing="ij"))
    probs = torch.ops.sol_ext.ordering_probabilities(r_x, r_y, num_ranks, sigma, tau, convention, torch.float64)
    # the CPU kernel, built in every install; the weights are used in the grouped sums' compute dtype
    table = probs.reshape(num_ranks, num_ranks, 3).to(device, _compute_dtype(device))
    lt, eq, gt = table.unbind(-1)
    return (lt + gt.T).contiguous(), (gt + lt.T).contiguous(), (eq + eq.T).contiguous()


def _compute_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def _hinge_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which the pairwise kernels add the margin to ``delta`` (``acc_t`` of sol_math.h's
    HingeArgs): float64 for float64 ``D``, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _hinge_active(dx: torch.Tensor, dy: torch.Tensor, c: float) -> torch.Tensor:
    """Whether ``[D_x - D_y + c]+`` is active (> 0), decided as the pairwise kernels and the reference decide
    it (docs/math.md §13.4): ``delta = D_x - D_y`` rounded to ``D``'s dtype, ``delta + c`` computed in
    :func:`_hinge_dtype` and rounded back to ``D``'s dtype, then compared with 0. For float32 and float64
    that is ``delta > -c`` (IEEE addition gives 0 only for ``delta == -c`` exactly)."""
    if dx.dtype in (torch.float32, torch.float64):
        return (dx - dy) > -c
    return ((dx - dy).to(_hinge_dtype(dx.dtype)) + c).to(dx.dtype) > 0


def _count_active(
    s: torch.Tensor,
    s_native: torch.Tensor,
    c: float,
    estimate: Optional[torch.Tensor],
    block: int,
) -> torch.Tensor:
    """``pos [K, B]``: for each sorted value ``x`` of each row, the number of ``y`` of its row whose hinge
    ``[D_x - D_y + c]+`` is active (docs/math.md §13.4).

    ``s [K, B]`` holds the sorted values in the compute dtype and ``s_native`` the same values in ``D``'s
    dtype. The decision is monotone in ``D_y`` (rounding is monotone), so the active ``y`` are a prefix of the
    row. ``searchsorted`` of ``D_x + c`` (or ``estimate``) finds it up to rounding; the prefix is then moved
    over whole runs of equal values until the value before it is active and the one after it is not, in
    the kernels' arithmetic. That fix-up visits only the few ``x`` whose threshold lies within rounding of
    a ``D_y``. The checks run ``block`` positions at a time.
    """
    K, B = s.shape
    pos = searchsorted_rows(s, s + c) if estimate is None else estimate
    flat = s_native.reshape(-1)
    base = torch.arange(0, K * B, B, device=s.device)[:, None]
    wrong = torch.empty((K, B), dtype=torch.bool, device=s.device)
    for i0 in range(0, B, block):
        i1 = min(i0 + block, B)
        p, x = pos[:, i0:i1], s_native[:, i0:i1]
        before = flat.index_select(0, (base + p - 1).clamp_(min=0).view(-1)).view(K, -1)
        after = flat.index_select(0, (base + p).clamp_(max=K * B - 1).view(-1)).view(K, -1)
        bad = (p > 0) & ~_hinge_active(x, before, c)
        bad |= (p < B) & _hinge_active(x, after, c)
        wrong[:, i0:i1] = bad
    if not bool(wrong.any()):  # one host synchronization per chunk and term on a GPU
        return pos
    todo = wrong.view(-1).nonzero().squeeze(1)
    if estimate is not None:
        pos = pos.clone()
    pos_flat = pos.view(-1)
    if K == 1:  # run boundaries by searching the row for the values met

        def run_start(i):
            return torch.searchsorted(s_native[0], flat.index_select(0, i))

        def run_stop(i):
            return torch.searchsorted(s_native[0], flat.index_select(0, i), right=True)

    else:  # run boundaries of every position at once
        index = torch.arange(B, device=s.device).expand(K, B)
        new_run = torch.ones_like(wrong)
        new_run[:, 1:] = s_native[:, 1:] != s_native[:, :-1]
        first = torch.where(new_run, index, 0).cummax(dim=1).values.reshape(-1)
        run_ends = torch.ones_like(wrong)
        run_ends[:, :-1] = new_run[:, 1:]
        end = torch.where(run_ends, index + 1, B).flip(1).cummin(dim=1).values.flip(1).reshape(-1)

        def run_start(i):
            return first.index_select(0, i)

        def run_stop(i):
            return end.index_select(0, i)

    while todo.numel():  # each pass moves every x still wrong over one run, down or up
        row = todo // B * B
        x = flat.index_select(0, todo)
        p = pos_flat.index_select(0, todo)
        below = (row + p - 1).clamp_(min=0)
        down = ((p > 0) & ~_hinge_active(x, flat.index_select(0, below), c)).nonzero().squeeze(1)
        if down.numel():
            p.index_copy_(0, down, run_start(below.index_select(0, down)))
        above = (row + p).clamp_(max=K * B - 1)
        up = ((p < B) & _hinge_active(x, flat.index_select(0, above), c)).nonzero().squeeze(1)
        if up.numel():
            p.index_copy_(0, up, run_stop(above.index_select(0, up)))
        pos_flat.index_copy_(0, todo, p)
        todo = todo.index_select(0, torch.cat([down, up]).unique())
    return pos


def _window_lookup(
    w: torch.Tensor, counts: torch.Tensor, total: Optional[torch.Tensor], at: torch.Tensor, label: torch.Tensor
) -> torch.Tensor:
    """``sum_b w[label[i], b] c[b, at[i]]`` for each ``i``, with ``c = counts`` or ``c = total - counts`` (the
    samples above), ``counts [n, B+1]``, ``at`` non-decreasing: one product over the window ``at[0] .. at[-1]``."""
    lo, hi = int(at[0]), int(at[-1]) + 1
    window = counts[:, lo:hi] if total is None else total - counts[:, lo:hi]
    table = torch.mm(w, window)  # [n, hi - lo]
    return table.view(-1).index_select(0, label * (hi - lo) + (at - lo))


def _first_above(pos: torch.Tensor) -> torch.Tensor:
    """``[K, B]``: for each position ``i``, ``#{x: pos[x] <= i}``. ``pos`` is non-decreasing along each row,
    so the ``x`` with ``pos[x] > i`` are the positions from there to the end."""
    K, B = pos.shape
    flat = (pos + torch.arange(0, K * (B + 1), B + 1, device=pos.device)[:, None]).view(-1) if K > 1 else pos.view(-1)
    if pos.device.type == "cpu":
        at_or_below = torch.bincount(flat, minlength=K * (B + 1))
    else:  # bincount would read the largest value back to the host
        at_or_below = torch.zeros(K * (B + 1), dtype=pos.dtype, device=pos.device)
        at_or_below.index_add_(0, flat, torch.ones((1,), dtype=pos.dtype, device=pos.device).expand(flat.shape[0]))
    return at_or_below.view(K, B + 1).cumsum_(1)[:, :B]


# Up to this many ranks the per-rank weights are applied by a matrix product with the label counts
# (n^2 per sorted position, in BLAS); above it by gathering each sample's count row and weight row
# (n per sample, in several passes). Measured crossover on a 2-core x86 CPU: n between 40 and 60.
_MATMUL_MAX_RANKS = 48
# On the CPU the passes over the sorted positions run in blocks, so that their temporaries stay in the
# cache (about 3 times faster than whole rows of a million values): blocks of at most this many positions
# times ranks in a chunk (divided by n / 8 for the row gathers, whose temporaries have n columns).
_BLOCK_VALUES = 2**17


def grouped_order_sum(
    D: torch.Tensor,
    labels: torch.Tensor,
    sigma: float,
    tau: int,
    margin: float,
    convention: str,
    ranks: Optional[tuple] = None,
    need_grad: bool = True,
):
    """``(total, grad)``: the sum of ``l_order`` over all unordered pairs ``{x, y}``, ``x != y`` (docs/math.md §13),
    restricted to the ranks ``q`` in ``range(*ranks)`` (default all), and its gradient with respect to ``D``
    (``[B, n]``, zero outside those ranks; ``None`` when ``need_grad`` is false).

    Both in float64 (float32 on MPS), without a graph: :func:`grouped_order_loss` is the differentiable loss.
    CPU and CUDA float32/float64: the fused op, which checks its inputs; otherwise plain torch operations
    (inputs unchecked: the callers check them).
    """
    total, grad = _grouped_sum(D.detach(), labels, sigma, tau, margin, convention, ranks, need_grad)
    return total, grad if need_grad else None


def _grouped_sum(D, labels, sigma, tau, margin, convention, ranks, need_grad):
    """``(total, grad)`` from the op that :func:`sol_ext._dispatch.grouped_op_runs` picks: the fused
    ``grouped_order_sum`` or ``grouped_order_sum_torch`` (below). Differentiable in ``D``: both ops have
    the same backward, :func:`sol_ext._autograd.grouped_sum_backward`."""
    q_begin, q_end = (0, D.shape[1]) if ranks is None else ranks
    op = torch.ops.sol_ext.grouped_order_sum if grouped_op_runs(D) else grouped_order_sum_torch
    return op(D, labels.long(), sigma, tau, margin, convention, q_begin, max(q_begin, q_end), need_grad)


def _torch_order_sum(
    D: torch.Tensor,
    labels: torch.Tensor,
    sigma: float,
    tau: int,
    margin: float,
    convention: str,
    ranks: Optional[tuple] = None,
    need_grad: bool = True,
):
    """:func:`grouped_order_sum` in plain torch operations, for any device and dtype: ranks in chunks, the
    positions of a chunk in blocks (see the constants above)."""
    B, n = D.shape
    device = D.device
    cdtype = _compute_dtype(device)
    q_begin, q_end = (0, n) if ranks is None else ranks
    total = torch.zeros((), dtype=cdtype, device=device)
    if B < 2 or q_end <= q_begin or device.type == "meta":  # meta tensors: shapes only
        return total, torch.zeros((B, n), dtype=cdtype, device=device) if need_grad else None
    # The gradient, transposed: each rank's row is written whole (a permutation of the sorted positions).
    grad_t = None
    if need_grad:
        grad_t = torch.empty((n, B), dtype=cdtype, device=device)
        grad_t[:q_begin] = 0
        grad_t[q_end:] = 0
    labels = labels.long()
    # The margin as the kernels hold it: in float64 for float64 D, else in float32 (docs/math.md §13.4).
    gamma = float(torch.tensor(margin, dtype=_hinge_dtype(D.dtype)))
    L, U, E2 = (w.to(cdtype) for w in _pair_weights(n, sigma, tau, convention, device))
    ranks_n = torch.arange(n, device=device)
    official = convention == "official"
    by_matmul = n <= _MATMUL_MAX_RANKS
    chunk = max(1, min(q_end - q_begin, _CHUNK_VALUES // max(B * n, 1)))
    # Buffers reused by every chunk (fresh large allocations cost page faults on the CPU).
    counts_buffer = torch.empty((chunk, n, B + 1), dtype=cdtype, device=device)
    rows_buffer = None if by_matmul else torch.empty((chunk, B + 1, n), dtype=cdtype, device=device)
    product_buffer = above_buffer = None  # whole tables of the matrix products, made when first needed
    zero = torch.zeros((), dtype=D.dtype, device=device)
    parts = []  # 0-d tensors whose sum is the total
    scratch = None  # row gathers: two [rows, n] buffers
    if not by_matmul:
        # Row gathers: W+_q(a, .) is U[a] for ranks a below q, L[a] above it and L[a] + U[a] at a = q (paper;
        # official: U[a] for a <= q, L[a] above), so x's weight rows come from one fixed [3n, n] table.
        E2_merged = E2 if gamma == 0 else torch.zeros_like(E2)  # gamma = 0: one pass with W+ + E2
        x_rows_table = torch.cat([U + E2_merged, L + E2_merged, L + U + E2_merged])
        U_t, L_t = U.T.contiguous(), L.T.contiguous()
    for q0 in range(q_begin, q_end, chunk):
        q1 = min(q0 + chunk, q_end)
        K = q1 - q0
        if device.type == "cpu":  # [K, block] for the matrix products, [K, block, n] for the row gathers
            block = max(1, _BLOCK_VALUES // K // (1 if by_matmul else max(4, n // 2)))
        else:  # one pass over whole rows: no per-block launches
            block = B
        q = torch.arange(q0, q1, device=device)[:, None]  # [K, 1]
        # W+_q[a, b] = L[a, b] [q in lower(a)] + U[a, b] [q >= a]   (docs/math.md §13.1)
        lower = (q < ranks_n) if official else (q <= ranks_n)  # [K, n] over a: q < a or q <= a
        upper = q >= ranks_n
        if by_matmul:
            w_plus = L * lower[:, :, None].to(cdtype) + U * upper[:, :, None].to(cdtype)  # [K, n, n]
        else:  # W+_q transposed, [K, n (b), n (a)], for y's weight rows W+_q(., r_y)
            below_q = (ranks_n[None, None, :] <= q[:, :, None]) if official else (ranks_n[None, None, :] < q[:, :, None])
            w_plus = torch.where(below_q, U_t, L_t)
            if not official:  # a = q: L + U
                w_plus[torch.arange(K, device=device), :, q[:, 0]] += U_t[:, q0:q1].T
            if gamma == 0:
                w_plus += E2_merged
        if gamma == 0:  # [delta]+ and the positive half of [|delta|]+ are the same hinge: one pass
            terms = [(0.0, w_plus + E2 if by_matmul else w_plus, False)]
        else:  # the last flag: the weights are symmetric (W(a, b) = W(b, a))
            terms = [(gamma, w_plus, False), (-gamma, E2.expand(K, n, n) if by_matmul else E2, True)]

        s_native, order = sort_rows(D[:, q0:q1].T.contiguous())  # [K, B], in D's dtype
        s = s_native.to(cdtype)
        lab = labels.index_select(0, order.view(-1)).view(K, B)  # labels along the sorted columns
        centred = s - 0.5 * (s[:, :1] + s[:, -1:])  # differences are unchanged; keeps the sums small
        # counts[k, b, p]: how many of the first p sorted samples of column k have label b; above[k, b, p]:
        # how many of the others (exact integers: the y side sums positive terms, without cancellation).
        # For the row gathers [K, B+1, n] (p, b) (a cumulative sum along the last dimension is the fast one).
        counts = counts_buffer[:K].zero_()
        counts[:, :, 1:].scatter_(1, lab[:, None, :], 1.0)
        counts.cumsum_(2)
        per_label = counts[:, :, B:]  # [K, n, 1]
        rows = torch.arange(K, device=device)[:, None]
        # One long row (K = 1) on the CPU: the products with the weights are formed per block, over the
        # window of positions the block reads (pos and first_above do not decrease along the row, so the
        # windows of consecutive blocks follow each other: about B positions in all), not as whole tables.
        windowed = by_matmul and K == 1 and block < B
        if by_matmul and not windowed:
            if above_buffer is None:
                above_buffer = torch.empty((chunk, n, B + 1), dtype=cdtype, device=device)
                product_buffer = torch.empty(chunk * 4 * n * (B + 1), dtype=cdtype, device=device)
            above = torch.sub(per_label, counts, out=above_buffer[:K])
        elif not by_matmul:
            flat_counts = rows_buffer[:K].copy_(counts.transpose(1, 2)).view(K * (B + 1), n)
            label_rows = lab + rows * n  # [K, B]: row (k, r) of [K*n, n]
            per_label_rows = per_label.transpose(1, 2)  # [K, 1, n]
        # Per term: pos[x] (the y whose hinge with x is active are the sorted positions 0 .. pos[x]-1),
        # first_above[i] (the x whose hinge with the y at position i is active are first_above[i] .. B-1),
        # and the weights' tables (matrix products) or matrices (row gathers).
        prepared = []
        first_above = None
        used = 0
        for c, w, symmetric in terms:
            # The hinge of c = -gamma is active for (x, y) where that of +gamma is not for (y, x), but for
            # exact ties at gamma: first_above of +gamma is its estimate (docs/math.md §13.4).
            pos = _count_active(s, s_native, c, first_above if c < 0 else None, block)
            first_above = _first_above(pos)
            # x's own hinge is active when c > 0 (delta = 0). It would add W(r, r) to x's side and take it
            # from x's y side: it cancels in the gradient and is taken out of the value here, as
            # c * sum_x W(r_x, r_x) = c * sum_a per_label_a W(a, a).
            if _hinge_active(zero, zero, c):
                diagonal = torch.diagonal(w, dim1=-2, dim2=-1)  # [K, n] (or [n] for E2)
                parts.append(-c * (per_label.squeeze(2) * diagonal).sum())
            if windowed:  # tables of the blocks' windows of positions, below
                prepared.append((c, pos, first_above, w[0], w[0].T))
            elif by_matmul:  # x table [a, p]: sum_b W(a, b) counts[b, p]; y table [b, p]: sum_a W(a, b) above[a, p]
                x_table = product_buffer[used : used + K * n * (B + 1)].view(K, n, B + 1)
                y_table = product_buffer[used + K * n * (B + 1) : used + 2 * K * n * (B + 1)].view(K, n, B + 1)
                torch.bmm(w, counts, out=x_table)
                torch.bmm(w.transpose(1, 2), above, out=y_table)
                prepared.append((c, pos, first_above, used + rows * (n * (B + 1)), K * n * (B + 1)))
                used += 2 * K * n * (B + 1)
            elif symmetric:  # E2: the same rows for x's and y's side
                prepared.append((c, pos, first_above, E2, None))
            else:  # x's rows: which of U, L, L + U rank q takes for label r_x; y's rows: of W+_q transposed
                if official:
                    pick = torch.where(lab <= q, lab, lab + n)
                else:
                    pick = torch.where(lab < q, lab, torch.where(lab > q, lab + n, lab + 2 * n))
                prepared.append((c, pos, first_above, pick, w.reshape(K * n, n)))
        table = product_buffer if by_matmul else None
        if not by_matmul and (scratch is None or scratch[0].shape[0] < K * block):
            scratch = [torch.empty((K * block, n), dtype=cdtype, device=device) for _ in range(2)]
        grad_sorted = torch.empty((K, B), dtype=cdtype, device=device) if need_grad else None
        for i0 in range(0, B, block):
            i1 = min(i0 + block, B)
            label_start = lab[:, i0:i1] * (B + 1) if by_matmul else None
            rows_b = None if by_matmul else label_rows[:, i0:i1].reshape(-1)
            grad_block = None
            for c, pos, first_above, a, b in prepared:
                if windowed:
                    x_side = _window_lookup(a, counts[0], None, pos[0, i0:i1], lab[0, i0:i1]).view(1, -1)
                    y_side = _window_lookup(b, counts[0], per_label[0], first_above[0, i0:i1], lab[0, i0:i1])
                    y_side = y_side.view(1, -1)
                elif by_matmul:
                    start = label_start + a
                    x_side = table.index_select(0, (start + pos[:, i0:i1]).view(-1)).view(K, -1)
                    y_side = table.index_select(0, (start + b + first_above[:, i0:i1]).view(-1)).view(K, -1)
                else:  # into scratch buffers: no allocations in this loop (they fragment the CPU heap)
                    m = K * (i1 - i0)
                    w_rows, c_rows = scratch[0][:m], scratch[1][:m]
                    if b is None:  # symmetric: W(r_x, .) = W(., r_y) for the sample at each position
                        torch.index_select(a, 0, lab[:, i0:i1].reshape(-1), out=w_rows)
                    else:
                        torch.index_select(x_rows_table, 0, a[:, i0:i1].reshape(-1), out=w_rows)  # W(r_x, b)
                    torch.index_select(flat_counts, 0, (pos[:, i0:i1] + rows * (B + 1)).view(-1), out=c_rows)
                    x_side = torch.bmm(w_rows.unsqueeze(1), c_rows.unsqueeze(2)).view(K, -1)
                    if b is not None:
                        torch.index_select(b, 0, rows_b, out=w_rows)  # W(a, r_y)
                    torch.index_select(flat_counts, 0, (first_above[:, i0:i1] + rows * (B + 1)).view(-1), out=c_rows)
                    torch.sub(per_label_rows, c_rows.view(K, -1, n), out=c_rows.view(K, -1, n))  # above
                    y_side = torch.bmm(w_rows.unsqueeze(1), c_rows.unsqueeze(2)).view(K, -1)
                # Every pair's hinge is W (D_x - D_y + c): homogeneous of degree 1 in (D, c), so its sum
                # is <gradient, D> + c * dF/dc, where dF/dc = sum of the x sides (docs/math.md §13.3).
                if c != 0:
                    parts.append(c * deterministic_sum(x_side))
                term = x_side.sub_(y_side)
                grad_block = term if grad_block is None else grad_block.add_(term)
            parts.append(deterministic_sum(grad_block * centred[:, i0:i1]))
            if need_grad:
                grad_sorted[:, i0:i1] = grad_block
        if need_grad:
            grad_t[q0:q1].scatter_(1, order, grad_sorted)
    # Swap symmetry: the unordered pairs carry half of the ordered pairs x != y (docs/math.md §13.2).
    total = deterministic_sum(torch.stack(parts)) * 0.5
    if not need_grad:
        return total, None
    return total, grad_t.mul_(0.5).T


@torch.library.custom_op("sol_ext::grouped_order_sum_torch", mutates_args=())
def grouped_order_sum_torch(
    D: torch.Tensor,
    labels: torch.Tensor,
    sigma: float,
    tau: int,
    margin: float,
    convention: str,
    rank_begin: int,
    rank_end: int,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op ``grouped_order_sum`` (csrc/sol_ext.cpp) in plain torch operations (:func:`_torch_order_sum`),
    for the devices and dtypes it has no kernel for; ``grad`` is empty unless ``need_grad``."""
    total, grad = _torch_order_sum(D, labels, sigma, tau, margin, convention, (rank_begin, rank_end), need_grad)
    return total, grad.contiguous() if need_grad else total.new_empty((0,))  # an op's outputs are fresh tensors


@grouped_order_sum_torch.register_fake
def _(D, labels, sigma, tau, margin, convention, rank_begin, rank_end, need_grad):
    dtype = _compute_dtype(D.device)
    return D.new_empty((), dtype=dtype), D.new_empty(D.shape if need_grad else (0,), dtype=dtype)


grouped_order_sum_torch.register_autograd(grouped_sum_backward, setup_context=setup_grouped_sum)


def _num_pairs(batch_size: int) -> int:
    return batch_size * (batch_size - 1) // 2


def grouped_order_loss(
    D: torch.Tensor,
    labels: torch.Tensor,
    sigma: float = 1.0,
    tau: int = 3,
    margin: float = 0.25,
    convention: str = "paper",
    reduction: str = "mean",
    ranks: Optional[tuple] = None,
    normalizer: Optional[int] = None,
) -> torch.Tensor:
    """The all-pairs order loss (``"mean"`` or ``"sum"``) by the grouped algorithm; differentiable in ``D``.

    ``reduction="mean"`` divides by ``normalizer`` (default ``max(B(B-1)/2, 1)``); ``ranks`` is a ``(begin,
    end)`` range of ranks or ``None`` for all. Returns a scalar in the dtype that the library's reductions
    give (float32 for half ``D``). The gradient with respect to ``D`` is computed in the forward pass (it
    costs what the value costs and shares its sorts) when ``D`` needs one, and scaled by the incoming
    gradient in the backward. Unvalidated: :func:`sol_ext.order_loss` with ``algorithm="grouped"`` checks
    its arguments and calls this.
    """
    need_grad = torch.is_grad_enabled() and D.requires_grad
    total, _ = _grouped_sum(D, labels, sigma, tau, margin, convention, ranks, need_grad)
    if reduction == "mean":
        total = total * (1.0 / (normalizer if normalizer is not None else max(_num_pairs(D.shape[0]), 1)))
    return total.to(reduced_dtype(D.dtype))

