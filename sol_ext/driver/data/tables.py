"""Tabular files: tables of features and labels (``load_table``: CSV/TSV,
Parquet, Feather / Arrow IPC, read by pyarrow) and precomputed embeddings (``load_npz``).

A table file becomes a ``pyarrow.Table`` here (:func:`read_table`), and its features come out of the
one adapter every table goes through (:func:`~.frames.table_features`). Also the line-by-line CSV
reading (delimiter detection, header and cells as text) that image lists share.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import gzip
import io
import itertools
import math
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import torch

from ...labels import LabelGrid
from ..errors import DataFileError, data_file_errors
from .encoding import DatasetIdentity, LabelSpec, OrdinalDataset, make_dataset
from .frames import (
    MissingValuesWarning,
    TableOrigin,
    cell_texts,
    fill_missing,
    fill_values,
    holds_words,
    is_text_type,
    listed,
    refuse_repeated_names,
    table_features,
    table_labels,
    text_cells,
    warn_numbers_as_text,
)
from .texts import TextRows

__all__ = ["load_table", "load_npz", "read_table", "read_table_features", "read_feature_table", "TableRead",
           "read_table_dataset", "table_columns",
           "table_format", "TABLE_SUFFIXES", "SNIFFED_DELIMITERS"]

# Delimiters told apart when a CSV's delimiter is not given, in order of preference on a tie.
SNIFFED_DELIMITERS = (",", ";", "\t")
_DELIMITER_NAMES = {"comma": ",", "semicolon": ";", "tab": "\t", "\\t": "\t"}


# --------------------------------------------------------------------------------------------------
# Tables (CSV)


def require_file(path: Path, missing: str) -> None:
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


def _check_encoding(encoding: str | None) -> str | None:
    """A given text encoding by Python's name for it (``"cp1252"`` for Windows-1252), or None (UTF-8)."""
    if encoding is None:
        return None
    try:
        name = codecs.lookup(encoding).name
    except (LookupError, TypeError):
        raise ValueError(f"encoding={encoding!r} is not a text encoding Python knows; expected e.g. utf-8, "
                         "cp1252 (Windows-1252, Excel's on Windows) or latin-1") from None
    return None if name == "utf-8" else name


def _open_text(path: Path, encoding: str | None = None) -> io.TextIOBase:
    encoding = encoding or "utf-8-sig"
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", newline="", encoding=encoding)
    return open(path, newline="", encoding=encoding)


def check_delimiter(delimiter: str | None) -> str | None:
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


