"""One adapter from a table of named columns to a model's features: :func:`table_features`.

Every table goes through it: a CSV, Parquet or Feather file (read into a ``pyarrow.Table`` by
:mod:`.tables`), a pandas or polars DataFrame and a ``pyarrow.Table`` (:func:`as_arrow_table`). Columns are
taken by name in the order given (extra columns ignored, a missing one refused by name), categorical
columns one-hot encoded with fixed categories, and numbers converted straight to float32; so a file and a
data frame of the same columns can never give different features.

pandas and polars are not imported here: a data frame is recognized by its type's module and converted
with its own ``to_arrow``/``from_pandas`` route.
"""

from __future__ import annotations

import dataclasses
import decimal
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["is_table_like", "has_column_names", "as_arrow_table", "table_features", "table_labels",
           "text_columns", "holds_words", "cell_texts", "text_cells", "fill_missing", "fill_values", "MISSING_POLICIES", "string_array", "TableOrigin", "MISSING_CELLS",
           "FLOAT32_MAX", "warn_numbers_as_text", "UnknownCategoryError"]

# Cells that mean "no value" in a text column (compared lower-cased, after stripping blanks).
MISSING_CELLS = ("", "na", "nan", "n/a", "null", "none", "?")
FLOAT32_MAX = float(np.finfo(np.float32).max)
# A number as Python's float() reads it (no underscores): what a text cell must look like.
_NUMBER = r"(?i)^[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf|infinity|nan)$"
# A number written with a decimal comma, as spreadsheets in German or French save CSV files (with ";"
# between the cells): read so in files whose delimiter is not a comma.
_DECIMAL_COMMA = r"(?i)^[+-]?(\d+,\d*|,\d+)(e[+-]?\d+)?$"
# How spreadsheets write a boolean: a feature column of these cells reads as 1 and 0.
BOOLEAN_CELLS = ("true", "false")


@dataclass(frozen=True)
class TableOrigin:
    """Where a table came from, for error messages: ``name`` (a file path, or "data") and whether it is
    a file (``"data row 3"``) or a data frame (``"row 3"``). Both count rows from 0, a file's from the
    first row after its header: the numbers of the prediction CSV's default ids, the audit's ``index``
    and ``pandas.read_csv``'s index (docs/data.md)."""

    name: str
    file: bool = True
    decimal_comma: bool = False  # cells such as "0,25" are numbers (a CSV whose delimiter is not ",")
    # the data row of each row of the table, where rows were left out (missing="skip"); None: the same
    rows: Optional[np.ndarray] = field(default=None, compare=False)
    # read with a trained run's columns (prediction): advice names what the data can change, and
    # names a training option as one
    for_run: bool = False

    def row(self, i: int) -> str:
        i = int(self.rows[i]) if self.rows is not None else int(i)
        return f"data row {i}" if self.file else f"row {i}"

    def kept(self, rows: np.ndarray) -> "TableOrigin":
        """This origin for the table of only ``rows`` (numbers of this origin's rows): its errors
        still name the data rows as given."""
        rows = np.asarray(rows) if self.rows is None else self.rows[rows]
        return dataclasses.replace(self, rows=rows)


# --------------------------------------------------------------------------------------------------
# Data frames in


