"""Argument checks run before any kernel: errors that name the argument, the value and what was expected.

Shape, dtype and device checks always run. Checks that read tensor values (label ranges, NaN/inf)
need a device synchronization and data-dependent control flow, so they are skipped while
``torch.compile`` traces, and on meta tensors, which have no values; the kernels' own ``TORCH_CHECK``s
remain as the last guard there.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Optional

import torch

BACKENDS = ("auto", "fused", "reference")
ALGORITHMS = ("auto", "pairwise", "grouped")
CONVENTIONS = ("paper", "official")
REDUCTIONS = ("mean", "sum", "none")


def tracing() -> bool:
    return torch.compiler.is_compiling()


def values_hidden(t: torch.Tensor) -> bool:
    """While torch.compile traces, and on meta tensors (shapes only), values cannot be read."""
    return tracing() or t.device.type == "meta"


def check_choice(name: str, value, choices) -> str:
    if value not in choices:
        options = ", ".join(f'"{c}"' for c in choices)
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def check_reduction(reduction, allow_none: bool = True) -> str:
    return check_choice("reduction", reduction, REDUCTIONS if allow_none else REDUCTIONS[:2])


def _is_real(value) -> bool:
    if type(value) in (float, int):  # the usual case, without the ABC check (the loss checks its settings per call)
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_float(name: str, value) -> float:
    if not _is_real(value):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_nonnegative_float(name: str, value) -> float:
    if not _is_real(value):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


INT64_MAX = 2**63 - 1


def check_int(name: str, value, minimum: int) -> int:
    """An integer in ``minimum … 2**63 - 1`` (the kernels take int64); integral floats such as 3.0 are
    accepted, 3.5 is not."""
    if type(value) is not int:  # the usual case skips the ABC checks
        if _is_real(value) and not isinstance(value, numbers.Integral) and float(value).is_integer():
            value = int(value)
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{name} must be an integer, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    if value > INT64_MAX:
        raise ValueError(f"{name} must be an integer <= 2**63 - 1 = {INT64_MAX} (int64), got {value}")
    return int(value)


def check_float_dtype(dtype) -> None:
    """The ``dtype`` of a returned table: an integer one would round its probabilities to 0."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")


# The noise kernel and the ordering table are [num_ranks, num_ranks] float64 tables: past this many ranks
# (2-6 PiB) no machine could hold them (csrc/tables.cpp refuses the same).
MAX_RANKS = 2**24


def check_num_ranks(value) -> int:
    num_ranks = check_int("num_ranks", value, 1)
    if num_ranks > MAX_RANKS:
        raise ValueError(f"num_ranks must be <= {MAX_RANKS} (the noise kernel and the ordering table are "
                         f"[num_ranks, num_ranks] float64 tables), got {num_ranks}")
    return num_ranks


def check_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_floating(name: str, t: torch.Tensor, ndim: int, shape_text: str) -> None:
    check_tensor(name, t)
    if t.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape_text}, got {tuple(t.shape)}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


def check_finite(name: str, t: torch.Tensor) -> None:
    if values_hidden(t) or t.numel() == 0:
        return
    extremes(name, t)


def extremes(name: str, t: torch.Tensor) -> tuple:
    """``(min, max)`` of a non-empty ``t`` whose values can be read, refusing NaN and inf."""
    # min and max propagate NaN and expose +-inf: one cheap reduction (and one device sync) instead
    # of an elementwise isfinite over the whole tensor on every call.
    lowest, highest = torch.stack(torch.aminmax(t)).tolist()
    if not (math.isfinite(lowest) and math.isfinite(highest)):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} contains {bad} NaN or inf value(s); expected finite numbers")
    return lowest, highest


def check_loss_finite(loss: torch.Tensor, dtype: torch.dtype, inputs: str, largest: Callable[[], float],
                      margin: float) -> None:
    """Finite inputs can still overflow the loss: a pair's order loss adds up to ``2n`` hinge terms of
    about ``|D| + margin`` each (docs/math.md §6), in the inputs' ``dtype``. Refuse the inf (or NaN, as
    0 * inf) instead of returning it, naming the ``inputs`` and their ``largest()`` |value| (read only
    then). csrc/stochastic_order_loss.cpp says the same of the CPU grouped op's loss."""
    if values_hidden(loss) or loss.numel() == 0:
        return
    if loss.dim() == 0:  # the reduced loss: one read (one dispatched operation per step)
        if math.isfinite(loss.item()):
            return
    elif all(math.isfinite(v) for v in torch.stack(torch.aminmax(loss.detach().reshape(-1))).tolist()):
        return
    raise ValueError(f"the loss overflows {dtype} although its inputs are finite: the largest |value| of {inputs} "
                     f"is {largest():.3g} and margin={margin:.3g}, and a pair's order loss adds up to 2n hinge "
                     "terms of about |D| + margin each; scale them down or compute in float64")


