"""Half precision and automatic mixed precision: reductions that cannot overflow, autocast, mixed dtypes.

The CUDA variants (fused float16/bfloat16 kernels, float16 autocast with GradScaler) live in
test_cuda.py; here the CPU runs the reference for half inputs and the fused kernels under autocast.
"""
from __future__ import annotations

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
    torch.testing.assert_close(disc.double(), disc_exact / (h.shape[0] if reduction == "mean" else 1), rtol=1e-6, atol=1e-6)


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
