"""Datasets for rank estimation and the encoder between label values and ranks.

Label values (ages, scores, months) map to 0-based ranks by a fixed grid (SPEC section 1):
``rank = round((value - min_value) / step)`` and ``n = round((max_value - min_value) / step) + 1``.
:class:`RankEncoder` holds that grid; every loader returns an :class:`OrdinalDataset` whose ``ranks`` are
on it, and predictions go back to label units with :meth:`RankEncoder.decode`.

Sources (nothing is downloaded):

- ``load_abalone()``: the UCI Abalone data shipped with the package (rings 1–29, 4177 samples).
- ``load_wine_red()``: the UCI Wine Quality red data shipped with the package (quality 3–8, 1599 wines).
- ``load_csv(path, label_column)``: a table of numeric feature columns and a label column; comma,
  semicolon or tab delimited (detected from the header, or ``delimiter=``).
- ``load_npz(path)``: precomputed embeddings ``[N, d]`` (key ``embeddings`` or ``features``) and ``labels``.
- ``load_image_folder(csv_path)``: images listed in a CSV of ``(path, label)`` rows.
- ``load_fashion_mnist_degradation()``: Fashion-MNIST images blurred or noised to a level 0…K-1, the rank.
- ``load_dataset(spec)``: any of the above by name or path; ``load_train_test`` for a training file with
  labels as given (possibly noisy) and a test file with clean labels, on one shared grid.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import itertools
import math
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import data_file_errors

__all__ = [
    "RankEncoder", "OrdinalDataset", "infer_step",
    "load_abalone", "load_wine_red", "load_csv", "load_npz", "load_image_folder",
    "load_fashion_mnist_degradation",
    "degradation_strengths", "load_dataset", "load_train_test", "split_indices", "train_test_split",
    "standardize",
    "DATASETS_DIR", "FASHION_MNIST_DIR", "FASHION_MNIST_INSTALL",
]

DATASETS_DIR = Path(__file__).resolve().parents[2] / "datasets"  # sol_ext/datasets (package data)
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # where Debian's package installs it
FASHION_MNIST_INSTALL = "apt-get install -y dataset-fashion-mnist"

# Above this many ranks an inferred step is almost surely wrong (continuous labels such as mean ratings):
# ask for an explicit step instead of building a huge grid.
MAX_INFERRED_RANKS = 1000

KINDS = ("tabular", "embeddings", "images")
# Delimiters told apart when a CSV's delimiter is not given, in order of preference on a tie.
SNIFFED_DELIMITERS = (",", ";", "\t")
_DELIMITER_NAMES = {"comma": ",", "semicolon": ";", "tab": "\t", "\\t": "\t"}
_MISSING = {"", "na", "nan", "n/a", "null", "none", "?"}


# --------------------------------------------------------------------------------------------------
# Rank encoder


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
        raise ValueError(f"all labels are equal ({v[0]}): one rank is not a ranking problem; "
                         "pass step and min_value/max_value, or use data with at least two distinct labels")
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


@dataclass(frozen=True)
class RankEncoder:
    """The grid between label values and 0-based ranks (SPEC section 1).

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
        # Plain Python numbers, so encoders compare equal and serialize the same whatever they came from.
        object.__setattr__(self, "min_value", float(self.min_value))
        object.__setattr__(self, "step", float(self.step))
        object.__setattr__(self, "num_ranks", int(self.num_ranks))

    @property
    def max_value(self) -> float:
        """Label value of the top rank ``n - 1``."""
        return self.min_value + (self.num_ranks - 1) * self.step

    @classmethod
    def fit(cls, values: Any, step: float | None = None, min_value: float | None = None,
            max_value: float | None = None) -> "RankEncoder":
        """Build the grid from label values ``[N]``; each of step, min and max is inferred when not given.

        ``min_value``/``max_value`` default to the smallest/largest label; ``step`` defaults to
        :func:`infer_step` of the labels and the given bounds. Raises ValueError for fewer than two
        ranks, for labels outside given bounds, and for an inferred grid of more than
        ``MAX_INFERRED_RANKS`` ranks (continuous labels: pass ``step``).
        """
        v = _float_vector(values, "labels")
        if v.size == 0:
            raise ValueError("cannot fit a RankEncoder on an empty set of labels")
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
                             f"between {lo:g} and {hi:g}; pass step= (for example step=1 for ages, "
                             "0.01 for scores in [0, 1])")
        enc = cls(lo, step, n)
        enc.encode(v)  # every label must fall on the grid's range (raises naming the first that does not)
        return enc

    def encode(self, values: Any) -> torch.Tensor:
        """Label values (any shape) -> int64 ranks of the same shape.

        Raises ValueError naming the first value whose rank falls outside ``0 … n-1``.
        """
        shape = tuple(values.shape) if hasattr(values, "shape") else np.shape(values)
        v = _float_vector(values, "label values")
        r = _round_half_up((v - self.min_value) / self.step)
        bad = np.flatnonzero((r < 0) | (r > self.num_ranks - 1))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"label value {v[i]:g} (index {i}) is outside the rank grid {self.min_value:g} … "
                f"{self.max_value:g} (step {self.step:g}, {self.num_ranks} ranks); {bad.size} value(s) are. "
                "Refit the encoder on all labels, or pass min_value/max_value that cover them.")
        return torch.from_numpy(r.astype(np.int64)).reshape(shape)

    def decode(self, ranks: Any) -> torch.Tensor:
        """Ranks (int or float, e.g. expected ranks; any shape) -> label values, float64 tensor."""
        r = ranks if isinstance(ranks, torch.Tensor) else torch.as_tensor(np.asarray(ranks, dtype=np.float64))
        return self.min_value + r.to(torch.float64) * self.step

    def values(self) -> torch.Tensor:
        """The label value of every rank, ``[n]`` float64."""
        return self.decode(torch.arange(self.num_ranks))


