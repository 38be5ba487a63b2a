"""CUDA-only properties of the fused kernels (csrc/cuda/*_kernel.cu).

The device/dtype-parametrized comparisons against the reference live in test_ops.py; this file adds
what only the CUDA build has: float16/bfloat16 accuracy (within 2x of PyTorch's own half-precision
reference error, both measured against float64), CPU-vs-CUDA agreement on the kernel's tiling edge
cases (rank groups, y segments, two rows per warp, the one-pass backward's tiles), bitwise reproducibility, the deterministic mode of
the explicit-pairs backward, gradcheck/opcheck on the GPU, bad and empty inputs on CUDA tensors.
"""
from __future__ import annotations

import os

import pytest
import torch
from torch.library import opcheck

import sol_ext
from common import CUDA_REASON, assert_rel_close, cuda_ready, random_labels, random_pairs
from sol_ext import reference

pytestmark = pytest.mark.skipif(not cuda_ready(), reason=CUDA_REASON)

ops = torch.ops.sol_ext
HALF_DTYPES = [torch.float16, torch.bfloat16]
LOSS_ARGS = dict(sigma=1.3, tau=2, margin=0.25)


def make_D(B: int, n: int, seed: int, device="cuda", dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    """A realistic D: the dissimilarities of random embeddings, computed in float64."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(B, 16, generator=gen, dtype=torch.float64)
    mu = torch.randn(n, 16, generator=gen, dtype=torch.float64) * 0.7
    return (reference.stochastic_dissimilarity(h, mu, 1.0) * scale).to(device, dtype)


def inputs(B: int, n: int, seed: int, explicit: bool, device="cuda", dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed + 1000)
    D = make_D(B, n, seed, device, dtype)
    labels = random_labels(B, n, gen, device)
    pairs = random_pairs(B, 3 * B + 5, gen, device) if explicit and B > 0 else None
    return D, labels, pairs


def max_err(actual: torch.Tensor, exact: torch.Tensor) -> float:
    return (actual.double().cpu() - exact.double().cpu()).abs().max().item() if exact.numel() else 0.0


def assert_within_2x_of_torch(fused, torch_half, exact, dtype, what):
    """Fused error <= 2x the error of PyTorch's own half-precision computation (+ one rounding of the result)."""
    scale = exact.double().abs().max().item() if exact.numel() else 0.0
    fused_err, torch_err = max_err(fused, exact), max_err(torch_half, exact)
    allowed = 2 * torch_err + torch.finfo(dtype).eps * scale
    assert fused_err <= allowed, f"{what} ({dtype}): fused error {fused_err:.3e} > 2 x torch's {torch_err:.3e} (+eps)"


@pytest.fixture(params=["separate", "fused"])
def centroid_kernels(request, monkeypatch):
    """A dissimilarity test under both implementations of the centroid side of the CUDA dissimilarity
    (SOL_EXT_CUDA_DISSIMILARITY, read at each call)."""
    monkeypatch.setenv("SOL_EXT_CUDA_DISSIMILARITY", request.param)
    return request.param


# -------------------------------------------------------------------------------------------------
# float16 / bfloat16 accuracy
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("B,n,d", [(37, 11, 64), (64, 60, 512), (5, 300, 33)])
def test_half_dissimilarity_accuracy(dtype, B, n, d, centroid_kernels):
    gen = torch.Generator().manual_seed(B * n + d)
    h = (torch.randn(B, d, generator=gen, dtype=torch.float64) / d**0.5).to("cuda", dtype)
    mu = (torch.randn(n, d, generator=gen, dtype=torch.float64) / d**0.5).to("cuda", dtype)
    upstream = torch.randn(B, n, generator=gen, dtype=torch.float64).to("cuda", dtype)
    results = {}
    for name, x, m, fn in (
        ("fused", h, mu, lambda a, b: sol_ext.stochastic_dissimilarity(a, b, 1.3, backend="fused")),
        ("torch", h, mu, lambda a, b: reference.stochastic_dissimilarity(a, b, 1.3)),
        ("exact", h.double(), mu.double(), lambda a, b: reference.stochastic_dissimilarity(a, b, 1.3)),
    ):
        x, m = x.clone().requires_grad_(), m.clone().requires_grad_()
        D = fn(x, m)
        results[name] = (D, *torch.autograd.grad(D, (x, m), upstream.to(D.dtype)))
    assert results["fused"][0].dtype == dtype
    for i, what in enumerate(("D", "dh", "dmu")):
        assert results["fused"][i].dtype == dtype, what
        assert_within_2x_of_torch(results["fused"][i], results["torch"][i], results["exact"][i], dtype, what)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("convention", ["paper", "official"])
@pytest.mark.parametrize("B,n", [(64, 30), (130, 101)])
def test_half_order_and_disc_loss_accuracy(dtype, explicit, convention, B, n):
    D64, labels, pairs = inputs(B, n, seed=B + n, explicit=explicit)
    D_half = D64.to(dtype)
    D_exact = D_half.double()  # the half inputs, exactly
    M = sol_ext.ops._ops.order_loss(D_half, labels, pairs, convention=convention, **LOSS_ARGS).shape[0]
    gen = torch.Generator().manual_seed(7)
    up_order = torch.randn(M, generator=gen, dtype=torch.float64).to("cuda", dtype)
    up_disc = torch.randn(B, generator=gen, dtype=torch.float64).to("cuda", dtype)
    results = {}
    for name, D, backend in (("fused", D_half, "fused"), ("torch", D_half, "reference"), ("exact", D_exact, "reference")):
        D = D.clone().requires_grad_()
        order = sol_ext.order_loss(D, labels, pairs, convention=convention, reduction="none", backend=backend, **LOSS_ARGS)
        disc = sol_ext.disc_loss(D, labels, T=2, reduction="none", backend=backend)
        (g_order,) = torch.autograd.grad(order, D, up_order.to(D.dtype))
        (g_disc,) = torch.autograd.grad(disc, D, up_disc.to(D.dtype))
        results[name] = (order, g_order, disc, g_disc)
    for i, what in enumerate(("order loss", "d order / dD", "disc loss", "d disc / dD")):
        assert results["fused"][i].dtype == dtype, what
        assert_within_2x_of_torch(results["fused"][i], results["torch"][i], results["exact"][i], dtype, what)


def test_half_module_runs_fused_and_is_finite():
    B, n, d = 48, 20, 32
    gen = torch.Generator().manual_seed(3)
    for dtype in HALF_DTYPES:
        h = torch.randn(B, d, generator=gen).to("cuda", dtype).requires_grad_()
        mu = torch.randn(n, d, generator=gen).to("cuda", dtype).requires_grad_()
        labels = random_labels(B, n, gen, "cuda")
        loss = sol_ext.StochasticOrderLoss(n, backend="fused")(h, labels, mu)
        dh, dmu = torch.autograd.grad(loss, (h, mu))
        assert loss.dtype == torch.float32 and dh.dtype == dmu.dtype == dtype  # reduced in float32
        assert torch.isfinite(loss) and torch.isfinite(dh).all() and torch.isfinite(dmu).all()


# -------------------------------------------------------------------------------------------------
# CPU vs CUDA, float64, on the CUDA kernels' tiling edge cases
# -------------------------------------------------------------------------------------------------

# (B, n): tails of the 4x4 forward micro-tile, one and several rank chunks, two rank groups (n > 256),
# y segments (B >= 64), B < 32 (one segment), n == 1.
SHAPES = [(2, 1), (3, 5), (17, 33), (31, 64), (64, 60), (70, 257), (150, 300), (301, 9)]


@pytest.mark.parametrize("B,n", SHAPES)
@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("convention", ["paper", "official"])
def test_cpu_and_cuda_agree(B, n, explicit, convention):
    D, labels, pairs = inputs(B, n, seed=B * 1000 + n, explicit=explicit)
    gen = torch.Generator().manual_seed(B + n)
    args = dict(convention=convention, **LOSS_ARGS)
    out_cuda = ops.order_loss(D, labels, pairs, args["sigma"], args["tau"], args["margin"], convention)
    out_cpu = ops.order_loss(D.cpu(), labels.cpu(), None if pairs is None else pairs.cpu(),
                             args["sigma"], args["tau"], args["margin"], convention)
    assert_rel_close(out_cuda.cpu(), out_cpu, 1e-12, "order loss")
    g = torch.randn(out_cpu.shape, generator=gen, dtype=torch.float64)
    grad_cuda = ops._order_loss_backward(g.cuda(), D, labels, pairs, args["sigma"], args["tau"], args["margin"], convention)
    grad_cpu = ops._order_loss_backward(g, D.cpu(), labels.cpu(), None if pairs is None else pairs.cpu(),
                                        args["sigma"], args["tau"], args["margin"], convention)
    assert_rel_close(grad_cuda.cpu(), grad_cpu, 1e-12, "d order / dD")
    for T in (1, 3):
        assert_rel_close(ops.disc_loss(D, labels, T).cpu(), ops.disc_loss(D.cpu(), labels.cpu(), T), 1e-12, "disc")
        gd = torch.randn(B, generator=gen, dtype=torch.float64)
        assert_rel_close(ops._disc_loss_backward(gd.cuda(), labels, n, T).cpu(),
                         ops._disc_loss_backward(gd, labels.cpu(), n, T), 1e-12, "d disc / dD")


@pytest.mark.parametrize("B,n,d", [(1, 1, 1), (33, 7, 100), (129, 300, 40)])
def test_cpu_and_cuda_agree_dissimilarity(B, n, d, centroid_kernels):
    gen = torch.Generator().manual_seed(B + n + d)
    h = torch.randn(B, d, generator=gen, dtype=torch.float64)
    mu = torch.randn(n, d, generator=gen, dtype=torch.float64)
    g = torch.randn(B, n, generator=gen, dtype=torch.float64)
    assert_rel_close(ops.stochastic_dissimilarity(h.cuda(), mu.cuda(), 0.8).cpu(),
                     ops.stochastic_dissimilarity(h, mu, 0.8), 1e-12, "D")
    for got, want, what in zip(ops._stochastic_dissimilarity_backward(g.cuda(), h.cuda(), mu.cuda(), 0.8, True, True),
                               ops._stochastic_dissimilarity_backward(g, h, mu, 0.8, True, True), ("dh", "dmu")):
        assert_rel_close(got.cpu(), want, 1e-12, what)


def test_float32_two_rows_per_warp_matches_cpu(monkeypatch):
    """A batch large enough for the two-rows-per-warp backward (float32 only; needs B/2 >= 8 warps per SM)
    against the CPU kernel in float32, which makes the same float32 hinge decisions. ("auto" would choose
    the one-pass kernel at this size.)"""
    monkeypatch.setenv("SOL_EXT_CUDA_ALL_PAIRS_BACKWARD", "two_pass")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    B, n = max(2400, 16 * sms + 2), 24
    D, labels, _ = inputs(B, n, seed=11, explicit=False, dtype=torch.float32)
    g = torch.ones(1, dtype=torch.float32, device="cuda").expand(B * (B - 1) // 2)
    args = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    got = ops._order_loss_backward(g, D, labels, *args)
    want = ops._order_loss_backward(g.cpu(), D.cpu(), labels.cpu(), *args)
    assert_rel_close(got.cpu(), want, 2e-5, "d order / dD (float32)")
    assert_rel_close(ops.order_loss(D, labels, *args).cpu(), ops.order_loss(D.cpu(), labels.cpu(), *args), 2e-5, "loss")


def test_cuda_matches_reference_float32():
    D, labels, _ = inputs(200, 80, seed=5, explicit=False, dtype=torch.float32)
    D = D.requires_grad_()
    fused = sol_ext.order_loss(D, labels, reduction="sum", backend="fused", **LOSS_ARGS)
    ref = sol_ext.order_loss(D, labels, reduction="sum", backend="reference", **LOSS_ARGS)
    assert_rel_close(fused, ref, 1e-5, "loss")
    assert_rel_close(torch.autograd.grad(fused, D)[0], torch.autograd.grad(ref, D)[0], 1e-5, "dD")


# -------------------------------------------------------------------------------------------------
# Determinism
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("B,n", [(64, 60), (700, 101), (1000, 130)])  # (1000, 130): the one-pass kernel
def test_all_pairs_backward_is_bitwise_reproducible(dtype, B, n):
    D, labels, _ = inputs(B, n, seed=B + n, explicit=False, dtype=dtype)
    M = B * (B - 1) // 2
    g = torch.randn(M, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to("cuda", dtype)
    args = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    first = ops._order_loss_backward(g, D, labels, *args)
    for _ in range(3):
        assert torch.equal(ops._order_loss_backward(g, D, labels, *args), first)
    assert torch.equal(ops.order_loss(D, labels, *args), ops.order_loss(D, labels, *args))


def test_stride_zero_upstream_gradient_is_read_in_place():
    D, labels, pairs = inputs(90, 40, seed=2, explicit=False)
    M = 90 * 89 // 2
    args = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    expanded = torch.full((1,), 0.5, dtype=torch.float64, device="cuda").expand(M)
    assert expanded.stride(0) == 0
    assert torch.equal(ops._order_loss_backward(expanded, D, labels, *args),
                       ops._order_loss_backward(expanded.contiguous(), D, labels, *args))
    strided = torch.randn(2 * M, dtype=torch.float64, device="cuda")[::2]
    assert torch.equal(ops._order_loss_backward(strided, D, labels, *args),
                       ops._order_loss_backward(strided.contiguous(), D, labels, *args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_explicit_pairs_deterministic_mode_is_bitwise_reproducible(dtype):
    B, n = 300, 70
    D, labels, pairs = inputs(B, n, seed=9, explicit=True, dtype=dtype)
    pairs = torch.cat([pairs, pairs[:50]])  # many pairs per row, repeats
    g = torch.randn(pairs.shape[0], generator=torch.Generator().manual_seed(4), dtype=torch.float64).to("cuda", dtype)
    args = (pairs, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "official")
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        first = ops._order_loss_backward(g, D, labels, *args)
        for _ in range(3):
            assert torch.equal(ops._order_loss_backward(g, D, labels, *args), first)
    finally:
        torch.use_deterministic_algorithms(previous)
    # The deterministic (row-owned) and the atomic path agree to rounding.
    atomic = ops._order_loss_backward(g, D, labels, *args)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert_rel_close(atomic, first, tol, "atomic vs deterministic")
    if dtype in (torch.float32, torch.float64):  # the CPU kernels take these; same hinge decisions
        cpu = ops._order_loss_backward(g.cpu(), D.cpu(), labels.cpu(), pairs.cpu(), *args[1:])
        assert_rel_close(first.cpu(), cpu, tol, "deterministic vs CPU")


def _cuda_kernel_names(step) -> set:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize("n,d,fused_runs", [(1, 5, True), (60, 512, True), (217, 512, True), (300, 1000, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fused_centroid_side_matches_the_separate_one(monkeypatch, n, d, fused_runs, dtype):
    """SOL_EXT_CUDA_DISSIMILARITY=fused: D and both gradients as with the torch operations (sums in another
    order: to 1e-12 in float64, 2e-5 in float32), its two kernels run in both passes up to 1024
    multiply-adds per thread (n ceil(d / 256)) and not beyond (checked on the float32 cases), and a NaN in
    mu gives a NaN D with both."""
    gen = torch.Generator().manual_seed(n + d)
    h = (torch.randn(70, d, generator=gen, dtype=torch.float64) / d**0.5 + 3).to("cuda", dtype)
    mu = (torch.randn(n, d, generator=gen, dtype=torch.float64) / d**0.5 + 3).to("cuda", dtype)
    upstream = torch.randn(70, n, generator=gen, dtype=torch.float64).to("cuda", dtype)
    results, kernels = {}, {}
    for setting in ("separate", "fused"):
        monkeypatch.setenv("SOL_EXT_CUDA_DISSIMILARITY", setting)
        D = ops.stochastic_dissimilarity(h, mu, 1.3)
        results[setting] = (D, *ops._stochastic_dissimilarity_backward(upstream, h, mu, 1.3, True, True))
        if dtype == torch.float32:  # which kernels run depends on (n, d) alone: profiled once per shape
            kernels[setting] = [
                _cuda_kernel_names(lambda: ops.stochastic_dissimilarity(h, mu, 1.3)),
                _cuda_kernel_names(lambda: ops._stochastic_dissimilarity_backward(upstream, h, mu, 1.3, True, True)),
            ]
        if n > 1:
            bad = mu.clone()
            bad[1, 0] = float("nan")
            assert torch.isnan(ops.stochastic_dissimilarity(h, bad, 1.3)).all(), setting
    tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 1e-2}[dtype]
    for what, got, want in zip(("D", "dh", "dmu"), results["fused"], results["separate"]):
        assert_rel_close(got, want, tol, what)
    for forward_or_backward in range(2 if kernels else 0):
        assert any("smooth_centroids_kernel" in k for k in kernels["fused"][forward_or_backward]) == fused_runs
        assert not any("smooth_centroids_kernel" in k for k in kernels["separate"][forward_or_backward])


def test_unknown_centroid_side_choice_is_refused(monkeypatch):
    monkeypatch.setenv("SOL_EXT_CUDA_DISSIMILARITY", "fastest")
    with pytest.raises(RuntimeError, match="SOL_EXT_CUDA_DISSIMILARITY must be separate or fused, got 'fastest'"):
        ops.stochastic_dissimilarity(torch.randn(4, 3, device="cuda"), torch.randn(2, 3, device="cuda"), 1.0)


# -------------------------------------------------------------------------------------------------
# gradcheck and opcheck on the GPU
# -------------------------------------------------------------------------------------------------


def test_gradcheck_cuda_dissimilarity(centroid_kernels):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(5, 4, generator=gen, dtype=torch.float64).cuda().requires_grad_()
    mu = torch.randn(3, 4, generator=gen, dtype=torch.float64).cuda().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: sol_ext.stochastic_dissimilarity(a, b, 0.9, backend="fused"), (h, mu))


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("convention", ["paper", "official"])
def test_gradcheck_cuda_losses(explicit, convention):
    D, labels, pairs = inputs(9, 6, seed=3, explicit=explicit)
    D = D.requires_grad_()
    def fn(D):
        return sol_ext.order_loss(D, labels, pairs, convention=convention, reduction="none", backend="fused", **LOSS_ARGS)

    # The explicit-pair backward uses atomics outside deterministic mode: allow its rounding noise.
    assert torch.autograd.gradcheck(fn, (D,), nondet_tol=1e-12 if explicit else 0.0)
    assert torch.autograd.gradcheck(lambda D: sol_ext.disc_loss(D, labels, 2, reduction="none", backend="fused"), (D,))


def _opcheck_cases():
    D, labels, pairs = inputs(12, 7, seed=4, explicit=True)
    h = torch.randn(12, 5, dtype=torch.float64, device="cuda")
    mu = torch.randn(7, 5, dtype=torch.float64, device="cuda")
    M_all = 12 * 11 // 2
    g_all = torch.randn(M_all, dtype=torch.float64, device="cuda")
    g_pairs = torch.randn(pairs.shape[0], dtype=torch.float64, device="cuda")
    c = (1.1, 2, 0.3, "paper")
    return {
        "stochastic_dissimilarity": (ops.stochastic_dissimilarity, (h, mu, 1.1)),
        "_stochastic_dissimilarity_backward": (ops._stochastic_dissimilarity_backward,
                                               (torch.randn(12, 7, dtype=torch.float64, device="cuda"), h, mu, 1.1, True, True)),
        "ordering_probabilities": (ops.ordering_probabilities, (labels, labels.flip(0), 7, 1.1, 2, "official", torch.float32)),
        "order_loss_all": (ops.order_loss, (D, labels, None, *c)),
        "order_loss_pairs": (ops.order_loss, (D, labels, pairs, *c)),
        "_order_loss_backward_all": (ops._order_loss_backward, (g_all, D, labels, None, *c)),
        "_order_loss_backward_pairs": (ops._order_loss_backward, (g_pairs, D, labels, pairs, *c)),
        "disc_loss": (ops.disc_loss, (D, labels, 2)),
        "_disc_loss_backward": (ops._disc_loss_backward, (torch.randn(12, dtype=torch.float64, device="cuda"), labels, 7, 2)),
    }


OPCHECK_CASES = [
    "stochastic_dissimilarity", "_stochastic_dissimilarity_backward", "ordering_probabilities", "order_loss_all",
    "order_loss_pairs", "_order_loss_backward_all", "_order_loss_backward_pairs", "disc_loss", "_disc_loss_backward",
]


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck_cuda(case):
    op, args = _opcheck_cases()[case]
    opcheck(op, args)


# -------------------------------------------------------------------------------------------------
# Bad and empty inputs on CUDA tensors
# -------------------------------------------------------------------------------------------------


def test_bad_inputs_on_cuda_raise():
    D, labels, pairs = inputs(6, 4, seed=1, explicit=True)
    c = (1.0, 1, 0.25, "paper")
    with pytest.raises(RuntimeError, match="device"):
        ops.order_loss(D, labels.cpu(), None, *c)
    with pytest.raises(RuntimeError, match="device"):
        ops.order_loss(D, labels, pairs.cpu(), *c)
    with pytest.raises(RuntimeError, match="int64"):
        ops.order_loss(D, labels.int(), None, *c)
    with pytest.raises(RuntimeError, match="shape"):
        ops.order_loss(D, labels[:-1], None, *c)
    with pytest.raises(RuntimeError, match="shape"):
        ops.order_loss(D, labels, pairs[:, :1], *c)
    with pytest.raises(RuntimeError, match="convention"):
        ops.order_loss(D, labels, None, 1.0, 1, 0.25, "nope")
    with pytest.raises(RuntimeError, match="sigma"):
        ops.order_loss(D, labels, None, -1.0, 1, 0.25, "paper")
    with pytest.raises(RuntimeError, match="grad_losses"):
        ops._order_loss_backward(torch.ones(3, dtype=D.dtype, device="cuda"), D, labels, None, *c)
    with pytest.raises(RuntimeError, match="floating"):
        ops.disc_loss(D.long(), labels, 1)
    with pytest.raises(RuntimeError):
        ops.stochastic_dissimilarity(torch.randn(3, 4, device="cuda"), torch.randn(2, 5, device="cuda"), 1.0)
    with pytest.raises(RuntimeError, match="device"):
        ops.stochastic_dissimilarity(torch.randn(3, 4, device="cuda"), torch.randn(2, 4), 1.0)
    # The public API validates label and pair ranges before any kernel runs (no device assert).
    with pytest.raises((ValueError, IndexError)):
        sol_ext.order_loss(D, labels + 10, backend="fused")
    with pytest.raises((ValueError, IndexError)):
        sol_ext.order_loss(D, labels, pairs + 100, backend="fused")


@pytest.mark.parametrize("B", [0, 1])
@pytest.mark.parametrize("explicit", [False, True])
def test_empty_inputs_on_cuda(B, explicit):
    n, d = 5, 3
    h = torch.randn(B, d, device="cuda", dtype=torch.float32, requires_grad=True)
    mu = torch.randn(n, d, device="cuda", dtype=torch.float32, requires_grad=True)
    labels = torch.zeros(B, dtype=torch.long, device="cuda")
    pairs = torch.zeros(0, 2, dtype=torch.long, device="cuda") if explicit else None
    D = sol_ext.stochastic_dissimilarity(h, mu, backend="fused")
    assert D.shape == (B, n)
    order = sol_ext.order_loss(D, labels, pairs, reduction="none", backend="fused")
    assert order.shape == (0,)
    disc = sol_ext.disc_loss(D, labels, reduction="none", backend="fused")
    assert disc.shape == (B,)
    total = sol_ext.order_loss(D, labels, pairs, backend="fused") + sol_ext.disc_loss(D, labels, backend="fused")
    assert total.item() == 0.0 or B == 1
    dh, dmu = torch.autograd.grad(total, (h, mu))
    assert dh.shape == (B, d) and dmu.shape == (n, d)
    assert torch.isfinite(dh).all() and torch.isfinite(dmu).all()
    probs = ops.ordering_probabilities(labels, labels, n, 1.0, 1, "paper", torch.float32)
    assert probs.shape == (B, 3)
    empty_g = torch.zeros(0, device="cuda", dtype=torch.float32)
    grad = ops._order_loss_backward(empty_g, D.detach(), labels, pairs, 1.0, 1, 0.25, "paper")
    assert grad.shape == (B, n) and (grad == 0).all()


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_fused_reductions_accumulate_in_float32(dtype):
    """The B = 48, n = 20 float16 per-pair losses sum past 65,504; the reduced loss is float32 and exact."""
    D, labels, _ = inputs(48, 20, seed=3, explicit=False, dtype=dtype)
    losses = sol_ext.order_loss(D, labels, reduction="none", backend="fused")
    assert losses.dtype == dtype and torch.isfinite(losses).all()
    for reduction, count in (("sum", 1), ("mean", losses.shape[0])):
        total = sol_ext.order_loss(D, labels, reduction=reduction, backend="fused")
        assert total.dtype == torch.float32
        torch.testing.assert_close(total.double(), losses.double().sum() / count, rtol=1e-6, atol=0)
    if dtype == torch.float16:
        assert losses.double().sum() > torch.finfo(torch.float16).max


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_autocast_training_step_on_cuda(dtype):
    """torch.autocast("cuda"): float16 with a GradScaler, bfloat16 without; float32 centroids, fused kernels."""
    import copy

    from test_mixed_precision import amp_problem, assert_amp_step_matches_float32, training_step

    encoder, x, labels, mu = amp_problem("cuda")
    criterion = sol_ext.StochasticOrderLoss(12, backend="fused")
    full = training_step(copy.deepcopy(encoder), x, labels, mu, criterion)
    # A scale that keeps the float16 gradient of h (|dL/dh| ~ 3) finite, so that the step is taken.
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10) if dtype == torch.float16 else None
    amp = training_step(copy.deepcopy(encoder), x, labels, mu, criterion, dtype, scaler=scaler)
    assert amp[0] == dtype
    if scaler:
        assert scaler.get_scale() == 2.0**10  # no inf/NaN gradient: the step was not skipped
    assert_amp_step_matches_float32(amp, full, tol=0.03)


# -------------------------------------------------------------------------------------------------
# Numerical hardening: NaN, margin rounding, TF32, device-independent plans, stream safety
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, *HALF_DTYPES])
@pytest.mark.parametrize("explicit", [False, True])
def test_nan_in_D_gives_nan_on_cuda_like_the_reference(dtype, explicit):
    """Both forward kernels (all-pairs micro-tiles, explicit pairs) keep a NaN, as the reference does."""
    D, labels, pairs = inputs(40, 12, seed=6, explicit=explicit, dtype=dtype)
    D[3, 5] = float("nan")
    c = (LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    fused = ops.order_loss(D, labels, pairs, *c)
    ref = reference.order_loss(D, labels, pairs, *c, reduction="none")
    assert fused.isnan().any()
    assert torch.equal(fused.isnan(), ref.isnan())
    if dtype in (torch.float32, torch.float64):
        cpu = ops.order_loss(D.cpu(), labels.cpu(), None if pairs is None else pairs.cpu(), *c)
        assert torch.equal(fused.isnan().cpu(), cpu.isnan())


@pytest.mark.parametrize("dtype, margin", [(torch.bfloat16, 0.1), (torch.float16, 0.3)])
@pytest.mark.parametrize("explicit", [False, True])
def test_half_margin_is_not_rounded_to_the_input_dtype(dtype, margin, explicit):
    """At delta = -round(margin) the reference's |delta| - margin (margin in float32) is positive; a margin
    rounded to bfloat16/float16 first would make it 0 and switch the Pr(x ~ y) term off."""
    n = 6
    delta = -torch.tensor(margin, dtype=dtype)
    assert delta.abs().float() > margin  # round(margin) lies above margin
    D = torch.zeros(2, n, dtype=dtype, device="cuda")
    D[0] = delta
    labels = torch.tensor([2, 2], device="cuda")
    pairs = torch.tensor([[0, 1]], device="cuda") if explicit else None
    # sigma -> 0: P is the identity, so equal labels with tau = 1 give Pr(x ~ y) = 1, Pr(x < y) = Pr(x > y) = 0.
    args = dict(sigma=1e-3, tau=1, margin=margin, reduction="none")
    results = {}
    for backend in ("fused", "reference"):
        D_ = D.clone().requires_grad_()
        loss = sol_ext.order_loss(D_, labels, pairs, backend=backend, **args)
        results[backend] = (loss, *torch.autograd.grad(loss.sum(), D_))
    assert results["reference"][0].item() > 0
    assert torch.equal(results["fused"][0], results["reference"][0])
    assert torch.equal(results["fused"][1], results["reference"][1])


def test_float32_dissimilarity_ignores_the_tf32_settings(centroid_kernels):
    """D and its gradients are the same bits with TF32 allowed and forbidden, and float32-accurate."""
    gen = torch.Generator().manual_seed(8)
    h = torch.randn(64, 512, generator=gen).cuda().requires_grad_()
    mu = torch.randn(30, 512, generator=gen).cuda().requires_grad_()
    upstream = torch.randn(64, 30, generator=gen).cuda()
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    results = {}
    try:
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
            D = sol_ext.stochastic_dissimilarity(h, mu, 1.0, backend="fused")
            results[tf32] = (D, *torch.autograd.grad(D, (h, mu), upstream))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous[0]
        torch.set_float32_matmul_precision(previous[1])
    for name, off, on in zip(("D", "dh", "dmu"), results[False], results[True]):
        assert torch.equal(off, on), f"{name} changes with TF32"
    h64, mu64 = h.detach().double().requires_grad_(), mu.detach().double().requires_grad_()
    exact = reference.stochastic_dissimilarity(h64, mu64, 1.0)
    exact_grads = torch.autograd.grad(exact, (h64, mu64), upstream.double())
    for name, got, want in zip(("D", "dh", "dmu"), results[True], (exact, *exact_grads)):
        assert_rel_close(got, want.float(), 1e-5, name)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _backward_target_warps() -> int:
    return int(os.environ.get("SOL_EXT_CUDA_BACKWARD_WARPS") or 4096)  # kBackwardTargetWarps


def _planned_segments(B: int, n: int, dtype: torch.dtype) -> int:
    """The y segments of the two-pass all-pairs backward, as order_loss_all_pairs_kernel.cu plans them from
    the shape alone."""
    groups = ceil_div(ceil_div(n, 32), 8)
    target = _backward_target_warps()
    two_rows = dtype != torch.float64 and ceil_div(B, 2) * groups >= target // 2
    warps = (ceil_div(B, 2) if two_rows else B) * groups
    segments = min(max(1, min(ceil_div(target, warps), B // 32)), 64)
    return ceil_div(B, ceil_div(B, segments))


def _planned_one_pass_rows(B: int, n: int, dtype: torch.dtype, choice: str = "auto") -> int:
    """Rows per warp of the one-pass all-pairs backward (tiles of 8 of them), or 0 for the two-pass kernel,
    as one_pass_rows_per_warp plans them from the shape alone."""
    if choice == "two_pass":
        return 0
    acc_bytes = 8 if dtype == torch.float64 else 4
    for rows in (32, 16, 8):
        if dtype == torch.float64 and rows > 8:
            continue
        tiles = ceil_div(B, 8 * rows)
        if tiles * B * n * acc_bytes > 64 << 20:
            return 0
        if choice == "one_pass" or tiles * (tiles + 1) // 2 * ceil_div(n, 32) * 8 >= _backward_target_warps():
            return rows
    return 0


def _backward_launches(tmp_path, D, labels, args) -> list[tuple[str, list[int]]]:
    """(kernel name, grid) of every all-pairs backward kernel one backward call launches, from the profiler."""
    import json

    g = torch.ones(D.shape[0] * (D.shape[0] - 1) // 2, dtype=D.dtype, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        ops._order_loss_backward(g, D, labels, *args)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    return [(e["name"], e["args"]["grid"]) for e in events
            if e.get("cat") == "kernel" and "order_loss_all_pairs_backward" in e.get("name", "")]


@pytest.mark.parametrize("B,n,dtype", [(1030, 24, torch.float32), (300, 50, torch.float64), (700, 101, torch.float32),
                                       (150, 300, torch.float16)])
def test_all_pairs_backward_plan_depends_on_the_shape_only(tmp_path, B, n, dtype):
    """The launch grid's y segments (which set the summation order) follow the shape, whatever the GPU's
    SM count: read from the profiler's record of the kernel launch."""
    assert _planned_one_pass_rows(B, n, dtype) == 0  # shapes of the two-pass kernel
    D, labels, _ = inputs(B, n, seed=B + n, explicit=False, dtype=dtype)
    args = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    launches = _backward_launches(tmp_path, D, labels, args)
    assert [name for name, _ in launches if "one_pass" in name] == []
    grids = [grid for name, grid in launches if "order_loss_all_pairs_backward_kernel" in name]
    assert len(grids) == 1, launches
    assert grids[0][2] == _planned_segments(B, n, dtype)


@pytest.mark.parametrize("B,n,dtype,rows", [(1000, 130, torch.float32, 8), (1000, 130, torch.float64, 8),
                                            (2600, 97, torch.float32, 16), (2900, 200, torch.float32, 32),
                                            (2900, 200, torch.bfloat16, 32)])
def test_one_pass_backward_plan_depends_on_the_shape_only(tmp_path, B, n, dtype, rows):
    """Large batches take the one-pass kernel, with tiles and grid (T, T, ceil(n/32)) from the shape alone."""
    assert _planned_one_pass_rows(B, n, dtype) == rows
    D, labels, _ = inputs(B, n, seed=B + n, explicit=False, dtype=dtype)
    args = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    launches = _backward_launches(tmp_path, D, labels, args)
    assert len(launches) == 1 and "one_pass" in launches[0][0], launches
    tiles = ceil_div(B, 8 * rows)
    assert launches[0][1] == [tiles, tiles, ceil_div(n, 32)]


# (B, n, choice): "auto" at sizes where it picks the one-pass kernel (tiles of 64, 128 and 256 rows, partial
# last tiles, a partial last rank chunk), and "one_pass" forced on small batches: one diagonal tile (B <= S),
# a diagonal and an off-diagonal tile, n == 1, B == 2.
ONE_PASS_SHAPES = [(1000, 130, "auto"), (2600, 97, "auto"), (2900, 200, "auto"), (70, 257, "one_pass"),
                   (300, 9, "one_pass"), (513, 33, "one_pass"), (2, 1, "one_pass")]


@pytest.mark.parametrize("B,n,choice", ONE_PASS_SHAPES)
@pytest.mark.parametrize("convention", ["paper", "official"])
def test_one_pass_backward_matches_the_cpu_kernel(monkeypatch, B, n, choice, convention):
    """float64: the one-pass kernel against the CPU kernel to 1e-12; float32: to 2e-5 (the same float32 hinge
    decisions, sums in another order), and against the two-pass kernel on the GPU."""
    monkeypatch.setenv("SOL_EXT_CUDA_ALL_PAIRS_BACKWARD", choice)
    args = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], convention)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        if B * B * n > 4e8 and dtype == torch.float64:
            continue  # the float32 case covers the largest tiles; float64 keeps 64-row tiles
        assert _planned_one_pass_rows(B, n, dtype, choice) > 0
        D, labels, _ = inputs(B, n, seed=B * 7 + n, explicit=False, dtype=dtype)
        g = torch.randn(B * (B - 1) // 2, generator=torch.Generator().manual_seed(B), dtype=torch.float64).to(dtype)
        got = ops._order_loss_backward(g.cuda(), D, labels, *args)
        want = ops._order_loss_backward(g, D.cpu(), labels.cpu(), *args)
        assert_rel_close(got.cpu(), want, tol, f"one-pass d order / dD ({dtype})")
        monkeypatch.setenv("SOL_EXT_CUDA_ALL_PAIRS_BACKWARD", "two_pass")
        two_pass = ops._order_loss_backward(g.cuda(), D, labels, *args)
        monkeypatch.setenv("SOL_EXT_CUDA_ALL_PAIRS_BACKWARD", choice)
        assert_rel_close(got, two_pass, tol, f"one-pass vs two-pass ({dtype})")


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_one_pass_backward_half_matches_the_two_pass_kernel(monkeypatch, dtype):
    """float16/bfloat16: the same hinge decisions and float32 sums as the two-pass kernel, in another order,
    so the two differ by float32 rounding before the one rounding to the half dtype."""
    B, n = 600, 70
    D, labels, _ = inputs(B, n, seed=9, explicit=False, dtype=dtype)
    g = torch.randn(B * (B - 1) // 2, generator=torch.Generator().manual_seed(2)).to("cuda", dtype)
    args = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    results = {}
    for choice in ("one_pass", "two_pass"):
        monkeypatch.setenv("SOL_EXT_CUDA_ALL_PAIRS_BACKWARD", choice)
        results[choice] = ops._order_loss_backward(g, D, labels, *args).float()
    assert torch.isfinite(results["one_pass"]).all()
    assert_rel_close(results["one_pass"], results["two_pass"], 2 * torch.finfo(dtype).eps, f"{dtype}")


def test_unknown_backward_choice_is_refused(monkeypatch):
    monkeypatch.setenv("SOL_EXT_CUDA_ALL_PAIRS_BACKWARD", "fastest")
    D, labels, _ = inputs(40, 5, seed=1, explicit=False)
    g = torch.ones(40 * 39 // 2, dtype=D.dtype, device="cuda")
    with pytest.raises(RuntimeError, match="SOL_EXT_CUDA_ALL_PAIRS_BACKWARD must be auto, one_pass or two_pass"):
        ops._order_loss_backward(g, D, labels, None, 1.0, 1, 0.25, "paper")


def test_a_cleared_cache_cannot_free_a_table_that_a_queued_kernel_reads():
    """A kernel queued on a side stream behind a long sleep reads the cached probability table; meanwhile
    the default stream evicts every cached table and fills freshly allocated memory with NaN. The table's
    memory must not be handed out before the kernel has read it."""
    B, n = 64, 97  # a table size no other test uses
    D, labels, _ = inputs(B, n, seed=21, explicit=False, dtype=torch.float32)
    c = (None, LOSS_ARGS["sigma"], LOSS_ARGS["tau"], LOSS_ARGS["margin"], "paper")
    expected = ops.order_loss(D, labels, *c)  # caches the float32 [n,n,3] table, allocated on this stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # some 0.5 s: the loss kernel below waits behind it
        got = ops.order_loss(D, labels, *c)
    r = labels[:1]
    for k in range(70):  # the cache holds 64 tables; new keys (sigma) clear it and drop the table above
        ops.ordering_probabilities(r, r, 5, 1.0 + k / 128, 1, "paper", torch.float64)
    fillers = [torch.full((n * n * 3,), float("nan"), device="cuda") for _ in range(64)]
    side.synchronize()
    assert torch.equal(got, expected)
    del fillers


# -------------------------------------------------------------------------------------------------
# No host-device synchronization inside a training step
# -------------------------------------------------------------------------------------------------


def _training_step(check_values: bool, explicit: bool):
    """A linear encoder, StochasticOrderLoss and an SGD step on CUDA tensors; returns ``step()``."""
    torch.manual_seed(0)
    B, n, d = 64, 20, 32
    encoder = torch.nn.Linear(16, d).cuda()
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    x = torch.randn(B, 16, device="cuda")
    labels = torch.randint(0, n, (B,), device="cuda")
    mu = torch.randn(n, d, device="cuda")
    pairs = torch.randint(0, B, (3 * B, 2), device="cuda") if explicit else None
    criterion = sol_ext.StochasticOrderLoss(n, backend="fused", check_values=check_values)

    def step():
        optimizer.zero_grad()
        loss = criterion(encoder(x), labels, mu, pairs)
        loss.backward()
        optimizer.step()
        return loss

    step()  # the first call builds and caches the rank tables (one host-to-device copy)
    torch.cuda.synchronize()
    return step


@pytest.mark.parametrize("explicit", [False, True])
def test_training_step_without_value_checks_never_synchronizes(explicit):
    step = _training_step(check_values=False, explicit=explicit)
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()


def test_value_checks_are_what_synchronizes():
    """The detector above is live: the default (value-checking) step does synchronize."""
    step = _training_step(check_values=True, explicit=False)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("explicit", [False, True])
def test_training_step_captured_in_a_cuda_graph_replays_the_eager_gradients(explicit, centroid_kernels):
    """With check_values=False the loss's forward and backward can be captured in a CUDA graph (no host
    synchronization, no host-side allocation that capture forbids); a replay gives the eager gradients."""
    torch.manual_seed(0)
    B, n, d = 48, 11, 16
    h = torch.randn(B, d, device="cuda", requires_grad=True)
    mu = torch.randn(n, d, device="cuda", requires_grad=True)
    labels = torch.randint(0, n, (B,), device="cuda")
    pairs = torch.randint(0, B, (3 * B, 2), device="cuda") if explicit else None
    criterion = sol_ext.StochasticOrderLoss(n, backend="fused", check_values=False)
    eager = torch.autograd.grad(criterion(h, labels, mu, pairs), (h, mu))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            h.grad = mu.grad = None
            criterion(h, labels, mu, pairs).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    h.grad = mu.grad = None
    with torch.cuda.graph(graph):
        captured_loss = criterion(h, labels, mu, pairs)
        captured_loss.backward()
    with torch.no_grad():
        h.add_(0.01)  # a new step's inputs, written in place into the captured buffers
    graph.replay()
    expected_loss = criterion(h, labels, mu, pairs)
    expected = torch.autograd.grad(expected_loss, (h, mu))
    torch.testing.assert_close(captured_loss, expected_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(h.grad, expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mu.grad, expected[1], rtol=1e-5, atol=1e-6)
    assert not torch.equal(h.grad, eager[0])  # the replay computed the new step, not the captured one


@pytest.mark.slow
def test_training_step_compiled_with_reduce_overhead_runs_in_cuda_graphs_and_matches_eager():
    """torch.compile(mode="reduce-overhead") of encoder + loss (check_values=False): PyTorch records the
    forward and the compiled backward as CUDA graphs (no cudagraph skip) and three SGD steps through the
    replays end where three eager steps end."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    B, n, d = 64, 9, 16
    x = torch.randn(B, d, device="cuda", dtype=torch.float64)
    labels = torch.randint(0, n, (B,), device="cuda")
    criterion = sol_ext.StochasticOrderLoss(n, backend="fused", check_values=False)
    runs = []
    for compile_it in (True, False):
        torch.manual_seed(1)
        encoder = torch.nn.Linear(d, d).double().cuda()
        mu = torch.nn.Parameter(torch.randn(n, d, device="cuda", dtype=torch.float64))
        optimizer = torch.optim.SGD([*encoder.parameters(), mu], lr=0.05)

        def loss_of(x, labels, encoder=encoder, mu=mu):
            return criterion(encoder(x), labels, mu)

        if compile_it:
            torch._dynamo.reset()
            counters.clear()
            loss_of = torch.compile(loss_of, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(x, labels)
            loss.backward()
            optimizer.step()
        if compile_it:
            assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        runs.append((loss.detach().clone(), encoder.weight.detach().clone(), mu.detach().clone()))
    for compiled, eager in zip(*runs):
        torch.testing.assert_close(compiled, eager, rtol=1e-9, atol=1e-12)


def test_unchecked_out_of_range_labels_stop_on_a_device_assertion():
    """check_values=False must not let a kernel read out of bounds: the device asserts (own process,
    since a device-side assertion leaves the CUDA context unusable)."""
    import subprocess
    import sys

    script = (
        "import torch, sol_ext\n"
        "h = torch.randn(8, 4, device='cuda'); mu = torch.randn(5, 4, device='cuda')\n"
        "labels = torch.full((8,), 7, device='cuda')\n"
        "loss = sol_ext.StochasticOrderLoss(5, check_values=False)(h, labels, mu)\n"
        "torch.cuda.synchronize()\n"
        "print('no assertion')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no assertion" not in done.stdout, done.stdout + done.stderr
    assert "labels must lie in 0" in done.stderr or "device-side assert" in done.stderr, done.stderr


# -------------------------------------------------------------------------------------------------
# The grouped (sorting) algorithm's CUDA op, csrc/cuda/grouped_order_loss_kernel.cu
# -------------------------------------------------------------------------------------------------


@pytest.fixture(params=["separate", "fused"])
def grouped_kernels(request, monkeypatch):
    """Each test of the op under both of its implementations (SOL_EXT_CUDA_GROUPED, read at each call)."""
    monkeypatch.setenv("SOL_EXT_CUDA_GROUPED", request.param)
    return request.param


def _refuse(what: str):
    """A stand-in for a function a test says must not run."""
    def refused(*args, **kwargs):
        raise AssertionError(f"{what} ran")

    return refused


def grouped_inputs(B: int, n: int, dtype: torch.dtype, ties: bool, seed: int):
    """D on a coarse grid (ties, differences exactly equal to the margin, -0.0 beside +0.0) or random."""
    gen = torch.Generator().manual_seed(seed)
    if ties:
        D = (torch.randint(-6, 7, (B, n), generator=gen) * 0.25).to(dtype)
        D[::7] = -0.0
    else:
        D = torch.randn(B, n, generator=gen, dtype=torch.float64).to(dtype)
    return D, torch.randint(0, n, (B,), generator=gen)


# (B, n, margin, convention, dtype, ties, ranks)
GROUPED_CASES = [
    (0, 4, 0.25, "paper", torch.float64, False, None),
    (1, 4, 0.25, "paper", torch.float64, False, None),
    (2, 1, 0.0, "official", torch.float64, False, None),
    (37, 5, 0.25, "paper", torch.float64, True, None),
    (37, 5, 0.25, "official", torch.float32, True, None),
    (200, 13, 0.0, "paper", torch.float64, True, None),
    (200, 13, 0.5, "official", torch.float64, False, (3, 9)),
    (700, 60, 0.25, "paper", torch.float32, False, None),
    (4096, 7, 0.3, "official", torch.float32, True, None),
    (300_000, 14, 0.25, "paper", torch.float32, False, None),  # several chunks of ranks (the counts' budget)
]


@pytest.mark.parametrize("case", GROUPED_CASES, ids=lambda c: "-".join(map(str, c)))
def test_grouped_op_matches_the_cpu_op(case, grouped_kernels):
    """The CUDA grouped_order_sum against the CPU op: the same hinge decisions, sums in float64 in another
    order, so total and gradient agree to 1e-12 (relative to their largest magnitude)."""
    B, n, margin, convention, dtype, ties, ranks = case
    D, labels = grouped_inputs(B, n, dtype, ties, seed=B + n)
    q0, q1 = ranks or (0, n)
    args = (1.3, 2, margin, convention, q0, q1, True)
    total_cpu, grad_cpu = ops.grouped_order_sum(D, labels, *args)
    total_cuda, grad_cuda = ops.grouped_order_sum(D.cuda(), labels.cuda(), *args)
    assert total_cuda.dtype == grad_cuda.dtype == torch.float64 and grad_cuda.shape == (B, n)
    assert abs(total_cuda.item() - total_cpu.item()) <= 1e-12 * max(abs(total_cpu.item()), 1e-300)
    assert_rel_close(grad_cuda.cpu(), grad_cpu, 1e-12, "grouped dD")
    if B >= 2:
        assert (grad_cuda[:, :q0] == 0).all() and (grad_cuda[:, q1:] == 0).all()
    total_only, empty = ops.grouped_order_sum(D.cuda(), labels.cuda(), *args[:-1], False)
    assert torch.equal(total_only, total_cuda) and empty.numel() == 0


def test_grouped_op_is_bitwise_reproducible_and_runs_in_a_cuda_graph(grouped_kernels):
    """No host synchronization inside the op: captured in a CUDA graph and replayed, it gives bitwise the
    eager result, which is the same on every call."""
    D, labels = grouped_inputs(5000, 9, torch.float32, False, seed=4)
    D, labels = D.cuda(), labels.cuda()
    args = (1.0, 1, 0.25, "paper", 0, 9, True)
    first = ops.grouped_order_sum(D, labels, *args)
    for _ in range(2):
        again = ops.grouped_order_sum(D, labels, *args)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.grouped_order_sum(D, labels, *args)  # warm-up outside the capture (the table cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.grouped_order_sum(D, labels, *args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], first[0]) and torch.equal(captured[1], first[1])


def test_grouped_op_gives_nan_for_a_column_holding_nan(grouped_kernels):
    D, labels = grouped_inputs(50, 4, torch.float64, False, seed=5)
    D[7, 2] = float("nan")
    total, grad = ops.grouped_order_sum(D.cuda(), labels.cuda(), 1.0, 1, 0.25, "paper", 0, 4, True)
    assert torch.isnan(total) and torch.isnan(grad[:, 2]).all() and torch.isfinite(grad[:, [0, 1, 3]]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grouped_op_opcheck_on_cuda(dtype, grouped_kernels):
    D, labels = grouped_inputs(30, 5, dtype, True, seed=6)
    D = D.cuda().requires_grad_(dtype == torch.float64)
    opcheck(torch.ops.sol_ext.grouped_order_sum.default, (D, labels.cuda(), 1.0, 2, 0.25, "official", 1, 4, True))


def test_grouped_loss_on_cuda_runs_the_fused_op(monkeypatch, grouped_kernels):
    """CUDA float32/float64: StochasticOrderLoss(algorithm="grouped") runs the CUDA op, not the torch path;
    with SOL_EXT_CUDA_GROUPED=fused as one op per direction (grouped_stochastic_order_loss), not the
    Python composition."""
    from sol_ext import grouped
    from sol_ext import loss as loss_module

    monkeypatch.setattr(grouped, "_torch_order_sum", _refuse("the torch path"))
    if grouped_kernels == "fused":
        monkeypatch.setattr(loss_module, "grouped_order_loss", _refuse("the Python composition"))
    h = torch.randn(3000, 8, device="cuda", requires_grad=True)
    mu = torch.randn(7, 8, device="cuda")
    loss = sol_ext.StochasticOrderLoss(7, algorithm="grouped")(h, torch.randint(0, 7, (3000,), device="cuda"), mu)
    loss.backward()
    assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("check_values", [True, False])
def test_grouped_loss_one_op_step_matches_the_composition(monkeypatch, reduction, check_values):
    """StochasticOrderLoss(algorithm="grouped") on CUDA, float64: the one-op step (SOL_EXT_CUDA_GROUPED=fused)
    and the Python composition (separate) give the loss and both gradients to 1e-12."""
    gen = torch.Generator().manual_seed(9)
    h0 = torch.randn(2000, 16, generator=gen, dtype=torch.float64)
    mu0 = torch.randn(9, 16, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 9, (2000,), generator=gen).cuda()
    results = {}
    for setting in ("separate", "fused"):
        monkeypatch.setenv("SOL_EXT_CUDA_GROUPED", setting)
        h, mu = h0.cuda().requires_grad_(True), mu0.cuda().requires_grad_(True)
        criterion = sol_ext.StochasticOrderLoss(9, algorithm="grouped", reduction=reduction, check_values=check_values)
        loss = criterion(h, labels, mu)
        results[setting] = (loss, *torch.autograd.grad(loss, (h, mu)))
    for name, a, b in zip(("loss", "dh", "dmu"), results["separate"], results["fused"]):
        assert_rel_close(b, a, 1e-12, f"{name}, one op against the composition")


def test_grouped_loss_one_op_step_checks_values_on_cuda(monkeypatch):
    """The one-op step on CUDA checks h, mu and the labels before the op and D after it, as the pairwise
    path does (the op reads values only on the CPU): a NaN in h, a label out of range and an overflowing D
    are named as on the other paths, and the op itself refuses check_values=True on CUDA."""
    from sol_ext import loss as loss_module

    monkeypatch.setenv("SOL_EXT_CUDA_GROUPED", "fused")
    monkeypatch.setattr(loss_module, "grouped_order_loss", _refuse("the Python composition"))
    criterion = sol_ext.StochasticOrderLoss(5, algorithm="grouped")
    h, mu = torch.randn(40, 4, device="cuda"), torch.randn(5, 4, device="cuda")
    labels = torch.arange(40, device="cuda") % 5
    bad_h = h.clone()
    bad_h[3, 1] = float("nan")
    with pytest.raises(ValueError, match="h contains 1 NaN or inf"):
        criterion(bad_h, labels, mu)
    with pytest.raises(ValueError, match="labels must lie in 0"):
        criterion(h, labels + 1, mu)
    with pytest.raises(ValueError, match="overflow"):
        criterion(h * 1e20, labels, mu)
    with pytest.raises(RuntimeError, match="check_values=True reads the values on the CPU"):
        torch.ops.sol_ext.grouped_stochastic_order_loss(h, mu, labels, 1.0, 3, 0.25, 1, 1.0, "paper", "mean", True, True)


def test_grouped_op_implementations_agree_at_a_million_rows(monkeypatch):
    """(1,000,000, 5), the size of the speed target, in two chunks of ranks: the two implementations give the
    same hinge decisions and float64 sums in other orders."""
    D, labels = grouped_inputs(1_000_000, 5, torch.float32, False, seed=8)
    D, labels = D.cuda(), labels.cuda()
    args = (1.0, 3, 0.25, "paper", 0, 5, True)
    results = {}
    for setting in ("separate", "fused"):
        monkeypatch.setenv("SOL_EXT_CUDA_GROUPED", setting)
        results[setting] = ops.grouped_order_sum(D, labels, *args)
    (total_a, grad_a), (total_b, grad_b) = results.values()
    assert abs(total_a.item() - total_b.item()) <= 1e-12 * abs(total_a.item())
    assert_rel_close(grad_b, grad_a, 1e-12, "grouped dD, fused against separate")


def test_grouped_op_refuses_an_unknown_implementation(monkeypatch):
    monkeypatch.setenv("SOL_EXT_CUDA_GROUPED", "fastest")
    D, labels = grouped_inputs(10, 3, torch.float32, False, seed=7)
    with pytest.raises(RuntimeError, match="SOL_EXT_CUDA_GROUPED must be separate or fused, got 'fastest'"):
        ops.grouped_order_sum(D.cuda(), labels.cuda(), 1.0, 1, 0.25, "paper", 0, 3, True)
