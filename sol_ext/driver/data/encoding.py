"""The dataset container: :class:`OrdinalDataset`, inputs with ranks on a :class:`~sol_ext.labels.LabelGrid`.

Every loader builds its :class:`OrdinalDataset` here (:func:`make_dataset`), so its ``ranks`` are on that
grid (docs/math.md section 1). The grid itself is library API: :mod:`sol_ext.labels`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...labels import MAX_INFERRED_RANKS, LabelGrid, LabelScaleWarning, infer_step
from .image_files import ImageFiles
from .texts import TextRows

__all__ = ["OrdinalDataset", "make_dataset", "LabelSpec", "DatasetIdentity", "KINDS", "LabelGrid", "infer_step", "LabelScaleWarning",
           "MAX_INFERRED_RANKS", "MAX_GIVEN_RANKS"]

KINDS = ("tabular", "embeddings", "images", "text")

# Most ranks of a grid set by a given step or range: the loss's probability table and the label-noise
# fit of --refine grow with the square of the ranks (2,000: about 10 s for the fit on one core; 9,001
# took minutes and 8 GB). An inferred step stops earlier, at MAX_INFERRED_RANKS: such a grid is
# rather a sign of continuous labels.
MAX_GIVEN_RANKS = 2000


# --------------------------------------------------------------------------------------------------
# Dataset container


@dataclass
class OrdinalDataset:
    """Inputs with 0-based ranks on a :class:`~sol_ext.labels.LabelGrid`.

    Attributes:
        features: float32 ``[N, F]`` for ``kind`` "tabular"/"embeddings", ``[N, C, H, W]`` in [0, 1] for
            "images": a tensor, or :class:`~sol_ext.driver.data.ImageFiles` decoded on access; for
            "text", :class:`~sol_ext.driver.data.TextRows` (a text per row, and the other features).
        ranks: int64 ``[N]`` in ``0 … n-1``: the labels as given (clean truth, or noisy training labels).
        grid: the label grid; ``grid.decode(ranks)`` gives label values.
        name: a short name for reports ("abalone", a file stem).
        kind: "tabular" | "embeddings" | "images" | "text".
        feature_names: names of the ``F`` columns for tabular data ("Sex=F", "Length", …), else empty.
        schema: how the features were read, so that new files can be read the same way for
            prediction (:func:`sol_ext.driver.data.read_inputs`): ``{"format": "csv", "columns": [...],
            "categorical": {column: [categories]}, "label_column": ...}``, ``{"format": "npz", ...}`` or
            ``{"format": "images", "image_size": [H, W], "channels": C, ...}``; empty when unknown.
    """

    features: torch.Tensor
    ranks: torch.Tensor
    grid: LabelGrid
    name: str
    kind: str
    feature_names: tuple[str, ...] = ()
    schema: dict[str, Any] = dataclasses.field(default_factory=dict)
    ids: tuple[str, ...] | None = None  # a table's id column, one per sample; None: row numbers

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        f, r = self.features, self.ranks
        lazy = isinstance(f, ImageFiles)  # decoded on access
        if lazy and self.kind != "images":
            raise ValueError(f"image files are features of kind 'images', not {self.kind!r}")
        if isinstance(f, TextRows) != (self.kind == "text"):
            raise ValueError(f"rows of text (TextRows) are the features of kind 'text', and only they; got "
                             f"{type(f).__name__} of kind {self.kind!r}")
        self.feature_names = tuple(self.feature_names)
        if isinstance(f, TextRows):  # texts, and the other columns' features, read as a table's
            self._check_shapes(f.features, r)
            return
        if not lazy and (not isinstance(f, torch.Tensor) or not f.is_floating_point()):
            raise ValueError(f"features must be a floating-point tensor, got {type(f).__name__} "
                             f"{getattr(f, 'dtype', '')}")
        self._check_shapes(f, r)
        if lazy:
            return
        self.features = self._finite(f)

    def _check_shapes(self, f: Any, r: torch.Tensor) -> None:
        want = 4 if self.kind == "images" else 2
        if len(f.shape) != want:
            raise ValueError(f"{self.kind} features must be {'[N, C, H, W]' if want == 4 else '[N, F]'}, "
                             f"got shape {tuple(f.shape)}")
        if not isinstance(r, torch.Tensor) or r.dim() != 1 or r.dtype != torch.int64:
            raise ValueError(f"ranks must be an int64 tensor [N], got {getattr(r, 'dtype', type(r))} "
                             f"{tuple(getattr(r, 'shape', ()))}")
        if f.shape[0] != r.shape[0]:
            raise ValueError(f"features have {f.shape[0]} rows but ranks {r.shape[0]}")
        if r.numel() == 0:
            raise ValueError(f"dataset {self.name!r} is empty: no samples")
        lo, hi = int(r.min()), int(r.max())
        if lo < 0 or hi >= self.grid.num_ranks:
            raise ValueError(f"ranks must lie in 0 … {self.grid.num_ranks - 1}, got {lo} … {hi}")

    def _finite(self, f: torch.Tensor) -> torch.Tensor:
        finite = torch.isfinite(f.reshape(f.shape[0], -1))
        if not bool(finite.all()):
            row, col = (int(i) for i in torch.nonzero(~finite)[0])
            where = (f"column {self.feature_names[col]!r}" if col < len(self.feature_names)
                     else f"feature {col}")
            raise ValueError(f"dataset {self.name!r} has a NaN or infinite feature ({where}, sample {row}); "
                             "drop or impute such samples before loading")
        return f.to(torch.float32)

    def __len__(self) -> int:
        return int(self.ranks.shape[0])

    @property
    def num_ranks(self) -> int:
        return self.grid.num_ranks

    @property
    def labels(self) -> torch.Tensor:
        """The ranks in label units, float64 ``[N]``."""
        return self.grid.decode(self.ranks)

    def subset(self, index: Any) -> "OrdinalDataset":
        """The samples at ``index`` (indices or a bool mask ``[N]``), same grid."""
        index = torch.as_tensor(np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index))
        ids = None if self.ids is None else tuple(np.asarray(self.ids, dtype=object)[index.numpy()])
        return dataclasses.replace(self, features=self.features[index], ranks=self.ranks[index], ids=ids)

    def with_ranks(self, ranks: Any) -> "OrdinalDataset":
        """The same inputs with other labels ``[N]`` (e.g. ``add_label_noise(...).noisy``)."""
        return dataclasses.replace(self, ranks=torch.as_tensor(ranks, dtype=torch.int64).cpu())


@dataclass(frozen=True)
class LabelSpec:
    """How a loader's label values become ranks: on ``grid`` when given (a test file on the training
    file's grid), else on a grid fitted to the labels with whichever of ``step``, ``min_value``,
    ``max_value`` are given (:meth:`~sol_ext.labels.LabelGrid.fit`)."""

    grid: LabelGrid | None = None
    step: float | None = None
    min_value: float | None = None
    max_value: float | None = None

    def grid_for(self, values: np.ndarray) -> LabelGrid:
        """The grid ``values`` are encoded on: ``grid``, or one fitted to them."""
        if self.grid is not None:
            if self.step is not None or self.min_value is not None or self.max_value is not None:
                raise ValueError("pass either grid= or step/min_value/max_value, not both")
            return self.grid
        return LabelGrid.fit(values, step=self.step, min_value=self.min_value, max_value=self.max_value)


@dataclass(frozen=True)
class DatasetIdentity:
    """What a loaded dataset is, beside its features and labels: the :class:`OrdinalDataset` fields
    of the same names, and ``source``, the file named in errors about its labels."""

    name: str
    kind: str
    source: str = ""
    schema: dict[str, Any] | None = None
    feature_names: Sequence[str] = ()
    ids: Sequence[str] | None = None


def make_dataset(features: torch.Tensor, values: np.ndarray, identity: DatasetIdentity,
                 labels: LabelSpec) -> OrdinalDataset:
    """Encode label values ``[N]`` on the grid ``labels`` gives (fitting it unless it is fixed) and
    build the dataset."""
    where, schema = identity.source or identity.name, identity.schema
    if values.size == 0:
        raise ValueError(f"{where} has no samples")
    try:
        grid = labels.grid_for(values)
    except ValueError as err:
        if labels.grid is not None:  # both a grid and grid settings: the caller's mistake, not the file's
            raise
        raise ValueError(f"{_labels_of(where, schema)}: {err}") from None
    if labels.grid is None and grid.num_ranks > MAX_GIVEN_RANKS:
        _refuse_too_many_ranks(grid, _labels_of(where, schema))
    # a file's labels are every data row in order (a row without one is refused when read)
    in_file = (schema or {}).get("format") in ("csv", "table", "images")
    try:
        ranks = grid.encode(values, (lambda i: f"data row {i}") if in_file else "index {}".format)
    except ValueError as err:
        raise ValueError(f"{_labels_of(where, schema)}: {err}") from None
    if labels.grid is not None or labels.step is not None or labels.min_value is not None:
        _refuse_labels_off_the_grid(values, ranks, grid, _labels_of(where, schema),
                                    (lambda i: f"data row {i}") if in_file else "index {}".format,
                                    fixed=labels.grid is not None)
    return OrdinalDataset(features=features, ranks=ranks, grid=grid, name=identity.name, kind=identity.kind,
                          feature_names=tuple(identity.feature_names), schema=dict(schema or {}),
                          ids=None if identity.ids is None else tuple(identity.ids))


def _refuse_too_many_ranks(grid: LabelGrid, where: str) -> None:
    """ValueError for a given step or range that makes a grid of more than ``MAX_GIVEN_RANKS`` ranks,
    with a step that keeps the range within it (a coarser 1, 2 or 5 times a power of ten)."""
    span = grid.max_value - grid.min_value
    least = span / (MAX_GIVEN_RANKS - 1)
    power = 10.0 ** math.floor(math.log10(least))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= least)
    raise ValueError(f"{where}: the label grid {grid.min_value:g} … {grid.max_value:g} in steps of "
                     f"{grid.step:g} has {grid.num_ranks} ranks, more than the {MAX_GIVEN_RANKS} ranks sol-ext "
                     f"trains on (its cost grows with the square of the ranks); choose a coarser --label-step "
                     f"(e.g. {step:g}: {int(round(span / step)) + 1} ranks) or a narrower --label-min/--label-max "
                     f"(in Python: step=, min_value=, max_value=)")


def _refuse_labels_off_the_grid(values: np.ndarray, ranks: torch.Tensor, grid: LabelGrid, where: str,
                                position: Any, fixed: bool) -> None:
    """ValueError when a label does not lie on a grid that was given (a step or minimum, or the
    training file's grid for a test file): encoding would round it onto a neighbouring rank without a
    word (labels 0 … 9 with a step of 2, or whole labels from a minimum of -0.5)."""
    off = np.abs(grid.decode(ranks).numpy() - values) > 1e-6 * grid.step
    if not off.any():
        return
    rows = np.flatnonzero(off)
    shown = ", ".join(f"{v:g}" for v in np.unique(values[off])[:5]) + (", …" if np.unique(values[off]).size > 5 else "")
    grid_text = (f"{grid.min_value:g}, {grid.min_value + grid.step:g}, {grid.min_value + 2 * grid.step:g} … "
                 f"{grid.max_value:g}")
    fix = ("encode the test labels as the training labels are, or train on labels that include these values"
           if fixed else "choose a step and minimum the labels lie on (--label-step, --label-min; in Python: "
           "step=, min_value=), or leave them out to infer the grid from the labels")
    raise ValueError(f"{where}: label values {shown} ({len(rows)} rows, the first in {position(int(rows[0]))}) are "
                     f"not on the label grid {grid_text} (step {grid.step:g}), and would be rounded to its "
                     f"nearest rank; {fix}")


def _labels_of(where: str, schema: dict[str, Any] | None) -> str:
    """``"ages.csv, label column 'age'"``: where the labels of an error came from."""
    schema = schema or {}
    if schema.get("label_column") is not None:
        return f"{where}, label column {schema['label_column']!r}"
    if schema.get("labels_key") is not None:
        return f"{where}, array {schema['labels_key']!r}"
    return where