# --------------------------------------------------------------------------------------------------
# Dataset container


@dataclass
class OrdinalDataset:
    """Inputs with 0-based ranks on a :class:`RankEncoder` grid.

    Attributes:
        features: float32 ``[N, F]`` for ``kind`` "tabular"/"embeddings", ``[N, C, H, W]`` in [0, 1] for
            "images".
        ranks: int64 ``[N]`` in ``0 … n-1``: the labels as given (clean truth, or noisy training labels).
        encoder: the label grid; ``encoder.decode(ranks)`` gives label values.
        name: a short name for reports ("abalone", a file stem).
        kind: "tabular" | "embeddings" | "images".
        feature_names: names of the ``F`` columns for tabular data ("Sex=F", "Length", …), else empty.
    """

    features: torch.Tensor
    ranks: torch.Tensor
    encoder: RankEncoder
    name: str
    kind: str
    feature_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        f, r = self.features, self.ranks
        if not isinstance(f, torch.Tensor) or not f.is_floating_point():
            raise ValueError(f"features must be a floating-point tensor, got {type(f).__name__} "
                             f"{getattr(f, 'dtype', '')}")
        want = 4 if self.kind == "images" else 2
        if f.dim() != want:
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
        if lo < 0 or hi >= self.encoder.num_ranks:
            raise ValueError(f"ranks must lie in 0 … {self.encoder.num_ranks - 1}, got {lo} … {hi}")
        finite = torch.isfinite(f.reshape(f.shape[0], -1))
        if not bool(finite.all()):
            row, col = (int(i) for i in torch.nonzero(~finite)[0])
            where = (f"column {self.feature_names[col]!r}" if col < len(self.feature_names)
                     else f"feature {col}")
            raise ValueError(f"dataset {self.name!r} has a NaN or infinite feature ({where}, sample {row}); "
                             "drop or impute such samples before loading")
        self.features = f.to(torch.float32)
        self.feature_names = tuple(self.feature_names)

    def __len__(self) -> int:
        return int(self.ranks.shape[0])

    @property
    def num_ranks(self) -> int:
        return self.encoder.num_ranks

    @property
    def labels(self) -> torch.Tensor:
        """The ranks in label units, float64 ``[N]``."""
        return self.encoder.decode(self.ranks)

    def subset(self, index: Any) -> "OrdinalDataset":
        """The samples at ``index`` (indices or a bool mask ``[N]``), same grid."""
        index = torch.as_tensor(np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index))
        return dataclasses.replace(self, features=self.features[index], ranks=self.ranks[index])

    def with_ranks(self, ranks: Any) -> "OrdinalDataset":
        """The same inputs with other labels ``[N]`` (e.g. ``add_label_noise(...).noisy``)."""
        return dataclasses.replace(self, ranks=torch.as_tensor(ranks, dtype=torch.int64).cpu())


def _make_dataset(features: torch.Tensor, values: np.ndarray, *, name: str, kind: str,
                  encoder: RankEncoder | None, step: float | None, min_value: float | None,
                  max_value: float | None, feature_names: Sequence[str] = (),
                  source: str = "") -> OrdinalDataset:
    """Encode label values ``[N]`` (fitting the grid unless ``encoder`` is given) and build the dataset."""
    if values.size == 0:
        raise ValueError(f"{source or name} has no samples")
    if encoder is not None:
        if step is not None or min_value is not None or max_value is not None:
            raise ValueError("pass either encoder= or step/min_value/max_value, not both")
    else:
        try:
            encoder = RankEncoder.fit(values, step=step, min_value=min_value, max_value=max_value)
        except ValueError as err:
            raise ValueError(f"{source or name}: {err}") from None
    try:
        ranks = encoder.encode(values)
    except ValueError as err:
        raise ValueError(f"{source or name}: {err}") from None
    return OrdinalDataset(features=features, ranks=ranks, encoder=encoder, name=name, kind=kind,
                          feature_names=tuple(feature_names))


# --------------------------------------------------------------------------------------------------
# Tables (CSV)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="", encoding="utf-8-sig")
    return open(path, newline="", encoding="utf-8-sig")


