"""Fused kernels against the plain-PyTorch reference: values and gradients on random configurations."""
from __future__ import annotations

import math
import random
import time

import pytest
import torch

import sol_ext
from common import REL_TOL, assert_rel_close, cpu_and_cuda, noncontiguous, random_labels, random_pairs
from sol_ext import reference

NUM_CONFIGS = 200


def _log_uniform_int(rng: random.Random, low: int, high: int) -> int:
    """Integers in [low, high], small values as likely as large ones on a log scale."""
    return min(high, int(math.exp(rng.uniform(math.log(low), math.log(high + 1)))))


def make_config(seed: int) -> dict:
    rng = random.Random(seed)
    batch_size = 0 if seed % 50 == 7 else _log_uniform_int(rng, 1, 130)  # a few empty batches
    return dict(
        num_ranks=_log_uniform_int(rng, 1, 150),
        batch_size=batch_size,
        dim=_log_uniform_int(rng, 1, 600),
        tau=rng.randint(0, 6),
        T=rng.randint(1, 3),
        sigma=rng.uniform(0.3, 3.0),
        margin=rng.choice([0.0, 1.0, rng.uniform(0.0, 1.0)]),
        convention=rng.choice(["paper", "official"]),
        explicit_pairs=rng.random() < 0.4,
        noncontiguous=rng.random() < 0.3,
    )


def make_inputs(cfg: dict, seed: int, dtype: torch.dtype, device: str):
    gen = torch.Generator().manual_seed(seed)
    B, n, d = cfg["batch_size"], cfg["num_ranks"], cfg["dim"]
    h = torch.randn(B, d, generator=gen, dtype=torch.float64)
    mu = torch.randn(n, d, generator=gen, dtype=torch.float64) * 0.5
    labels = random_labels(B, n, gen)
    pairs = random_pairs(B, 2 * B + 3, gen) if cfg["explicit_pairs"] and B > 0 else None
    h, mu = h.to(device, dtype), mu.to(device, dtype)
    if cfg["noncontiguous"]:
        h, mu = noncontiguous(h), noncontiguous(mu)
    return h, mu, labels.to(device), None if pairs is None else pairs.to(device)


def grads(output: torch.Tensor, inputs, upstream: torch.Tensor):
    return torch.autograd.grad(output, inputs, upstream, allow_unused=False)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", range(NUM_CONFIGS))
def test_fused_matches_reference(seed, dtype, device):
    """Each fused op's forward and both gradients equal the reference's, for the same upstream gradient."""
    cfg = make_config(seed)
    tol = REL_TOL[dtype]
    h, mu, labels, pairs = make_inputs(cfg, seed, dtype, device)
    gen = torch.Generator().manual_seed(seed + 1)
    loss_args = dict(sigma=cfg["sigma"], tau=cfg["tau"], margin=cfg["margin"], convention=cfg["convention"])

    # Dissimilarity: forward, and d/dh, d/dmu for one random upstream gradient.
    h.requires_grad_(True)
    mu.requires_grad_(True)
    D_fused = sol_ext.stochastic_dissimilarity(h, mu, cfg["sigma"], backend="fused")
    D_ref = reference.stochastic_dissimilarity(h, mu, cfg["sigma"])
    assert_rel_close(D_fused, D_ref, tol, "D")
    upstream = torch.randn(D_ref.shape, generator=gen, dtype=torch.float64).to(device, dtype)
    for name, g_fused, g_ref in zip(("dh", "dmu"), grads(D_fused, (h, mu), upstream), grads(D_ref, (h, mu), upstream)):
        assert_rel_close(g_fused, g_ref, tol, name)

    # Order and discriminative losses, per pair / per sample, on one shared D.
    D = D_ref.detach().requires_grad_(True)
    order_fused = sol_ext.order_loss(D, labels, pairs, reduction="none", backend="fused", **loss_args)
    order_ref = reference.order_loss(D, labels, pairs, reduction="none", **loss_args)
    assert_rel_close(order_fused, order_ref, tol, "order loss")
    upstream = torch.randn(order_ref.shape, generator=gen, dtype=torch.float64).to(device, dtype)
    if order_ref.numel() > 0:
        assert_rel_close(grads(order_fused, D, upstream)[0], grads(order_ref, D, upstream)[0], tol, "order dD")

    disc_fused = sol_ext.disc_loss(D, labels, cfg["T"], reduction="none", backend="fused")
    disc_ref = reference.disc_loss(D, labels, cfg["T"], reduction="none")
    assert_rel_close(disc_fused, disc_ref, tol, "disc loss")
    upstream = torch.randn(disc_ref.shape, generator=gen, dtype=torch.float64).to(device, dtype)
    if disc_ref.numel() > 0:
        assert_rel_close(grads(disc_fused, D, upstream)[0], grads(disc_ref, D, upstream)[0], tol, "disc dD")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("seed", range(0, NUM_CONFIGS, 10))
