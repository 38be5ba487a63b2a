"""The label grid: label values (ages, scores, months) to 0-based ranks and back (docs/math.md section 1).

``rank = round((value - min_value) / step)`` and ``n = round((max_value - min_value) / step) + 1``.
:class:`LabelGrid` holds that grid; :meth:`LabelGrid.fit` infers it from labels, :meth:`LabelGrid.encode`
maps label values to the ranks the loss and the head take, and :meth:`LabelGrid.decode` maps predicted
ranks back to label units.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["LabelGrid", "infer_step", "LabelScaleWarning", "MAX_INFERRED_RANKS"]

# Above this many ranks an inferred step is almost surely wrong (continuous labels such as mean ratings):
# ask for an explicit step instead of building a huge grid.
MAX_INFERRED_RANKS = 1000

# A label scale inferred from the labels is questioned when values holding at most this share of the
# labels decide it: they alone make the step finer, or lie beyond a stretch of empty ranks.
RARE_LABEL_SHARE = 0.01
# ... a stretch of at least this many ranks, and of a third of the scale, without a label.
EMPTY_STRETCH_RANKS = 5


class LabelScaleWarning(UserWarning):
    """The label scale inferred from the labels rests on a few of them: a typo (``60`` among grades
    3 … 9, ``5.5`` among whole numbers) changes the number of ranks the model learns."""


def _float_vector(values: Any, what: str) -> np.ndarray:
    """``values`` as a float64 numpy vector ``[N]``; ValueError on NaN/inf, naming the first bad index."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    a = np.asarray(values, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"{what} must be finite numbers; got {a[bad[0]]} at index {int(bad[0])}")
    return a


def _float_gcd(a: float, b: float, tol: float) -> float:
    """Greatest common divisor of two positive floats, treating remainders within ``tol`` as exact."""
    while b > tol:
        a, b = b, math.fmod(a, b)
        if b > a - tol:  # remainder is a whole multiple minus rounding error
            b = 0.0
    return a


def infer_step(values: Any) -> float:
    """The grid step of label values ``[N]``: the largest step on which every value lies.

    It is the (floating-point tolerant) greatest common divisor of the gaps between distinct values,
    rounded to a short decimal when that changes it by less than one part in a million (``0.0099999`` →
    ``0.01``). For integer ages it is 1; for scores 0.00, 0.01, … 1.00 it is 0.01.
    """
    v = np.unique(_float_vector(values, "labels"))
    if v.size == 0:
        raise ValueError("cannot infer a step from an empty set of labels")
    scale = max(abs(float(v[0])), abs(float(v[-1])), 1e-300)
    gaps = np.diff(v)
    gaps = gaps[gaps > 1e-9 * scale]  # equal values up to float round-off
    if gaps.size == 0:
        raise ValueError(f"all labels are equal ({v[0]:g}): one rank is not a ranking problem; use data "
                         "with at least two distinct labels (in Python: or give the grid with step=, "
                         "min_value=, max_value=)")
    smallest = float(gaps.min())
    tol = 1e-4 * smallest
    step = smallest
    for gap in np.unique(gaps):
        step = _float_gcd(float(gap), step, tol)
        if step <= tol:
            break
    for decimals in range(13):
        snapped = round(step, decimals)
        if snapped > 0 and abs(snapped - step) <= 1e-6 * step:
            if _on_grid(v, float(v[0]), snapped):
                step = snapped
            break
    return float(step)


def _on_grid(v: np.ndarray, lo: float, step: float) -> bool:
    x = (v - lo) / step
    return bool(np.all(np.abs(x - np.round(x)) <= 1e-3))


def _round_half_up(x: np.ndarray) -> np.ndarray:
    # Halves go up (20.5 years -> 21 on a 1-year grid); the tiny slack absorbs float error in (v - lo) / step.
    return np.floor(x + 0.5 + 1e-9)