def _check_delimiter(delimiter: str | None) -> str | None:
    """A given CSV delimiter as one character (the names "comma", "semicolon", "tab" allowed), or None."""
    if delimiter is None:
        return None
    if isinstance(delimiter, str):
        d = _DELIMITER_NAMES.get(delimiter.lower(), delimiter)
        if len(d) == 1 and (d == "\t" or not (d.isalnum() or d.isspace() or d in "\"'.+-")):
            return d
    raise ValueError(f"delimiter must be one character such as ',', ';', '\\t' or '|' (or one of the names "
                     f"'comma', 'semicolon', 'tab'), or None to detect it from the header; got {delimiter!r}")


def _sniff_delimiter(lines: Sequence[str]) -> str:
    """The delimiter of a CSV, one of ``SNIFFED_DELIMITERS``, from its header and first data line.

    Each candidate is counted outside double quotes, so quoted names that hold one (UCI's
    ``"fixed acidity";"volatile acidity"``) do not count. Preferred are candidates found as often in
    the header as in the first data line; among them (or else among all found in the header) the most
    frequent wins, ties going to the earlier of comma, semicolon, tab. A header with none is one
    column: comma.
    """
    counts = [[re.sub(r'"[^"]*"', "", line).count(d) for d in SNIFFED_DELIMITERS] for line in lines[:2]]
    if not counts:
        return ","
    header = counts[0]
    found = [k for k, c in enumerate(header) if c > 0]
    steady = [k for k in found if len(counts) < 2 or counts[1][k] == header[k]]
    pool = steady or found
    if not pool:
        return ","
    return SNIFFED_DELIMITERS[max(pool, key=lambda k: (header[k], -k))]


def _with_delimiter(fh: io.TextIOBase, delimiter: str | None) -> tuple[Iterator[str], str]:
    """The lines of ``fh`` and its delimiter: ``delimiter`` if given, else sniffed from the first lines."""
    lines: Iterator[str] = iter(fh)
    if delimiter is not None:
        return lines, delimiter
    head, filled = [], []
    for line in lines:
        head.append(line)
        if line.strip():
            filled.append(line)
            if len(filled) == 2:
                break
    return itertools.chain(head, lines), _sniff_delimiter(filled)