def check_embedding_loss_finite(loss: torch.Tensor, h: torch.Tensor, mu: torch.Tensor, margin: float) -> None:
    """:func:`check_loss_finite` of a loss of embeddings ``h`` and centroids ``mu``."""
    check_loss_finite(loss, h.dtype, "h and mu",
                      lambda: max(h.detach().abs().max().item(), mu.detach().abs().max().item()), margin)


def check_same_device(**tensors) -> None:
    """Run before any check that reads values, so that a tensor on the wrong device is named as such."""
    present = {name: t for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in present.items())
        raise ValueError(f"all tensors must be on one device, got {where}; move them with .to(device)")


def check_embeddings(h: torch.Tensor, mu: torch.Tensor, values: bool = True) -> None:
    """``h [B, d]`` and ``mu [n, d]``: floating, one dtype, one device, and finite when ``values``."""
    check_floating("h", h, 2, "[B, d]")
    check_floating("mu", mu, 2, "[n, d]")
    if mu.shape[0] < 1:
        raise ValueError(f"mu must have at least one rank (shape [n, d], n >= 1), got {tuple(mu.shape)}")
    if mu.shape[1] != h.shape[1]:
        raise ValueError(
            f"h and mu must have the same embedding size d: h is {tuple(h.shape)}, mu is {tuple(mu.shape)}"
        )
    if h.dtype != mu.dtype:
        raise TypeError(f"h and mu must have one dtype, got h {h.dtype} and mu {mu.dtype}")
    if values:
        check_finite("h", h)
        check_finite("mu", mu)


def check_dissimilarities(D: torch.Tensor, name: str = "D", values: bool = True) -> float:
    """``D [B, n]``, floating, and finite when ``values``; returns its largest ``|value|`` (0 where values
    are not read)."""
    check_floating(name, D, 2, "[B, n]")
    if D.shape[1] < 1:
        raise ValueError(f"{name} must have at least one rank column (shape [B, n], n >= 1), got {tuple(D.shape)}")
    if not values or values_hidden(D) or D.numel() == 0:
        return 0.0
    return max(abs(v) for v in extremes(name, D))


def check_inputs_through_dissimilarities(D: torch.Tensor, h: torch.Tensor, mu: torch.Tensor) -> None:
    """:func:`check_finite` of ``h`` and ``mu``, then :func:`check_dissimilarities_finite`, read from ``D``
    first: a NaN or inf in a row of ``h`` makes that row of ``D`` non-finite, and one in ``mu`` all of ``D``,
    so a finite ``D`` clears both, and ``h`` ([B, d], the largest input) is read only to name the culprit
    (with no rows, ``mu`` is read itself)."""
    if values_hidden(D):
        return
    if D.numel() == 0:
        check_finite("mu", mu)
        return
    if all(math.isfinite(v) for v in torch.stack(torch.aminmax(D.detach())).tolist()):
        return
    check_finite("h", h)
    check_finite("mu", mu)
    check_dissimilarities_finite(D, h, mu)


def check_dissimilarities_finite(D: torch.Tensor, h: torch.Tensor, mu: torch.Tensor) -> None:
    """Finite ``h`` and ``mu`` can still give an inf ``D`` (squared distances past the dtype's range), and
    the order loss then turns ``inf - inf`` into NaN: refuse it here, as :func:`sol_ext.order_loss` refuses an inf ``D``."""
    if values_hidden(D) or D.numel() == 0:
        return
    if not all(math.isfinite(v) for v in torch.stack(torch.aminmax(D.detach())).tolist()):
        bad = int((~torch.isfinite(D)).sum())
        largest = max(h.detach().abs().max().item(), mu.detach().abs().max().item())
        raise ValueError(
            f"the stochastic dissimilarities of h and mu overflow {D.dtype}: {bad} of D's {D.numel()} values "
            f"are inf or NaN although h and mu are finite (largest |value| {largest:.3g}); scale the embeddings "
            "down or compute in float64"
        )


