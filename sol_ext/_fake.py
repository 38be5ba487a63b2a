"""Fake (meta) kernels: output shapes and dtypes of every op, for torch.compile and opcheck."""
from __future__ import annotations

import torch

from . import _extension  # noqa: F401  the ops whose fake kernels are registered here


@torch.library.register_fake("sol_ext::stochastic_dissimilarity")
def _(h, mu, sigma):
    return h.new_empty((h.shape[0], mu.shape[0]))


@torch.library.register_fake("sol_ext::_stochastic_dissimilarity_backward")
def _(grad_D, h, mu, sigma, need_grad_h, need_grad_mu):
    grad_h = torch.empty_like(h, memory_format=torch.contiguous_format) if need_grad_h else h.new_empty((0,))
    grad_mu = torch.empty_like(mu, memory_format=torch.contiguous_format) if need_grad_mu else mu.new_empty((0,))
    return grad_h, grad_mu


@torch.library.register_fake("sol_ext::ordering_probabilities")
def _(r_x, r_y, num_ranks, sigma, tau, convention, dtype):
    return r_x.new_empty((r_x.shape[0], 3), dtype=dtype)


def _num_pairs(D, pairs):
    batch_size = D.shape[0]
    return batch_size * (batch_size - 1) // 2 if pairs is None else pairs.shape[0]


@torch.library.register_fake("sol_ext::order_loss")
def _(D, labels, pairs, sigma, tau, margin, convention):
    return D.new_empty((_num_pairs(D, pairs),))


@torch.library.register_fake("sol_ext::_order_loss_backward")
def _(grad_losses, D, labels, pairs, sigma, tau, margin, convention):
    return torch.empty_like(D, memory_format=torch.contiguous_format)


@torch.library.register_fake("sol_ext::order_loss_block")
def _(D, labels, D_all, labels_all, offset, sigma, tau, margin, convention):
    return D.new_empty((D.shape[0],))


@torch.library.register_fake("sol_ext::_order_loss_block_backward")
def _(grad_rows, D, labels, D_all, labels_all, offset, sigma, tau, margin, convention, need_grad_D, need_grad_D_all):
    grad_D = torch.empty_like(D, memory_format=torch.contiguous_format) if need_grad_D else D.new_empty((0,))
    grad_D_all = (
        torch.empty_like(D_all, memory_format=torch.contiguous_format) if need_grad_D_all else D_all.new_empty((0,))
    )
    return grad_D, grad_D_all


@torch.library.register_fake("sol_ext::disc_loss")
def _(D, labels, T):
    return D.new_empty((D.shape[0],))


@torch.library.register_fake("sol_ext::_disc_loss_backward")
def _(grad_losses, labels, num_ranks, T):
    return grad_losses.new_empty((grad_losses.shape[0], num_ranks))


@torch.library.register_fake("sol_ext::stochastic_order_loss")
def _(h, mu, labels, pairs, sigma, tau, margin, T, disc_weight, convention, reduction):
    loss = h.new_empty((), dtype=torch.promote_types(h.dtype, torch.float32))
    return loss, h.new_empty((h.shape[0], mu.shape[0]))


@torch.library.register_fake("sol_ext::_stochastic_order_loss_backward")
def _(grad_loss, h, mu, D, labels, pairs, sigma, tau, margin, T, disc_weight, convention, reduction, need_grad_h,
      need_grad_mu):
    grad_h = torch.empty_like(h, memory_format=torch.contiguous_format) if need_grad_h else h.new_empty((0,))
    grad_mu = torch.empty_like(mu, memory_format=torch.contiguous_format) if need_grad_mu else mu.new_empty((0,))
    return grad_h, grad_mu


@torch.library.register_fake("sol_ext::grouped_stochastic_order_loss")
def _(h, mu, labels, sigma, tau, margin, T, disc_weight, convention, reduction, check_values, need_grad):
    loss = h.new_empty((), dtype=torch.promote_types(h.dtype, torch.float32))
    shape = (h.shape[0], mu.shape[0])
    return loss, h.new_empty(shape), h.new_empty(shape if need_grad else (0,), dtype=torch.float64)


@torch.library.register_fake("sol_ext::_grouped_stochastic_order_loss_backward")
def _(grad_loss, h, mu, D, labels, grad_order, sigma, T, disc_weight, reduction, need_grad_h, need_grad_mu):
    grad_h = torch.empty_like(h, memory_format=torch.contiguous_format) if need_grad_h else h.new_empty((0,))
    grad_mu = torch.empty_like(mu, memory_format=torch.contiguous_format) if need_grad_mu else mu.new_empty((0,))
    return grad_h, grad_mu


@torch.library.register_fake("sol_ext::grouped_order_sum")
def _(D, labels, sigma, tau, margin, convention, rank_begin, rank_end, need_grad):
    total = D.new_empty((), dtype=torch.float64)
    grad = D.new_empty(D.shape if need_grad else (0,), dtype=torch.float64)
    return total, grad