def _refuse_merged_labels(v: np.ndarray, enc: "LabelGrid") -> None:
    """ValueError when the inferred grid ``enc`` puts distinct label values ``v`` on one rank.

    :func:`infer_step` takes gaps under 1e-9 of the largest label for round-off: one outlier label
    (1e15 among ages 1 … 10) makes the real gaps look like round-off and the step absurd. Values
    equal up to round-off (``0.1 + 0.2`` and ``0.3``) still share a rank: a gap counts as real when
    it exceeds 1e-9 of the values' own size, or near zero of the labels' median size.
    """
    u = np.unique(v)
    r = _round_half_up((u - enc.min_value) / enc.step)
    same = np.flatnonzero(np.diff(r) == 0)  # u is sorted: neighbours on one rank
    if same.size == 0:
        return
    size = np.maximum(np.maximum(np.abs(u[same]), np.abs(u[same + 1])), float(np.median(np.abs(u))))
    real = same[u[same + 1] - u[same] > 1e-9 * size]
    if real.size == 0:
        return
    members = u[r == r[real[0]]]
    top = float(u[np.argmax(np.abs(u))])
    raise ValueError(
        f"the inferred step {enc.step:g} puts distinct labels {members[0]:g} … {members[-1]:g} on one "
        f"rank ({enc.num_ranks} ranks in all): gaps under 1e-9 of the largest label, {top:g}, count as "
        f"round-off. Fix or drop the outlier label {top:g} (in Python: or give the grid with step=)")


def _warn_if_a_few_labels_set_the_step(v: np.ndarray, enc: "LabelGrid") -> None:
    """A :class:`LabelScaleWarning` when one rare value alone makes the inferred step finer."""
    values, counts = np.unique(v, return_counts=True)
    if values.size < 3:
        return
    rare = np.flatnonzero(counts <= RARE_LABEL_SHARE * v.size)
    for k in rare[np.argsort(counts[rare], kind="stable")][:20]:  # the rarest first; a few tries at most
        rest = np.delete(values, k)
        coarser = infer_step(rest)
        if coarser > enc.step * (1 + 1e-9) and not _on_grid(values[k: k + 1], float(rest[0]), coarser):
            n = int(_round_half_up(np.float64((rest[-1] - rest[0]) / coarser))) + 1
            warnings.warn(
                f"label {values[k]:g} ({counts[k]} of {v.size} labels) is the only value off a scale of step "
                f"{coarser:g}: it makes the inferred step {enc.step:g} and the scale {enc.num_ranks} ranks "
                f"instead of {n}. If it is a typo, fix or drop it; otherwise give the scale's step (step=).",
                LabelScaleWarning, stacklevel=3)
            return


def _warn_if_a_few_labels_stretch_the_scale(v: np.ndarray, enc: "LabelGrid") -> None:
    """A :class:`LabelScaleWarning` when rare values lie beyond a long stretch of ranks no label has."""
    values, counts = np.unique(v, return_counts=True)
    ranks = enc.encode(values).numpy()
    empty = np.diff(ranks) - 1  # ranks without a label between neighbouring values
    if empty.size == 0:
        return
    j = int(np.argmax(empty))
    if empty[j] < max(EMPTY_STRETCH_RANKS, enc.num_ranks / 3):
        return
    low, high = counts[: j + 1].sum(), counts[j + 1:].sum()
    few, rest = (values[: j + 1], values[j + 1:]) if low <= high else (values[j + 1:], values[: j + 1])
    share = min(low, high)
    if share > RARE_LABEL_SHARE * v.size:
        return
    span = f"{few[0]:g}" if few.size == 1 else f"{few[0]:g} … {few[-1]:g}"
    warnings.warn(
        f"label{'s' if few.size > 1 else ''} {span} ({share} of {v.size} labels) {'lie' if few.size > 1 else 'lies'} "
        f"{int(empty[j])} ranks "
        f"without a label away from the rest ({rest[0]:g} … {rest[-1]:g}): the inferred scale has "
        f"{enc.num_ranks} ranks, {int((empty[empty > 0]).sum())} of them without a label. If they are typos, "
        "fix or drop them; otherwise give the scale's ends (min_value= and max_value=).", LabelScaleWarning, stacklevel=3)


