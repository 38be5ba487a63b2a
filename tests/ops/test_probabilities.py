"""Noise kernel and ordering probabilities (docs/math.md §2, §5, §10.2)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import sol_ext
from common import cpu_and_cuda
from sol_ext import ops, reference


def direct_probabilities(a: int, b: int, n: int, sigma: float, tau: int, convention: str):
    """docs/math.md §5 (and §10.2) written as explicit loops over the true ranks j of x and k of y."""
    P = [[math.exp(-((j - q) ** 2) / (2 * sigma**2)) for j in range(n)] for q in range(n)]
    P = [[v / sum(row) for v in row] for row in P]
    lt = eq = gt = 0.0
    for j, k in itertools.product(range(n), range(n)):
        w = P[a][j] * P[b][k]
        if convention == "official":
            lt += w * (k >= min(n - 1, j + tau + 1))
            gt += w * (j >= min(n - 1, k + tau + 1))
        else:
            lt += w * (k - j > tau)
            gt += w * (j - k > tau)
        eq += w * (abs(k - j) <= tau)
    return lt, eq, gt


@pytest.mark.parametrize("convention, expected", [
    ("official", (0.283021, 0.896718, 0.004441)),
    ("paper", (0.103252, 0.896718, 0.000030)),
])
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_known_values_from_the_authors_code(convention, expected, backend):
    """n=12, tau=3, sigma=1, noisy ranks (8, 10): values measured by running the authors' code."""
    probs = sol_ext.ordering_probabilities(
        torch.tensor([8]), torch.tensor([10]), 12, sigma=1.0, tau=3, convention=convention, backend=backend
    )
    assert probs.shape == (1, 3) and probs.dtype == torch.float64
    assert probs[0].tolist() == pytest.approx(expected, abs=5e-7)


@pytest.mark.parametrize("n, sigma, tau", [(1, 1.0, 0), (5, 0.5, 0), (12, 1.0, 3), (9, 2.5, 2), (20, 0.7, 6)])
@pytest.mark.parametrize("convention", ["paper", "official"])
def test_table_equals_the_direct_double_sum(n, sigma, tau, convention):
    table = ops.ordering_probability_table(n, sigma, tau, convention, backend="fused")
    for a, b in itertools.product(range(n), range(n)):
        assert table[a, b].tolist() == pytest.approx(direct_probabilities(a, b, n, sigma, tau, convention), abs=1e-13)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_paper_probabilities_sum_to_one_and_mirror(device):
    table = ops.ordering_probability_table(40, 1.3, 3, "paper", device=device, backend="fused").cpu()
    torch.testing.assert_close(table.sum(-1), torch.ones(40, 40, dtype=torch.float64), atol=1e-13, rtol=0)
    # Swapping x and y swaps "<" and ">".
    torch.testing.assert_close(table[:, :, 0], table[:, :, 2].T, atol=1e-15, rtol=0)


def test_official_convention_adds_mass_near_the_top_rank():
    """docs/math.md §10.2: the clamp at n-1 makes lt + eq + gt exceed 1 for ranks near the top."""
    table = ops.ordering_probability_table(12, 1.0, 3, "official", backend="fused")
    assert table.sum(-1).max() > 1.01
    paper = ops.ordering_probability_table(12, 1.0, 3, "paper", backend="fused")
    torch.testing.assert_close(table[:, :, 1], paper[:, :, 1], atol=1e-15, rtol=0)  # Pr(x ~ y) is exact


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gather_matches_reference(device, dtype):
    gen = torch.Generator().manual_seed(0)
    r_x, r_y = torch.randint(0, 30, (500,), generator=gen), torch.randint(0, 30, (500,), generator=gen)
    fused = sol_ext.ordering_probabilities(r_x.to(device), r_y.to(device), 30, 0.8, 2, dtype=dtype, backend="fused")
    ref = reference.ordering_probabilities(r_x, r_y, 30, 0.8, 2, dtype=dtype)
    assert fused.dtype == dtype and fused.device.type == device
    torch.testing.assert_close(fused.cpu(), ref, atol=1e-15, rtol=1e-6 if dtype == torch.float32 else 1e-12)


