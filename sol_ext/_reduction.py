"""How the library reduces per-pair and per-sample losses to one value.

Production code: the fused ops, the grouped algorithm and the distributed loss reduce here; the one-op
:class:`~sol_ext.StochasticOrderLoss` (csrc/stochastic_order_loss.cpp) repeats these reductions and their
gradients in C++, operation for operation (tests/ops/test_autograd.py holds the two to bitwise equality on
the CPU). :mod:`sol_ext.reference` has its own plain reduction, so that the test oracle and the numbers
users get can be changed independently.
"""
from __future__ import annotations

import torch

__all__ = ["reduce_losses", "reduced_dtype"]


def reduced_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a reduced loss of ``dtype`` losses: float32 for float16/bfloat16, else ``dtype``."""
    return torch.promote_types(dtype, torch.float32)


def reduce_losses(losses: torch.Tensor, reduction: str) -> torch.Tensor:
    """``"none"``: as is; ``"sum"``; ``"mean"``, where an empty set gives 0 rather than NaN (docs/math.md §7).

    ``"sum"`` and ``"mean"`` accumulate in float32 or wider and return float32 for float16/bfloat16
    losses: their sum passes float16's largest value (65,504) at ordinary batch sizes, and bfloat16
    keeps 8 bits. Other dtypes come back as they are. The gradient reaches ``losses`` in their dtype.
    On the CPU the sum runs in float64 in an order fixed by the number of losses alone, so the result is
    bitwise the same for any number of threads (a plain ``sum`` splits the work by thread).
    """
    if reduction == "none":
        return losses
    dtype = reduced_dtype(losses.dtype)
    if losses.device.type != "cpu":
        total = losses.sum(dtype=dtype)
        return total / max(losses.shape[0], 1) if reduction == "mean" else total
    total = _fixed_order_sum(losses)
    return (total / max(losses.shape[0], 1) if reduction == "mean" else total).to(dtype)


def _fixed_order_sum(losses: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Sum of ``losses [M]`` in float64: blocks of ``block`` values, then the block sums, each run in order.

    ``cumsum`` scans each row from start to end in one thread, whatever the thread count, so the order
    of the additions depends on ``M`` only.
    """
    values = losses.to(torch.float64)
    if values.numel() == 0:
        return values.sum()
    if values.numel() <= block:  # one block: the same additions in the same order, without the padding
        return values.cumsum(dim=0)[-1]
    values = torch.nn.functional.pad(values, (0, -values.shape[0] % block)).view(-1, block)
    return values.cumsum(dim=1)[:, -1].cumsum(dim=0)[-1]