def _read_csv(path: str | Path, delimiter: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV (``.csv`` or ``.csv.gz``), cells stripped; rows checked for length.

    ``delimiter``: one character (or "comma", "semicolon", "tab"); None detects comma, semicolon or tab
    from the header line (:func:`_sniff_delimiter`).
    """
    path = Path(path)
    delimiter = _check_delimiter(delimiter)
    if not path.is_file():
        raise FileNotFoundError(f"CSV file not found: {path}")
    with data_file_errors(path), _open_text(path) as fh:
        lines, delimiter = _with_delimiter(fh, delimiter)
        rows = [[c.strip() for c in row] for row in csv.reader(lines, delimiter=delimiter)
                if any(c.strip() for c in row)]
    if not rows:
        raise ValueError(f"{path} is empty: expected a header row and at least one data row")
    header, body = rows[0], rows[1:]
    if not body:
        raise ValueError(f"{path} has a header but no data rows: the dataset would be empty")
    for i, row in enumerate(body):
        if len(row) != len(header):
            raise ValueError(f"{path}, data row {i + 1}: {len(row)} cells but the header has {len(header)} "
                             f"columns (read with delimiter {delimiter!r}; pass delimiter= if that is wrong)")
    return header, body


def _column(header: list[str], name: str, path: Path, role: str) -> int:
    if name not in header:
        hint = (" The header was read as one column: if its cells are separated by some other character, "
                "pass it as delimiter=." if len(header) == 1 else "")
        raise ValueError(f"{path} has no {role} column {name!r}; its columns are {header}.{hint} "
                         f"Pass the right name with {role}_column=")
    return header.index(name)


def _parse_labels(body: list[list[str]], j: int, name: str, path: Path) -> np.ndarray:
    out = np.empty(len(body), dtype=np.float64)
    for i, row in enumerate(body):
        cell = row[j]
        try:
            out[i] = float(cell)
        except ValueError:
            out[i] = np.nan
        if not math.isfinite(out[i]):
            raise ValueError(f"{path}: label column {name!r} has a missing or non-numeric value {cell!r} in "
                             f"data row {i + 1}; labels must be numbers (ages, scores, months)")
    return out


def _parse_features(body: list[list[str]], header: list[str], columns: Sequence[str],
                    categorical: Mapping[str, Sequence[str]], path: Path) -> tuple[np.ndarray, list[str]]:
    """Numeric columns as they are, categorical ones one-hot, in the order of ``columns``."""
    blocks, names = [], []
    for name in columns:
        j = _column(header, name, path, "feature")
        cells = [row[j] for row in body]
        if name in categorical:
            cats = list(categorical[name]) or sorted(set(cells))
            unknown = sorted(set(cells) - set(cats))
            if unknown:
                raise ValueError(f"{path}: categorical column {name!r} has values {unknown} outside its "
                                 f"categories {cats}")
            onehot = np.array([[c == k for k in cats] for c in cells], dtype=np.float64)
            blocks.append(onehot)
            names += [f"{name}={k}" for k in cats]
            continue
        col = np.empty(len(cells), dtype=np.float64)
        for i, cell in enumerate(cells):
            if cell.lower() in _MISSING:
                raise ValueError(f"{path}: feature column {name!r} has a missing value (NaN) in data row "
                                 f"{i + 1}; drop or impute such rows before loading")
            try:
                col[i] = float(cell)
            except ValueError:
                raise ValueError(f"{path}: feature column {name!r} has a non-numeric value {cell!r} in data "
                                 f"row {i + 1}; list it in categorical=[{name!r}] to one-hot encode it, or "
                                 "leave it out with feature_columns=[...]") from None
            if not math.isfinite(col[i]):
                raise ValueError(f"{path}: feature column {name!r} has a NaN or infinite value in data row "
                                 f"{i + 1}; drop or impute such rows before loading")
        blocks.append(col[:, None])
        names.append(name)
    if not blocks:
        raise ValueError(f"{path}: no feature columns left besides the label")
    return np.concatenate(blocks, axis=1), names


def load_csv(path: str | Path, label_column: str = "label", feature_columns: Sequence[str] | None = None,
             step: float | None = None, min_value: float | None = None, max_value: float | None = None,
             *, encoder: RankEncoder | None = None,
             categorical: Sequence[str] | Mapping[str, Sequence[str]] = (),
             name: str | None = None, delimiter: str | None = None) -> OrdinalDataset:
    """A tabular dataset from a CSV (``.csv`` or ``.csv.gz``) with a header row.

    Args:
        path: the file.
        label_column: the column of label values (numbers), mapped to ranks on the grid.
        feature_columns: the input columns, in order; default every column but the label.
        step, min_value, max_value: the grid, each inferred from the labels when not given.
        encoder: a fixed grid instead (e.g. the training set's, when loading a test file).
        categorical: columns to one-hot encode, either names (categories = sorted distinct values) or
            ``{name: categories}`` (use this when train and test files must get the same columns).
        name: dataset name; default the file stem.
        delimiter: the cell separator, one character (``","``, ``";"``, ``"\\t"``, ``"|"``, …) or
            ``"comma"``/``"semicolon"``/``"tab"``; default None detects comma, semicolon or tab from the
            header line (quoted names allowed, as in UCI's semicolon files).

    Returns:
        ``OrdinalDataset`` of kind "tabular" with raw (unscaled) float32 features ``[N, F]``; scale them
        with :func:`standardize` after splitting.
    """
    path = Path(path)
    header, body = _read_csv(path, delimiter)
    j = _column(header, label_column, path, "label")
    values = _parse_labels(body, j, label_column, path)
    if feature_columns is None:
        feature_columns = [c for c in header if c != label_column]
    elif label_column in feature_columns:
        raise ValueError(f"the label column {label_column!r} cannot also be a feature column")
    cats = dict(categorical) if isinstance(categorical, Mapping) else {c: () for c in categorical}
    for c in cats:
        if c not in feature_columns:
            raise ValueError(f"categorical column {c!r} is not among the feature columns "
                             f"{list(feature_columns)}")
    x, names = _parse_features(body, header, list(feature_columns), cats, path)
    return _make_dataset(torch.from_numpy(x).to(torch.float32), values, name=name or _stem(path),
                         kind="tabular", encoder=encoder, step=step, min_value=min_value,
                         max_value=max_value, feature_names=names, source=str(path))


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv", ".npz"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


ABALONE_SEX = ("F", "I", "M")


def load_abalone() -> OrdinalDataset:
    """UCI Abalone (Nash et al. 1994, CC BY 4.0), shipped with the package (``sol_ext/datasets/ABALONE.md``).

    4177 samples; label: rings 1–29 on a step-1 grid (29 ranks; 28 rings never occurs).
    Features ``[N, 10]``: ``Sex`` one-hot (``Sex=F``, ``Sex=I``, ``Sex=M``) and the seven raw
    measurements (length, diameter, height, four weights), unscaled: call :func:`standardize` after
    splitting, so test data never shape the scaling.
    """
    return load_csv(DATASETS_DIR / "abalone.csv.gz", label_column="Rings",
                    encoder=RankEncoder(min_value=1.0, step=1.0, num_ranks=29),
                    categorical={"Sex": ABALONE_SEX}, name="abalone")


def load_wine_red() -> OrdinalDataset:
    """UCI Wine Quality, red (Cortez et al. 2009, CC BY 4.0), shipped (``sol_ext/datasets/WINE_QUALITY.md``).

    1599 wines; label: ``quality`` 3–8 on a step-1 grid (6 ranks, imbalanced: 10, 53, 681, 638, 199, 18
    wines). Features ``[N, 11]``: the raw physicochemical measurements (fixed acidity … alcohol),
    unscaled: call :func:`standardize` after splitting. The file is UCI's semicolon-delimited CSV.
    """
    return load_csv(DATASETS_DIR / "winequality-red.csv.gz", label_column="quality",
                    encoder=RankEncoder(min_value=3.0, step=1.0, num_ranks=6), name="wine-red",
                    delimiter=";")


# --------------------------------------------------------------------------------------------------
# Precomputed embeddings (.npz)


def load_npz(path: str | Path, step: float | None = None, min_value: float | None = None,
             max_value: float | None = None, *, encoder: RankEncoder | None = None,
             features_key: str | None = None, labels_key: str = "labels",
             name: str | None = None) -> OrdinalDataset:
    """Precomputed embeddings and labels from a numpy ``.npz`` file.

    The file holds ``embeddings`` (or ``features``) ``[N, d]`` and ``labels`` ``[N]`` in label units;
    ``[N, H, W]`` or ``[N, C, H, W]`` arrays are read as images. Grid arguments as in :func:`load_csv`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f".npz file not found: {path}")
    with data_file_errors(path), np.load(path, allow_pickle=False) as npz:
        keys = list(npz.keys())
        if features_key is None:
            present = [k for k in ("embeddings", "features") if k in keys]
            if len(present) != 1:
                raise ValueError(f"{path} must hold exactly one of the arrays 'embeddings' or 'features' "
                                 f"(it has {keys}); pass features_key= to choose")
            features_key = present[0]
        for key in (features_key, labels_key):
            if key not in keys:
                raise ValueError(f"{path} has no array {key!r}; it has {keys}")
        x, y = npz[features_key], npz[labels_key]
    if not np.issubdtype(y.dtype, np.number) or y.ndim != 1:
        raise ValueError(f"{path}: {labels_key!r} must be a numeric vector [N], got {y.dtype} {y.shape}")
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"{path}: {features_key!r} must be numeric, got {x.dtype}")
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim not in (2, 4) or x.shape[0] != y.shape[0]:
        raise ValueError(f"{path}: {features_key!r} must be [N, d] (or images [N, C, H, W]) with N = "
                         f"{y.shape[0]} labels, got shape {x.shape}")
    values = y.astype(np.float64)
    if not np.all(np.isfinite(values)):
        i = int(np.flatnonzero(~np.isfinite(values))[0])
        raise ValueError(f"{path}: label {i} is {values[i]}; labels must be finite numbers")
    kind = "embeddings" if x.ndim == 2 else "images"
    return _make_dataset(torch.from_numpy(x.astype(np.float32)), values, name=name or _stem(path),
                         kind=kind, encoder=encoder, step=step, min_value=min_value, max_value=max_value,
                         source=str(path))


# --------------------------------------------------------------------------------------------------
# Images


def _import_pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("loading image files needs Pillow: pip install pillow") from None
    return Image


_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}


