"""SOL as a Lightning module: ``SOLModule(encoder, num_ranks, embedding_dim)`` (extra ``lightning``).

:class:`SOLModule` trains an encoder with SOL's loss against a :class:`~sol_ext.SOLHead` and runs SOL's
end-of-epoch step itself::

    import lightning as L
    from sol_ext.lightning import SOLModule

    module = SOLModule(encoder, num_ranks=10, embedding_dim=16, sigma=1.0)
    L.Trainer(max_epochs=5).fit(module, train_loader, val_loader)   # batches (inputs, ranks)
    out = module.predict(x_new)     # SOLPrediction: ranks, labels, probabilities, expected, embeddings

- Before the first epoch (unless the head has centroids: a resumed or loaded one) and after the last
  training batch of every epoch it embeds the whole training set with the encoder in eval mode and
  updates the head (:meth:`SOLHead.update <sol_ext.SOLHead.update>`: damped centroid rule, read-out),
  before that epoch's validation. When validation runs before the first epoch (Lightning's sanity
  check), the first head (centroids and read-out) is fitted before it, so a ``validation_step`` of
  your own can predict from the first batch on. Under a data-parallel strategy (``strategy="ddp"``) each
  process embeds its :func:`~sol_ext.distributed.shard` of the training set and the update is
  all-reduced (:func:`sol_ext.distributed.update_head`), so every process holds the same head; the
  loss of a step is then that of the global batch with all its pairs
  (:class:`~sol_ext.distributed.DistributedStochasticOrderLoss`).
- Every epoch logs ``train_loss`` (the mean of the epoch's batches) and ``train_mae``,
  ``train_macro_mae``, ``train_qwk`` (of the head just updated, on the embedded training set);
  validation logs ``val_loss``, ``val_mae``, ``val_macro_mae`` and ``val_qwk``, and ``trainer.test``
  the same as ``test_*`` (:mod:`sol_ext.metrics`, in rank units, over the whole set of all processes).
- Labels are integer ranks ``0 … n-1``, or, with ``label_values``, values of that grid (ages 18, 19,
  …; grades 0.5, 1.0, …) mapped to ranks for you; anything else is refused by name, in training,
  validation and testing alike.
- The head's buffers and settings are part of the module's ``state_dict``, so Lightning checkpoints
  save it and ``Trainer.fit(..., ckpt_path=...)`` resumes with it.

The end-of-epoch pass reads the training ``DataLoader``'s dataset in order (map-style datasets); for
another source, override :meth:`SOLModule.embedding_dataloader`. Batches are ``(inputs, ranks)``; for
another layout, override :meth:`SOLModule.split_batch`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset

try:
    import lightning.pytorch as pl
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("sol_ext.lightning needs Lightning: pip install 'sol_ext[lightning]' "
                      "(or pip install lightning)") from error

from . import _validation as check
from . import metrics
from .distributed import (
    DistributedStochasticOrderLoss,
    gather_all,
    is_distributed,
    shard,
    update_centroids,
    update_head,
)
from .head import SOLHead

__all__ = ["SOLModule", "SOLPrediction"]


@dataclass
class SOLPrediction:
    """What :meth:`SOLModule.predict` and ``trainer.predict(module, ...)`` give for a batch of ``B`` inputs.

    Attributes:
        ranks: ``[B]`` int64 predicted ranks (the head's read-out).
        labels: ``[B]`` the predicted ranks as label values (``label_values[ranks]``; the ranks
            themselves without a label grid).
        probabilities: ``[B, n]`` float64 rank probabilities ``p(q | x)`` (rows sum to 1).
        expected: ``[B]`` float64 expected label ``sum_q p(q | x) label_values[q]`` (the expected
            rank without a label grid).
        embeddings: ``[B, d]`` the encoder's embeddings.
    """

    ranks: torch.Tensor
    labels: torch.Tensor
    probabilities: torch.Tensor
    expected: torch.Tensor
    embeddings: torch.Tensor

    @classmethod
    def cat(cls, parts: Sequence["SOLPrediction"]) -> "SOLPrediction":
        """One :class:`SOLPrediction` of the batches of ``parts`` in order (``trainer.predict``'s list)."""
        if not parts:
            raise ValueError("SOLPrediction.cat needs at least one prediction, got none")
        return cls(**{name: torch.cat([getattr(p, name) for p in parts])
                      for name in ("ranks", "labels", "probabilities", "expected", "embeddings")})


class SOLModule(pl.LightningModule):
    """An encoder trained with SOL, and the :class:`~sol_ext.SOLHead` that turns its embeddings into ranks.

    Args:
        encoder: maps a batch of inputs to embeddings ``[B, embedding_dim]``.
        num_ranks: ``n``; labels are integer ranks ``0 … n-1``. May be ``None`` with ``label_values``.
        embedding_dim: ``d``, the encoder's output size.
        label_values: the label grid, one value per rank in increasing order (e.g. ``range(18, 81)``
            for ages, ``[0.5, 1.0, 1.5]``): batches then hold label values, which the module maps to
            ranks, and predictions come back in these units as well. Default: the labels are ranks.
        lr: Adam's learning rate (override :meth:`configure_optimizers` for another optimizer).
        weight_decay: Adam's weight decay; default ``0.01 * num_ranks``, what ``sol-ext train``
            uses for its MLP encoder (its image encoders keep 5e-4: pass that for a CNN).
        normalize_embeddings: L2-normalize the encoder's outputs (SOL's embeddings are; pair it with
            the head's ``normalize=True``, the default).
        embed_batch_size: batch size of the end-of-epoch pass (default: the training loader's).
        **head_options: settings of the :class:`~sol_ext.SOLHead` (``sigma``, ``tau``, ``margin``,
            ``momentum``, ``readout``, …).

    Attributes:
        encoder, head: the modules (``head.predict(h)``, ``head.predict_proba(h)`` on embeddings).
        label_values: ``[n]`` float64 label grid (``0 … n-1`` without ``label_values``).
    """

    def __init__(self, encoder: nn.Module, num_ranks: Optional[int], embedding_dim: int, *,
                 label_values: Optional[Sequence[float]] = None, lr: float = 1e-3,
                 weight_decay: Optional[float] = None, normalize_embeddings: bool = True,
                 embed_batch_size: Optional[int] = None, **head_options: Any) -> None:
        super().__init__()
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"encoder must be a torch.nn.Module mapping inputs to embeddings "
                            f"[B, embedding_dim], got {type(encoder).__name__}")
        if embed_batch_size is not None and (not isinstance(embed_batch_size, int) or embed_batch_size < 1):
            raise ValueError(f"embed_batch_size must be a positive integer or None, got {embed_batch_size!r}")
        grid = _label_grid(label_values, num_ranks)
        self.save_hyperparameters(ignore=["encoder"])
        self.encoder = encoder
        self.head = SOLHead(len(grid), embedding_dim, **head_options)
        self.register_buffer("label_values", grid, persistent=False)  # in the hyperparameters already
        self._values_are_ranks = label_values is None
        self.lr = float(lr)
        self.weight_decay = 0.01 * self.head.num_ranks if weight_decay is None else float(weight_decay)
        self.normalize_embeddings = normalize_embeddings
        self.embed_batch_size = embed_batch_size
        self._updated_epoch = -1  # the last epoch whose end-of-epoch step ran
        self._scored: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    # -- what users may override -------------------------------------------------------------
    def split_batch(self, batch: Any) -> tuple[Any, torch.Tensor]:
        """``(inputs, labels [B])`` of a batch; the default takes a batch ``(inputs, labels)``."""
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"SOLModule expects batches (inputs, ranks), got {type(batch).__name__}; "
                            f"override SOLModule.split_batch for another layout")
        return batch[0], batch[1]

    def embed(self, inputs: Any) -> torch.Tensor:
        """Embeddings ``[B, d]`` of a batch of inputs (L2-normalized with ``normalize_embeddings``)."""
        h = self.encoder(inputs)
        return F.normalize(h, dim=1) if self.normalize_embeddings else h

    def embedding_dataloader(self) -> DataLoader:
        """This process's share of the training set, in order, for the end-of-epoch pass.

        The default reads the dataset of the trainer's training ``DataLoader`` (map-style), split
        between the processes by :func:`sol_ext.distributed.shard` (every sample once: no shuffling,
        no padding), with the loader's ``collate_fn``."""
        loader = self.trainer.train_dataloader
        if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
            raise TypeError(
                "SOLModule's end-of-epoch step embeds the whole training set, read from the training "
                f"DataLoader's dataset, which needs one DataLoader of a map-style dataset; got "
                f"{type(loader).__name__}. Override SOLModule.embedding_dataloader to return this "
                "process's share of the training set")
        dataset = loader.dataset
        part = shard(len(dataset))
        batch_size = self.embed_batch_size or loader.batch_size or 256
        return DataLoader(Subset(dataset, range(part.start, part.stop)), batch_size=batch_size,
                          shuffle=False, collate_fn=loader.collate_fn, num_workers=loader.num_workers)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.encoder.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    # -- labels ----------------------------------------------------------------------------------
    def to_ranks(self, labels: Any, name: str = "labels") -> torch.Tensor:
        """``[B]`` int64 ranks of a batch's labels: integer ranks ``0 … n-1`` as they are, or, with
        ``label_values``, the rank of each value on the grid. Anything else (a label off the grid, a
        float rank such as 2.5) is refused with an error naming it."""
        labels = torch.as_tensor(labels, device=self.device)
        if self._values_are_ranks:
            if labels.is_floating_point():
                fractional = torch.nonzero(labels.reshape(-1) != labels.reshape(-1).round())
                example = (f" ({float(labels.reshape(-1)[fractional[0, 0]])} at index {int(fractional[0, 0])})"
                           if fractional.numel() else "")
                raise TypeError(f"{name} must be integer ranks 0 … {self.head.num_ranks - 1} (an integer tensor), "
                                f"got dtype {labels.dtype}{example}; convert whole ranks with .long(), or pass "
                                f"label_values=[...] to SOLModule for labels on another grid")
            return check.check_ranks(name, labels, self.head.num_ranks)
        grid = self.label_values.to(labels.device)
        values = labels.to(torch.float64).reshape(-1)
        nearer, i = check.nearest_grid_ranks(values, grid)
        if i is not None:
            raise ValueError(f"{name} must be values of label_values ({_describe(grid)}), got "
                             f"{float(values[i])} at index {i}")
        return nearer

    # -- training ------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, labels = self.split_batch(batch)
        labels = self.to_ranks(labels)
        h = self.embed(inputs)
        if is_distributed(None):  # the global batch's loss, all its pairs; DDP averages the gradients
            criterion = DistributedStochasticOrderLoss(self.head.criterion)
            loss = criterion(h, labels, self.head.centroids.detach().to(h.dtype))
        else:
            loss = self.head.loss(h, labels)
        # the epoch's mean: one row per epoch in the logs, however few steps an epoch has
        self.log("train_loss", loss, prog_bar=True, on_step=False, on_epoch=True, batch_size=len(labels),
                 sync_dist=True)
        return loss

    def on_validation_start(self) -> None:
        if self.trainer.sanity_checking and not bool(self.head.has_readout):
            self.first_head()

    def first_head(self) -> None:
        """The head before the first epoch, when validation runs then (Lightning's sanity check): the
        first centroids and a read-out of the training set, so that any ``validation_step`` can
        predict. Training starts from the same centroids as without it."""
        self.trainer.fit_loop.setup_data()  # Lightning sets the training loader up after the sanity check
        update_head(self.head, *self.embed_training_set())

    def on_train_start(self) -> None:
        if not bool(self.head.has_centroids):  # a resumed or loaded head keeps its centroids
            update_centroids(self.head, *self.embed_training_set())

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.is_last_batch:  # before this epoch's validation, which needs the new head
            self.end_of_epoch()

    def on_train_epoch_end(self) -> None:
        if self._updated_epoch != self.current_epoch:  # an epoch cut short (limit_train_batches)
            self.end_of_epoch()

    def end_of_epoch(self) -> None:
        """SOL's end-of-epoch step: embed the training set, update the centroids and the read-out
        (across the processes under a data-parallel strategy), and log the new head's
        ``train_mae``, ``train_macro_mae`` and ``train_qwk`` on the training set."""
        h, ranks = self.embed_training_set()
        update_head(self.head, h, ranks)
        self._updated_epoch = self.current_epoch
        scores = self._scores("train", self.head.predict(h) if len(h) else ranks, ranks)
        if scores:
            self.log_dict(scores, on_step=False, on_epoch=True, sync_dist=True)

    @torch.no_grad()
    def embed_training_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h [N_r, d] float32, ranks [N_r])`` of this process's share of the training set
        (:meth:`embedding_dataloader`), embedded with the encoder in eval mode."""
        was_training = self.encoder.training
        self.encoder.eval()
        embeddings, ranks = [], []
        try:
            for batch in self.embedding_dataloader():
                batch = self.transfer_batch_to_device(batch, self.device, 0)
                inputs, labels = self.split_batch(batch)
                embeddings.append(self.embed(inputs).float())
                ranks.append(self.to_ranks(labels))
        finally:
            self.encoder.train(was_training)
        if not embeddings:  # more processes than samples: an empty share
            return (torch.empty(0, self.head.embedding_dim, device=self.device),
                    torch.empty(0, dtype=torch.int64, device=self.device))
        return torch.cat(embeddings), torch.cat(ranks)

    # -- validation, testing and prediction ------------------------------------------------
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluation_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._evaluation_end("val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluation_step("test", batch)

    def on_test_epoch_end(self) -> None:
        self._evaluation_end("test")

    def _evaluation_step(self, stage: str, batch: Any) -> None:
        """The batch's loss (logged as ``<stage>_loss``, the epoch's mean) and predictions, kept for
        the epoch's metrics."""
        self._require_head(stage)
        inputs, labels = self.split_batch(batch)
        ranks = self.to_ranks(labels, f"{stage} labels")
        h = self.embed(inputs).float()
        self.log(f"{stage}_loss", self.head.loss(h, ranks), on_step=False, on_epoch=True,
                 batch_size=len(ranks), sync_dist=True)
        predictions, truths = self._scored.setdefault(stage, ([], []))
        predictions.append(self.head.predict(h))
        truths.append(ranks)

    def _evaluation_end(self, stage: str) -> None:
        predictions, truths = self._scored.pop(stage, ([], []))
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        scores = self._scores(stage, torch.cat(predictions) if predictions else empty,
                              torch.cat(truths) if truths else empty)
        if scores:
            self.log_dict(scores, prog_bar=stage == "val", sync_dist=True)

    def _scores(self, stage: str, predictions: torch.Tensor, ranks: torch.Tensor) -> dict[str, float]:
        """``<stage>_mae``, ``_macro_mae`` and ``_qwk`` in rank units of the samples of every process
        (an all-gather: every process must call it); empty when there are none."""
        predictions, ranks = gather_all(predictions), gather_all(ranks)
        if len(ranks) == 0:
            return {}
        pred, true = predictions.cpu().numpy(), ranks.cpu().numpy()
        # the same values on every process (of the gathered set): the mean over processes keeps them
        return {f"{stage}_mae": metrics.mae(pred, true), f"{stage}_macro_mae": metrics.macro_mae(pred, true),
                f"{stage}_qwk": metrics.quadratic_weighted_kappa(pred, true, self.head.num_ranks)}

    def _require_head(self, stage: str) -> None:
        if not bool(self.head.has_readout):
            raise RuntimeError(f"SOLModule: {stage} needs a trained head (centroids and read-out); fit the "
                               f"module first (trainer.fit), or load a trained one "
                               f"(SOLModule.load_from_checkpoint)")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> SOLPrediction:
        """The :class:`SOLPrediction` of a batch ``(inputs, labels)`` or of a batch of inputs alone (a
        ``TensorDataset(x)`` gives it as the 1-tuple ``[x]``); :meth:`SOLPrediction.cat` joins
        ``trainer.predict``'s list."""
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            inputs = self.split_batch(batch)[0]
        elif isinstance(batch, (tuple, list)) and len(batch) == 1:
            inputs = batch[0]
        else:
            inputs = batch
        return self.predict(inputs)

    @torch.no_grad()
    def predict(self, inputs: Any) -> SOLPrediction:
        """Ranks, label values, probabilities, expected label and embeddings of a batch of inputs
        (the head's read-out; encoder in eval mode)."""
        self._require_head("predict")
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            h = self.embed(inputs).float()
        finally:
            self.encoder.train(was_training)
        d = self.head.dissimilarity(h)
        probabilities = self.head.probabilities(d)
        ranks = self.head.ranks(d, probabilities)
        grid = self.label_values.to(probabilities.device)
        return SOLPrediction(ranks=ranks, labels=grid[ranks] if not self._values_are_ranks else ranks,
                             probabilities=probabilities, expected=probabilities @ grid, embeddings=h)

    def forward(self, inputs: Any) -> torch.Tensor:
        """Embeddings ``[B, d]`` of a batch of inputs (:meth:`embed`); :meth:`predict` gives ranks,
        probabilities and the expected label."""
        return self.embed(inputs)


