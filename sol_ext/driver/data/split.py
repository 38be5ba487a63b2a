"""Splitting and scaling: a stratified train/test split by rank and feature standardization."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from .encoding import OrdinalDataset
from .texts import TextRows

__all__ = ["split_indices", "train_test_split", "standardize", "feature_scaling", "apply_scaling"]


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


def feature_scaling(train: OrdinalDataset) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per-column ``(mean, std)`` (float64 ``[F]``) of the training features, as :func:`standardize`
    uses them; constant columns get std 1 (centred only). ``None`` for images (kept in [0, 1])."""
    if train.kind == "images":
        return None
    features = train.features.features if isinstance(train.features, TextRows) else train.features
    x = features.to(torch.float64)
    if x.shape[1] == 0:  # a text alone: no other feature to scale
        return x.new_zeros(0), x.new_ones(0)
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    return mean, torch.where(std > 1e-12, std, torch.ones_like(std))


def apply_scaling(features: torch.Tensor | TextRows,
                  scaling: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor | TextRows:
    """``(features - mean) / std`` in float64, returned as float32 (``scaling`` None: unchanged); of
    rows of text, their other features."""
    if scaling is None:
        return features
    if isinstance(features, TextRows):
        return features.with_features(apply_scaling(features.features, scaling))
    mean, std = scaling
    return ((features.to(torch.float64) - mean) / std).float()


def standardize(train: OrdinalDataset,
                test: OrdinalDataset | None = None) -> tuple[OrdinalDataset, OrdinalDataset | None]:
    """Scale features to zero mean and unit variance per column, fitted on ``train`` only
    (:func:`feature_scaling`).

    Applies to "tabular" and "embeddings" data; constant columns are centred only. Images are returned
    unchanged (they are already in [0, 1]).
    """
    scaling = feature_scaling(train)
    if scaling is None:
        return train, test

    def scale(ds: OrdinalDataset) -> OrdinalDataset:
        if ds.features.shape[1:] != train.features.shape[1:]:
            raise ValueError(f"{ds.name!r} has features {tuple(ds.features.shape[1:])}, train has "
                             f"{tuple(train.features.shape[1:])}")
        return dataclasses.replace(ds, features=apply_scaling(ds.features, scaling))

    return scale(train), (scale(test) if test is not None else None)
