"""Half precision and automatic mixed precision: reductions that cannot overflow, autocast, mixed dtypes.

The CUDA variants (fused float16/bfloat16 kernels, float16 autocast with GradScaler) live in
test_cuda.py; here the CPU runs the reference for half inputs and the fused kernels under autocast.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import sol_ext
from common import random_labels

HALF_DTYPES = [torch.float16, torch.bfloat16]


def half_case(dtype, B=48, n=20, d=32, seed=3):
    """The B = 48, n = 20 batch whose per-pair float16 losses sum past 65,504 (float16's largest value)."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(B, d, generator=gen).to(dtype)
    mu = torch.randn(n, d, generator=gen).to(dtype)
    return h, mu, random_labels(B, n, gen)


def reference_quietly(fn, *args, **kwargs):
    """Call with backend="auto" on half CPU tensors, which falls back to the reference with a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn(*args, **kwargs)


# -------------------------------------------------------------------------------------------------
# Reductions accumulate in float32 or wider
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_half_reduction_accumulates_in_float32(dtype, reduction):
    h, mu, labels = half_case(dtype)
    D = sol_ext.stochastic_dissimilarity(h, mu, backend="reference")
    losses = sol_ext.order_loss(D, labels, reduction="none", backend="reference")
    assert losses.dtype == dtype and torch.isfinite(losses).all()
    exact = losses.double().sum() / (losses.shape[0] if reduction == "mean" else 1)
    if dtype == torch.float16:
        assert losses.double().sum() > torch.finfo(torch.float16).max  # a float16 sum overflows here

    total = sol_ext.order_loss(D, labels, reduction=reduction, backend="reference")
    assert total.dtype == torch.float32
    torch.testing.assert_close(total.double(), exact, rtol=1e-6, atol=0)
    disc = sol_ext.disc_loss(D, labels, T=2, reduction=reduction, backend="reference")
    assert disc.dtype == torch.float32
    disc_exact = sol_ext.disc_loss(D, labels, T=2, reduction="none", backend="reference").double().sum()
    disc_exact = disc_exact / (h.shape[0] if reduction == "mean" else 1)
    torch.testing.assert_close(disc.double(), disc_exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_module_loss_is_finite_float32_with_gradients_in_the_input_dtype(dtype):
    h, mu, labels = half_case(dtype)
    h.requires_grad_()
    mu.requires_grad_()
    loss = reference_quietly(sol_ext.StochasticOrderLoss(20, reduction="sum"), h, labels, mu)
    dh, dmu = torch.autograd.grad(loss, (h, mu))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert dh.dtype == dmu.dtype == dtype
    assert torch.isfinite(dh).all() and torch.isfinite(dmu).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_precision_reduction_keeps_the_input_dtype(dtype):
    h, mu, labels = half_case(dtype)
    loss = sol_ext.StochasticOrderLoss(20, backend="fused")(h, labels, mu)
    assert loss.dtype == dtype


# -------------------------------------------------------------------------------------------------
# Autocast and mixed dtypes
# -------------------------------------------------------------------------------------------------


def amp_problem(device="cpu", B=32, n=12, d_in=16, d=8, seed=0):
    """A small Linear encoder, its inputs, labels and float32 centroids (SOL keeps them as buffers)."""
    gen = torch.Generator().manual_seed(seed)
    encoder = torch.nn.Linear(d_in, d)
    with torch.no_grad():
        encoder.weight.copy_(torch.randn(d, d_in, generator=gen) / d_in**0.5)
        encoder.bias.copy_(torch.randn(d, generator=gen) * 0.1)
    x = torch.randn(B, d_in, generator=gen)
    labels = random_labels(B, n, gen)
    mu = torch.randn(n, d, generator=gen)
    return encoder.to(device), x.to(device), labels.to(device), mu.to(device)


def training_step(encoder, x, labels, mu, criterion, autocast_dtype=None, backward_in_autocast=False, scaler=None):
    """One SGD step; returns (h dtype, loss, gradients, updated weights)."""
    device = x.device.type
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.05)
    optimizer.zero_grad()
    with torch.autocast(device, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        h = encoder(x)
        loss = criterion(h, labels, mu)
        if backward_in_autocast:
            loss.backward()
    if not backward_in_autocast:
        (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(optimizer)
    grads = [p.grad.clone() for p in encoder.parameters()]
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return h.dtype, loss.detach(), grads, [p.detach().clone() for p in encoder.parameters()]


def assert_amp_step_matches_float32(amp, full, tol):
    """Loss, gradients and updated weights of an AMP step within ``tol`` (relative norm) of float32."""
    _, loss, grads, weights = amp
    _, loss32, grads32, weights32 = full
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert abs(loss.item() - loss32.item()) <= tol * abs(loss32.item())
    for g, g32, w, w32 in zip(grads, grads32, weights, weights32):
        assert g.dtype == g32.dtype == torch.float32  # the parameters' dtype
        assert torch.isfinite(g).all()
        assert (g - g32).norm() <= tol * g32.norm(), f"gradient off by {((g - g32).norm() / g32.norm()).item():.3g}"
        assert (w - w32).norm() <= tol * w32.norm()


@pytest.mark.parametrize("backward_in_autocast", [False, True])
def test_bfloat16_autocast_training_step_on_cpu(backward_in_autocast):
    """The drop-in loss under torch.autocast("cpu"): bfloat16 h, float32 centroids, the fused CPU kernels."""
    encoder, x, labels, mu = amp_problem()
    criterion = sol_ext.StochasticOrderLoss(12, backend="fused")  # refuses instead of falling back
    full = training_step(copy.deepcopy(encoder), x, labels, mu, criterion)
    amp = training_step(
        copy.deepcopy(encoder), x, labels, mu, criterion, torch.bfloat16, backward_in_autocast=backward_in_autocast
    )
    assert amp[0] == torch.bfloat16  # autocast did give the loss bfloat16 embeddings
    assert_amp_step_matches_float32(amp, full, tol=0.03)


def test_autocast_functional_ops_compute_in_float32():
    h, mu, labels = half_case(torch.float32, B=10, n=7, d=5)
    D32 = sol_ext.stochastic_dissimilarity(h.bfloat16().float(), mu, backend="fused")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        D = sol_ext.stochastic_dissimilarity(h.bfloat16(), mu, backend="fused")
        assert D.dtype == torch.float32
        torch.testing.assert_close(D, D32, rtol=1e-6, atol=1e-6)
        D_half = D32.bfloat16()
        for fn in (sol_ext.order_loss, sol_ext.disc_loss):
            loss = fn(D_half, labels, reduction="none", backend="fused")
            assert loss.dtype == torch.float32
            with torch.autocast("cpu", enabled=False):
                torch.testing.assert_close(loss, fn(D_half.float(), labels, reduction="none", backend="fused"))


def test_direct_op_calls_under_autocast_compute_in_float32():
    h, mu, labels = half_case(torch.float32, B=10, n=7, d=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        D = torch.ops.sol_ext.stochastic_dissimilarity(h.bfloat16(), mu, 1.0)
        losses = torch.ops.sol_ext.order_loss(D.bfloat16(), labels, None, 1.0, 3, 0.25, "paper")
        disc = torch.ops.sol_ext.disc_loss(D.bfloat16(), labels, 1)
    assert D.dtype == losses.dtype == disc.dtype == torch.float32


@pytest.mark.parametrize("h_dtype, mu_dtype, computed", [
    (torch.bfloat16, torch.float32, torch.float32),
    (torch.float32, torch.float16, torch.float32),
    (torch.float32, torch.float64, torch.float64),
])
def test_mixed_dtypes_are_promoted_outside_autocast(h_dtype, mu_dtype, computed):
    """Like PyTorch's own losses, mixed floating dtypes compute in the wider one; gradients keep each dtype."""
    h32, mu32, labels = half_case(torch.float32, B=10, n=7, d=5)
    h = h32.to(h_dtype).requires_grad_()
    mu = mu32.to(mu_dtype).requires_grad_()
    criterion = sol_ext.StochasticOrderLoss(7, backend="fused")
    loss = criterion(h, labels, mu)
    dh, dmu = torch.autograd.grad(loss, (h, mu))
    assert loss.dtype == computed and dh.dtype == h_dtype and dmu.dtype == mu_dtype
    h_c, mu_c = h.detach().to(computed).requires_grad_(), mu.detach().to(computed).requires_grad_()
    expected = criterion(h_c, labels, mu_c)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    torch.testing.assert_close(dh, torch.autograd.grad(expected, h_c)[0].to(h_dtype))
    assert sol_ext.stochastic_dissimilarity(h, mu, backend="fused").dtype == computed
    with pytest.raises(TypeError, match=r"h must be a floating-point tensor"):  # no promotion of integers
        criterion(h.detach().round().long(), labels, mu)