def _label_grid(label_values: Optional[Sequence[float]], num_ranks: Optional[int]) -> torch.Tensor:
    """``[n]`` float64 label grid: ``label_values`` checked (finite, strictly increasing, ``n`` of them
    if ``num_ranks`` is given), or ``0 … num_ranks-1``."""
    if label_values is None:
        if num_ranks is None:
            raise ValueError("SOLModule needs num_ranks (labels 0 … num_ranks-1) or label_values (the label grid)")
        num_ranks = check.check_num_ranks(num_ranks)
        return torch.arange(num_ranks, dtype=torch.float64)
    try:
        grid = torch.as_tensor(list(label_values), dtype=torch.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"label_values must be a sequence of numbers (the label of each rank, increasing), "
                         f"got {label_values!r}") from error
    if grid.ndim != 1 or len(grid) < 1 or not bool(torch.isfinite(grid).all()) \
            or not bool((grid[1:] > grid[:-1]).all()):
        raise ValueError(f"label_values must be finite numbers in strictly increasing order, one per rank, "
                         f"got {label_values!r}")
    if num_ranks is not None and num_ranks != len(grid):
        raise ValueError(f"num_ranks ({num_ranks!r}) must equal the number of label_values ({len(grid)}); "
                         f"pass num_ranks=None to take it from label_values")
    return grid


def _describe(grid: torch.Tensor) -> str:
    values = [f"{v:g}" for v in grid.tolist()]
    return ", ".join(values) if len(values) <= 6 else f"{', '.join(values[:3])}, …, {values[-1]}"
