"""Data of one run: load, split, standardize, and add label noise to the training labels."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..labels import LabelGrid
from .config import TrainConfig
from .data import (
    ImageFiles,
    OrdinalDataset,
    apply_scaling,
    feature_scaling,
    is_builtin,
    load_dataset,
    load_train_test,
    train_test_split,
)
from .synthetic_noise import add_label_noise

__all__ = ["PreparedData", "prepare_data", "preprocessing_record"]


@dataclass
class PreparedData:
    """Training and test sets of a run, as tensors.

    Attributes:
        name, kind: data set name and kind (``tabular``, ``embeddings`` or ``images``).
        grid: the ``LabelGrid`` mapping label values to ranks (shared by both sets).
        train_x: ``[N, ...]`` float32 training inputs (images: a tensor, or
            :class:`~sol_ext.driver.data.ImageFiles` decoded when a batch needs them).
        train_given: ``[N]`` int64 training ranks as given to the learner (noisy).
        train_clean: ``[N]`` int64 clean training ranks, or ``None`` when unknown (labels that
            came noisy from a file).
        test_x: ``[M, ...]`` float32 test inputs, as ``train_x``.
        test_ranks: ``[M]`` int64 test ranks (clean; never shown to the learner).
        train_rows: ``[N]`` int64 row of each training sample in the data file.
        preprocessing: what turns a new file into ``train_x``-like inputs (saved with the model):
            the data's ``schema``, ``feature_names``, the feature ``scaling`` (``mean``/``std``,
            float64, or ``None`` for images), the ``delimiter`` and the label ``grid``.
    """

    name: str
    kind: str
    grid: LabelGrid
    train_x: torch.Tensor | ImageFiles
    train_given: torch.Tensor
    train_clean: Optional[torch.Tensor]
    test_x: torch.Tensor | ImageFiles
    test_ranks: torch.Tensor
    train_rows: Optional[torch.Tensor] = None
    preprocessing: Optional[dict[str, Any]] = None
    read_from: Optional[str] = None  # the working folder the config's relative data paths were read from
    row_ids: Optional[list[str]] = None  # the id column's id of each data row (train_rows index it)

    @property
    def num_ranks(self) -> int:
        return int(self.grid.num_ranks)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must agree on to be resumed with these data."""
        return {"name": self.name, "kind": self.kind, "num_ranks": self.num_ranks,
                "min_value": float(self.grid.min_value), "step": float(self.grid.step),
                "n_train": int(self.train_x.shape[0]), "n_test": int(self.test_x.shape[0]),
                "input_shape": list(self.input_shape),
                "given_label_sum": int(self.train_given.sum())}


def preprocessing_record(train: OrdinalDataset, delimiter: Optional[str] = None) -> dict[str, Any]:
    """How inputs like ``train``'s (before scaling) become the model's: its ``schema`` (how the
    file was read), feature names, input shape, the CSV ``delimiter``, the training set's feature
    ``scaling`` (mean and std, float64; ``None`` for images) and the label ``grid``. Saved with the
    model (:attr:`PreparedData.preprocessing`)."""
    scaling = feature_scaling(train)
    enc = train.grid
    return {
        "kind": train.kind, "schema": dict(train.schema), "feature_names": list(train.feature_names),
        "input_shape": list(train.features.shape[1:]), "delimiter": delimiter,
        "scaling": None if scaling is None else {"mean": scaling[0], "std": scaling[1]},
        "grid": {"min_value": float(enc.min_value), "step": float(enc.step),
                 "num_ranks": int(enc.num_ranks)},
    }


def _float(features: torch.Tensor | ImageFiles) -> torch.Tensor | ImageFiles:
    return features if isinstance(features, ImageFiles) else features.float()


def _options(config: TrainConfig) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if config.label_column is not None:
        opts["label_column"] = config.label_column
    if config.delimiter is not None:
        opts["delimiter"] = config.delimiter
    if config.image_size is not None:
        opts["image_size"] = config.image_size
    opts["one_hot_text"] = True  # a table's columns of words, with the training file's categories
    opts["missing"] = config.missing
    if config.encoding is not None:
        opts["encoding"] = config.encoding
    if config.id_column is not None:
        opts["id_column"] = config.id_column
    if config.text_column is not None:
        opts["text_column"] = config.text_column
    for name in ("feature_columns", "drop_columns", "categorical"):
        if getattr(config, name) is not None:
            opts[name] = config.column_list(name)
    for name, argument in (("label_min", "min_value"), ("label_max", "max_value"), ("label_step", "step")):
        if getattr(config, name) is not None:
            opts[argument] = float(getattr(config, name))
    return opts


def prepare_data(config: TrainConfig) -> PreparedData:
    """Load ``config.data`` (and ``config.test_data``), split, standardize vectors, add noise.

    Without ``test_data`` the data set is split ``1 - test_fraction : test_fraction`` with
    ``config.seed`` (stratified by rank; ``test_fraction`` 0: every row trains, and the test set is
    empty); its labels count as clean and noise of
    ``config.noise``/``kappa`` is added to the training part only (by default on the built-in
    data sets only: a user's own labels are taken as given, their clean values unknown). With ``test_data`` the first
    file is the whole training set, its labels taken as given (already noisy: no clean labels)
    unless noise is requested, and the test file is put on the training file's rank grid.
    """
    if config.test_data is not None:
        train, test = load_train_test(config.data, config.test_data, **_options(config),
                                      test_label_column=config.test_label_column)
        rows = torch.arange(len(train))
        row_ids = train.ids
    elif config.test_fraction == 0:  # every row trains; no test set
        train = load_dataset(config.data, **_options(config))
        row_ids = train.ids
        test = None
        rows = torch.arange(len(train))
    else:
        full = load_dataset(config.data, **_options(config))
        row_ids = full.ids
        train, test = train_test_split(full, test_fraction=config.test_fraction, seed=config.seed)
        # the split depends on the ranks and the seed only: split row numbers the same way
        numbers = OrdinalDataset(torch.arange(len(full), dtype=torch.float64)[:, None], full.ranks,
                                 full.grid, full.name, "tabular")
        rows = train_test_split(numbers, test_fraction=config.test_fraction,
                                seed=config.seed)[0].features[:, 0].round().long()
    preprocessing = preprocessing_record(train, config.delimiter)
    scaling = preprocessing["scaling"]  # the training set's, once: also what prediction applies
    if scaling is not None:
        mean_std = (scaling["mean"], scaling["std"])
        train = dataclasses.replace(train, features=apply_scaling(train.features, mean_std))
        if test is not None:
            test = dataclasses.replace(test, features=apply_scaling(test.features, mean_std))
    config.augmentation(train.kind)  # refuses augmentation of vectors before anything trains
    n = int(train.grid.num_ranks)
    noisy = add_label_noise(train.ranks, n, noise=config.noise, kappa=config.kappa,
                            seed=config.seed, fraction=config.noise_fraction)
    # the labels of a built-in set are clean; a user's file may be noisy already (unknown truth)
    labels_known_clean = (config.test_data is None and is_builtin(config.data)) or noisy.scale > 0
    return PreparedData(
        name=train.name, kind=train.kind, grid=train.grid,
        train_x=_float(train.features), train_given=noisy.noisy.long(),
        train_clean=noisy.clean.long() if labels_known_clean else None,
        test_x=_float(train.features[:0] if test is None else test.features),
        test_ranks=torch.zeros(0, dtype=torch.int64) if test is None else test.ranks.long(), train_rows=rows,
        preprocessing=preprocessing, read_from=os.getcwd(),
        row_ids=None if row_ids is None else list(row_ids))