def _image_array(img: Any, channels: int, size: tuple[int, int]) -> np.ndarray:
    """A PIL image as float32 ``[C, H, W]`` in [0, 1], resized to ``size = (H, W)``."""
    Image = _import_pil()
    if channels == 3:
        arr = np.asarray(img.convert("RGB").resize(size[::-1], Image.BILINEAR), dtype=np.float32) / 255.0
        return arr.transpose(2, 0, 1)
    if img.mode.startswith("I"):
        # 16-bit (and 32-bit integer) grayscale: scale by the 16-bit range instead of clipping at 255.
        arr = np.asarray(img, dtype=np.float32) / 65535.0
        img = Image.fromarray(arr, mode="F")
    elif img.mode == "F":
        pass  # already float; taken as [0, 1]
    else:
        img = Image.fromarray(np.asarray(img.convert("L"), dtype=np.float32) / 255.0, mode="F")
    arr = np.asarray(img.resize(size[::-1], Image.BILINEAR), dtype=np.float32)
    return arr[None]


def load_image_folder(csv_path: str | Path, root: str | Path | None = None, path_column: str = "path",
                      label_column: str = "label", image_size: int | tuple[int, int] = 64,
                      step: float | None = None, min_value: float | None = None,
                      max_value: float | None = None, *, encoder: RankEncoder | None = None,
                      channels: int | None = None, name: str | None = None,
                      delimiter: str | None = None) -> OrdinalDataset:
    """Images listed in a CSV of ``(path, label)`` rows, decoded with Pillow (PNG, JPEG, BMP, TIFF, …).

    Args:
        csv_path: the list; paths in it are relative to ``root`` (default: the CSV's folder) or absolute.
        path_column, label_column: the CSV's column names.
        image_size: every image is resized (bilinear, aspect ratio not kept) to ``image_size`` squared, or
            ``(H, W)``.
        channels: 1 (grayscale) or 3 (RGB); default 1 when every image is grayscale, else 3.
        step, min_value, max_value, encoder, name, delimiter: as in :func:`load_csv`.

    Returns:
        ``OrdinalDataset`` of kind "images", features float32 ``[N, C, H, W]`` in [0, 1]
        (``N * C * H * W * 4`` bytes in memory).
    """
    Image = _import_pil()
    csv_path = Path(csv_path)
    header, body = _read_csv(csv_path, delimiter)
    jp = _column(header, path_column, csv_path, "path")
    jl = _column(header, label_column, csv_path, "label")
    values = _parse_labels(body, jl, label_column, csv_path)
    root = csv_path.parent if root is None else Path(root)
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (H, W), got {image_size}")
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1, 3 or None (automatic), got {channels}")

    files = []
    for i, row in enumerate(body):
        p = Path(row[jp])
        p = p if p.is_absolute() else root / p
        if not p.is_file():
            raise FileNotFoundError(f"image {p} (data row {i + 1} of {csv_path}) not found; paths are read "
                                    f"relative to root={root}")
        files.append(p)

    def _open(i: int) -> Any:
        try:
            img = Image.open(files[i])
            img.load()
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise ValueError(f"cannot read image {files[i]} (data row {i + 1} of {csv_path}): {err}. "
                             "Replace the file or remove its row") from None
        return img

    if channels is None:
        # First pass reads only the headers (Image.open is lazy) to pick gray or colour for all images.
        channels = 1
        for i, f in enumerate(files):
            try:
                with Image.open(f) as img:
                    mode = img.mode
            except (OSError, ValueError) as err:
                raise ValueError(f"cannot read image {f} (data row {i + 1} of {csv_path}): {err}. "
                                 "Replace the file or remove its row") from None
            if mode not in _GRAY_MODES:
                channels = 3
                break
    x = np.empty((len(files), channels, *size), dtype=np.float32)
    for i in range(len(files)):
        with _open(i) as img:
            x[i] = _image_array(img, channels, size)
    return _make_dataset(torch.from_numpy(x), values, name=name or _stem(csv_path), kind="images",
                         encoder=encoder, step=step, min_value=min_value, max_value=max_value,
                         source=str(csv_path))


