"""Autograd and autocast of the ops: ``torch.ops.sol_ext.*`` are differentiable on their own.

One mechanism for every leaf op, ``torch.library.register_autograd`` (as PyTorch's extension-cpp example
does): the forward is the op itself and each backward calls the op's backward kernel, so the functional
API (:mod:`sol_ext.ops`), direct calls of the ops, ``torch.compile`` and ``torch.library.opcheck`` all see
the same autograd formula. The two whole-step ops (``stochastic_order_loss`` and
``grouped_stochastic_order_loss``) keep their C++ autograd nodes (csrc/stochastic_order_loss.cpp): one node
per step is measured faster. ``ordering_probabilities`` takes integer ranks and has no gradient.

Double backward: the backward kernels have no derivatives of their own, and :func:`first_order_only`, the
one guard every kernel backward goes through, makes differentiating their results raise a clear error.
The grouped sums return their gradient beside their value and are piecewise linear in ``D``, so their
backward (:func:`grouped_sum_backward`) is a product that is exact to differentiate again.
"""
from __future__ import annotations

import functools

import torch

from . import _extension  # noqa: F401  the ops registered here must exist

__all__ = ["first_order_only", "setup_grouped_sum", "grouped_sum_backward"]

_ops = torch.ops.sol_ext

# Under autocast the ops compute in float32, as PyTorch's own losses do (autocast's float32 list);
# float64 stays float64. The public functions cast and then turn autocast off themselves; this
# registration covers direct calls of torch.ops.sol_ext.*.
for _name in (
    "stochastic_dissimilarity",
    "_stochastic_dissimilarity_backward",
    "order_loss",
    "_order_loss_backward",
    "order_loss_block",
    "_order_loss_block_backward",
    "disc_loss",
    "_disc_loss_backward",
    "stochastic_order_loss",
    "_stochastic_order_loss_backward",
    "grouped_stochastic_order_loss",  # not its backward: grad_order stays float64
):
    for _device_type in ("cpu", "cuda"):
        torch.library.register_autocast(f"sol_ext::{_name}", _device_type, torch.float32)


# ---------------------------------------------------------------------------------------------
# The double-backward guard
# ---------------------------------------------------------------------------------------------


class _DoubleBackwardError(torch.autograd.Function):
    """Passes a gradient of a fused op through; differentiating it again raises a clear error."""

    @staticmethod
    def forward(ctx, op: str, grad: torch.Tensor, *sources: torch.Tensor) -> torch.Tensor:
        ctx.op = op
        return grad.clone()

    @staticmethod
    def backward(ctx, *unused):
        raise RuntimeError(
            f"double backward (differentiating a gradient, e.g. a gradient penalty built with "
            f"create_graph=True) through the fused sol_ext.{ctx.op} is not supported: its backward kernel "
            "has no derivative of its own. Use backend='reference' for such a loss."
        )


def first_order_only(op: str):
    """Decorates the backward of ``op``: like ``once_differentiable``, but also when only the op's saved
    inputs require grad.

    ``once_differentiable`` guards a backward's result only when the incoming gradients require grad. A
    gradient penalty differentiates ``dL/dh``, which depends on ``h`` through the backward kernel; the
    incoming gradient there is a constant, so the result came back as a constant and the penalty silently
    added 0. Under ``create_graph=True`` the results are tied to every input that requires grad, and
    differentiating them raises.
    """

    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            with torch.no_grad():
                outputs = backward(ctx, *grads)
            if not torch.is_grad_enabled():  # create_graph=False: the usual case
                return outputs
            sources = [t for t in (*grads, *ctx.saved_tensors) if isinstance(t, torch.Tensor) and t.requires_grad]
            if not sources:
                return outputs
            return tuple(g if g is None else _DoubleBackwardError.apply(op, g, *sources) for g in outputs)

        return wrapper

    return decorate


# ---------------------------------------------------------------------------------------------
# The leaf ops. Each setup_context saves what its backward kernel reads.
# ---------------------------------------------------------------------------------------------


def _setup_dissimilarity(ctx, inputs, output) -> None:
    h, mu, ctx.sigma = inputs
    ctx.save_for_backward(h, mu)