@dataclass(frozen=True)
class LabelGrid:
    """The grid between label values and 0-based ranks (docs/math.md section 1).

    ``rank = round((value - min_value) / step)`` with halves rounded up; ``value = min_value + rank * step``.

    Attributes:
        min_value: label value of rank 0.
        step: label units per rank, > 0.
        num_ranks: ``n``; ranks are ``0 … n-1`` and the largest label value is ``max_value``.
    """

    min_value: float
    step: float
    num_ranks: int

    def __post_init__(self) -> None:
        if not math.isfinite(float(self.min_value)):
            raise ValueError(f"min_value must be finite, got {self.min_value}")
        if not (math.isfinite(float(self.step)) and float(self.step) > 0):
            raise ValueError(f"step must be a finite number > 0, got {self.step}")
        if isinstance(self.num_ranks, bool) or int(self.num_ranks) != self.num_ranks or self.num_ranks < 1:
            raise ValueError(f"num_ranks must be an integer >= 1, got {self.num_ranks}")
        # Plain Python numbers, so grids compare equal and serialize the same whatever they came from.
        object.__setattr__(self, "min_value", float(self.min_value))
        object.__setattr__(self, "step", float(self.step))
        object.__setattr__(self, "num_ranks", int(self.num_ranks))

    @property
    def max_value(self) -> float:
        """Label value of the top rank ``n - 1``."""
        return self.min_value + (self.num_ranks - 1) * self.step

    @classmethod
    def fit(cls, values: Any, step: float | None = None, min_value: float | None = None,
            max_value: float | None = None) -> "LabelGrid":
        """Build the grid from label values ``[N]``; each of step, min and max is inferred when not given.

        ``min_value``/``max_value`` default to the smallest/largest label; ``step`` defaults to
        :func:`infer_step` of the labels and the given bounds. Raises ValueError for fewer than two
        ranks, for labels outside given bounds, and for an inferred grid of more than
        ``MAX_INFERRED_RANKS`` ranks (continuous labels: pass ``step``).
        """
        v = _float_vector(values, "labels")
        if v.size == 0:
            raise ValueError("cannot fit a LabelGrid on an empty set of labels")
        lo = float(v.min()) if min_value is None else float(min_value)
        hi = float(v.max()) if max_value is None else float(max_value)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"min_value and max_value must be finite, got {lo} and {hi}")
        if hi < lo:
            raise ValueError(f"max_value ({hi}) is below min_value ({lo})")
        inferred = step is None
        if inferred:
            step = infer_step(np.r_[v, lo, hi])
        step = float(step)
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"step must be a finite number > 0, got {step}")
        n = int(_round_half_up(np.float64((hi - lo) / step))) + 1
        if n < 2:
            raise ValueError(f"labels span one rank only (min {lo}, max {hi}, step {step}); "
                             "rank estimation needs at least two distinct labels")
        if inferred and n > MAX_INFERRED_RANKS:
            raise ValueError(f"the labels look continuous: the inferred step {step:g} gives {n} ranks "
                             f"between {lo:g} and {hi:g}; round the labels to the precision that matters, "
                             "e.g. whole years or scores to 0.01 (in Python: or pass step=, e.g. step=1)")
        enc = cls(lo, step, n)
        enc.encode(v)  # every label must fall on the grid's range (raises naming the first that does not)
        if inferred:
            _refuse_merged_labels(v, enc)
            _warn_if_a_few_labels_set_the_step(v, enc)
        if min_value is None and max_value is None:
            _warn_if_a_few_labels_stretch_the_scale(v, enc)
        return enc

    def encode(self, values: Any, position: Callable[[int], str] = "index {}".format) -> torch.Tensor:
        """Label values (any shape) -> int64 ranks of the same shape.

        Raises ValueError naming the first value whose rank falls outside ``0 … n-1``, at
        ``position(i)`` of the flattened values ("index 3"; "data row 3" for a file's rows).
        """
        shape = tuple(values.shape) if hasattr(values, "shape") else np.shape(values)
        v = _float_vector(values, "label values")
        r = _round_half_up((v - self.min_value) / self.step)
        bad = np.flatnonzero((r < 0) | (r > self.num_ranks - 1))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"label value {v[i]:g} ({position(i)}) is outside the rank grid {self.min_value:g} … "
                f"{self.max_value:g} (step {self.step:g}, {self.num_ranks} ranks); {bad.size} value(s) are. "
                "Fix or drop such labels, or train on data whose labels cover them (in Python: or fit "
                "the grid on all labels, or pass min_value=/max_value= that cover them).")
        return torch.from_numpy(r.astype(np.int64)).reshape(shape)

    def decode(self, ranks: Any) -> torch.Tensor:
        """Ranks (int or float, e.g. expected ranks; any shape) -> label values, float64 tensor."""
        r = ranks if isinstance(ranks, torch.Tensor) else torch.as_tensor(np.asarray(ranks, dtype=np.float64))
        return self.min_value + r.to(torch.float64) * self.step

    def values(self) -> torch.Tensor:
        """The label value of every rank, ``[n]`` float64."""
        return self.decode(torch.arange(self.num_ranks))
