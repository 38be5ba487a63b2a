"""The grouped (sorting) algorithm of the all-pairs order loss (sol_ext/grouped.py, docs/math.md §13).

Against the float64 reference and the fused pairwise kernels: values and gradients to 1e-12, ties of every
kind, edge sizes, both code paths (matrix products for few ranks, row gathers for many), chunks and
blocks, rank ranges, thread counts, the `algorithm` argument and the data-parallel loss.
"""
from __future__ import annotations

import os

import pytest
import torch

import sol_ext
from common import cpu_and_cuda, load_benchmark, spawn_processes
from sol_ext import _dispatch, grouped, reference
from sol_ext.distributed import DistributedStochasticOrderLoss

REL = 1e-12
CountOps = load_benchmark("bench_overhead").CountOps  # counts the operations a call dispatches


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, floor: float = 0.0) -> None:
    """max |actual - expected| <= 1e-12 * max(max |expected|, floor). ``floor`` keeps a gradient that is 0
    up to the reference's rounding (a pair whose hinges all have weight 0) from asking for 1e-28."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.numel() == 0:
        return
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    error = (actual - expected).abs().max().item()
    scale = max(expected.abs().max().item(), floor)
    assert error <= REL * scale, f"{what}: max abs error {error:.3e} > {REL:.0e} x {scale:.3e}"


def make_labels(B: int, n: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    if mode == "single":  # one label only
        return torch.full((B,), n // 2, dtype=torch.long)
    if mode == "all":  # every label present (B >= n)
        return torch.cat([torch.arange(n), torch.randint(0, n, (B - n,), generator=gen)])[torch.randperm(B, generator=gen)]
    return torch.randint(0, n, (B,), generator=gen)


def make_D(B: int, n: int, mode: str, gen: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """``[B, n]`` dissimilarities. ``"ties"``: small integers and halves, so that many values are equal and
    many differences equal the margins exactly (0, 0.5, 1); ``"near"``: random values, some rows copied and
    some shifted by a margin in the dtype (their differences are the margin up to rounding)."""
    if mode == "ties":
        return (torch.randint(0, 7, (B, n), generator=gen) * 0.5).to(dtype)
    D = torch.randn(B, n, generator=gen, dtype=torch.float64).to(dtype) + 2
    if mode == "near" and B >= 6:
        D[1] = D[0]
        D[2] = D[0] + 0.5
        D[3] = D[0] - 0.3
        D[4] = D[3] + 0.3
        D[5, : n // 2] = D[2, : n // 2]
    return D


# Code paths: "kernel" is the fused op; the others the plain-torch path (what MPS and half precision
# run), where "matmul" and "gather" force how the weights meet the counts and "small" forces one rank per
# chunk (the K = 1 fix-ups) and blocks of a few positions. The switches of the fused op are _dispatch's
# (which path runs), the sizes grouped's (how the torch path runs).
TORCH = dict(_GROUPED_CPU_OP=False, _GROUPED_CUDA_OP=False)
PATHS = {
    "kernel": {},
    "torch": TORCH,
    "torch-matmul": dict(TORCH, _MATMUL_MAX_RANKS=10**6),
    "torch-gather": dict(TORCH, _MATMUL_MAX_RANKS=0),
    "torch-small": dict(TORCH, _CHUNK_VALUES=1, _BLOCK_VALUES=40),
    "torch-gather-small": dict(TORCH, _MATMUL_MAX_RANKS=0, _CHUNK_VALUES=1, _BLOCK_VALUES=40),
}


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch):
    for name, value in PATHS[request.param].items():
        monkeypatch.setattr(_dispatch if name in TORCH else grouped, name, value)
    return request.param


# (B, n, tau, margin, convention, labels, D)
CASES = [
    (0, 5, 2, 0.25, "paper", "random", "random"),
    (1, 5, 2, 0.25, "official", "random", "random"),
    (2, 5, 2, 0.25, "paper", "random", "random"),
    (2, 1, 0, 0.0, "official", "random", "random"),
    (3, 4, 1, 0.5, "official", "random", "ties"),
    (17, 1, 3, 0.25, "paper", "random", "random"),
    (17, 1, 3, 1.0, "official", "random", "ties"),
    (40, 6, 0, 0.0, "paper", "all", "ties"),
    (40, 6, 0, 0.5, "official", "all", "ties"),
    (40, 6, 1000, 1.0, "paper", "random", "ties"),
    (40, 9, 2, 0.3, "paper", "single", "near"),
    (40, 9, 2, 0.5, "official", "single", "ties"),
    (64, 13, 3, 0.25, "paper", "random", "near"),
    (64, 13, 0, 0.3, "official", "all", "near"),
    (64, 13, 1000, 0.0, "official", "random", "near"),
    (50, 60, 3, 0.25, "paper", "random", "random"),
    (70, 60, 5, 0.5, "official", "all", "ties"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_order_loss_matches_reference_and_pairwise(case, path):
    """sol_ext.order_loss(algorithm="grouped"): value and dD equal the float64 reference's and the fused
    pairwise kernel's to 1e-12, for both reductions."""
    B, n, tau, margin, convention, label_mode, D_mode = case
    gen = torch.Generator().manual_seed(B * 1000 + n)
    D = make_D(B, n, D_mode, gen).requires_grad_()
    labels = make_labels(B, n, label_mode, gen)
    args = dict(sigma=0.8, tau=tau, margin=margin, convention=convention)
    for reduction in ("mean", "sum"):
        ours = sol_ext.order_loss(D, labels, reduction=reduction, algorithm="grouped", **args)
        ref = reference.order_loss(D, labels, None, reduction=reduction, **args)
        fused = sol_ext.order_loss(D, labels, reduction=reduction, backend="fused", algorithm="pairwise", **args)
        what = f"{case} {reduction} ({path})"
        assert_close(ours, ref, f"loss vs reference, {what}", floor=1e-3)
        assert_close(ours, fused, f"loss vs fused, {what}", floor=1e-3)
        if B < 2:
            assert ours.item() == 0.0
            continue
        g_ours, g_ref, g_fused = (torch.autograd.grad(x, D)[0] for x in (ours, ref, fused))
        unit = 1.0 if reduction == "sum" else 2.0 / (B * (B - 1))
        assert_close(g_ours, g_ref, f"dD vs reference, {what}", floor=1e-3 * unit)
        assert_close(g_ours, g_fused, f"dD vs fused, {what}", floor=1e-3 * unit)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("convention", ["paper", "official"])
