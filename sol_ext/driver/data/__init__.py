"""Datasets for rank estimation.

Label values (ages, scores, months) map to 0-based ranks by a fixed grid (docs/math.md section 1),
:class:`sol_ext.labels.LabelGrid`; every loader returns an :class:`OrdinalDataset` whose ``ranks`` are on
it, and predictions go back to label units with :meth:`~sol_ext.labels.LabelGrid.decode`.

Sources (nothing is downloaded):

- ``load_abalone()``: the UCI Abalone data shipped with the package (rings 1–29, 4177 samples).
- ``load_wine_red()``: the UCI Wine Quality red data shipped with the package (quality 3–8, 1599 wines).
- ``load_table(path, label_column)``: a table of feature columns and a label column,
  read by pyarrow: CSV/TSV, comma, semicolon or tab delimited (detected from the header, or
  ``delimiter=``), also gzipped; Parquet; Feather / Arrow IPC.
- ``load_table(path, label_column, text_column=...)``: a table with a column of free text, kept as
  text (:class:`TextRows`) for a text encoder's tokenizer; the other columns as features beside it.
- ``load_npz(path)``: precomputed embeddings ``[N, d]`` (key ``embeddings`` or ``features``) and ``labels``.
- ``load_image_folder(csv_path)``: images listed in a CSV of ``(path, label)`` rows, kept as files
  (:class:`ImageFiles`) and decoded when a batch needs them.
- ``load_fashion_mnist_degradation()``: Fashion-MNIST images blurred or noised to a level 0…K-1, the rank.
- ``load_dataset(spec)``: any of the above by name or path; ``load_train_test`` for a training file with
  labels as given (possibly noisy) and a test file with clean labels, on one shared grid.

Data frames (pandas, polars, ``pyarrow.Table``) and table files share one adapter, ``frames.table_features``:
columns by name, in a given order, categorical ones one-hot with given categories.

The modules, by source: ``encoding`` (:class:`OrdinalDataset`), ``tables`` (table files
and ``.npz``), ``frames`` (tables to features), ``image_files`` (:class:`ImageFiles`, decoding), ``texts`` (:class:`TextRows`, a table's text column), ``images`` (image folders), ``builtin`` (Abalone, Wine Quality, Fashion-MNIST), ``load``
(``load_dataset``, ``load_train_test``), ``split`` (splitting and scaling) and ``inputs`` (new files read
as a run's training data were, for prediction). Import from here.
"""

from .builtin import (
    DATASETS_DIR,
    FASHION_MNIST_DIR,
    FASHION_MNIST_INSTALL,
    degradation_strengths,
    load_abalone,
    load_fashion_mnist_degradation,
    load_wine_red,
)
from .encoding import OrdinalDataset, infer_step
from .image_files import ImageFiles, read_image
from .images import load_image_folder
from .inputs import Inputs, read_inputs
from .load import is_builtin, load_dataset, load_train_test
from .split import apply_scaling, feature_scaling, split_indices, standardize, train_test_split
from .tables import load_npz, load_table
from .texts import TextRows

__all__ = [
    "OrdinalDataset", "infer_step", "ImageFiles", "read_image", "TextRows",
    "load_abalone", "load_wine_red", "load_table", "load_npz", "load_image_folder",
    "load_fashion_mnist_degradation",
    "degradation_strengths", "load_dataset", "is_builtin", "load_train_test", "split_indices", "train_test_split",
    "standardize", "feature_scaling", "apply_scaling", "Inputs", "read_inputs",
    "DATASETS_DIR", "FASHION_MNIST_DIR", "FASHION_MNIST_INSTALL",
]