def test_module_matches_reference(seed, reduction, device):
    """StochasticOrderLoss end to end (h -> D -> both losses), float64, value and gradients."""
    cfg = make_config(seed)
    h, mu, labels, pairs = make_inputs(cfg, seed, torch.float64, device)
    kwargs = dict(
        num_ranks=cfg["num_ranks"], sigma=cfg["sigma"], tau=cfg["tau"], margin=cfg["margin"], T=cfg["T"],
        disc_weight=0.7, convention=cfg["convention"], reduction=reduction,
    )
    results = {}
    for backend in ("fused", "reference"):
        h_, mu_ = h.clone().requires_grad_(True), mu.clone().requires_grad_(True)
        loss = sol_ext.StochasticOrderLoss(**kwargs, backend=backend)(h_, labels, mu_, pairs)
        results[backend] = (loss, *torch.autograd.grad(loss, (h_, mu_)))
    for name, fused, ref in zip(("loss", "dh", "dmu"), results["fused"], results["reference"]):
        assert_rel_close(fused, ref, REL_TOL[torch.float64], name)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("algorithm", ["pairwise", "grouped"])
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_the_functional_loss_is_the_module_and_the_sum_of_its_parts(backend, algorithm, device):
    """sol_ext.ops.stochastic_order_loss is what StochasticOrderLoss computes (bit for bit: the module calls it)
    and the composition of the leaf ops, order_loss + disc_weight * disc_loss of stochastic_dissimilarity."""
    gen = torch.Generator().manual_seed(11)
    h = torch.randn(70, 6, generator=gen, dtype=torch.float64).to(device)
    mu = torch.randn(5, 6, generator=gen, dtype=torch.float64).to(device)
    labels = random_labels(70, 5, gen).to(device)
    settings = dict(sigma=0.8, tau=2, margin=0.1, T=2, disc_weight=0.6, convention="official", reduction="sum")
    results = {}
    for name in ("function", "module", "parts"):
        h_, mu_ = h.clone().requires_grad_(True), mu.clone().requires_grad_(True)
        if name == "function":
            loss = sol_ext.ops.stochastic_order_loss(h_, labels, mu_, **settings, backend=backend, algorithm=algorithm)
        elif name == "module":
            loss = sol_ext.StochasticOrderLoss(5, **settings, backend=backend, algorithm=algorithm)(h_, labels, mu_)
        else:
            D = sol_ext.stochastic_dissimilarity(h_, mu_, settings["sigma"], backend=backend)
            order = sol_ext.order_loss(D, labels, None, settings["sigma"], settings["tau"], settings["margin"],
                                       settings["convention"], "sum", backend=backend, algorithm=algorithm)
            loss = order + settings["disc_weight"] * sol_ext.disc_loss(D, labels, settings["T"], "sum", backend=backend)
        results[name] = (loss, *torch.autograd.grad(loss, (h_, mu_)))
    assert all(torch.equal(a, b) for a, b in zip(results["function"], results["module"]))
    for what, value, parts in zip(("loss", "dh", "dmu"), results["function"], results["parts"]):
        assert_rel_close(value, parts, REL_TOL[torch.float64], what)


def test_the_functional_loss_checks_its_settings_and_the_rows_of_mu():
    h, mu, labels = torch.randn(4, 3), torch.randn(5, 3), torch.tensor([0, 1, 2, 4])
    with pytest.raises(ValueError, match=r"tau must be an integer >= 0"):
        sol_ext.ops.stochastic_order_loss(h, labels, mu, tau=-1)
    with pytest.raises(ValueError, match=r"reduction must be one of \"mean\", \"sum\""):
        sol_ext.ops.stochastic_order_loss(h, labels, mu, reduction="none")
    with pytest.raises(TypeError, match=r"check_values must be True or False"):
        sol_ext.ops.stochastic_order_loss(h, labels, mu, check_values=1)
    with pytest.raises(ValueError, match=r"mu must have num_ranks=6 rows \(one centroid per rank\)"):
        sol_ext.ops.stochastic_order_loss(h, labels, mu, num_ranks=6)
    with pytest.raises(ValueError, match=r"labels must lie in 0 … 4"):
        sol_ext.ops.stochastic_order_loss(h, labels + 1, mu)