def nearest_grid_ranks(values: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, Optional[int]]:
    """The rank of the nearest value of an increasing ``grid [n]`` for each of ``values`` (float64), and
    the index of the first value that is not one of the grid's (within 1e-9), or None when all are."""
    index = torch.searchsorted(grid, values).clamp(max=len(grid) - 1)
    below = (index - 1).clamp(min=0)
    nearer = torch.where((values - grid[below]).abs() < (grid[index] - values).abs(), below, index)
    off = ~torch.isclose(grid[nearer], values, rtol=1e-9, atol=1e-9)
    return nearer, (int(torch.nonzero(off)[0, 0]) if bool(off.any()) else None)


def check_ranks(
    name: str, ranks, num_ranks: int, length: Optional[int] = None, values: bool = True
) -> torch.Tensor:
    """Integer ranks in ``0 … num_ranks-1``; returned as int64 (integer widening only).

    With ``values=False`` the range is asserted on the device instead (see :func:`assert_in_range`)."""
    check_tensor(name, ranks)
    if ranks.is_floating_point() or ranks.is_complex() or ranks.dtype == torch.bool:
        raise TypeError(
            f"{name} must be an integer tensor of 0-based ranks, got dtype {ranks.dtype}; "
            f"convert with {name}.round().long() if the values are whole ranks"
        )
    if ranks.dim() != 1 or (length is not None and ranks.shape[0] != length):
        expected = f"[{length}]" if length is not None else "[M]"
        raise ValueError(f"{name} must have shape {expected} (one rank per sample), got {tuple(ranks.shape)}")
    if not values:
        assert_in_range(name, ranks, num_ranks)
    elif not values_hidden(ranks) and ranks.numel() > 0:
        lowest, highest = (int(v) for v in torch.aminmax(ranks))
        if lowest < 0 or highest > num_ranks - 1:
            hint = ""
            if lowest >= 1 and highest == num_ranks:
                hint = "; they look 1-based: pass labels - 1"
            raise ValueError(
                f"{name} must lie in 0 … {num_ranks - 1} (0-based ranks for num_ranks={num_ranks}), "
                f"got values in {lowest} … {highest}{hint}"
            )
    return ranks.long()


def check_pairs(pairs, batch_size: int, values: bool = True) -> Optional[torch.Tensor]:
    """``None`` (all pairs) or integer ``[M, 2]`` batch indices; returned as int64.

    With ``values=False`` the range is asserted on the device instead (see :func:`assert_in_range`)."""
    if pairs is None:
        return None
    check_tensor("pairs", pairs)
    if pairs.is_floating_point() or pairs.is_complex() or pairs.dtype == torch.bool:
        raise TypeError(f"pairs must be an integer tensor of batch indices, got dtype {pairs.dtype}")
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must have shape [M, 2] (rows of (x, y) batch indices), got {tuple(pairs.shape)}")
    if not values:
        assert_in_range("pairs", pairs, batch_size)
    elif not values_hidden(pairs) and pairs.numel() > 0:
        lowest, highest = (int(v) for v in torch.aminmax(pairs))
        if lowest < 0 or highest > batch_size - 1:
            raise ValueError(
                f"pairs must hold batch indices in 0 … {batch_size - 1} (batch size {batch_size}), "
                f"got values in {lowest} … {highest}"
            )
    return pairs.long()


def check_indices_on_cpu(labels: torch.Tensor, num_ranks: int, pairs=None, batch_size: Optional[int] = None) -> None:
    """With ``check_values=False``, before the paths in plain torch operations (the reference, the grouped
    composition), which index with ``labels`` and ``pairs`` where a negative index silently wraps around:
    on the CPU only the kernels check indices, so these paths are checked here, which costs no host-device
    synchronization (a GPU asserts them on the device, :func:`assert_in_range`)."""
    if labels.device.type != "cpu" or values_hidden(labels):
        return
    check_ranks("labels", labels, num_ranks)
    if pairs is not None:
        check_pairs(pairs, batch_size)


def assert_in_range(name: str, indices: torch.Tensor, size: int) -> None:
    """Index range check without a host-device synchronization, for ``check_values=False``.

    On a GPU the condition is evaluated and asserted by the device (``torch._assert_async``): a bad index
    stops the program with a device-side assertion naming the argument, at the next synchronization,
    instead of letting a kernel read out of bounds. On the CPU there is no synchronization to save, and
    the kernels' own checks raise. The CPU and meta tensors are left to those checks.
    """
    if indices.device.type != "cuda" or indices.numel() == 0 or tracing():
        return
    inside = ((indices >= 0) & (indices < size)).all()
    torch._assert_async(inside, f"{name} must lie in 0 … {size - 1}")