@pytest.mark.parametrize("B, n", [(0, 4), (1, 4), (2, 4), (37, 1), (64, 11), (90, 60)])
@pytest.mark.parametrize("ties", ["repeated", "integer"])
def test_module_matches_pairwise_and_reference(ties, B, n, convention, reduction, device):
    """StochasticOrderLoss(algorithm="grouped"): loss, dh and dmu equal the fused pairwise module's and the
    reference's to 1e-12 in float64, with repeated embeddings or integer coordinates (tied values of D)."""
    gen = torch.Generator().manual_seed(B + n)
    if ties == "integer":  # coordinates in -1..1, centroids in -1..1: few distinct rows of D
        h = torch.randint(-1, 2, (B, 5), generator=gen).double()
        mu = torch.randint(-1, 2, (n, 5), generator=gen).double()
    else:
        h = torch.randn(B, 5, generator=gen, dtype=torch.float64)
        if B >= 8:
            h[1], h[5], h[7] = h[0], h[0], h[3]  # equal rows of D
        mu = torch.randn(n, 5, generator=gen, dtype=torch.float64) * 0.7
    labels = torch.randint(0, n, (B,), generator=gen)
    h, mu, labels = h.to(device).requires_grad_(), mu.to(device).requires_grad_(), labels.to(device)
    kwargs = dict(sigma=0.9, tau=2, margin=0.2, T=2, disc_weight=0.6, convention=convention, reduction=reduction)
    results = {}
    for name, extra in {"grouped": dict(algorithm="grouped"), "pairwise": dict(backend="fused", algorithm="pairwise"),
                        "reference": dict(backend="reference")}.items():
        loss = sol_ext.StochasticOrderLoss(n, **kwargs, **extra)(h, labels, mu)
        results[name] = (loss, *torch.autograd.grad(loss, (h, mu)))
    for other in ("pairwise", "reference"):
        for name, ours, theirs in zip(("loss", "dh", "dmu"), results["grouped"], results[other]):
            assert_close(ours, theirs, f"{name} vs {other}", floor=1e-6)
    if B < 2:
        assert results["grouped"][0].item() == results["pairwise"][0].item()


def test_hinge_decisions_follow_the_kernels_in_float32():
    """float32 D with differences equal to the margin up to float32 rounding (and exactly equal): each hinge
    is active exactly where the fused kernel (and the reference) find delta + gamma > 0 in float32. One
    decision more or less would move a gradient entry by a probability weight, about 1e-2 here."""
    gen = torch.Generator().manual_seed(5)
    B, n = 300, 5
    base = torch.rand(B, n, generator=gen) * 3
    base[100:200] = base[:100] + 0.3  # rounded in float32: the differences are 0.3 up to an ulp
    base[200:250] = base[:50] - 0.3
    base[250:] = (torch.randint(0, 12, (50, n), generator=gen) * 0.25)  # exact quarter ties
    labels = torch.randint(0, n, (B,), generator=gen)
    for margin in (0.3, 0.25, 0.0):
        D = base.clone().requires_grad_()
        args = dict(sigma=1.0, tau=1, margin=margin, reduction="sum")
        ours = sol_ext.order_loss(D, labels, algorithm="grouped", **args)
        fused = sol_ext.order_loss(D, labels, backend="fused", algorithm="pairwise", **args)
        ref = reference.order_loss(D, labels, **args)
        g = [torch.autograd.grad(x, D)[0].double() for x in (ours, fused, ref)]
        assert ours.dtype == torch.float32
        # The fused kernel sums in float64; the reference's autograd in float32 (relative 1e-6 here).
        for other, name, tol in ((g[1], "fused", 1e-4), (g[2], "reference", 2e-3)):
            assert (g[0] - other).abs().max() < tol, f"margin {margin}: dD differs from the {name}'s"