def test_without_value_checks_the_ops_read_no_values():
    """check_values=False: a NaN goes through (no host read), as in StochasticOrderLoss; the reference's
    indices are still checked on the CPU, where -1 would wrap around."""
    gen = torch.Generator().manual_seed(2)
    h, mu = torch.randn(6, 3, generator=gen), torch.randn(4, 3, generator=gen)
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    h[1, 2] = math.nan
    with pytest.raises(ValueError, match="h contains 1 NaN or inf"):
        sol_ext.stochastic_dissimilarity(h, mu)
    D = sol_ext.stochastic_dissimilarity(h, mu, check_values=False)
    assert torch.isnan(D[1]).all() and torch.isfinite(D[0]).all()
    assert torch.isnan(sol_ext.order_loss(D, labels, check_values=False))
    assert torch.isnan(sol_ext.disc_loss(D, labels, check_values=False))
    assert torch.isnan(sol_ext.ops.order_loss_block(D[:3], labels[:3], D, labels, 0, check_values=False)).any()
    assert torch.isnan(sol_ext.ops.stochastic_order_loss(h, labels, mu, check_values=False))
    wrapped = torch.tensor([-1, 1, 2, 3, 0, 1])
    finite = torch.randn(6, 4, generator=gen)
    for call in (
        lambda: sol_ext.order_loss(finite, wrapped, backend="reference", check_values=False),
        lambda: sol_ext.disc_loss(finite, wrapped, backend="reference", check_values=False),
        lambda: sol_ext.ops.order_loss_block(finite, wrapped, finite, labels, 0, backend="reference",
                                             check_values=False),
    ):
        with pytest.raises(ValueError, match=r"labels must lie in 0 … 3"):
            call()


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_only_needed_gradients_are_computed(device):
    h = torch.randn(6, 4, dtype=torch.float64, device=device)
    mu = torch.randn(5, 4, dtype=torch.float64, device=device, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 3, 4, 0], device=device)
    sol_ext.StochasticOrderLoss(5, backend="fused")(h, labels, mu).backward()
    assert h.grad is None and mu.grad is not None and mu.grad.abs().sum() > 0
    grad_h, grad_mu = torch.ops.sol_ext._stochastic_dissimilarity_backward(
        torch.ones(6, 5, dtype=torch.float64, device=device), h, mu.detach(), 1.0, True, False
    )
    assert grad_h.shape == (6, 4) and grad_mu.numel() == 0


