"""One entry point by name or path: ``load_dataset`` picks the loader; ``load_train_test`` loads a
training and a test file onto one grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .builtin import load_abalone, load_fashion_mnist_degradation, load_wine_red
from .encoding import OrdinalDataset
from .frames import UnknownCategoryError
from .images import load_image_folder
from .tables import check_delimiter, load_npz, load_table, table_columns, table_format

__all__ = ["load_dataset", "load_train_test", "is_builtin", "TABULAR_FORMATS"]

# The schema formats of data read as tables of named columns (``"csv"``: every table file before
# Parquet and Feather; ``"table"``: those and data frames).
TABULAR_FORMATS = ("csv", "table")
_KNOWN_FILES = ".csv, .tsv (also gzipped), .parquet, .feather, .arrow, .npz file or image folder"


BUILTIN_NAMES = ("abalone", "wine-red", "fashion-mnist", "fashion-mnist-blur", "fashion-mnist-noise")


def is_builtin(spec: str | Path) -> bool:
    """Whether ``spec`` names a built-in data set (whose labels are clean) rather than a file."""
    return str(spec).strip().lower() in BUILTIN_NAMES


def load_dataset(spec: str | Path, **options: Any) -> OrdinalDataset:
    """Load a dataset by name or path; ``options`` go to the loader.

    ``spec`` is one of:

    - ``"abalone"`` → :func:`load_abalone`; ``"wine-red"`` → :func:`load_wine_red`;
    - ``"fashion-mnist-blur"`` (or ``"fashion-mnist"``) / ``"fashion-mnist-noise"`` →
      :func:`load_fashion_mnist_degradation`;
    - a ``.npz`` file → :func:`load_npz`;
    - a ``.csv``/``.csv.gz`` file with a ``path`` column (or ``path_column=`` given) →
      :func:`load_image_folder`; any other CSV/TSV, Parquet (``.parquet``) or Feather / Arrow IPC
      (``.feather``, ``.arrow``) file → :func:`load_table` (``label_column`` defaults to ``"label"``);
    - a folder holding ``labels.csv`` → :func:`load_image_folder` on it.

    ``image_size=`` (a side, or ``(H, W)``) resizes images (image lists: 64 by default; Fashion-MNIST:
    28); it is an error for tables.
    Pass ``grid=`` to put the data on an existing grid (a test file on the training file's grid).
    ``delimiter=`` (one character, or "comma"/"semicolon"/"tab") is the cell separator of a CSV; None
    (the default) detects comma, semicolon or tab from the header. It applies to CSV/TSV files only.
    """
    key = str(spec).strip()
    if options.get("image_size", 0) is None:
        del options["image_size"]  # the loader's default size
    # text columns one-hot where the data are a table; nothing to encode elsewhere
    one_hot_text = options.pop("one_hot_text", False)
    missing = options.pop("missing", "error")  # images, arrays and the built-in data have no missing cells
    csv_options = _csv_options(key, options)
    if key.lower() in BUILTIN_NAMES:
        return _load_builtin(key.lower(), options)
    path = Path(key)
    if path.is_dir():
        listing = path / "labels.csv"
        if not listing.is_file():
            raise FileNotFoundError(f"{path} is a folder without labels.csv; an image folder needs a "
                                    "labels.csv with columns path,label")
        return load_image_folder(listing, **csv_options)
    if not path.exists():
        raise FileNotFoundError(f"no dataset {key!r}: not a built-in name ({', '.join(BUILTIN_NAMES)}) nor an "
                                f"existing {_KNOWN_FILES}")
    if "image_size" in options and table_format(path) != "csv":
        raise ValueError(f"image_size={options['image_size']} applies to images; {path} is not an "
                         "image list")
    if path.name.lower().endswith(".npz"):
        return load_npz(path, **options)
    return _load_table_file(path, options, csv_options, one_hot_text=one_hot_text, missing=missing)


def _csv_options(key: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` (from which ``delimiter`` and ``encoding`` are taken) with those two where given:
    the options of a CSV file's loader. ValueError for an option of tables given data ``key`` that is
    none (a built-in data set, an ``.npz``, a folder)."""
    not_a_table = key.lower() in BUILTIN_NAMES or key.lower().endswith(".npz")
    for option in _TABLE_OPTIONS:
        if options.get(option) in (None, (), []):
            options.pop(option, None)
        elif not_a_table or Path(key).is_dir():
            raise ValueError(f"{option}= applies to tables (CSV, Parquet, Feather); {key!r} is not one: "
                             f"leave {option}= out")
    delimiter = check_delimiter(options.pop("delimiter", None))
    encoding = options.pop("encoding", None)
    csv_options = options if delimiter is None else {**options, "delimiter": delimiter}
    if encoding is not None:  # CSV tables only (load_table refuses it for Parquet and Feather)
        if not_a_table or Path(key).is_dir():
            raise ValueError(f"encoding={encoding!r} applies to CSV files only; {key!r} is not one: leave "
                             "encoding out")
        csv_options = {**csv_options, "encoding": encoding}
    if delimiter is not None and not_a_table:
        raise ValueError(f"delimiter={delimiter!r} applies to CSV files only; {key!r} is not one: leave "
                         "delimiter out")
    if options.get("label_column") is not None and not_a_table:
        raise ValueError(f"label_column={options['label_column']!r} applies to tables (CSV, Parquet, Feather) and "
                         f"image folders; {key!r} is neither, so do not pass label_column=")
    return csv_options


def _load_builtin(name: str, options: dict[str, Any]) -> OrdinalDataset:
    """The built-in data set ``name`` (one of ``BUILTIN_NAMES``), ``options`` going to its loader."""
    if "image_size" in options and name in ("abalone", "wine-red"):
        raise ValueError(f"image_size={options['image_size']} applies to images; {name!r} is a table")
    if name == "abalone":
        return load_abalone(**options)
    if name == "wine-red":
        return load_wine_red(**options)
    if name == "fashion-mnist":
        return load_fashion_mnist_degradation(**options)
    return load_fashion_mnist_degradation(kind=name.rsplit("-", 1)[1], **options)


def _load_table_file(path: Path, options: dict[str, Any], csv_options: dict[str, Any], *, one_hot_text: bool,
                     missing: str) -> OrdinalDataset:
    """A table file (or an image list: a CSV with a ``path`` column) by its format."""
    fmt = table_format(path)
    if fmt == "csv":
        if "path_column" in options or "path" in table_columns(path, csv_options.get("delimiter"),
                                                               csv_options.get("encoding")):
            for option in ("encoding", *_TABLE_OPTIONS):
                if option in csv_options:
                    raise ValueError(f"{option}= applies to tables; {path} is an image list (it has a "
                                     f"'path' column): leave {option}= out")
            return load_image_folder(path, **csv_options)
        if "image_size" in options:
            raise ValueError(f"image_size={options['image_size']} applies to images; {path} has no "
                             "'path' column, so it is read as a table")
    if fmt is not None:
        return load_table(path, **csv_options, one_hot_text=one_hot_text, missing=missing)
    raise ValueError(f"cannot tell the format of {path}: expected a {_KNOWN_FILES.replace(' file or', ' or')} "
                     "(a folder with labels.csv)")


# Options of table files only (load_table's).
_TABLE_OPTIONS = ("id_column", "drop_columns", "feature_columns", "categorical", "text_column")


def load_train_test(train_spec: str | Path, test_spec: str | Path, test_label_column: str | None = None,
                    **options: Any) -> tuple[OrdinalDataset, OrdinalDataset]:
    """A training set with labels as given (possibly noisy) and a test set with clean labels, on one grid.

    The grid is fitted on the training labels only (with any ``step``/``min_value``/``max_value`` given)
    and reused for the test file, so test labels never shape training. A test label off that grid is an
    error: pass ``min_value``/``max_value`` covering both files. ``test_label_column`` names the test
    file's label column where it differs from ``label_column``.
    """
    train = load_dataset(train_spec, **options)
    rest = {k: v for k, v in options.items()
            if k not in ("step", "min_value", "max_value", "grid", "one_hot_text", "drop_columns")}
    # a test row with a missing value cannot be scored fairly by a filled-in guess: left out or refused
    if rest.get("missing") == "impute":
        rest["missing"] = "skip"
    if test_label_column is not None:
        rest["label_column"] = test_label_column
    if train.schema.get("format") in TABULAR_FORMATS and not is_builtin(test_spec):
        # the training file's columns, in its order and with its categories: a test file with the
        # same columns in another order must not be scored on swapped features
        rest.update(feature_columns=list(train.schema["columns"]),
                    categorical={k: list(v) for k, v in train.schema["categorical"].items()})
    if train.schema.get("format") == "images" and not is_builtin(test_spec):
        rest["channels"] = train.schema["channels"]  # gray or colour as the training images
    try:
        test = load_dataset(test_spec, grid=train.grid, **rest)
    except UnknownCategoryError as exc:  # its advice is prediction's: say what training can do
        raise ValueError(exc.of_a_test_file()) from None
    if train.features.shape[1:] != test.features.shape[1:]:
        raise ValueError(f"train and test features differ in shape: {tuple(train.features.shape[1:])} vs "
                         f"{tuple(test.features.shape[1:])}")
    return train, test