def test_noise_kernel_rows_are_normalized_gaussians():
    P = sol_ext.noise_kernel(7, 1.5)
    torch.testing.assert_close(P.sum(1), torch.ones(7, dtype=torch.float64), atol=1e-15, rtol=0)
    assert P[3, 1] / P[3, 3] == pytest.approx(math.exp(-4 / (2 * 1.5**2)))
    # A tiny sigma makes P the identity: plain order learning.
    torch.testing.assert_close(sol_ext.noise_kernel(5, 1e-3), torch.eye(5, dtype=torch.float64))


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("convention", ["paper", "official"])
def test_every_tau_from_n_minus_1_up_means_the_same(backend, convention):
    """True ranks differ by at most n - 1, so any larger tau is the same "always similar" threshold,
    up to the largest int64 (where tau + 1 used to overflow)."""
    n = 6
    expected = ops.ordering_probability_table(n, 1.0, n - 1, convention, backend=backend)
    torch.testing.assert_close(expected[:, :, 1], torch.ones(n, n, dtype=torch.float64), atol=1e-15, rtol=0)
    for tau in (n, 1000, 2**62, 2**63 - 1):
        table = ops.ordering_probability_table(n, 1.0, tau, convention, backend=backend)
        assert torch.equal(table, expected), f"tau={tau}"


@pytest.mark.parametrize("sigma", [5e-155, 1e-160, 1e-300])
def test_a_tiny_sigma_gives_the_identity_kernel(sigma):
    assert torch.equal(sol_ext.noise_kernel(5, sigma), torch.eye(5, dtype=torch.float64))
    fused = ops.ordering_probability_table(5, sigma, 1, backend="fused")
    torch.testing.assert_close(fused, ops.ordering_probability_table(5, sigma, 1, backend="reference"))
    # With P the identity the true ranks are the noisy ones: Pr(x ~ y) = [|a - b| <= 1].
    ranks = torch.arange(5)
    assert torch.equal(fused[:, :, 1], ((ranks[:, None] - ranks[None, :]).abs() <= 1).double())


@pytest.mark.parametrize("sigma", [1.4e154, 1e200, 1e308])
def test_a_huge_sigma_gives_the_uniform_kernel(sigma):
    torch.testing.assert_close(sol_ext.noise_kernel(5, sigma), torch.full((5, 5), 0.2, dtype=torch.float64))
    fused = ops.ordering_probability_table(5, sigma, 1, backend="fused")
    torch.testing.assert_close(fused, ops.ordering_probability_table(5, sigma, 1, backend="reference"))
    assert torch.isfinite(fused).all()


# Past 1,000 ranks the table is built from cumulative sums along its diagonals (csrc/tables.cpp), O(n^2)
# instead of one O(n) sum per entry; the grids below are just past that bound, and the wide kernels and
# large taus reach every boundary case of those sums.
@pytest.mark.parametrize("n, sigma, tau, convention", [
    (1001, 1.0, 3, "paper"),
    (1001, 0.3, 0, "official"),
    (1001, 40.0, 7, "official"),
    (1024, 900.0, 3, "paper"),
    (1024, 2.5, 1023, "official"),
])
def test_tables_past_1000_ranks_equal_the_double_sums(n, sigma, tau, convention):
    table = ops.ordering_probability_table(n, sigma, tau, convention, backend="fused")
    expected = reference.ordering_probability_table(n, sigma, tau, convention)
    assert table.shape == (n, n, 3) and (table >= 0).all()
    # Pr(x ~ y) to the rounding of sums of n terms near 1; Pr(x < y) and Pr(x > y) also relatively, down
    # to the smallest normal numbers (a small probability is a sum of small terms, not a difference of
    # large ones).
    torch.testing.assert_close(table[..., 1], expected[..., 1], rtol=0, atol=5e-14)
    normal = expected[..., [0, 2]] > torch.finfo(torch.float64).tiny
    torch.testing.assert_close(table[..., [0, 2]][normal], expected[..., [0, 2]][normal], rtol=1e-12, atol=0)
    assert (table[..., [0, 2]][~normal] < 1e-300).all()
    assert torch.equal(table[..., 2], table[..., 0].T)  # Pr(x > y) for (a, b) is Pr(x < y) for (b, a)


def test_tables_past_1000_ranks_sum_to_one():
    n = 1500
    table = ops.ordering_probability_table(n, 3.0, 3, "paper", backend="fused")
    torch.testing.assert_close(table.sum(-1), torch.ones(n, n, dtype=torch.float64), rtol=0, atol=1e-15)
    # A far-apart pair is ordered for certain, a pair within tau of each other mostly similar.
    torch.testing.assert_close(table[0, n - 1], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64),
                               rtol=0, atol=1e-15)
    assert table[n - 1, 0, 0] == 0.0 and table[700, 701, 1] > 0.5
    tau_all = ops.ordering_probability_table(n, 3.0, n - 1, "paper", backend="fused")
    assert torch.equal(tau_all[..., 1], torch.ones(n, n, dtype=torch.float64))