@first_order_only("stochastic_dissimilarity")
def _dissimilarity_backward(ctx, grad_D):
    h, mu = ctx.saved_tensors
    need_h, need_mu = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (need_h or need_mu):
        return None, None, None
    grad_h, grad_mu = _ops._stochastic_dissimilarity_backward(grad_D, h, mu, ctx.sigma, need_h, need_mu)
    return (grad_h if need_h else None), (grad_mu if need_mu else None), None


def _setup_order_loss(ctx, inputs, output) -> None:
    D, labels, pairs, *ctx.constants = inputs  # sigma, tau, margin, convention
    ctx.save_for_backward(D, labels, pairs)


@first_order_only("order_loss")
def _order_loss_backward(ctx, grad_losses):
    if not ctx.needs_input_grad[0]:
        return (None,) * 7
    D, labels, pairs = ctx.saved_tensors
    grad_D = _ops._order_loss_backward(grad_losses, D, labels, pairs, *ctx.constants)
    return (grad_D,) + (None,) * 6


def _setup_order_loss_block(ctx, inputs, output) -> None:
    D, labels, D_all, labels_all, *ctx.constants = inputs  # offset, sigma, tau, margin, convention
    ctx.save_for_backward(D, labels, D_all, labels_all)


@first_order_only("order_loss_block")
def _order_loss_block_backward(ctx, grad_rows):
    need_D, need_D_all = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
    if not (need_D or need_D_all):
        return (None,) * 9
    D, labels, D_all, labels_all = ctx.saved_tensors
    grad_D, grad_D_all = _ops._order_loss_block_backward(
        grad_rows, D, labels, D_all, labels_all, *ctx.constants, need_D, need_D_all
    )
    return (grad_D if need_D else None), None, (grad_D_all if need_D_all else None), None, *(None,) * 5


def _setup_disc_loss(ctx, inputs, output) -> None:
    D, labels, ctx.T = inputs
    ctx.num_ranks = D.shape[1]
    ctx.save_for_backward(labels)


@first_order_only("disc_loss")
def _disc_loss_backward(ctx, grad_losses):
    if not ctx.needs_input_grad[0]:
        return None, None, None
    (labels,) = ctx.saved_tensors
    return _ops._disc_loss_backward(grad_losses, labels, ctx.num_ranks, ctx.T), None, None


def setup_grouped_sum(ctx, inputs, output) -> None:
    """setup_context of the grouped sums ``(D, labels, ..., need_grad) -> (total, grad)``: the op on the CPU
    and CUDA, and the torch operations elsewhere (:mod:`sol_ext.grouped`)."""
    ctx.need_grad = inputs[-1]
    ctx.D_dtype = inputs[0].dtype
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def grouped_sum_backward(ctx, grad_total, unused):
    """d total / dD came out of the forward; the loss is piecewise linear in D, so this product is also exact
    to differentiate again (the second derivative is 0)."""
    if not ctx.needs_input_grad[0]:
        return (None,) * 9
    if not ctx.need_grad:
        raise RuntimeError("sol_ext::grouped_order_sum was called with need_grad=False; pass need_grad=True "
                           "to differentiate it")
    (grad,) = ctx.saved_tensors
    return (grad_total * grad).to(ctx.D_dtype, memory_format=torch.contiguous_format), *(None,) * 8


# The leaf ops' backward kernels are not differentiable (first_order_only guards their results): their
# autograd kernel says so, as torch.library's guidance for such ops asks, so that their outputs never
# require grad and opcheck finds an autograd registration for them too.
_library = torch.library.Library("sol_ext", "IMPL")


def _not_differentiable(op: torch._ops.OpOverload):
    def kernel(keyset, *args):
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    return kernel


for _name in (
    "_stochastic_dissimilarity_backward",
    "_order_loss_backward",
    "_order_loss_block_backward",
    "_disc_loss_backward",
):
    _library.impl(_name, _not_differentiable(getattr(_ops, _name).default), "Autograd", with_keyset=True)

for _op, _backward, _setup in (
    ("stochastic_dissimilarity", _dissimilarity_backward, _setup_dissimilarity),
    ("order_loss", _order_loss_backward, _setup_order_loss),
    ("order_loss_block", _order_loss_block_backward, _setup_order_loss_block),
    ("disc_loss", _disc_loss_backward, _setup_disc_loss),
    ("grouped_order_sum", grouped_sum_backward, setup_grouped_sum),
):
    torch.library.register_autograd(f"sol_ext::{_op}", _backward, setup_context=_setup)
