"""Rows of text: :class:`TextRows`, the ``features`` of a table with a text column (kind "text"): one
text per row, kept as text until the model's tokenizer reads a batch of them, and the row's other
feature columns as numbers."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .image_files import row_numbers

__all__ = ["TextRows"]


class TextRows:
    """One text per row and the row's other features: what a text encoder takes.

    Indexing with row numbers (a tensor, array, list or slice) gives those rows; :meth:`to` moves the
    features to a device (the texts stay strings: the model tokenizes each batch, padded to its
    longest text). ``shape`` is that of the features, ``[N, F]`` (``F`` may be 0).

    Args:
        texts: the text of each row.
        features: float32 ``[N, F]``, the row's other feature columns; default none (``[N, 0]``).
    """

    dtype = torch.float32

    def __init__(self, texts: Sequence[str], features: torch.Tensor | None = None):
        # numpy strings: indexing a batch copies no Python list item by item
        self.texts = np.asarray([str(t) for t in texts], dtype=np.str_)
        if features is None:
            features = torch.zeros(len(self.texts), 0)
        if features.dim() != 2 or features.shape[0] != len(self.texts):
            raise ValueError(f"TextRows: features must be [N, F] with N = {len(self.texts)} texts, got "
                             f"{tuple(features.shape)}")
        self.features = features

    @property
    def shape(self) -> torch.Size:
        return self.features.shape

    @property
    def device(self) -> torch.device:
        return self.features.device

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: Any) -> "TextRows":
        rows = row_numbers(index, len(self.texts))
        return TextRows(self.texts[rows], self.features[torch.from_numpy(rows).to(self.features.device)])

    def to(self, *args: Any, **kwargs: Any) -> "TextRows":
        """These rows with the features moved or converted as ``Tensor.to`` does."""
        return TextRows(self.texts, self.features.to(*args, **kwargs))

    def float(self) -> "TextRows":
        return self.to(torch.float32)

    def with_features(self, features: torch.Tensor) -> "TextRows":
        """The same texts with other features (scaled ones)."""
        return TextRows(self.texts, features)

    def __repr__(self) -> str:
        return f"TextRows({len(self)} texts, {self.shape[1]} other features)"