def _module(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def is_table_like(obj: Any) -> bool:
    """Whether ``obj`` is a ``pyarrow.Table`` or ``RecordBatch``, a pandas or a polars DataFrame: data
    whose columns are named, and taken by name."""
    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        return True
    return _module(obj) in ("pandas", "polars") and type(obj).__name__ == "DataFrame"


def has_column_names(obj: Any) -> bool:
    """Whether the data frame ``obj`` names its columns with strings (a pandas DataFrame built from an
    array has the numbers 0, 1, … instead: scikit-learn reads it as an array)."""
    return _module(obj) != "pandas" or all(isinstance(c, str) for c in obj.columns)


def as_arrow_table(obj: Any, what: str = "data") -> pa.Table:
    """``obj`` (see :func:`is_table_like`) as a ``pyarrow.Table`` of its columns; the index of a pandas
    DataFrame is left out. Column names must be strings (names are what columns are matched by)."""
    if isinstance(obj, pa.Table):
        table = obj
    elif isinstance(obj, pa.RecordBatch):
        table = pa.Table.from_batches([obj])
    elif _module(obj) == "polars":
        table = obj.to_arrow()
    elif _module(obj) == "pandas":
        names = list(obj.columns)
        if not all(isinstance(c, str) for c in names):
            raise ValueError(f"{what}: column names must be strings, got {names[:10]}; name the columns "
                             "as in training (e.g. df.columns = [...])")
        try:
            table = pa.Table.from_pandas(obj, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise ValueError(f"{what}: a column cannot be read as one type ({err}); give each column "
                             "numbers only (or text only, for a categorical column)") from None
    else:
        raise TypeError(f"{what}: expected a pyarrow.Table or RecordBatch, a pandas or a polars DataFrame, got "
                        f"{type(obj).__name__}")
    refuse_repeated_names(table.column_names, what)
    return table


def refuse_repeated_names(names: Sequence[str], what: str) -> None:
    first: dict[str, int] = {}
    for k, name in enumerate(names):
        if name in first:
            label = f"the column name {name!r}" if name else "an empty column name"
            raise ValueError(f"{what}: {label} appears more than once in the header (columns "
                             f"{first[name] + 1} and {k + 1}); give each column its own name")
        first[name] = k


# --------------------------------------------------------------------------------------------------
# Columns out


def _column(table: pa.Table, name: str, origin: TableOrigin, role: str,
            positions: Optional[Mapping[str, int]] = None) -> pa.ChunkedArray:
    """The column ``name`` of ``table``; ``positions`` (name -> index, built once) keeps a lookup of each
    of many columns from costing a list of every name."""
    position = (positions if positions is not None else _positions(table)).get(name)
    if position is None:
        names = table.column_names
        hint = (" The header was read as one column: if its cells are separated by some other character, "
                "pass it as delimiter=." if len(names) == 1 and origin.file else "")
        fix = {"label": "Pass the right name with label_column=",
               "feature": ("Give the file that column: the run was trained on it" if origin.for_run and origin.file
                           else "Give the file that column (in Python: or choose others with feature_columns=)"
                           if origin.file else "Give the data that column, by that name"),
               }.get(role, "Give the file that column: the run names each row by it" if origin.for_run
                     else f"Pass the right name with {role}_column=")
        raise ValueError(f"{origin.name} has no {role} column {name!r}; its columns are {listed(names)}.{hint} "
                         f"{fix}")
    return table.column(position)


def _positions(table: pa.Table) -> dict[str, int]:
    return {name: k for k, name in enumerate(table.column_names)}


def is_text_type(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _text(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A text, dictionary or other column as stripped strings (nulls stay null)."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not is_text_type(col.type):
        col = col.cast(pa.string())
    return pc.utf8_trim_whitespace(col)


def text_columns(table: pa.Table) -> list[str]:
    """The columns of ``table`` that hold text or categories (pandas' ``category``, polars'
    ``Categorical``): the ones a data frame's features one-hot encode."""
    return [name for name, col in zip(table.column_names, table.columns)
            if is_text_type(col.type) or pa.types.is_dictionary(col.type)]


def holds_words(col: pa.ChunkedArray, origin: TableOrigin) -> bool:
    """Whether a text column is a categorical one (colours, regions, ids) rather than a number column:
    fewer than half of its non-missing cells read as numbers (or true/false). A number column with a
    few bad cells stays a number column, so that its bad cells are named instead of one-hot encoded."""
    cells = _text(col)
    present = pc.invert(pc.fill_null(_missing_text(cells), True))
    n_present = pc.sum(present).as_py() or 0
    if n_present == 0:
        return False
    number = pc.fill_null(pc.match_substring_regex(cells, _NUMBER), False)
    if origin.decimal_comma:
        number = pc.or_(number, pc.fill_null(pc.match_substring_regex(cells, _DECIMAL_COMMA), False))
    number = pc.or_(number, pc.fill_null(pc.is_in(pc.utf8_lower(cells), string_array(BOOLEAN_CELLS)), False))
    return 2 * (pc.sum(pc.and_(present, number)).as_py() or 0) < n_present


# What to do with rows that have a missing feature cell: refuse them naming every such cell
# ("error"), leave them out ("skip"), fill each cell with its column's median or most common category
# ("impute"), or fill them so the model can run and say which they were ("mark": prediction).
MISSING_POLICIES = ("error", "skip", "impute", "mark")


def _missing_mask(col: pa.ChunkedArray) -> Optional[np.ndarray]:
    """``[N]`` bool: the cells of a feature column that hold no value (null, NaN or a missing-text
    cell); None where there is none. (No Python value meets arrow here before a cell is missing:
    pa.scalar and a boolean column's to_numpy import pandas, a fifth of a large prediction.)"""
    if pa.types.is_null(col.type):
        return np.ones(len(col), bool)
    if not col.null_count and (pa.types.is_integer(col.type) or pa.types.is_boolean(col.type)):
        return None
    if not col.null_count and pa.types.is_floating(col.type):  # a CSV's features: numpy, no copy
        nan = np.isnan(_to_numpy(col))
        return nan if nan.any() else None
    if is_text_type(col.type) or pa.types.is_dictionary(col.type):
        mask = _missing_text(_text(col))
    else:
        mask = pc.is_null(col)
        if pa.types.is_floating(col.type):
            mask = pc.or_kleene(mask, pc.is_nan(col))
    if not pc.any(mask).as_py():
        return None
    return np.asarray(mask.to_pylist(), dtype=bool)


def _fill_value(col: pa.ChunkedArray, missing: Optional[np.ndarray], name: str, origin: TableOrigin,
                categorical: bool) -> Any:
    """The value a missing cell of ``col`` gets: the most common category, else the median number
    (``missing``: the cells without a value, None where every cell has one)."""
    present = col if missing is None else col.filter(pa.array(~missing))
    if categorical or (is_text_type(col.type) and holds_words(present, origin)):
        counts = pc.value_counts(_text(present)).to_pylist()
        return max(counts, key=lambda c: (c["counts"], c["values"]))["values"] if counts else ""
    if is_text_type(col.type) or pa.types.is_dictionary(col.type):
        values = _numbers_from_text(present, name, origin, "feature")
    else:
        values = _numeric(present, name, origin).astype(np.float64)
    return float(np.median(values)) if values.size else 0.0


def fill_values(table: pa.Table, columns: Sequence[str], categorical: Mapping[str, Sequence[str]],
                origin: TableOrigin) -> dict[str, Any]:
    """What :func:`fill_missing` fills a missing cell of each of ``columns`` with, from the cells
    present: the median (numbers) or the most common category (text). A run keeps these of its
    training file, so that a prediction fills a cell as training did."""
    values = {}
    positions = _positions(table)
    for name in columns:
        col = table.column(positions[name])
        mask = _missing_mask(col)
        if mask is None or not mask.all():  # a column without any value has nothing to fill from
            values[name] = _fill_value(col, mask, name, origin, name in categorical)
    return values


def fill_missing(table: pa.Table, columns: Sequence[str], categorical: Mapping[str, Sequence[str]],
                 origin: TableOrigin, policy: str, fill: Optional[Mapping[str, Any]] = None
                 ) -> tuple[pa.Table, Optional[np.ndarray]]:
    """``table`` with its missing feature cells dealt with by ``policy`` (:data:`MISSING_POLICIES`), and
    ``[N]`` bool of the rows that had one (of the table as given; None where none had).

    "error" raises one ValueError counting every missing cell, by column with its first row; "skip"
    keeps the other rows; "impute" and "mark" fill each cell with ``fill[column]`` (the values of a
    run's training file, :func:`fill_values`) where given, else with its column's median (numbers)
    or most common category (text), from the cells present.
    """
    if policy not in MISSING_POLICIES:
        raise ValueError(f"missing={policy!r}; expected one of {', '.join(MISSING_POLICIES)}")
    masks = {}
    positions = _positions(table)  # once: table.column_names is a new list at every call
    for name in columns:
        if name in positions:
            mask = _missing_mask(table.column(positions[name]))
            if mask is not None:
                masks[name] = mask
    if not masks:
        return table, None
    if policy in ("skip", "impute"):  # training: a column without any value leaves nothing to learn or fill from
        empty = [name for name, mask in masks.items()
                 if mask.all() and (policy == "skip" or fill is None or name not in fill)]
        if empty and table.num_rows:
            raise ValueError(f"{origin.name}: feature column{'s' if len(empty) > 1 else ''} "
                             f"{listed(empty) if len(empty) > 1 else repr(empty[0])} "
                             f"{'have' if len(empty) > 1 else 'has'} no value in any row; leave "
                             f"{'them' if len(empty) > 1 else 'it'} out of the features (drop_columns=)")
    incomplete = np.logical_or.reduce(list(masks.values()))
    if policy == "error":
        cells = sum(int(m.sum()) for m in masks.values())
        parts = []
        for name, m in list(masks.items())[:10]:
            k, first = int(m.sum()), origin.row(int(np.flatnonzero(m)[0]))
            parts.append(f"feature column {name!r} has " + (f"a missing value (NaN) in {first}" if k == 1 else
                                                            f"{k} missing values (NaN), the first in {first}"))
        more = f"; … ({len(masks)} columns in all)" if len(masks) > 10 else ""
        total = f" ({cells} cells in {int(incomplete.sum())} of {table.num_rows} rows)" if cells > 1 else ""
        raise ValueError(f"{origin.name}: {'; '.join(parts)}{more}{total}; drop or impute such rows "
                         "(missing=skip or missing=impute)")
    if policy == "skip":
        return table.filter(pa.array(~incomplete)), incomplete
    for name, mask in masks.items():
        col = table.column(name)
        value = fill[name] if fill is not None and name in fill else _fill_value(col, mask, name, origin,
                                                                                 name in categorical)
        if is_text_type(col.type) or pa.types.is_dictionary(col.type):
            filled = pc.if_else(pa.array(mask), pa.scalar(str(value) if not isinstance(value, float)
                                                          else repr(value)), _text(col))
        else:
            target = col.type if pa.types.is_floating(col.type) else pa.float64()
            filled = pc.if_else(pa.array(mask), pa.scalar(value, target), col.cast(target))
        table = table.set_column(positions[name], name, filled)
    return table, incomplete


def cell_texts(col: pa.ChunkedArray) -> list[str]:
    """A column's cells as stripped text, a missing cell as ``""`` (an id column's ids)."""
    return [c or "" for c in pc.fill_null(_text(col), "").to_pylist()]


def text_cells(col: pa.ChunkedArray, name: str, origin: TableOrigin) -> list[str]:
    """The cells of a column of free text (``--text-column``) as stripped text; ValueError naming the
    first empty one (a text encoder has nothing to read there)."""
    cells = _text(col)
    empty = pc.fill_null(pc.equal(cells, ""), True)
    bad = _first(empty)
    if bad is not None:
        count = pc.sum(empty).as_py()
        fix = ("write a text in it, or leave the row out of the data" if origin.for_run else
               "write a text in it, or leave the row out; or pass the column of texts with text_column=")
        raise ValueError(f"{origin.name}: text column {name!r} has {count} empty cell{'s' if count > 1 else ''}, "
                         f"the first in {origin.row(bad)}; {fix}")
    return cells.to_pylist()


def _first(mask: Any) -> Optional[int]:
    """The index of the first true value of a boolean array (numpy or arrow; nulls count as false),
    or None."""
    if isinstance(mask, (pa.Array, pa.ChunkedArray)):
        i = pc.index(mask, True).as_py()
        return i if i >= 0 else None
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def string_array(strings: Sequence[str]) -> pa.Array:
    """``strings`` as an arrow string array, built from its buffers (``pa.array`` imports pandas)."""
    data = [text.encode("utf-8") for text in strings]
    offsets = np.zeros(len(data) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, data), np.int64, len(data)), out=offsets[1:])
    kind, width = (pa.string(), np.int32) if offsets[-1] < 2**31 else (pa.large_string(), np.int64)
    return pa.Array.from_buffers(kind, len(data), [None, pa.py_buffer(offsets.astype(width)),
                                                   pa.py_buffer(b"".join(data))])


def _to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric arrow array as numpy: integers and floats without nulls are read-only views of the
    arrow buffers (one array per chunk, concatenated when there are several). pyarrow's own
    ``to_numpy`` imports pandas on its first call, a fifth of the time of a 200,000-row
    ``sol-ext predict``."""
    t = arr.type
    if arr.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return np.asarray(arr.to_numpy(zero_copy_only=False))
    dtype = np.dtype(t.to_pandas_dtype())
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    parts = [np.frombuffer(c.buffers()[1], dtype, count=len(c), offset=c.offset * dtype.itemsize)
             for c in chunks if len(c)]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def _missing_text(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.or_kleene(pc.is_null(col), pc.is_in(pc.utf8_lower(col), string_array(MISSING_CELLS)))


def _numbers_from_text(col: pa.ChunkedArray, name: str, origin: TableOrigin, role: str) -> np.ndarray:
    """A text column as float64, each cell read as Python's ``float()`` would; ValueError naming the
    first cell that is missing or not a number."""
    col = _text(col)
    missing = pc.fill_null(_missing_text(col), True)
    number = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
    if origin.decimal_comma:
        comma = pc.fill_null(pc.match_substring_regex(col, _DECIMAL_COMMA), False)
        if pc.any(comma).as_py():
            col, number = pc.replace_substring(col, ",", "."), pc.or_(number, comma)
    booleans = None
    if role == "feature":
        truth = pc.fill_null(pc.is_in(pc.utf8_lower(col), string_array(BOOLEAN_CELLS)), False)
        if pc.any(truth).as_py() and pc.all(pc.or_(truth, missing)).as_py():
            booleans, number = pc.equal(pc.utf8_lower(col), "true"), truth
    bad = _first(pc.or_(missing, pc.invert(number)))
    if bad is not None:
        cell = col[bad].as_py() or ""
        if role == "label":
            raise ValueError(_label_message(origin, name, cell, bad))
        if pc.fill_null(missing, True)[bad].as_py():
            raise ValueError(f"{origin.name}: feature column {name!r} has a missing value (NaN) in "
                             f"{origin.row(bad)}; drop or impute such rows before loading")
        advice = ("fix the cell: the run reads this column as numbers (to read it as categories or leave it "
                  "out, train again with it in categorical= or drop_columns=)" if origin.for_run else
                  "fix the cell, or name the column in categorical= to one-hot encode it or in "
                  "drop_columns= to leave it out" if origin.file else
                  "encode it as numbers, or train with it as a categorical column")
        raise ValueError(f"{origin.name}: feature column {name!r} has a non-numeric value {cell!r} in "
                         f"{origin.row(bad)}; {advice}")
    if booleans is not None:
        return _to_numpy(pc.cast(booleans, pa.float64()))
    # "inf"/"infinity"/"nan" in any case, as float() reads them; the rest is plain decimal notation
    return _to_numpy(pc.cast(pc.utf8_lower(col), pa.float64()))


def _label_message(origin: TableOrigin, name: str, cell: Any, i: int) -> str:
    return (f"{origin.name}: label column {name!r} has a missing or non-numeric value {cell!r} in "
            f"{origin.row(i)}; labels must be numbers (ages, scores, months)")


def _numeric(col: pa.ChunkedArray, name: str, origin: TableOrigin) -> np.ndarray:
    """A numeric (or boolean, or null) column as a numpy array of its own float or integer dtype;
    ValueError naming the first null."""
    if pa.types.is_null(col.type) or col.null_count:
        i = _first(pc.is_null(col)) or 0
        raise ValueError(f"{origin.name}: feature column {name!r} has a missing value (NaN) in "
                         f"{origin.row(i)}; drop or impute such rows before loading")
    if pa.types.is_boolean(col.type):
        col = col.cast(pa.uint8())
    if pa.types.is_decimal(col.type):
        col = col.cast(pa.float64())
    return _to_numpy(col)


def _feature_column(col: pa.ChunkedArray, name: str, origin: TableOrigin, out: np.ndarray) -> None:
    """Write one feature column into ``out [N]`` (float32), refusing missing, non-finite and
    float32-overflowing values with the row they are in."""
    t = col.type
    if pa.types.is_float32(t) and not col.null_count:  # what a CSV's features are read as: no copy
        _copy_chunks(col, out)
        if not np.isfinite(out).all():
            _refuse_non_finite(out, out, name, origin)
        return
    if is_text_type(t) or pa.types.is_dictionary(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        values: np.ndarray = _numbers_from_text(col, name, origin, "feature")
    elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
          or pa.types.is_decimal(t) or pa.types.is_null(t)):
        values = _numeric(col, name, origin)
    else:
        raise ValueError(f"{origin.name}: feature column {name!r} holds {t} values; features must be "
                         "numbers (or text categories, one-hot encoded)")
    with np.errstate(over="ignore"):  # a finite value beyond float32's range is refused below
        out[:] = values  # the one conversion to float32
    if values.dtype.kind == "f" and not np.isfinite(out).all():
        _refuse_non_finite(values, out, name, origin)


def _copy_chunks(col: pa.ChunkedArray, out: np.ndarray) -> None:
    """A float32 column without nulls into ``out [N]``, chunk by chunk (no concatenated copy)."""
    start = 0
    for chunk in col.chunks:
        out[start:start + len(chunk)] = _to_numpy(chunk)
        start += len(chunk)


def _refuse_non_finite(values: np.ndarray, out: np.ndarray, name: str, origin: TableOrigin) -> None:
    i = _first(~np.isfinite(out))
    v = float(values[i])
    if np.isnan(v):
        raise ValueError(f"{origin.name}: feature column {name!r} has a missing value (NaN) in "
                         f"{origin.row(i)}; drop or impute such rows before loading")
    if np.isinf(v):
        raise ValueError(f"{origin.name}: feature column {name!r} has a NaN or infinite value in "
                         f"{origin.row(i)}; drop or impute such rows before loading")
    raise ValueError(f"{origin.name}: feature column {name!r} has a value {v:g} in {origin.row(i)} that "
                     f"overflows float32 (largest magnitude {FLOAT32_MAX:.4g}); rescale the column")


def listed(values: Sequence[Any], limit: int = 10) -> str:
    """``values`` for a message: all of a short list, the first ``limit`` of a long one and how many
    there are (a column list of a 5,000-column file, the categories of an id column)."""
    values = list(values)
    if len(values) <= limit:
        return repr(values)
    return f"[{', '.join(map(repr, values[:limit]))}, …] ({len(values):,} in all)"


class MissingValuesWarning(UserWarning):
    """Rows with a missing feature value were left out or filled in, as asked."""


class ManyCategoriesWarning(UserWarning):
    """A text column one-hot encoded into about as many features as it has rows: an id, most likely."""


class NumbersAsTextWarning(UserWarning):
    """A column of numbers written with thousands separators or as percentages, read as categories."""


class UnknownCategoryError(ValueError):
    """A categorical column holds values outside the categories it was trained with. The message
    says how to predict them anyway (``handle_unknown``); :meth:`of_a_test_file` says what a
    training run, which encodes its test file as its training file, can do instead."""

    def __init__(self, where: str, column: str, found: Sequence[str], categories: Sequence[str]):
        self.where, self.column, self.found, self.categories = where, column, list(found), list(categories)
        super().__init__(f"{where}: categorical column {column!r} has values {listed(self.found)} outside its "
                         f"categories {listed(self.categories)}; fix the cells, or pass "
                         f"handle_unknown='ignore' to encode them as none of the categories (all of the "
                         f"column's one-hot features 0)")

    def of_a_test_file(self) -> str:
        """The message for a training run's test file, whose categories are the training file's."""
        return (f"{self.where}: categorical column {self.column!r} has values {listed(self.found)} outside the "
                f"training file's categories {listed(self.categories)}; fix or leave out "
                f"those rows of the test file, train on data that has these categories, or leave the column "
                f"out of the features (drop_columns=)")


def _value_of(text: str) -> Optional[decimal.Decimal]:
    """The exact value of ``text`` where it is a finite number as Python writes one (``"1.0"`` and
    ``"1"`` alike: 1), else None. Decimal, not float: codes such as 12345678901234567891 stay apart."""
    if not re.match(_NUMBER, text):
        return None
    value = decimal.Decimal(text)
    return value if value.is_finite() else None


def _categories_by_value(cells: pa.ChunkedArray, unknown: pa.ChunkedArray,
                         cats: Sequence[str]) -> pa.ChunkedArray:
    """``cells`` with each cell that is no category of ``cats`` (``unknown``) but the number of exactly
    one, written otherwise (``1.0`` for ``1``, ``2.50`` for ``2.5``), replaced by that category: a
    code column reads the same from a file that writes its codes another way, and from a Parquet or
    data frame column of floats (1.0, whose text is ``1``) against codes a CSV wrote ``1.0``."""
    by_value: dict[decimal.Decimal, list[str]] = {}
    for c in cats:
        value = _value_of(c)
        if value is not None:
            by_value.setdefault(value, []).append(c)
    if not by_value:
        return cells
    written: list[str] = []
    category: list[str] = []
    for text in pc.unique(pc.filter(cells, unknown)).to_pylist():
        same = by_value.get(_value_of(text), [])
        if len(same) == 1:  # two categories of one value (1 and 1.0 in training): neither is chosen
            written.append(text)
            category.append(same[0])
    if not written:
        return cells
    renamed = pc.take(string_array(category), pc.index_in(cells, string_array(written)))
    return pc.coalesce(renamed.cast(cells.type), cells)


# Numbers as spreadsheets write them for people: "1,234", "1.234.567" (thousands separators), "45%"
_SEPARATED_NUMBER = r"^[+-]?\d{1,3}([,.' ]\d{3})+([.,]\d+)?$"
_PERCENT = r"^[+-]?(\d+([.,]\d*)?|[.,]\d+)\s*%$"


def warn_numbers_as_text(col: pa.ChunkedArray, name: str, origin: TableOrigin) -> None:
    """A warning naming ``name`` when every cell of the text column ``col`` that is about to be one-hot
    encoded is a number written with thousands separators or as a percentage: its categories say
    less than the numbers would."""
    cells = pc.utf8_trim_whitespace(_text(col).drop_null())
    cells = cells.filter(pc.not_equal(cells, ""))
    if len(cells) == 0:
        return
    for pattern, how, example in ((_SEPARATED_NUMBER, "with thousands separators", "1,234"),
                                  (_PERCENT, "as percentages", "45%")):
        if pc.all(pc.match_substring_regex(cells, pattern)).as_py():
            warnings.warn(f"{origin.name}: text column {name!r} holds numbers written {how} ({example!r}), which "
                          f"are one-hot encoded as categories; to read them as numbers write them plainly "
                          f"(1234, 0.45), or leave the column out (drop_columns=)", NumbersAsTextWarning,
                          stacklevel=3)
            return


# A text column with at least this share of its rows as distinct values (two rows a value or fewer; and
# more than MANY_CATEGORIES) tells little about new rows when one-hot encoded: an id, free text, or codes
# too fine. Measured on 300 rows: 150 values of no meaning took test MAE from 0.48 (column dropped) to 1.09,
# 150 with a per-value effect gained nothing (0.99 against 1.02); 75 such values did help (0.68 against 1.03).
MANY_CATEGORIES, MANY_CATEGORIES_SHARE = 50, 0.5


# What a category the training data did not have gets when a prediction meets it: an error naming it,
# or "ignore": no category of its column (all its one-hot features 0), as scikit-learn's OneHotEncoder.
HANDLE_UNKNOWN = ("error", "ignore")


def _categories(col: pa.ChunkedArray, name: str, origin: TableOrigin,
                given: Sequence[str], handle_unknown: str = "error") -> tuple[pa.ChunkedArray, list[str]]:
    cells = _text(col)
    if cells.null_count:
        i = _first(pc.is_null(cells)) or 0
        raise ValueError(f"{origin.name}: categorical column {name!r} has a missing value in "
                         f"{origin.row(i)}; drop or impute such rows before loading")
    cats = [str(c) for c in given] or sorted(pc.unique(cells).to_pylist())
    if not given and len(cats) > MANY_CATEGORIES and len(cats) >= MANY_CATEGORIES_SHARE * len(cells):
        warnings.warn(f"{origin.name}: text column {name!r} has {len(cats):,} distinct values in {len(cells):,} "
                      f"rows; one-hot encoded, it makes {len(cats):,} features that say little about new "
                      "rows. If it is an id, free text or codes too fine, leave it out of the features (drop_columns=).",
                      ManyCategoriesWarning, stacklevel=2)
    unknown = pc.invert(pc.is_in(cells, string_array(cats)))
    if given and _first(unknown) is not None:
        cells = _categories_by_value(cells, unknown, cats)
        unknown = pc.invert(pc.is_in(cells, string_array(cats)))
    if handle_unknown != "ignore" and _first(unknown) is not None:
        found = sorted(set(pc.filter(cells, unknown).to_pylist()))
        raise UnknownCategoryError(origin.name, name, found, cats)
    return cells, cats


def table_features(table: pa.Table, columns: Sequence[str], categorical: Mapping[str, Sequence[str]],
                   origin: TableOrigin, handle_unknown: str = "error"
                   ) -> tuple[np.ndarray, list[str], dict[str, list[str]]]:
    """The features of ``table``: float32 ``[N, F]`` C-ordered, numeric columns as they are and
    categorical ones one-hot, in the order of ``columns``; also the feature names and the categories
    used for each categorical column (empty categories given: the column's sorted distinct values).

    Raises ValueError naming ``origin``, the column and the first bad row for a missing column, a
    missing, non-numeric, infinite or float32-overflowing value, or an unknown category (unless
    ``handle_unknown="ignore"``: its one-hot features are all 0).
    """
    if handle_unknown not in HANDLE_UNKNOWN:
        raise ValueError(f"handle_unknown={handle_unknown!r}; expected one of {', '.join(HANDLE_UNKNOWN)}")
    positions = _positions(table)
    cols = {name: _column(table, name, origin, "feature", positions) for name in columns}
    encoded: dict[str, tuple[pa.ChunkedArray, list[str]]] = {}
    width = 0
    for name in columns:
        if name in categorical:
            encoded[name] = _categories(cols[name], name, origin, categorical[name], handle_unknown)
            width += len(encoded[name][1])
        else:
            width += 1
    if width == 0:
        raise ValueError(f"{origin.name}: no feature columns left besides the label")
    x = np.zeros((table.num_rows, width), dtype=np.float32)
    names: list[str] = []
    used: dict[str, list[str]] = {}
    for name in columns:
        k = len(names)
        if name in encoded:
            cells, cats = encoded[name]
            found = pc.index_in(cells, string_array(cats))
            if found.null_count:  # unknown categories, ignored: no one-hot feature set
                index = np.array([-1 if i is None else i for i in found.to_pylist()])
                rows = np.flatnonzero(index >= 0)
                x[rows, k + index[rows]] = 1.0
            else:
                x[np.arange(table.num_rows), k + _to_numpy(found)] = 1.0
            names += [f"{name}={c}" for c in cats]
            used[name] = cats
            continue
        _feature_column(cols[name], name, origin, x[:, k])
        names.append(name)
    return x, names, used


def table_labels(table: pa.Table, name: str, origin: TableOrigin, optional: bool = False
                 ) -> Optional[np.ndarray]:
    """The label column ``name`` as float64 ``[N]``.

    ValueError naming the first row whose label is missing, not a number or not finite; with
    ``optional=True`` a table without the column, or whose every cell is empty, has no labels (None).
    """
    if optional and name not in table.column_names:
        return None
    col = _column(table, name, origin, "label")
    textual = is_text_type(col.type) or pa.types.is_dictionary(col.type)
    if optional and table.num_rows and (
            pa.types.is_null(col.type) or col.null_count == table.num_rows
            or (textual and not pc.any(pc.not_equal(_text(col), "")).as_py())):
        return None
    if textual:
        values = _numbers_from_text(col, name, origin, "label")
    elif pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_decimal(col.type):
        if col.null_count:
            i = _first(pc.is_null(col)) or 0
            raise ValueError(_label_message(origin, name, "", i))
        values = _to_numpy(col.cast(pa.float64()))
    else:
        raise ValueError(f"{origin.name}: label column {name!r} holds {col.type} values; labels must be "
                         "numbers (ages, scores, months)")
    bad = _first(~np.isfinite(values))
    if bad is not None:
        raise ValueError(_label_message(origin, name, str(col[bad].as_py()), bad))
    return values if values.flags.writeable else values.copy()