def read_csv_rows(path: str | Path, delimiter: str | None = None,
              encoding: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV (``.csv`` or ``.csv.gz``), cells stripped; rows checked for length.

    ``delimiter``: one character (or "comma", "semicolon", "tab"); None detects comma, semicolon or tab
    from the header line (:func:`_sniff_delimiter`).
    """
    path = Path(path)
    delimiter = check_delimiter(delimiter)
    require_file(path, f"CSV file not found: {path}")
    with data_file_errors(path), _open_text(path, encoding) as fh:
        lines, delimiter = _with_delimiter(fh, delimiter)
        rows = [[c.strip() for c in row] for row in csv.reader(lines, delimiter=delimiter)
                if any(c.strip() for c in row)]
    if not rows:
        raise ValueError(f"{path} is empty: expected a header row and at least one data row")
    header, body = rows[0], rows[1:]
    refuse_repeated_names(header, str(path))
    if not body:
        raise ValueError(f"{path} has a header but no data rows: the dataset would be empty")
    for i, row in enumerate(body):
        if len(row) != len(header):
            raise ValueError(f"{path}, data row {i}: {len(row)} cells but the header has {len(header)} "
                             f"columns (read with delimiter {delimiter!r}; pass delimiter= if that is wrong)")
    return header, body


def column_index(header: list[str], name: str, path: Path, role: str) -> int:
    """Position of column ``name`` in a CSV ``header``; ValueError naming the file, the ``role`` of the column
    ("label", "feature", "path") and the columns it has."""
    if name not in header:
        hint = (" The header was read as one column: if its cells are separated by some other character, "
                "pass it as delimiter=." if len(header) == 1 else "")
        fix = {"label": "Pass the right name with label_column=",
               "feature": "Give the file that column (in Python: or choose others with feature_columns=)",
               "path": f"Name the column of image paths {name!r} (in Python: or pass path_column=)",
               }.get(role, f"Pass the right name with {role}_column=")
        raise ValueError(f"{path} has no {role} column {name!r}; its columns are {listed(header)}.{hint} {fix}")
    return header.index(name)


def parse_labels(body: list[list[str]], j: int, name: str, path: Path) -> np.ndarray:
    """Column ``j`` of CSV rows as float64 label values ``[N]``; ValueError naming the first row that is no number."""
    out = np.empty(len(body), dtype=np.float64)
    for i, row in enumerate(body):
        cell = row[j]
        try:
            out[i] = float(cell)
        except ValueError:
            out[i] = np.nan
        if not math.isfinite(out[i]):
            raise ValueError(f"{path}: label column {name!r} has a missing or non-numeric value {cell!r} in "
                             f"data row {i}; labels must be numbers (ages, scores, months)")
    return out


# --------------------------------------------------------------------------------------------------
# Table files read by pyarrow: CSV/TSV (also gzipped), Parquet, Feather / Arrow IPC

CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz")
PARQUET_SUFFIXES = (".parquet",)
FEATHER_SUFFIXES = (".feather", ".arrow")
TABLE_SUFFIXES = CSV_SUFFIXES + PARQUET_SUFFIXES + FEATHER_SUFFIXES
_FORMAT_NAMES = {"csv": "CSV", "parquet": "Parquet", "feather": "Feather/Arrow"}
# pandas writes its index as such a column into Parquet/Feather: never a feature by default
_PANDAS_INDEX = re.compile(r"^__index_level_\d+__$")
# pyarrow reads a CSV from this size on with its thread pool (3x faster on 2 cores at 94 MB). Below it,
# on one thread: a process that has imported torch and used that pool aborts now and then as it exits
# ("terminate called without an active exception", 3 runs in 30 here; apache/arrow#34314), after its
# work is done, which a small table's read is not worth.
THREADED_CSV_BYTES = 32 * 2**20


def table_format(path: str | Path) -> str | None:
    """"csv", "parquet" or "feather" from a file name's suffix (case-insensitive); None for others."""
    name = Path(path).name.lower()
    for fmt, suffixes in (("csv", CSV_SUFFIXES), ("parquet", PARQUET_SUFFIXES), ("feather", FEATHER_SUFFIXES)):
        if name.endswith(suffixes):
            return fmt
    return None


def _csv_header(path: Path, delimiter: str | None, encoding: str | None = None) -> tuple[list[str], str]:
    """The header cells of a CSV as written (unstripped: pyarrow's column names) and its delimiter,
    from the first lines only; ValueError for an empty file or a repeated column name."""
    with data_file_errors(path), _open_text(path, encoding) as fh:
        lines, delimiter = _with_delimiter(fh, delimiter)
        first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise ValueError(f"{path} is empty: expected a header row and at least one data row")
    raw = next(csv.reader([first], delimiter=delimiter))
    if len(raw) > 1 and not raw[-1].strip():  # "a,b,label,": a trailing delimiter, not an unnamed column
        raw = raw[:-1]
    refuse_repeated_names([c.strip() for c in raw], str(path))
    return raw, delimiter


@contextlib.contextmanager
def _arrow_file_errors(path: Path, kind: str) -> Iterator[None]:
    """pyarrow's refusal of a damaged Parquet/Feather file as one :class:`DataFileError` naming it."""
    try:
        yield
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataFileError(f"{path} is not a readable {kind} file ({first}); it is truncated or not "
                            f"in the format its name says.") from err


def table_columns(path: str | Path, delimiter: str | None = None, encoding: str | None = None) -> list[str]:
    """The column names of a table file (a CSV's header cells stripped), without reading its rows."""
    path = Path(path)
    fmt = table_format(path) or "csv"  # any other name is read as CSV text
    require_file(path, f"{_FORMAT_NAMES[fmt]} file not found: {path}")
    if fmt == "csv":
        return [c.strip() for c in _csv_header(path, check_delimiter(delimiter), _check_encoding(encoding))[0]]
    if fmt == "parquet":
        with _arrow_file_errors(path, "Parquet"):
            names = pq.read_schema(path).names
    else:
        with _arrow_file_errors(path, "Feather/Arrow"):
            names = _ipc_schema(path).names
    refuse_repeated_names(names, str(path))
    return names


def _ipc_schema(path: Path) -> pa.Schema:
    try:
        with pa.ipc.open_file(path) as reader:
            return reader.schema
    except pa.ArrowInvalid:  # the streaming format, also written as .arrow
        with pa.ipc.open_stream(path) as reader:
            return reader.schema


def _read_ipc(path: Path, columns: Sequence[str]) -> pa.Table:
    try:
        return feather.read_table(path, columns=list(columns), memory_map=False)
    except pa.ArrowInvalid:
        with pa.ipc.open_stream(path) as reader:
            return reader.read_all().select(list(columns))


def read_table(path: str | Path, types: Mapping[str, pa.DataType], delimiter: str | None = None,
               encoding: str | None = None) -> pa.Table:
    """The columns ``types`` names of a table file, as a ``pyarrow.Table`` with those names.

    CSV/TSV (``.gz`` too) is read by pyarrow's reader (on its threads from THREADED_CSV_BYTES on), each column straight to its type in
    ``types`` (float32 features: no float64 copy); a file where some cell does not convert, or a float is
    not finite, is read again as text, so that :func:`~.frames.table_features` names the cell; its text is
    UTF-8 unless ``encoding`` names another (``"cp1252"``). Parquet
    and Feather columns keep their stored types. Columns ``types`` names must exist.
    """
    path = Path(path)
    fmt = table_format(path)
    if fmt == "parquet":
        with _arrow_file_errors(path, "Parquet"):
            return pq.read_table(path, columns=list(types))
    if fmt == "feather":
        with _arrow_file_errors(path, "Feather/Arrow"):
            return _read_ipc(path, list(types))
    encoding = _check_encoding(encoding)
    raw, delimiter = _csv_header(path, check_delimiter(delimiter), encoding)
    position = {}
    for k, c in enumerate(raw):  # the first of a name, as list.index finds it (not once per column)
        position.setdefault(c.strip(), k)
    wanted = {raw[position[n]]: t for n, t in types.items()}
    table = _read_csv_typed(path, delimiter, wanted, encoding)
    if table is None or not _all_finite(table):
        table = _drop_blank_rows(_read_csv_typed(path, delimiter, {c: pa.string() for c in wanted}, encoding))
    return table.rename_columns([c.strip() for c in table.column_names])


def _drop_blank_rows(table: pa.Table) -> pa.Table:
    """``table`` (text columns) without the rows whose every cell is blank (``,,``): no data, as a
    blank line is none, and not counted in the data row numbers of errors."""
    blank = None
    for col in table.columns:
        empty = pc.equal(pc.utf8_trim_whitespace(col), "")
        blank = empty if blank is None else pc.and_(blank, empty)
    if blank is None or not pc.any(blank).as_py():
        return table
    return table.filter(pc.invert(blank))


def _all_finite(table: pa.Table) -> bool:
    return all(pc.all(pc.is_finite(col)).as_py() is not False for col in table.columns
               if pa.types.is_floating(col.type))


def _read_csv_typed(path: Path, delimiter: str, types: Mapping[str, pa.DataType],
                    encoding: str | None = None) -> pa.Table | None:
    """pyarrow's read of the CSV ``path``, the columns ``types`` names (as written in the header) in
    those types; None when a cell does not convert. Nothing counts as null: a missing cell is text."""
    convert = pacsv.ConvertOptions(include_columns=list(types), column_types=dict(types), null_values=[],
                                   strings_can_be_null=False, quoted_strings_can_be_null=False)
    parse = pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=lambda row: (
        "skip" if not row.text.replace(delimiter, "").replace('"', "").strip() else "error"))  # ",,": no row
    try:
        with data_file_errors(path), (gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")) as fh:
            threads = path.stat().st_size >= THREADED_CSV_BYTES
            table = pacsv.read_csv(fh, parse_options=parse, convert_options=convert,
                                   read_options=pacsv.ReadOptions(use_threads=threads, encoding=encoding or "utf8"))
    except pa.ArrowInvalid as err:
        text = str(err)
        if "conversion error" in text:
            return None
        if "UTF8" in text or "UTF-8" in text:
            raise DataFileError(f"{path} is not UTF-8 text ({text.splitlines()[0]}); save it as UTF-8, or give "
                                "its encoding= (cp1252 for Windows-1252).") from None
        if "Empty CSV file" in text:
            raise ValueError(f"{path} is empty: expected a header row and at least one data row") from None
        read_csv_rows(path, delimiter, encoding)  # the row of a parse error (cells per row), as the line-by-line reader names it
        raise ValueError(f"{path}: {text.splitlines()[0]} (read with delimiter {delimiter!r}; pass delimiter= "
                         "if that is wrong)") from None
    if table.num_rows == 0:
        raise ValueError(f"{path} has a header but no data rows: the dataset would be empty")
    return table


def _categorical_map(categorical: Sequence[str] | Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    return ({k: list(v) for k, v in categorical.items()} if isinstance(categorical, Mapping)
            else {c: [] for c in categorical})


@dataclass(frozen=True)
class TableRead:
    """Which columns of a table file to read, and how: the one description :func:`load_table` (training
    data) and prediction's readers (:mod:`~.inputs`) give :func:`read_table_features`.

    Attributes:
        columns: the feature columns, in order.
        categorical: ``{column: categories}`` one-hot encoded (empty categories: its sorted values).
        label_column: the labels' column, or None.
        delimiter, encoding: a CSV's cell separator (None: detected) and text encoding (None: UTF-8).
        id_column: a column naming each row, or None (rows are numbered from 0).
        label_optional: a file without the label column (or with it empty) is read without labels.
        where: the data's name in errors (default the path).
        one_hot_text: columns of words (:func:`~.frames.holds_words`) are categorical too.
        missing: what rows with a missing feature cell get (:func:`~.frames.fill_missing`).
        handle_unknown: what a category not in ``categorical`` gets (:func:`~.frames.table_features`).
        fill: what a missing cell of a column is filled with (a run's :func:`~.frames.fill_values`);
            None: its column's median or most common category in this file.
        for_run: the columns are a trained run's (a prediction): errors advise what the file can
            change.
        text_column: a column of free text, read as text (:class:`~.texts.TextRows`), or None.
    """

    columns: Sequence[str]
    categorical: Mapping[str, Sequence[str]]
    label_column: str | None
    delimiter: str | None = None
    encoding: str | None = None
    id_column: str | None = None
    label_optional: bool = False
    where: str | None = None
    one_hot_text: bool = False
    missing: str = "error"
    handle_unknown: str = "error"
    fill: Mapping[str, Any] | None = None
    for_run: bool = False
    text_column: str | None = None


def read_table_features(path: str | Path, read: TableRead
                        ) -> tuple[np.ndarray, list[str], dict[str, list[str]], np.ndarray | None, list[str],
                                   np.ndarray | None, dict[str, Any] | None]:
    """A table file's features (:func:`~.frames.table_features` of ``read.columns``; with
    ``read.text_column``, :class:`~.texts.TextRows` of its texts and those features), its labels (None
    when ``read.label_optional`` and the file has none, or an empty label column) and the id of each
    row: the cells of ``read.id_column``, else the row number from 0. Then ``[N]`` bool of the rows of
    the file with a missing feature cell (None where none has one), the rest are of the rows kept
    (``read.missing``); last, what a missing cell of each column is filled with: ``read.fill``, or
    for training data (``read.missing`` not "mark") those of this file (:func:`~.frames.fill_values`),
    which a run keeps for its predictions (None where a column's cells do not convert: the features'
    error says why)."""
    table, origin, has_label = read_feature_table(path, read)
    columns, categorical = list(read.columns), dict(read.categorical)
    if read.one_hot_text:
        words = [c for c in columns if c not in categorical and _text_typed(table.column(c))
                 and holds_words(table.column(c), origin)]
        for c in words:
            warn_numbers_as_text(table.column(c), c, origin)
        categorical = {**categorical, **{c: [] for c in words}}
    row_numbers = np.arange(table.num_rows)
    fill = read.fill
    if fill is None and read.missing != "mark":
        try:
            fill = fill_values(table, columns, categorical, origin)
        except ValueError:  # a cell that is no number: table_features names it below
            fill = None
    table, incomplete = fill_missing(table, columns, categorical, origin, read.missing, fill)
    if read.missing == "skip" and incomplete is not None:
        row_numbers = row_numbers[~incomplete]
        origin = origin.kept(row_numbers)  # an error in a later column names the file's row
    if read.text_column is not None and not columns:  # the text alone
        x, names, used = np.zeros((table.num_rows, 0), dtype=np.float32), [], {}
    else:
        x, names, used = table_features(table, columns, categorical, origin, read.handle_unknown)
    if read.text_column is not None:
        x = TextRows(text_cells(table.column(read.text_column), read.text_column, origin), torch.from_numpy(x))
    values = (table_labels(table, read.label_column, origin, optional=read.label_optional)
              if has_label else None)
    ids = cell_texts(table.column(read.id_column)) if read.id_column is not None else [str(i) for i in row_numbers]
    del table
    # the table's buffers stay with pyarrow's allocator once freed: hand them back, so that the label
    # encoding after this reuses memory instead of adding to the peak
    pa.default_memory_pool().release_unused()
    return x, names, used, values, ids, incomplete, fill


def read_feature_table(path: str | Path, read: TableRead) -> tuple[pa.Table, TableOrigin, bool]:
    """The columns of a table file that :func:`read_table_features` converts, as read (numbers typed
    where every cell converts, else text), before any conversion: the table, where it came from
    (for errors) and whether it has the label column. A missing column is refused by name before
    any row is read."""
    path = Path(path)
    delimiter, encoding, label_column, id_column = read.delimiter, read.encoding, read.label_column, read.id_column
    header = table_columns(path, delimiter, encoding)
    decimal_comma = ((table_format(path) or "csv") == "csv"
                     and _csv_header(path, check_delimiter(delimiter), _check_encoding(encoding))[1] != ",")
    origin = TableOrigin(read.where or str(path), decimal_comma=decimal_comma, for_run=read.for_run)
    present = set(header)
    # the file's columns without rows, built only to be refused (pyarrow's pa.array imports pandas)
    def empty() -> pa.Table:
        return pa.table({c: pa.array([], pa.string()) for c in header})
    for name in read.columns:
        if name not in present:  # before reading any row: the message lists the file's columns
            table_features(empty(), [name], {}, origin)
    has_label = label_column is not None and label_column in header
    if label_column is not None and not has_label and not read.label_optional:
        table_labels(empty(), label_column, origin)
    text_column = read.text_column
    if text_column is not None and text_column not in present:
        raise ValueError(f"{origin.name} has no text column {text_column!r}; its columns are {listed(header)}. "
                         + ("Give the file that column: the run reads its texts from it" if read.for_run else
                            "Pass the right name with text_column="))
    if id_column is not None and id_column not in present:
        raise ValueError(f"{origin.name} has no id column {id_column!r}; its columns are {listed(header)}. "
                         + ("Give the file that column: the run names each row by it" if read.for_run else
                            "Pass the right name with id_column="))
    types: dict[str, pa.DataType] = {c: (pa.string() if c in read.categorical else pa.float32())
                                     for c in read.columns}
    if has_label:  # an optional label column left empty does not convert: the text read sees it
        types[label_column] = pa.float64()
    if id_column is not None:
        types[id_column] = pa.string()
    if text_column is not None:
        types[text_column] = pa.string()
    table = read_table(path, types, delimiter, encoding)
    if table.num_rows == 0:
        raise ValueError(f"{path} has a header but no data rows: the dataset would be empty")
    return table, origin, has_label


def _text_typed(col: pa.ChunkedArray) -> bool:
    return is_text_type(col.type) or pa.types.is_dictionary(col.type)


def load_table(path: str | Path, label_column: str = "label", feature_columns: Sequence[str] | None = None,
               step: float | None = None, min_value: float | None = None, max_value: float | None = None,
               *, grid: LabelGrid | None = None,
               categorical: Sequence[str] | Mapping[str, Sequence[str]] = (),
               name: str | None = None, delimiter: str | None = None, one_hot_text: bool = False,
               id_column: str | None = None, drop_columns: Sequence[str] = (),
               missing: str = "error", encoding: str | None = None,
               text_column: str | None = None) -> OrdinalDataset:
    """A tabular dataset from a table file with named columns: CSV/TSV with a header row (``.csv``,
    ``.tsv``, also gzipped ``.gz``), Parquet (``.parquet``) or Feather / Arrow IPC (``.feather``, ``.arrow``),
    read by pyarrow.

    Args:
        path: the file.
        label_column: the column of label values (numbers), mapped to ranks on the grid.
        feature_columns: the input columns, in order; default every column but the label.
        step, min_value, max_value: the grid, each inferred from the labels when not given.
        grid: a fixed label grid instead (e.g. the training set's, when loading a test file).
        categorical: columns to one-hot encode, either names (categories = sorted distinct values) or
            ``{name: categories}`` (use this when train and test files must get the same columns).
        name: dataset name; default the file stem.
        delimiter: the cell separator of a CSV, one character (``","``, ``";"``, ``"\\t"``, ``"|"``, …) or
            ``"comma"``/``"semicolon"``/``"tab"``; default None detects comma, semicolon or tab from the
            header line (quoted names allowed, as in UCI's semicolon files). CSV files only.
        one_hot_text: one-hot encode every column of words too (categories: its sorted values), as
            :class:`sol_ext.driver.sklearn.SOLRanker` does a data frame's text columns.
        id_column: a column naming each row (kept out of the features; the dataset's ``ids``).
        drop_columns: columns left out of the default feature columns.
        encoding: the text encoding of a CSV, e.g. ``"cp1252"`` (Windows-1252); default UTF-8.
        missing: rows with a missing feature cell: ``"error"`` names every such cell, ``"skip"`` leaves
            the rows out (with a :class:`~.frames.MissingValuesWarning` counting them), ``"impute"``
            fills each cell with its column's median or most common category (warned likewise).
        text_column: a column of free text (a review, a description): kept as text for a text encoder,
            not one-hot encoded; every cell must hold some text. The other feature columns are read
            beside it (none: the text alone).

    Returns:
        ``OrdinalDataset`` of kind "tabular" with raw (unscaled) float32 features ``[N, F]``; scale them
        with :func:`standardize` after splitting. With ``text_column``, of kind "text" with
        :class:`~.texts.TextRows` (the texts and those features).
    """
    # The keyword API users call; it checks the arguments against the file's header and hands the
    # reading to read_table_dataset as one TableRead and one LabelSpec.
    path = Path(path)
    fmt = table_format(path) or "csv"  # any other name is read as CSV text, as before
    for option, value in (("delimiter", delimiter), ("encoding", encoding)):
        if fmt != "csv" and value is not None:
            raise ValueError(f"{option}={value!r} applies to CSV files only; {path} is a {fmt} file: leave "
                             f"{option} out")
    encoding = _check_encoding(encoding)
    header = table_columns(path, delimiter, encoding)
    if text_column is not None:
        _check_text_column(path, header, text_column, label_column, id_column, feature_columns)
    columns = _feature_columns(path, header, label_column, feature_columns, id_column,
                               [*drop_columns, *([] if text_column is None else [text_column])]
                               if feature_columns is None else drop_columns)
    cats = _categorical_map(categorical)
    for c in cats:
        if c not in columns:
            raise ValueError(f"categorical column {c!r} is not among the feature columns {list(columns)}")
    if label_column not in header:
        table_labels(pa.table({c: pa.array([], pa.string()) for c in header}), label_column, TableOrigin(str(path)))
    if missing == "mark":
        raise ValueError("missing='mark' is for prediction; expected 'error', 'skip' or 'impute'")
    read = TableRead(columns, cats, label_column, delimiter=delimiter, encoding=encoding, id_column=id_column,
                     one_hot_text=one_hot_text, missing=missing, text_column=text_column)
    return read_table_dataset(path, read, LabelSpec(grid, step, min_value, max_value), name)


def _check_text_column(path: Path, header: list[str], text_column: str, label_column: str,
                       id_column: str | None, feature_columns: Sequence[str] | None) -> None:
    """ValueError for a text column the file lacks, or that is also the label, the id or a feature column."""
    if text_column not in header:
        raise ValueError(f"{path} has no text column {text_column!r}; its columns are {listed(header)}. Pass the "
                         "right name with text_column=")
    for role, name in (("label", label_column), ("id", id_column)):
        if text_column == name:
            raise ValueError(f"the text column {text_column!r} cannot also be the {role} column; pass another "
                             f"text_column=")
    if feature_columns is not None and text_column in feature_columns:
        raise ValueError(f"the text column {text_column!r} is read as text, not as a feature column: leave it "
                         "out of feature_columns=")


def _feature_columns(path: Path, header: list[str], label_column: str, feature_columns: Sequence[str] | None,
                     id_column: str | None, drop_columns: Sequence[str]) -> list[str]:
    """The feature columns :func:`load_table` reads: ``feature_columns``, or every column of ``header``
    but the label, the id, ``drop_columns`` and a pandas index; ValueError for a column named twice
    over or not in the file."""
    for role, names in (("drop_columns", drop_columns), ("id_column", [] if id_column is None else [id_column])):
        unknown = [c for c in names if c not in header]
        if unknown:
            raise ValueError(f"{path}: {role}= names {listed(unknown)}, not columns of the file; its "
                             f"columns are {listed(header)}")
    if feature_columns is None:
        left_out = {label_column, id_column, *drop_columns}
        feature_columns = [c for c in header if c not in left_out and not _PANDAS_INDEX.match(c)]
    elif drop_columns:
        raise ValueError("pass feature_columns= (the columns to use) or drop_columns= (the columns to "
                         "leave out), not both")
    elif label_column in feature_columns:
        raise ValueError(f"the label column {label_column!r} cannot also be a feature column")
    if id_column is not None and id_column in feature_columns:
        raise ValueError(f"the id column {id_column!r} cannot also be a feature column")
    if id_column is not None and id_column == label_column:
        raise ValueError(f"the id column {id_column!r} cannot also be the label column; name the column "
                         f"that identifies each row with id_column=, or leave it out")
    repeated = sorted({c for c in feature_columns if list(feature_columns).count(c) > 1})
    if repeated:
        raise ValueError(f"feature_columns= names {listed(repeated)} more than once; name each column once")
    return list(feature_columns)


def read_table_dataset(path: Path, read: TableRead, labels: LabelSpec, name: str | None = None) -> OrdinalDataset:
    """The dataset :func:`load_table` returns, from arguments already checked against the file (its
    columns exist, ``read.missing`` is not "mark"): its ``read`` columns, labels on the grid of ``labels``, named ``name`` (default the file stem)."""
    x, names, used, values, ids, incomplete, fill = read_table_features(path, read)
    if incomplete is not None:
        what = "left out" if read.missing == "skip" else "filled with their column's median or most common value"
        warnings.warn(f"{path}: {int(incomplete.sum())} of {incomplete.size} rows have a missing feature "
                      f"value; they were {what} (missing={read.missing})", MissingValuesWarning, stacklevel=3)
    keep_ids = read.id_column is not None or (read.missing == "skip" and incomplete is not None)
    schema = {"format": "csv" if (table_format(path) or "csv") == "csv" else "table", "columns": list(read.columns),
              "categorical": used, "label_column": read.label_column}
    if read.id_column is not None:
        schema["id_column"] = read.id_column
    if read.encoding is not None:
        schema["encoding"] = read.encoding  # a file to predict is read so too
    if read.text_column is not None:
        schema["text_column"] = read.text_column
    # how a prediction fills a missing cell as this file's were (or would have been) filled
    schema["missing"] = read.missing
    if fill is not None:
        schema["fill_values"] = fill
    identity = DatasetIdentity(name or file_stem(path), "tabular" if read.text_column is None else "text",
                               source=str(path), schema=schema, feature_names=names, ids=ids if keep_ids else None)
    return make_dataset(x if isinstance(x, TextRows) else torch.from_numpy(x), values, identity, labels)


def file_stem(path: Path) -> str:
    """A data file's name without its data suffixes (``ages.csv.gz`` -> ``ages``): the data set's default name."""
    name = path.name
    for suffix in (".gz", ".csv", ".tsv", ".npz", ".parquet", ".feather", ".arrow"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


# --------------------------------------------------------------------------------------------------
# Precomputed embeddings (.npz)


@contextlib.contextmanager
def open_npz(path: Path) -> Iterator[np.lib.npyio.NpzFile]:
    """``np.load`` of an ``.npz`` archive, its read errors as :class:`DataFileError`; a ``.npy``
    array under that name is refused."""
    with data_file_errors(path):
        npz = np.load(path, allow_pickle=False)
        if isinstance(npz, np.ndarray):
            raise DataFileError(f"{path} is a .npy array, not an .npz archive; save with "
                                "numpy.savez(..., embeddings=..., labels=...)")
        with npz:
            yield npz


def refuse_complex(path: Path, key: str, a: np.ndarray) -> None:
    """ValueError when array ``key`` of an ``.npz`` holds complex numbers."""
    if np.iscomplexobj(a):
        raise ValueError(f"{path}: {key!r} holds complex numbers ({a.dtype}); features and labels must be "
                         "real: save numpy.real(...) or numpy.abs(...) of it if that is what you mean")


def load_npz(path: str | Path, step: float | None = None, min_value: float | None = None,
             max_value: float | None = None, *, grid: LabelGrid | None = None,
             features_key: str | None = None, labels_key: str = "labels",
             name: str | None = None) -> OrdinalDataset:
    """Precomputed embeddings and labels from a numpy ``.npz`` file.

    The file holds ``embeddings`` (or ``features``) ``[N, d]`` and ``labels`` ``[N]`` in label units;
    ``[N, H, W]`` or ``[N, C, H, W]`` arrays are read as images. Grid arguments (``grid``) as in
    :func:`load_table`.
    """
    # The keyword API users call: the grid arguments become one LabelSpec.
    path = Path(path)
    x, values, features_key = _npz_arrays(path, features_key, labels_key)
    schema = {"format": "npz", "features_key": features_key, "labels_key": labels_key}
    identity = DatasetIdentity(name or file_stem(path), "embeddings" if x.ndim == 2 else "images",
                               source=str(path), schema=schema)
    return make_dataset(torch.from_numpy(x.astype(np.float32)), values, identity,
                        LabelSpec(grid, step, min_value, max_value))


def _npz_arrays(path: Path, features_key: str | None, labels_key: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The features (``[N, d]`` or ``[N, C, H, W]``) and float64 labels ``[N]`` of an ``.npz`` file, and
    the features' key (``features_key``, else the one of ``embeddings``/``features`` it holds)."""
    require_file(path, f".npz file not found: {path}")
    with open_npz(path) as npz:
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
    refuse_complex(path, features_key, x)
    refuse_complex(path, labels_key, y)
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
    return x, values, features_key