# -------------------------------------------------------------------------------------------------
# Numerical edge cases
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("explicit", [False, True])
def test_nan_in_D_gives_nan_like_the_reference(device, dtype, explicit):
    """The public functions refuse a NaN in D; the op itself (torch.compile skips the value checks)
    gives NaN for exactly the pairs that read it, as the reference does, never a silent 0."""
    gen = torch.Generator().manual_seed(5)
    B, n = 9, 6
    D = torch.randn(B, n, generator=gen, dtype=torch.float64).to(device, dtype)
    D[2, 3] = math.nan
    labels = random_labels(B, n, gen, device)
    pairs = torch.tensor([[0, 1], [2, 5], [4, 2], [3, 8], [2, 2], [7, 6]], device=device) if explicit else None
    fused = torch.ops.sol_ext.order_loss(D, labels, pairs, 1.0, 1, 0.25, "paper")
    ref = reference.order_loss(D, labels, pairs, 1.0, 1, 0.25, "paper", reduction="none")
    assert fused.isnan().any()
    assert torch.equal(fused.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert_rel_close(fused[finite], ref[finite], REL_TOL[dtype], "finite losses")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype, offset", [(torch.float32, 100.0), (torch.float32, 1e3), (torch.float64, 1e6)])
@pytest.mark.parametrize("B, n, d", [(8, 6, 16), (64, 24, 32)], ids=["small", "large"])
def test_dissimilarity_keeps_its_precision_far_from_the_origin(device, dtype, offset, B, n, d):
    """h and mu close to one point far from the origin, where a ||h||^2 - 2 h.nu + c cancels: D and its
    gradients keep the dtype's precision, element by element for D. On the CPU the small problem takes the
    definition directly, the large one the product form (csrc/cpu/stochastic_dissimilarity_kernel.cpp)."""
    gen = torch.Generator().manual_seed(0)
    h = (offset + 0.05 * torch.randn(B, d, generator=gen, dtype=torch.float64)).to(dtype)
    mu = (offset + 0.05 * torch.randn(n, d, generator=gen, dtype=torch.float64)).to(dtype)
    upstream = torch.randn(B, n, generator=gen, dtype=torch.float64)
    h64, mu64 = h.double().requires_grad_(), mu.double().requires_grad_()  # the same values, exactly
    exact = reference.stochastic_dissimilarity(h64, mu64, 1.0)
    exact_grads = grads(exact, (h64, mu64), upstream)
    h, mu = h.to(device).requires_grad_(), mu.to(device).requires_grad_()
    D = sol_ext.stochastic_dissimilarity(h, mu, 1.0, backend="fused")
    tol = REL_TOL[dtype]
    relative = ((D.detach().double().cpu() - exact.detach()).abs() / exact.detach().abs()).max().item()
    assert relative <= tol, f"max relative error of D {relative:.3e} > {tol:.0e}"
    for name, got, want in zip(("dh", "dmu"), grads(D, (h, mu), upstream.to(device, dtype)), exact_grads):
        assert_rel_close(got.cpu(), want.to(dtype), tol, name)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_huge_T_costs_what_T_equal_to_n_costs(backend):
    """Every t >= n adds the same term (both neighbours out of range), so the loss is linear in T from
    T = n - 1 on; a T of 10**8 or 2**62 is computed at once, not term by term."""
    gen = torch.Generator().manual_seed(2)
    B, n = 6, 5
    D = torch.randn(B, n, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = random_labels(B, n, gen)
    upstream = torch.randn(B, generator=gen, dtype=torch.float64)
    at = {T: sol_ext.disc_loss(D, labels, T, reduction="none", backend=backend) for T in (n - 1, n)}
    base, step = at[n - 1], at[n] - at[n - 1]
    grad_base = grads(base, D, upstream)[0]
    grad_step = grads(at[n], D, upstream)[0] - grad_base
    for T in (10**8, 2**62):
        start = time.perf_counter()
        loss = sol_ext.disc_loss(D, labels, T, reduction="none", backend=backend)
        (grad,) = grads(loss, D, upstream)
        elapsed = time.perf_counter() - start
        assert_rel_close(loss, base + (T - (n - 1)) * step, 1e-12, f"loss, T={T}")
        assert_rel_close(grad, grad_base + (T - (n - 1)) * grad_step, 1e-12, f"dD, T={T}")
        # term by term, 2**62 terms would never end: the bound separates that from "at once" with room
        # for a machine busy with other work
        assert elapsed < 10.0, f"T={T} took {elapsed:.2f} s"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("sigma", [1e-300, 1e-160, 1e160, 1e300])
def test_extreme_sigma_reaches_the_identity_and_uniform_limits(device, sigma):
    """A tiny sigma makes P the identity (plain order learning), a huge one makes it uniform; both
    backends compute those limits instead of NaN (0 * inf) or an OverflowError (sigma**2)."""
    gen = torch.Generator().manual_seed(1)
    B, n = 7, 5
    h = torch.randn(B, 3, generator=gen, dtype=torch.float64).to(device)
    mu = torch.randn(n, 3, generator=gen, dtype=torch.float64).to(device)
    labels = random_labels(B, n, gen, device)
    distances = ((h[:, None, :] - mu[None, :, :]) ** 2).sum(-1)
    limit = distances if sigma < 1 else distances.mean(1, keepdim=True).expand(B, n)
    for backend in ("fused", "reference"):
        hg, mug = h.clone().requires_grad_(), mu.clone().requires_grad_()
        D = sol_ext.stochastic_dissimilarity(hg, mug, sigma, backend=backend)
        assert_rel_close(D.detach(), limit, 1e-12, f"D ({backend})")
        loss = sol_ext.StochasticOrderLoss(n, sigma=sigma, backend=backend)(hg, labels, mug)
        dh, dmu = torch.autograd.grad(loss, (hg, mug))
        assert torch.isfinite(loss) and torch.isfinite(dh).all() and torch.isfinite(dmu).all(), backend


def test_reduced_losses_are_bitwise_identical_for_any_number_of_threads():
    """The per-pair losses do not depend on the thread count, and neither do their sum and mean (a plain
    float32 sum over 44,850 pairs differs in the last bit between 1 and 2 threads)."""
    gen = torch.Generator().manual_seed(0)
    B, n = 300, 40
    h = torch.randn(B, 16, generator=gen)
    mu = torch.randn(n, 16, generator=gen) * 0.7
    D = reference.stochastic_dissimilarity(h, mu, 1.0)
    labels = torch.randint(0, n, (B,), generator=gen)
    previous = torch.get_num_threads()
    results = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results[threads] = [
                sol_ext.order_loss(D_, labels, reduction=reduction, backend=backend)
                for D_ in (D, D.double())
                for reduction in ("sum", "mean")
                for backend in ("fused", "reference")
            ] + [sol_ext.StochasticOrderLoss(n, reduction="sum")(h, labels, mu)]
    finally:
        torch.set_num_threads(previous)
    for one, two in zip(results[1], results[2]):
        assert torch.equal(one, two), f"{one.item()!r} (1 thread) != {two.item()!r} (2 threads)"


@pytest.mark.parametrize("B, d", [(6000, 6), (256, 512), (700, 512)])  # one row block, one, three
def test_dissimilarity_and_its_gradients_are_bitwise_identical_for_any_number_of_threads(B, d):
    """D, dh and dmu of the fused op on the CPU: a row block's matrix products stay on one thread (MKL
    on two splits dmu's sum over the rows differently), so one block or several give the same bits on
    one thread and on two."""
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(B, d, generator=gen).requires_grad_()
    mu = torch.randn(7, d, generator=gen).requires_grad_()
    weights = torch.randn(B, 7, generator=gen)
    previous = torch.get_num_threads()
    results = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            D = sol_ext.stochastic_dissimilarity(h, mu, 0.8, backend="fused")
            results[threads] = (D, *torch.autograd.grad((D * weights).sum(), (h, mu)))
    finally:
        torch.set_num_threads(previous)
    for name, one, two in zip(("D", "dh", "dmu"), results[1], results[2]):
        assert torch.equal(one, two), f"{name}: 1 thread and 2 threads differ by {(one - two).abs().max().item()}"


@pytest.mark.parametrize("count", [1, 7, 4096, 4097, 9000])
def test_fixed_order_sum_adds_in_blocks_in_order(count):
    """The CPU reduction's order: in float64, each block of 4096 losses from first to last, then the block
    sums in order (one block needs no padding)."""
    from sol_ext._reduction import _fixed_order_sum

    losses = torch.randn(count, generator=torch.Generator().manual_seed(count), dtype=torch.float32) * 1e3
    values = losses.double().tolist()
    total = 0.0
    for start in range(0, count, 4096):
        block = 0.0
        for v in values[start:start + 4096]:
            block += v
        total += block
    assert _fixed_order_sum(losses).item() == total


def test_the_library_does_not_reduce_through_the_reference(monkeypatch):
    """The reference is only the test oracle: editing its reduction must not change the numbers users get."""
    def oracle_only(losses, reduction):
        if reduction != "none":
            raise AssertionError("a production path reduced through sol_ext.reference.reduce_losses")
        return losses

    monkeypatch.setattr(reference, "reduce_losses", oracle_only)
    gen = torch.Generator().manual_seed(0)
    h, mu = torch.randn(40, 3, generator=gen, dtype=torch.float64), torch.randn(5, 3, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (40,), generator=gen)
    D = sol_ext.stochastic_dissimilarity(h, mu)
    for backend in ("fused", "reference"):
        for reduction in ("mean", "sum"):
            sol_ext.order_loss(D, labels, reduction=reduction, backend=backend, algorithm="pairwise")
            sol_ext.disc_loss(D, labels, reduction=reduction, backend=backend)
            for algorithm in ("pairwise", "grouped"):
                sol_ext.StochasticOrderLoss(5, reduction=reduction, backend=backend, algorithm=algorithm)(h, labels, mu)
    sol_ext.order_loss(D, labels, algorithm="grouped")