# --------------------------------------------------------------------------------------------------
# Fashion-MNIST with a controlled degradation level as the rank

DEGRADATIONS = ("blur", "noise")
# Strength at the top level K-1. Blur: Gaussian sigma in pixels; noise: std of additive Gaussian pixel noise
# on [0, 1] intensities (then clipped to [0, 1]).
DEFAULT_MAX_STRENGTH = {"blur": 2.5, "noise": 0.5}
# Blur below sigma 0.5 px hardly changes a 28x28 image, while each further step of sigma matters less and
# less: blur levels 1..K-1 are spaced geometrically from this sigma up to the maximum.
MIN_BLUR_SIGMA = 0.5


def degradation_strengths(levels: int, kind: str = "blur", max_strength: float | None = None) -> list[float]:
    """The strength of each level ``0 … levels-1`` (level 0 is the original image, strength 0).

    ``kind="blur"``: Gaussian sigma in pixels, geometric from 0.5 at level 1 to ``max_strength`` (2.5)
    at the top level. ``kind="noise"``: std of additive pixel noise, linear ``k / (levels-1) * max_strength``
    (0.5).
    """
    if kind not in DEGRADATIONS:
        raise ValueError(f"kind must be one of {DEGRADATIONS}, got {kind!r}")
    if isinstance(levels, bool) or int(levels) != levels or levels < 2:
        raise ValueError(f"levels must be an integer >= 2, got {levels}")
    top = DEFAULT_MAX_STRENGTH[kind] if max_strength is None else float(max_strength)
    if not (math.isfinite(top) and top > 0):
        raise ValueError(f"max_strength must be a finite number > 0, got {max_strength}")
    levels = int(levels)
    if kind == "noise":
        return [top * k / (levels - 1) for k in range(levels)]
    low = min(MIN_BLUR_SIGMA, top)
    if levels == 2:
        return [0.0, top]
    return [0.0] + [low * (top / low) ** ((k - 1) / (levels - 2)) for k in range(1, levels)]


def _read_idx_images(path: Path) -> np.ndarray:
    """An IDX3 ubyte file (gzipped) as uint8 ``[N, H, W]``."""
    with data_file_errors(path), gzip.open(path, "rb") as fh:
        data = fh.read()
    magic, n, h, w = struct.unpack(">IIII", data[:16])
    if magic != 2051 or len(data) != 16 + n * h * w:
        raise ValueError(f"{path} is not an IDX image file (magic {magic}, {len(data)} bytes)")
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, h, w)


