"""Tabular files: CSV tables of features and labels (``load_csv``) and precomputed embeddings (``load_npz``).

Also the CSV reading (delimiter detection, header and cell parsing) that image lists share.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import DataFileError, data_file_errors
from .encoding import OrdinalDataset, RankEncoder, _make_dataset

__all__ = ["load_csv", "load_npz", "SNIFFED_DELIMITERS"]

# Delimiters told apart when a CSV's delimiter is not given, in order of preference on a tie.
SNIFFED_DELIMITERS = (",", ";", "\t")
_DELIMITER_NAMES = {"comma": ",", "semicolon": ";", "tab": "\t", "\\t": "\t"}
_MISSING = {"", "na", "nan", "n/a", "null", "none", "?"}


# --------------------------------------------------------------------------------------------------
# Tables (CSV)


def _require_file(path: Path, missing: str) -> None:
    """FileNotFoundError(``missing``) when ``path`` does not exist; ValueError when it is a folder or
    no regular file (a named pipe would block the reader)."""
    if path.is_file():
        return
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a file")
    if path.exists():
        raise ValueError(f"{path} is not a regular file (a named pipe, socket or device); give a file "
                         "saved on disk")
    raise FileNotFoundError(missing)


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
    _require_file(path, f"CSV file not found: {path}")
    with data_file_errors(path), _open_text(path) as fh:
        lines, delimiter = _with_delimiter(fh, delimiter)
        rows = [[c.strip() for c in row] for row in csv.reader(lines, delimiter=delimiter)
                if any(c.strip() for c in row)]
    if not rows:
        raise ValueError(f"{path} is empty: expected a header row and at least one data row")
    header, body = rows[0], rows[1:]
    first: dict[str, int] = {}
    for k, name in enumerate(header):
        if name in first:
            what = f"the column name {name!r}" if name else "an empty column name"
            raise ValueError(f"{path}: {what} appears more than once in the header (columns {first[name] + 1} "
                             f"and {k + 1}); give each column its own name")
        first[name] = k
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
        fix = {"label": "Pass the right name with label_column=",
               "feature": "Give the file that column (in Python: or choose others with feature_columns=)",
               "path": f"Name the column of image paths {name!r} (in Python: or pass path_column=)",
               }.get(role, f"Pass the right name with {role}_column=")
        raise ValueError(f"{path} has no {role} column {name!r}; its columns are {header}.{hint} {fix}")
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
                    categorical: Mapping[str, Sequence[str]], path: Path
                    ) -> tuple[np.ndarray, list[str], dict[str, list[str]]]:
    """Numeric columns as they are, categorical ones one-hot, in the order of ``columns``; also the
    categories used for each categorical column (so that another file gets the same columns)."""
    blocks, names, used = [], [], {}
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
            used[name] = cats
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
                                 f"row {i + 1}; encode it as numbers or drop the column from the file (in "
                                 f"Python: categorical=[{name!r}] one-hot encodes it, feature_columns=[...] "
                                 "leaves it out)") from None
            if not math.isfinite(col[i]):
                raise ValueError(f"{path}: feature column {name!r} has a NaN or infinite value in data row "
                                 f"{i + 1}; drop or impute such rows before loading")
        blocks.append(col[:, None])
        names.append(name)
    if not blocks:
        raise ValueError(f"{path}: no feature columns left besides the label")
    return np.concatenate(blocks, axis=1), names, used


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
    x, names, used = _parse_features(body, header, list(feature_columns), cats, path)
    schema = {"format": "csv", "columns": list(feature_columns), "categorical": used,
              "label_column": label_column}
    return _make_dataset(torch.from_numpy(x).to(torch.float32), values, name=name or _stem(path),
                         kind="tabular", encoder=encoder, step=step, min_value=min_value,
                         max_value=max_value, feature_names=names, source=str(path), schema=schema)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv", ".npz"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name



# --------------------------------------------------------------------------------------------------
# Precomputed embeddings (.npz)


@contextlib.contextmanager
def _open_npz(path: Path) -> Iterator[np.lib.npyio.NpzFile]:
    """``np.load`` of an ``.npz`` archive, its read errors as :class:`DataFileError`; a ``.npy``
    array under that name is refused."""
    with data_file_errors(path):
        npz = np.load(path, allow_pickle=False)
        if isinstance(npz, np.ndarray):
            raise DataFileError(f"{path} is a .npy array, not an .npz archive; save with "
                                "numpy.savez(..., embeddings=..., labels=...)")
        with npz:
            yield npz


def _refuse_complex(path: Path, key: str, a: np.ndarray) -> None:
    if np.iscomplexobj(a):
        raise ValueError(f"{path}: {key!r} holds complex numbers ({a.dtype}); features and labels must be "
                         "real: save numpy.real(...) or numpy.abs(...) of it if that is what you mean")


def load_npz(path: str | Path, step: float | None = None, min_value: float | None = None,
             max_value: float | None = None, *, encoder: RankEncoder | None = None,
             features_key: str | None = None, labels_key: str = "labels",
             name: str | None = None) -> OrdinalDataset:
    """Precomputed embeddings and labels from a numpy ``.npz`` file.

    The file holds ``embeddings`` (or ``features``) ``[N, d]`` and ``labels`` ``[N]`` in label units;
    ``[N, H, W]`` or ``[N, C, H, W]`` arrays are read as images. Grid arguments as in :func:`load_csv`.
    """
    path = Path(path)
    _require_file(path, f".npz file not found: {path}")
    with _open_npz(path) as npz:
        keys = list(npz.keys())
        if features_key is None:
            present = [k for k in ("embeddings", "features") if k in keys]
            if len(present) != 1:
                fix = ("keep only one of them" if present else "name the features array 'embeddings'")
                raise ValueError(f"{path} must hold exactly one of the arrays 'embeddings' or 'features' "
                                 f"(it has {keys}); {fix} (in Python: or choose with features_key=)")
            features_key = present[0]
        for key in (features_key, labels_key):
            if key not in keys:
                raise ValueError(f"{path} has no array {key!r}; it has {keys}")
        x, y = npz[features_key], npz[labels_key]
    _refuse_complex(path, features_key, x)
    _refuse_complex(path, labels_key, y)
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
    schema = {"format": "npz", "features_key": features_key, "labels_key": labels_key}
    return _make_dataset(torch.from_numpy(x.astype(np.float32)), values, name=name or _stem(path),
                         kind=kind, encoder=encoder, step=step, min_value=min_value, max_value=max_value,
                         source=str(path), schema=schema)
