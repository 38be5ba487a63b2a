"""Inputs for prediction: new files read the way a run's training data were read, labels optional.

A trained run records its data's ``schema`` (:attr:`OrdinalDataset.schema`): which CSV columns in
which order, the categories of each one-hot column, the image size and channels. :func:`read_inputs`
reads a new file with that schema, so a prediction sees the same feature columns as training did;
the file may lack the label column (then there is nothing to score against).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .builtin import DATASETS_DIR
from .frames import cell_texts, fill_missing, table_features, table_labels
from .image_files import ImageFiles
from .load import BUILTIN_NAMES, TABULAR_FORMATS, load_dataset
from .tables import (
    TableRead,
    column_index,
    open_npz,
    parse_labels,
    read_csv_rows,
    read_feature_table,
    read_table_features,
    refuse_complex,
    require_file,
    table_format,
)
from .texts import TextRows

__all__ = ["Inputs", "read_inputs", "TableSlices", "table_slices", "SLICE_ROWS"]

# rows of a table file converted at a time by table_slices: a slice's features, embeddings and
# probabilities stay a few tens of MB whatever the file's length
SLICE_ROWS = 65_536

# The built-in tables as files with their delimiter: read for prediction by a run's own columns, as
# any file is (a run trained on other columns must not predict on them).
_BUILTIN_TABLES = {"abalone": ("abalone.csv.gz", None), "wine-red": ("winequality-red.csv.gz", ";")}


@dataclass
class Inputs:
    """Raw (unscaled) inputs of a prediction.

    Attributes:
        features: float32 ``[N, F]``, or images ``[N, C, H, W]`` in [0, 1] (image files stay
            :class:`ImageFiles`, decoded when a batch needs them), or :class:`TextRows` (a run
            trained on a text column).
        ids: one id per row: the data row number (from 0), or the image path as written in the list.
        values: ``[N]`` float64 label values when the data have labels, else ``None``.
        incomplete: ``[N]`` bool, the rows of a table with a missing feature value (their features
            filled in so that the model runs; their predictions are not to be trusted), or ``None``.
    """

    features: torch.Tensor | ImageFiles
    ids: list[str]
    values: Optional[np.ndarray]
    incomplete: Optional[np.ndarray] = None  # [N] bool: rows with a missing feature value (filled in)


def read_inputs(spec: str | Path, schema: dict[str, Any], delimiter: Optional[str] = None,
                handle_unknown: str = "error", missing: str = "mark") -> Inputs:
    """Read ``spec`` (a built-in name; a CSV/TSV, Parquet, Feather or ``.npz`` file; or an image folder
    with ``labels.csv``) the way data of ``schema`` were read for training: a table's columns by name,
    in the training order, with the training categories (a category training did not see: an error,
    or with ``handle_unknown="ignore"`` none of its column's); its label column optional.

    ``missing``: a table's row with a missing feature cell is filled with the training file's values
    (``schema["fill_values"]``) and marked in ``incomplete`` (``"mark"``: no prediction), filled so
    and predicted (``"impute"``, as a run trained with ``--missing impute`` does), or refused
    (``"error"``)."""
    key = str(spec).strip()
    fmt = schema.get("format")
    if key.lower() in BUILTIN_NAMES:
        if key.lower() in _BUILTIN_TABLES and fmt in TABULAR_FORMATS:
            file, builtin_delimiter = _BUILTIN_TABLES[key.lower()]
            return _read_table(DATASETS_DIR / file, schema, builtin_delimiter, where=f"{key} ({file})",
                               handle_unknown=handle_unknown, missing=missing)
        if key.lower() in _BUILTIN_TABLES or fmt != "images":
            kind = "a table" if key.lower() in _BUILTIN_TABLES else "images"
            raise ValueError(f"{key} is {kind} but the run was trained on {fmt or 'other'} data; give data "
                             "of the same kind")
        image_size = schema.get("image_size")
        ds = load_dataset(key, **({} if image_size is None else {"image_size": tuple(image_size)}))
        return Inputs(ds.features, [str(i) for i in range(len(ds))], ds.labels.numpy())
    path = Path(key)
    if path.is_dir():
        path = path / "labels.csv"
    require_file(path, f"no data {key!r}: not a built-in name ({', '.join(BUILTIN_NAMES)}) nor an existing "
                  ".csv, .tsv, .parquet, .feather, .arrow, .npz file or image folder")
    name = path.name.lower()
    if name.endswith(".npz"):
        if fmt != "npz":
            raise ValueError(f"{path} is an .npz file but the run was trained on {fmt or 'other'} data; "
                             "give a file of the same kind")
        return _read_npz(path, schema)
    kind = table_format(path)
    if kind is None:
        raise ValueError(f"cannot tell the format of {path}: expected .csv, .tsv (also gzipped), .parquet, "
                         ".feather, .arrow, .npz or a folder with labels.csv")
    if fmt == "images" and kind == "csv":
        return _read_image_list(path, schema, delimiter)
    if fmt in TABULAR_FORMATS:
        return _read_table(path, schema, delimiter if kind == "csv" else None, handle_unknown=handle_unknown,
                           missing=missing)
    raise ValueError(f"{path} is a {'CSV' if kind == 'csv' else kind} file but the run was trained on "
                     f"{fmt or 'other'} data; give a file of the same kind")


@dataclass
class TableSlices:
    """A table file read once, whose rows :func:`table_slices` converts a slice at a time: iterating
    gives the :class:`Inputs` of consecutive slices of ``rows_per_slice`` rows, as :func:`read_inputs`
    gives them for the whole file (ids go on from slice to slice). ``rows``: the file's data rows;
    ``ids_need_quotes``: whether any id holds a comma, a quote or a line break (a CSV of them quotes
    its ids)."""

    table: Any  # pyarrow.Table, as read_feature_table reads it
    origin: Any  # TableOrigin
    schema: dict[str, Any]
    values: Optional[np.ndarray]
    handle_unknown: str
    rows_per_slice: int
    missing: str = "mark"

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)

    @property
    def ids_need_quotes(self) -> bool:
        id_column = self.schema.get("id_column")
        if id_column is None or self.rows == 0:
            return False
        return bool(pc.any(pc.match_substring_regex(self.table.column(id_column), r'[,"\r\n]')).as_py())

    def __iter__(self) -> Iterator[Inputs]:
        columns = list(self.schema["columns"])
        categorical = {k: list(v) for k, v in self.schema.get("categorical", {}).items()}
        id_column = self.schema.get("id_column")
        for start in range(0, self.rows, self.rows_per_slice):
            part = self.table.slice(start, self.rows_per_slice)
            # as read_inputs: a row with a missing cell is filled as the training file's were, and marked
            # (or, imputed, predicted)
            part, incomplete = fill_missing(part, columns, categorical, self.origin, self.missing,
                                            self.schema.get("fill_values"))
            if self.missing == "impute":
                incomplete = None
            x, _, _ = table_features(part, columns, categorical, self.origin, self.handle_unknown)
            ids = (cell_texts(part.column(id_column)) if id_column is not None
                   else [str(i) for i in range(start, start + part.num_rows)])
            values = None if self.values is None else self.values[start:start + part.num_rows]
            yield Inputs(torch.from_numpy(x), ids, values, incomplete)


def table_slices(spec: str | Path, schema: dict[str, Any], delimiter: Optional[str] = None,
                 handle_unknown: str = "error", rows_per_slice: int = SLICE_ROWS,
                 missing: str = "mark") -> Optional[TableSlices]:
    """:func:`read_inputs` of a table file (a built-in table, CSV/TSV, Parquet, Feather) in slices: the
    file's columns are read at once, as typed as they convert (float32 features), and each slice is
    converted when it is reached, so that the memory a prediction needs beyond that read is a slice's.
    None for data read whole (``.npz``, images, anything :func:`read_inputs` refuses: it says why).

    An error of a slice names its row within the slice: the caller reads the whole data with
    :func:`read_inputs` for the message naming the file's row."""
    located = _table_file(spec, schema)
    if located is None:
        return None
    path, builtin_delimiter, where = located
    kind = table_format(path) or "csv"
    delimiter = builtin_delimiter if where is not None else (delimiter if kind == "csv" else None)
    label_column = schema.get("label_column")
    read = TableRead(list(schema["columns"]), schema.get("categorical", {}), label_column, delimiter=delimiter,
                     encoding=schema.get("encoding") if kind == "csv" else None,
                     id_column=schema.get("id_column"), label_optional=True, where=where, for_run=True)
    table, origin, has_label = read_feature_table(path, read)
    values = table_labels(table, label_column, origin, optional=True) if has_label else None
    if has_label:  # the labels are read: the column's buffer goes back
        table = table.drop_columns([label_column])
    pa.default_memory_pool().release_unused()
    return TableSlices(table, origin, schema, values, handle_unknown, int(rows_per_slice), missing)


def _table_file(spec: str | Path, schema: dict[str, Any]) -> Optional[tuple[Path, Optional[str], Optional[str]]]:
    """``(path, delimiter of a built-in table, name in errors)`` of a table file that
    :func:`read_inputs` reads with ``_read_table``; None for other data."""
    key = str(spec).strip()
    if schema.get("format") not in TABULAR_FORMATS or schema.get("text_column") is not None:
        return None  # texts are read whole: a text encoder's passes cost far more than the read
    if key.lower() in _BUILTIN_TABLES:
        file, delimiter = _BUILTIN_TABLES[key.lower()]
        return DATASETS_DIR / file, delimiter, f"{key} ({file})"
    path = Path(key)
    if key.lower() in BUILTIN_NAMES or not path.is_file() or re.search(r"\.npz$", path.name, re.I) \
            or table_format(path) is None:
        return None
    return path, None, None


def _optional_labels(header: list[str], body: list[list[str]], label_column: Optional[str],
                     path: Path) -> Optional[np.ndarray]:
    """An image list's labels: None without the column, or when its every cell is empty."""
    if label_column is None or label_column not in header:
        return None
    j = header.index(label_column)
    if not any(row[j] for row in body):
        return None
    return parse_labels(body, j, label_column, path)


def _read_table(path: Path, schema: dict[str, Any], delimiter: Optional[str], where: Optional[str] = None,
                handle_unknown: str = "error", missing: str = "mark") -> Inputs:
    categorical = {k: list(v) for k, v in schema.get("categorical", {}).items()}
    # a row with a missing cell is filled as the training file's were, so the model can run, and marked:
    # its prediction is left empty (imputed: predicted)
    read = TableRead(list(schema["columns"]), categorical, schema.get("label_column"), delimiter=delimiter,
                     encoding=schema.get("encoding") if (table_format(path) or "csv") == "csv" else None,
                     id_column=schema.get("id_column"), label_optional=True, where=where, missing=missing,
                     handle_unknown=handle_unknown, fill=schema.get("fill_values") or {}, for_run=True,
                     text_column=schema.get("text_column"))
    x, _, _, values, ids, incomplete, _ = read_table_features(path, read)
    return Inputs(x if isinstance(x, TextRows) else torch.from_numpy(x), ids, values,
                  None if missing == "impute" else incomplete)


def _read_npz(path: Path, schema: dict[str, Any]) -> Inputs:
    with open_npz(path) as npz:
        keys = list(npz.keys())
        features_key = schema.get("features_key") or "embeddings"
        if features_key not in keys:
            raise ValueError(f"{path} has no array {features_key!r} (the run's features); it has {keys}")
        x = npz[features_key]
        labels_key = schema.get("labels_key", "labels")
        y = npz[labels_key] if labels_key in keys else None
    refuse_complex(path, features_key, x)
    if y is not None:
        refuse_complex(path, labels_key, y)
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"{path}: {features_key!r} must be real numbers, got {x.dtype}")
    if x.ndim == 3:
        x = x[:, None]
    values = None
    if y is not None:
        if not np.issubdtype(y.dtype, np.number) or y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"{path}: {labels_key!r} must be a numeric vector of one label per row "
                             f"({x.shape[0]}), got {y.dtype} {y.shape}")
        values = y.astype(np.float64)
    return Inputs(torch.from_numpy(x.astype(np.float32)), [str(i) for i in range(x.shape[0])], values)


def _read_image_list(path: Path, schema: dict[str, Any], delimiter: Optional[str]) -> Inputs:
    header, body = read_csv_rows(path, delimiter)
    jp = column_index(header, schema.get("path_column", "path"), path, "path")
    files = []
    for i, row in enumerate(body):
        file = Path(row[jp]) if Path(row[jp]).is_absolute() else path.parent / row[jp]
        if not file.is_file():
            raise FileNotFoundError(f"image {file} (data row {i} of {path}) not found; paths are "
                                    f"read relative to the list's folder")
        files.append(file)
    images = ImageFiles(files, int(schema["channels"]), tuple(schema["image_size"]), source=str(path))
    return Inputs(images, [row[jp] for row in body],
                  _optional_labels(header, body, schema.get("label_column"), path))