def _gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``[N, 1, H, W]`` with edge replication; sigma in pixels (0 = identity)."""
    if sigma <= 0:
        return x
    radius = max(1, int(math.ceil(3.0 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-(t**2) / (2.0 * sigma**2))
    k = (k / k.sum()).to(x.dtype)
    x = torch.nn.functional.pad(x, (radius, radius, radius, radius), mode="replicate")
    x = torch.nn.functional.conv2d(x, k.view(1, 1, 1, -1))
    return torch.nn.functional.conv2d(x, k.view(1, 1, -1, 1))


def load_fashion_mnist_degradation(levels: int = 8, samples_per_level: int = 500, kind: str = "blur",
                                   seed: int = 0, root: str | Path | None = None, split: str = "train",
                                   max_strength: float | None = None) -> OrdinalDataset:
    """Real Fashion-MNIST images whose rank is a degradation level ``0 … levels-1`` applied to them.

    ``levels * samples_per_level`` distinct images (default 4000) are drawn at random from the split,
    each is given a level (balanced: ``samples_per_level`` per level) and degraded with the strength of
    its level (:func:`degradation_strengths`): a Gaussian blur of sigma 0.5 … 2.5 pixels, geometric in the
    level, for ``kind="blur"``; additive Gaussian pixel noise of std ``k / (levels-1) * 0.5``, clipped to
    [0, 1], for ``kind="noise"``. Level 0 is the original image. ``max_strength`` changes the top level's
    strength. Features: float32 ``[N, 1, 28, 28]`` in [0, 1].

    The data come from Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``;
    ``root=`` points elsewhere, to a folder with the ``*-images-idx3-ubyte.gz`` files). ``split="test"``
    draws from the 10 000 test images, so a train/test pair shares no source image.
    """
    strengths = degradation_strengths(levels, kind, max_strength)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if isinstance(samples_per_level, bool) or int(samples_per_level) != samples_per_level \
            or samples_per_level < 1:
        raise ValueError(f"samples_per_level must be an integer >= 1, got {samples_per_level}")
    levels, samples_per_level = int(levels), int(samples_per_level)
    folder = FASHION_MNIST_DIR if root is None else Path(root)
    path = folder / ("train-images-idx3-ubyte.gz" if split == "train" else "t10k-images-idx3-ubyte.gz")
    if not path.is_file():
        raise FileNotFoundError(f"Fashion-MNIST not found: {path} is missing. Install it with "
                                f"`{FASHION_MNIST_INSTALL}` (Debian/Ubuntu, as root), or pass root= a folder "
                                "holding train-images-idx3-ubyte.gz and t10k-images-idx3-ubyte.gz")
    images = _read_idx_images(path)
    total = levels * samples_per_level
    if total > images.shape[0]:
        raise ValueError(f"levels * samples_per_level = {total} exceeds the {images.shape[0]} images of the "
                         f"{split} split")
    rng = np.random.default_rng(seed)
    pick = rng.choice(images.shape[0], size=total, replace=False)
    level = rng.permutation(np.repeat(np.arange(levels), samples_per_level))
    x = torch.from_numpy(images[pick].astype(np.float32) / 255.0)[:, None]
    noise_gen = torch.Generator().manual_seed(int(seed))
    for k in range(1, levels):
        rows = torch.from_numpy(np.flatnonzero(level == k))
        s = strengths[k]
        if kind == "blur":
            x[rows] = _gaussian_blur(x[rows], s)
        else:
            noisy = x[rows] + s * torch.randn(x[rows].shape, generator=noise_gen)
            x[rows] = noisy.clamp_(0.0, 1.0)
    encoder = RankEncoder(min_value=0.0, step=1.0, num_ranks=levels)
    return OrdinalDataset(features=x, ranks=torch.from_numpy(level.astype(np.int64)), encoder=encoder,
                          name=f"fashion-mnist-{kind}", kind="images")


# --------------------------------------------------------------------------------------------------
# One entry point by name or path


_NAMED = ("abalone", "wine-red", "fashion-mnist", "fashion-mnist-blur", "fashion-mnist-noise")


def load_dataset(spec: str | Path, **options: Any) -> OrdinalDataset:
    """Load a dataset by name or path; ``options`` go to the loader.

    ``spec`` is one of:

    - ``"abalone"`` → :func:`load_abalone`; ``"wine-red"`` → :func:`load_wine_red`;
    - ``"fashion-mnist-blur"`` (or ``"fashion-mnist"``) / ``"fashion-mnist-noise"`` →
      :func:`load_fashion_mnist_degradation`;
    - a ``.npz`` file → :func:`load_npz`;
    - a ``.csv``/``.csv.gz`` file with a ``path`` column (or ``path_column=`` given) →
      :func:`load_image_folder`; any other CSV → :func:`load_csv` (``label_column`` defaults to
      ``"label"``);
    - a folder holding ``labels.csv`` → :func:`load_image_folder` on it.

    Pass ``encoder=`` to put the data on an existing grid (a test file on the training file's grid).
    ``delimiter=`` (one character, or "comma"/"semicolon"/"tab") is the cell separator of a CSV; None
    (the default) detects comma, semicolon or tab from the header. It applies to CSV files only.
    """
    key = str(spec).strip()
    delimiter = _check_delimiter(options.pop("delimiter", None))
    csv_options = options if delimiter is None else {**options, "delimiter": delimiter}
    if delimiter is not None and (key.lower() in _NAMED or key.lower().endswith(".npz")):
        raise ValueError(f"delimiter={delimiter!r} applies to CSV files only; {key!r} is not one: leave "
                         "delimiter out")
    if options.get("label_column") is not None and (key.lower() in _NAMED or key.lower().endswith(".npz")):
        raise ValueError(f"label_column={options['label_column']!r} applies to CSV files and image folders; "
                         f"{key!r} is neither, so do not pass label_column=")
    if key.lower() == "abalone":
        return load_abalone(**options)
    if key.lower() == "wine-red":
        return load_wine_red(**options)
    if key.lower() == "fashion-mnist":
        return load_fashion_mnist_degradation(**options)
    if key.lower() in ("fashion-mnist-blur", "fashion-mnist-noise"):
        return load_fashion_mnist_degradation(kind=key.lower().rsplit("-", 1)[1], **options)
    path = Path(key)
    if path.is_dir():
        listing = path / "labels.csv"
        if not listing.is_file():
            raise FileNotFoundError(f"{path} is a folder without labels.csv; an image folder needs a "
                                    "labels.csv with columns path,label")
        return load_image_folder(listing, **csv_options)
    if not path.exists():
        raise FileNotFoundError(f"no dataset {key!r}: not a built-in name ({', '.join(_NAMED)}) nor an "
                                "existing .csv, .npz file or image folder")
    name = path.name.lower()
    if name.endswith(".npz"):
        return load_npz(path, **options)
    if name.endswith(".csv") or name.endswith(".csv.gz"):
        header, _ = _read_csv(path, delimiter)
        if "path_column" in options or "path" in header:
            return load_image_folder(path, **csv_options)
        return load_csv(path, **csv_options)
    raise ValueError(f"cannot tell the format of {path}: expected .csv, .csv.gz, .npz or a folder with "
                     "labels.csv")


def load_train_test(train_spec: str | Path, test_spec: str | Path,
                    **options: Any) -> tuple[OrdinalDataset, OrdinalDataset]:
    """A training set with labels as given (possibly noisy) and a test set with clean labels, on one grid.

    The grid is fitted on the training labels only (with any ``step``/``min_value``/``max_value`` given)
    and reused for the test file, so test labels never shape training. A test label off that grid is an
    error: pass ``min_value``/``max_value`` covering both files.
    """
    train = load_dataset(train_spec, **options)
    rest = {k: v for k, v in options.items() if k not in ("step", "min_value", "max_value", "encoder")}
    test = load_dataset(test_spec, encoder=train.encoder, **rest)
    if train.features.shape[1:] != test.features.shape[1:]:
        raise ValueError(f"train and test features differ in shape: {tuple(train.features.shape[1:])} vs "
                         f"{tuple(test.features.shape[1:])}")
    return train, test


# --------------------------------------------------------------------------------------------------
# Splitting and scaling


def split_indices(ranks: Any, test_fraction: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Row numbers ``(train, test)`` (int64, ascending) of a deterministic split stratified by rank.

    Samples are grouped by rank ``[N]`` (random order within a rank, from ``seed``) and every
    ``1/test_fraction``-th one goes to the test set, so each rank contributes its share (± 1) and the
    test set has ``round(test_fraction * N)`` samples (± 1). It depends on the ranks and the seed only.
    """
    if not (0.0 < float(test_fraction) < 1.0):
        raise ValueError(f"test_fraction must be between 0 and 1 (exclusive), got {test_fraction}")
    r = np.asarray(ranks.cpu() if isinstance(ranks, torch.Tensor) else ranks).reshape(-1)
    n = r.size
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    order = perm[np.argsort(r[perm], kind="stable")]
    offset = rng.random()
    pos = np.arange(n)
    take = (np.floor((pos + 1) * test_fraction + offset) - np.floor(pos * test_fraction + offset)) >= 1
    test_idx, train_idx = np.sort(order[take]), np.sort(order[~take])
    if test_idx.size == 0 or train_idx.size == 0:
        raise ValueError(f"splitting {n} samples with test_fraction={test_fraction} leaves an empty part; "
                         "use more data or another fraction")
    return torch.from_numpy(train_idx), torch.from_numpy(test_idx)


def train_test_split(ds: OrdinalDataset, test_fraction: float = 0.2,
                     seed: int = 0) -> tuple[OrdinalDataset, OrdinalDataset]:
    """``(train, test)`` parts of ``ds`` by :func:`split_indices`; both keep the original sample order."""
    train_idx, test_idx = split_indices(ds.ranks, test_fraction, seed)
    return ds.subset(train_idx), ds.subset(test_idx)


def standardize(train: OrdinalDataset,
                test: OrdinalDataset | None = None) -> tuple[OrdinalDataset, OrdinalDataset | None]:
    """Scale features to zero mean and unit variance per column, fitted on ``train`` only.

    Applies to "tabular" and "embeddings" data; constant columns are centred only. Images are returned
    unchanged (they are already in [0, 1]).
    """
    if train.kind == "images":
        return train, test
    x = train.features.to(torch.float64)
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))

    def scale(ds: OrdinalDataset) -> OrdinalDataset:
        if ds.features.shape[1:] != train.features.shape[1:]:
            raise ValueError(f"{ds.name!r} has features {tuple(ds.features.shape[1:])}, train has "
                             f"{tuple(train.features.shape[1:])}")
        return dataclasses.replace(ds, features=((ds.features.to(torch.float64) - mean) / std).float())

    return scale(train), (scale(test) if test is not None else None)