@pytest.mark.parametrize("convention", ["paper", "official"])
def test_gradcheck(convention):
    gen = torch.Generator().manual_seed(0)
    D = (torch.randn(9, 6, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    labels = torch.randint(0, 6, (9,), generator=gen)

    def fn(D):
        return grouped.grouped_order_loss(D, labels, 1.1, 1, 0.05, convention, "sum")

    assert torch.autograd.gradcheck(fn, (D,))
    assert torch.autograd.gradgradcheck(fn, (D,))  # piecewise linear: the second derivative is 0


def test_gradient_penalty_through_the_grouped_loss_equals_the_reference():
    """backward is differentiable (the loss is piecewise linear in D): a gradient penalty built with
    create_graph=True through the reference dissimilarity matches the all-reference one."""
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(20, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    mu = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (20,), generator=gen)
    penalties = []
    for algorithm in ("grouped", "pairwise"):
        D = reference.stochastic_dissimilarity(h, mu)
        loss = sol_ext.order_loss(D, labels, algorithm=algorithm, backend="reference" if algorithm == "pairwise" else "auto")
        (dh,) = torch.autograd.grad(loss, h, create_graph=True)
        penalties.append(torch.autograd.grad((dh**2).sum(), h)[0])
    assert_close(penalties[0], penalties[1], "d/dh |dL/dh|^2")


def test_rank_ranges_add_up_to_the_whole():
    gen = torch.Generator().manual_seed(2)
    D = make_D(50, 11, "near", gen).requires_grad_()
    labels = torch.randint(0, 11, (50,), generator=gen)
    whole = grouped.grouped_order_loss(D, labels, 1.0, 2, 0.25, "paper", "sum")
    parts = [grouped.grouped_order_loss(D, labels, 1.0, 2, 0.25, "paper", "sum", ranks=r)
             for r in ((0, 4), (4, 4), (4, 10), (10, 11))]
    assert_close(sum(parts), whole, "sum over rank ranges")
    assert_close(torch.autograd.grad(sum(parts), D)[0], torch.autograd.grad(whole, D)[0], "dD over rank ranges")


@pytest.mark.parametrize("B, n", [(100_000, 3), (5000, 7), (600, 60), (40_000, 1)])  # B·n >= 2^15, so helpers start (n = 1: one rank)
def test_bitwise_the_same_for_any_number_of_threads(B, n):
    gen = torch.Generator().manual_seed(3)
    D = torch.randn(B, n, generator=gen).requires_grad_()
    labels = torch.randint(0, n, (D.shape[0],), generator=gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            loss = sol_ext.order_loss(D, labels, algorithm="grouped")
            results.append((loss, torch.autograd.grad(loss, D)[0]))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("n", [5, 20])  # the sweep over a table of label counts (n <= 16), and the other
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_call_after_a_larger_one_gives_the_same_numbers(n, dtype):
    """The sorting buffers are memory whose first writes are the kernel's (csrc/cpu/large_buffers.h), which
    may hold what a larger call left: past the end of a shorter column it must not reach the result."""
    gen = torch.Generator().manual_seed(5)
    small = (torch.randn(300, n, generator=gen, dtype=torch.float64) + 2).to(dtype)
    small_labels = torch.randint(0, n, (300,), generator=gen)
    large = (torch.randn(5000, n, generator=gen, dtype=torch.float64) + 2).to(dtype)
    large_labels = torch.randint(0, n, (5000,), generator=gen)
    op = torch.ops.sol_ext.grouped_order_sum
    before = op(small, small_labels, 1.0, 1, 0.25, "paper", 0, n, True)
    op(large, large_labels, 1.0, 1, 0.25, "paper", 0, n, True)
    after = op(small, small_labels, 1.0, 1, 0.25, "paper", 0, n, True)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    expected = grouped.grouped_order_sum_torch(small, small_labels, 1.0, 1, 0.25, "paper", 0, n, True)
    assert_close(after[0], expected[0], "value after a larger call")
    assert_close(after[1], expected[1], "gradient after a larger call")


# ------------------------------------------------------------------------------------------------
# The fused CPU op, torch.ops.sol_ext.grouped_order_sum.
# ------------------------------------------------------------------------------------------------


def _op_args(B, n, dtype=torch.float64, margin=0.25, convention="paper", ranks=None, need_grad=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    D = make_D(B, n, "near", gen, dtype)
    labels = torch.randint(0, n, (B,), generator=gen)
    begin, end = (0, n) if ranks is None else ranks
    return D, labels, 0.9, 2, margin, convention, begin, end, need_grad


OPCHECK_CASES = {
    "float64": _op_args(30, 5),
    "float32-official-no-margin": _op_args(30, 5, torch.float32, 0.0, "official"),
    "rank-range": _op_args(30, 6, ranks=(2, 4)),
    "no-grad": _op_args(30, 5, need_grad=False),
    "empty": _op_args(0, 3),
    "one-row": _op_args(1, 3),
    "long-columns": _op_args(600, 3, torch.float32),
}


@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck(case):
    """Schema, fake kernel, autograd registration and dispatch consistency of grouped_order_sum."""
    args = OPCHECK_CASES[case]
    if args[-1] and args[0].dtype == torch.float64:
        args = (args[0].clone().requires_grad_(), *args[1:])
    torch.library.opcheck(torch.ops.sol_ext.grouped_order_sum.default, args)


def test_op_gradcheck_over_a_rank_range():
    D, labels, *rest = _op_args(12, 6, margin=0.05, ranks=(1, 5))
    D = (D * 3).requires_grad_()

    def total(D):
        return torch.ops.sol_ext.grouped_order_sum(D, labels, *rest)[0]

    assert torch.autograd.gradcheck(total, (D,))
    assert torch.autograd.gradgradcheck(total, (D,))


def test_op_refuses_a_bad_rank_range():
    D, labels, *rest = _op_args(10, 4)
    with pytest.raises(RuntimeError, match=r"0 <= rank_begin <= rank_end <= 4, got 3 and 5"):
        torch.ops.sol_ext.grouped_order_sum(D, labels, 1.0, 2, 0.25, "paper", 3, 5, True)
    with pytest.raises(RuntimeError, match="labels must lie in 0..3"):
        torch.ops.sol_ext.grouped_order_sum(D, labels + 4, 1.0, 2, 0.25, "paper", 0, 4, True)


@pytest.mark.parametrize("B", [1, 10])
def test_op_refuses_an_unknown_convention_even_where_nothing_is_summed(B):
    D, labels, *rest = _op_args(B, 4)
    with pytest.raises(RuntimeError, match='convention must be "paper" or "official", got "bogus"'):
        torch.ops.sol_ext.grouped_order_sum(D, labels, 1.0, 2, 0.25, "bogus", 0, 4, True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("margin, convention", [(0.5, "paper"), (0.0, "official"), (0.25, "official")])
def test_long_columns_match_pairwise(margin, convention, dtype):
    """Columns long enough for the kernel's radix sort (B >= 256): negative values, -0.0 beside +0.0, many
    equal values and differences exactly equal to the margin; value and dD equal the fused pairwise kernel's
    (float64: to 1e-12; float32: the same hinge decisions, so the same value up to float32 D's rounding)."""
    gen = torch.Generator().manual_seed(8)
    B, n = 700, 4
    D = (torch.randint(-6, 7, (B, n), generator=gen) * 0.25).to(dtype)
    D[::7] = -0.0
    D[1::7] = 0.0
    D[2::5] = torch.randn(len(D[2::5]), n, generator=gen).to(dtype) * 100
    D.requires_grad_()
    labels = torch.randint(0, n, (B,), generator=gen)
    args = dict(sigma=0.8, tau=1, margin=margin, convention=convention, reduction="sum")
    ours = sol_ext.order_loss(D, labels, algorithm="grouped", **args)
    fused = sol_ext.order_loss(D, labels, backend="fused", algorithm="pairwise", **args)
    g_ours, g_fused = (torch.autograd.grad(x, D)[0] for x in (ours, fused))
    if dtype == torch.float64:
        assert_close(ours, fused, "loss")
        assert_close(g_ours, g_fused, "dD")
    else:  # both sum in float64 and round to float32: an ulp apart at most (one decision more: a weight)
        assert abs(ours.item() - fused.item()) <= 1e-6 * abs(fused.item())
        assert (g_ours.double() - g_fused.double()).abs().max() <= 1e-6 * g_fused.abs().max()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_columns_of_the_11_bit_radix_sort_match_the_torch_path(dtype):
    """Columns of 2^14 values and more sort on 11-bit digits: values of every sign and exponent (each digit
    of the keys varies), -0.0 beside +0.0 and runs of equal values; value and dD equal the torch path's."""
    gen = torch.Generator().manual_seed(12)
    B, n = 20_000, 5
    D = torch.randn(B, n, generator=gen, dtype=torch.float64) * torch.exp(torch.randn(B, n, generator=gen) * 8)
    D[::9] = (torch.randint(-4, 5, (len(D[::9]), n), generator=gen) * 0.25).double()
    D[::13] = -0.0
    D = D.to(dtype)
    labels = torch.randint(0, n, (B,), generator=gen)
    args = (labels, 0.9, 2, 0.25, "paper", 0, n, True)
    total, grad = torch.ops.sol_ext.grouped_order_sum(D, *args)
    torch_total, torch_grad = grouped.grouped_order_sum_torch(D, *args)
    assert_close(total, torch_total, "loss")
    assert_close(grad, torch_grad, "dD")


def test_cpu_float_inputs_run_the_fused_op_only(monkeypatch):
    """CPU float32/float64: the loss runs the C++ op, not the per-chunk torch operations."""

    def refuse(*args, **kwargs):
        raise AssertionError("the torch path ran")

    monkeypatch.setattr(grouped, "_torch_order_sum", refuse)
    gen = torch.Generator().manual_seed(9)
    h = torch.randn(500, 8, generator=gen, requires_grad=True)
    mu = torch.randn(7, 8, generator=gen)
    loss = sol_ext.StochasticOrderLoss(7, algorithm="grouped")(h, torch.randint(0, 7, (500,), generator=gen), mu)
    loss.backward()
    assert torch.isfinite(h.grad).all()


def test_nan_gives_nan_like_the_reference():
    """sol_ext.order_loss refuses a NaN D; the unchecked op (as the module with check_values=False runs it)
    gives NaN, as the reference does, and ends."""
    D = torch.randn(10, 4, dtype=torch.float64)
    D[3, 2] = float("nan")
    labels = torch.arange(10) % 4
    for reduction in ("mean", "sum"):
        assert torch.isnan(grouped.grouped_order_loss(D, labels, 1.0, 1, 0.25, "paper", reduction))
        assert torch.isnan(reference.order_loss(D, labels, reduction=reduction))
    with pytest.raises(ValueError, match="NaN"):
        sol_ext.order_loss(D, labels, algorithm="grouped")


def test_half_precision_runs_close_to_the_reference():
    gen = torch.Generator().manual_seed(4)
    D = (torch.rand(60, 5, generator=gen) * 4).half().requires_grad_()
    labels = torch.randint(0, 5, (60,), generator=gen)
    with pytest.warns(UserWarning, match="reference"):  # pairwise has no half CPU kernel
        ref = sol_ext.order_loss(D, labels, algorithm="pairwise")
    ours = sol_ext.order_loss(D, labels, algorithm="grouped")
    assert ours.dtype == ref.dtype == torch.float32
    assert abs(ours.item() - ref.item()) <= 1e-2 * abs(ref.item())
    grad = torch.autograd.grad(ours, D)[0]
    assert grad.dtype == torch.float16 and torch.isfinite(grad).all()


# ------------------------------------------------------------------------------------------------
# The grouped algorithm's limits (the algorithm argument and the auto rule: test_dispatch.py).
# ------------------------------------------------------------------------------------------------


def test_grouped_refuses_explicit_pairs_and_per_pair_losses():
    D, labels = torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 0])
    pairs = torch.tensor([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="algorithm='grouped'.*explicit pairs"):
        sol_ext.order_loss(D, labels, pairs, algorithm="grouped")
    with pytest.raises(ValueError, match="algorithm='grouped'.*reduction='none'"):
        sol_ext.order_loss(D, labels, reduction="none", algorithm="grouped")
    criterion = sol_ext.StochasticOrderLoss(4, algorithm="grouped")
    with pytest.raises(ValueError, match="sol_ext.stochastic_order_loss: algorithm='grouped'.*explicit pairs"):
        criterion(torch.randn(5, 3), labels, torch.randn(4, 3), pairs)
    # auto takes pairwise for them
    assert sol_ext.order_loss(D, labels, reduction="none").shape == (10,)
    assert "algorithm='grouped'" in repr(criterion)


# ------------------------------------------------------------------------------------------------
# StochasticOrderLoss(algorithm="grouped") on the CPU: one op per direction,
# torch.ops.sol_ext.grouped_stochastic_order_loss and its backward.
# ------------------------------------------------------------------------------------------------


def _composed_grouped_loss(h, mu, labels, criterion):
    """The loss spelled out with the public fused ops and grouped_order_loss, one op each."""
    c = criterion
    D = sol_ext.stochastic_dissimilarity(h, mu, c.sigma, backend="fused")
    order = grouped.grouped_order_loss(D, labels, c.sigma, c.tau, c.margin, c.convention, c.reduction)
    return order + c.disc_weight * sol_ext.disc_loss(D, labels, c.T, c.reduction, backend="fused")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("convention", ["paper", "official"])
@pytest.mark.parametrize("case", ["all", "h only", "no disc", "empty batch", "one row", "large"])
def test_one_op_is_one_node_equal_to_the_composed_ops(case, convention, reduction, dtype):
    """Loss, dh and dmu bitwise those of the composition of the fused ops (same kernels, same roundings),
    from one C++ autograd node."""
    gen = torch.Generator().manual_seed(5)
    B = {"empty batch": 0, "one row": 1, "large": 6000}.get(case, 80)  # large: B n >= 2^15, helpers start
    h = torch.randn(B, 6, generator=gen, dtype=dtype).requires_grad_()
    mu = torch.randn(7, 6, generator=gen, dtype=dtype).requires_grad_(case != "h only")
    labels = torch.randint(0, 7, (B,), generator=gen)
    criterion = sol_ext.StochasticOrderLoss(
        7, sigma=0.8, tau=2, margin=0.3, T=2, disc_weight=0.0 if case == "no disc" else 1.7, convention=convention,
        reduction=reduction, algorithm="grouped",
    )
    fused = criterion(h, labels, mu)
    assert "GroupedStochasticOrderLossFunction" in fused.grad_fn.name()
    expected = _composed_grouped_loss(h, mu, labels, criterion)
    inputs = [h, mu] if mu.requires_grad else [h]
    got = (fused, *torch.autograd.grad(fused * 1.5, inputs))
    want = (expected, *torch.autograd.grad(expected * 1.5, inputs))
    for ours, theirs in zip(got, want):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_a_grouped_training_step_dispatches_the_loss_op_and_its_backward_only():
    """With the value checks on (the default): they run inside the op, so forward + backward dispatch the two
    ops and no torch operation of their own, and no OpenMP team waits on a busy machine."""
    gen = torch.Generator().manual_seed(6)
    h = torch.randn(600, 8, generator=gen, requires_grad=True)
    mu = torch.randn(5, 8, generator=gen, requires_grad=True)
    labels = torch.randint(0, 5, (600,), generator=gen)
    with CountOps() as counted:
        torch.autograd.grad(sol_ext.StochasticOrderLoss(5, algorithm="grouped")(h, labels, mu), (h, mu))
    ours = [op for op in counted.ops if op.startswith("sol_ext.")]
    assert ours == ["sol_ext.grouped_stochastic_order_loss.default",
                    "sol_ext._grouped_stochastic_order_loss_backward.default"]
    assert len(counted.ops) <= 4, counted.ops


@pytest.mark.parametrize("B, n", [(20_000, 3), (5000, 7)])  # B n >= 2^15: helpers start
def test_one_op_is_bitwise_the_same_for_any_number_of_threads_and_restores_the_count(B, n):
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(B, 16, generator=gen, requires_grad=True)
    mu = torch.randn(n, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, n, (B,), generator=gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            loss = sol_ext.StochasticOrderLoss(n, algorithm="grouped")(h, labels, mu)
            results.append((loss, *torch.autograd.grad(loss, (h, mu))))
            assert torch.get_num_threads() == count  # the op runs its regions on one thread, then gives them back
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:  # loss, dh, dmu
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("need", ["both", "h", "mu"])
def test_dissimilarity_in_several_blocks_matches_the_reference(need):
    """B over the dissimilarity's block size (2048 rows at d = 64) with a partial last block: D and both
    gradients against the float64 reference, by the public op and inside the grouped loss."""
    gen = torch.Generator().manual_seed(10)
    B, n, d = 3 * 2048 + 5, 6, 64
    h = torch.randn(B, d, generator=gen, dtype=torch.float64).requires_grad_(need != "mu")
    mu = torch.randn(n, d, generator=gen, dtype=torch.float64).requires_grad_(need != "h")
    inputs = [t for t in (h, mu) if t.requires_grad]
    D = sol_ext.stochastic_dissimilarity(h, mu, 0.8, backend="fused")
    D_ref = reference.stochastic_dissimilarity(h, mu, 0.8)
    assert_close(D, D_ref, "D")
    weights = torch.randn(B, n, generator=gen, dtype=torch.float64)
    for ours, theirs in zip(torch.autograd.grad((D * weights).sum(), inputs),
                            torch.autograd.grad((D_ref * weights).sum(), inputs)):
        assert_close(ours, theirs, "dD-weighted gradient")
    labels = torch.randint(0, n, (B,), generator=gen)
    kwargs = dict(sigma=0.8, tau=2, margin=0.2, T=2, disc_weight=0.6)
    loss = sol_ext.StochasticOrderLoss(n, algorithm="grouped", **kwargs)(h, labels, mu)
    expected = sol_ext.StochasticOrderLoss(n, backend="reference", **kwargs)(h, labels, mu)
    assert_close(loss, expected, "loss")
    for ours, theirs in zip(torch.autograd.grad(loss, inputs), torch.autograd.grad(expected, inputs)):
        assert_close(ours, theirs, "loss gradient", floor=1e-6)


def _helper_threads() -> int:
    """The number of this process's threads named as sol_ext's helpers."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return names.count("sol_ext helper")


def _grouped_sum(queue=None):
    gen = torch.Generator().manual_seed(9)
    D = torch.randn(20_000, 5, generator=gen)
    labels = torch.randint(0, 5, (20_000,), generator=gen)
    total, grad = torch.ops.sol_ext.grouped_order_sum(D, labels, 1.0, 2, 0.25, "paper", 0, 5, True)
    started = _helper_threads()
    result = (total.item(), grad.numpy().copy(), started)  # numpy's copy: torch's would open an OpenMP region
    if queue is not None:
        queue.put(result)
    return result


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs fork and Linux's /proc")
def test_a_forked_child_starts_its_own_helpers():
    """A process forked after the parent started helper threads (a DataLoader worker) has none of them:
    its calls start their own, neither waiting for the parent's nor differing. The grouped op alone, with
    no BLAS or OpenMP in it (OpenMP itself does not survive a fork)."""
    import multiprocessing

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = _grouped_sum()  # starts a helper in this process
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_grouped_sum, args=(queue,))
        child.start()
        got = queue.get(timeout=120)
        child.join(timeout=60)
    finally:
        torch.set_num_threads(threads)
    assert child.exitcode == 0
    assert got[0] == expected[0] and (got[1] == expected[1]).all()
    # the child started a helper of its own (a thread that a helper starts inherits its name: >= 1)
    assert expected[2] >= 1 and got[2] >= 1


@pytest.mark.parametrize("what", ["h", "h inf", "mu", "D", "labels"])
def test_one_op_refuses_bad_values_like_the_other_paths(what):
    h, mu = torch.randn(300, 4), torch.randn(5, 4)
    if what.startswith("h"):  # the op reads h only once D is non-finite: both must make it so
        h[7, 1] = float("inf") if what == "h inf" else float("nan")
        match = "h contains 1 NaN or inf value"
    elif what == "mu":
        mu[2, 0] = float("inf")
        match = "mu contains 1 NaN or inf value"
    elif what == "D":  # finite embeddings whose squared distances pass float32's range
        h[3] = 3e19
        match = r"the stochastic dissimilarities of h and mu overflow torch.float32: 5 of D's 1500 values .*3e\+19"
    labels = torch.randint(0, 5, (300,))
    if what == "labels":  # 1-based
        labels = torch.randint(1, 6, (300,))
        labels[0] = 5
        match = r"labels must lie in 0 … 4 \(0-based ranks for num_ranks=5\), got values in 1 … 5; they look 1-based"
    threads = torch.get_num_threads()
    for algorithm in ("grouped", "pairwise"):
        with pytest.raises(ValueError, match=match):
            sol_ext.StochasticOrderLoss(5, algorithm=algorithm)(h, labels, mu)
    assert torch.get_num_threads() == threads
    # unchecked, a NaN goes through to the loss, as on the other paths
    if what in ("h", "h inf", "mu"):
        assert torch.isnan(sol_ext.StochasticOrderLoss(5, algorithm="grouped", check_values=False)(h, labels, mu))


def _one_op_args(B=30, n=5, dtype=torch.float64, need_grad=True, reduction="mean", check_values=True):
    gen = torch.Generator().manual_seed(8)
    h = torch.randn(B, 4, generator=gen, dtype=dtype)
    mu = torch.randn(n, 4, generator=gen, dtype=dtype)
    labels = torch.randint(0, n, (B,), generator=gen)
    if need_grad and dtype == torch.float64:
        h, mu = h.requires_grad_(), mu.requires_grad_()
    return h, mu, labels, 0.9, 2, 0.25, 2, 1.3, "paper", reduction, check_values, need_grad


ONE_OP_CASES = {
    "float64": _one_op_args(),
    "float32-sum-unchecked": _one_op_args(dtype=torch.float32, reduction="sum", check_values=False),
    "no-grad": _one_op_args(need_grad=False),
    "empty": _one_op_args(B=0),
    "one-row": _one_op_args(B=1),
}


@pytest.mark.parametrize("case", list(ONE_OP_CASES))
def test_one_op_opcheck(case):
    """Schema, fake kernel, autograd registration and dispatch consistency of the op and its backward."""
    args = ONE_OP_CASES[case]
    torch.library.opcheck(torch.ops.sol_ext.grouped_stochastic_order_loss.default, args)
    h, mu, labels, sigma, _, _, T, disc_weight, _, reduction, _, need_grad = args
    if need_grad:
        _, D, grad_order = torch.ops.sol_ext.grouped_stochastic_order_loss(*args)
        grad_loss = torch.tensor(1.3, dtype=torch.promote_types(h.dtype, torch.float32))
        for need_h, need_mu in ((True, True), (False, True)):
            torch.library.opcheck(
                torch.ops.sol_ext._grouped_stochastic_order_loss_backward.default,
                (grad_loss, h.detach(), mu.detach(), D, labels, grad_order, sigma, T, disc_weight, reduction, need_h,
                 need_mu),
            )


def test_one_op_gradcheck():
    h, mu, labels, *rest = _one_op_args(B=12, n=4)
    assert torch.autograd.gradcheck(
        lambda h, mu: torch.ops.sol_ext.grouped_stochastic_order_loss(h, mu, labels, *rest)[0], (h, mu)
    )


def test_one_op_without_need_grad_refuses_backward_with_a_clear_error():
    h, mu, labels, *rest = _one_op_args(need_grad=False)
    h.requires_grad_()
    loss = torch.ops.sol_ext.grouped_stochastic_order_loss(h, mu, labels, *rest)[0]
    with pytest.raises(RuntimeError, match="called with need_grad=False; pass need_grad=True"):
        loss.backward()


# ------------------------------------------------------------------------------------------------
# Data-parallel loss: one process in this process, two spawned ones.
# ------------------------------------------------------------------------------------------------


def _criterion(algorithm, n=9, reduction="mean", convention="paper"):
    return sol_ext.StochasticOrderLoss(n, sigma=0.8, tau=2, margin=0.3, T=2, disc_weight=0.7, convention=convention,
                                       reduction=reduction, algorithm=algorithm)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_distributed_loss_in_one_process_equals_the_single_process_loss(tmp_path, monkeypatch):
    """A process group of one: the gathered D is the batch, and grouped over it (the fused CPU op) equals
    pairwise."""
    monkeypatch.setattr(grouped, "_torch_order_sum", lambda *args: pytest.fail("the torch path ran"))
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        gen = torch.Generator().manual_seed(6)
        h = torch.randn(40, 4, generator=gen, dtype=torch.float64, requires_grad=True)
        mu = torch.randn(9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
        labels = torch.randint(0, 9, (40,), generator=gen)
        for reduction in ("mean", "sum"):
            results = []
            for loss in (DistributedStochasticOrderLoss(_criterion("grouped", reduction=reduction)),
                         DistributedStochasticOrderLoss(_criterion("pairwise", reduction=reduction)),
                         _criterion("pairwise", reduction=reduction)):
                value = loss(h, labels, mu)
                results.append((value, *torch.autograd.grad(value, (h, mu))))
            for other in results[1:]:
                for name, a, b in zip(("loss", "dh", "dmu"), results[0], other):
                    assert_close(a, b, f"{name}, {reduction}")
    finally:
        torch.distributed.destroy_process_group()


def _worker(rank, world_size, cases, out_dir):
    results = []
    for seed, (sizes, n, reduction) in enumerate(cases):
        h, mu, labels = _global_batch(sizes, n, seed)
        start = sum(sizes[:rank])
        h = h[start : start + sizes[rank]].clone().requires_grad_()
        mu = mu.clone().requires_grad_()
        loss = DistributedStochasticOrderLoss(_criterion("grouped", n, reduction))(h, labels[start : start + sizes[rank]], mu)
        dh, dmu = torch.autograd.grad(loss, (h, mu))
        results.append((loss.detach(), dh, dmu))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def _global_batch(sizes, n, seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(sum(sizes), 4, generator=gen, dtype=torch.float64)
    mu = torch.randn(n, 4, generator=gen, dtype=torch.float64)
    return h, mu, torch.randint(0, n, (sum(sizes),), generator=gen)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_distributed_grouped_splits_the_ranks_over_two_processes(tmp_path):
    """Two processes, each taking half of the ranks (n = 1: one of them none): the loss on every process and
    the gradients summed over the processes (what DDP's averaging of W times the share gives) equal one
    process's pairwise loss on the concatenated batch."""
    cases = [([6, 5], 9, "mean"), ([7, 0], 4, "sum"), ([3, 4], 1, "mean")]
    spawn_processes(_worker, 2, (cases, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for seed, (sizes, n, reduction) in enumerate(cases):
        h, mu, labels = _global_batch(sizes, n, seed)
        h.requires_grad_()
        mu.requires_grad_()
        expected = _criterion("pairwise", n, reduction)(h, labels, mu)
        dh, dmu = torch.autograd.grad(expected, (h, mu))
        for rank in range(2):
            assert_close(per_rank[rank][seed][0], expected.detach(), f"loss, case {seed}, rank {rank}")
        got_dh = torch.cat([per_rank[r][seed][1] for r in range(2)]) / 2  # DDP averages W x share
        got_dmu = sum(per_rank[r][seed][2] for r in range(2)) / 2
        assert_close(got_dh, dh, f"dh, case {seed}", floor=1e-6)
        assert_close(got_dmu, dmu, f"dmu, case {seed}", floor=1e-6)
