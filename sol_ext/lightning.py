"""SOL as a Lightning module: ``SOLModule(encoder, num_ranks, embedding_dim)`` (extra ``lightning``).

:class:`SOLModule` trains an encoder with SOL's loss against a :class:`~sol_ext.SOLHead` and runs SOL's
end-of-epoch step itself::

    import lightning as L
    from sol_ext.lightning import SOLModule

    module = SOLModule(encoder, num_ranks=10, embedding_dim=16, sigma=1.0)
    L.Trainer(max_epochs=5).fit(module, train_loader, val_loader)   # batches (inputs, ranks)
    ranks = module.predict_ranks(x_new)

- Before the first epoch (unless the head has centroids: a resumed or loaded one) and after the last
  training batch of every epoch it embeds the whole training set with the encoder in eval mode and
  updates the head (:meth:`SOLHead.update <sol_ext.SOLHead.update>`: damped centroid rule, read-out),
  before that epoch's validation. Under a data-parallel strategy (``strategy="ddp"``) each
  process embeds its :func:`~sol_ext.distributed.shard` of the training set and the update is
  all-reduced (:func:`sol_ext.distributed.update_head`), so every process holds the same head; the
  loss of a step is then that of the global batch with all its pairs
  (:class:`~sol_ext.distributed.DistributedStochasticOrderLoss`).
- Validation logs ``val_mae``, ``val_macro_mae`` and ``val_qwk`` (:mod:`sol_ext.metrics`, over the
  whole validation set of all processes) once the head has a read-out; training logs ``train_loss``.
- The head's buffers and settings are part of the module's ``state_dict``, so Lightning checkpoints
  save it and ``Trainer.fit(..., ckpt_path=...)`` resumes with it.

The end-of-epoch pass reads the training ``DataLoader``'s dataset in order (map-style datasets); for
another source, override :meth:`SOLModule.embedding_dataloader`. Batches are ``(inputs, ranks)``; for
another layout, override :meth:`SOLModule.split_batch`.
"""
from __future__ import annotations

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

from . import metrics
from .distributed import (
    DistributedStochasticOrderLoss,
    _distributed,
    gather_all,
    shard,
    update_centroids,
    update_head,
)
from .head import SOLHead

__all__ = ["SOLModule"]


class SOLModule(pl.LightningModule):
    """An encoder trained with SOL, and the :class:`~sol_ext.SOLHead` that turns its embeddings into ranks.

    Args:
        encoder: maps a batch of inputs to embeddings ``[B, embedding_dim]``.
        num_ranks: ``n``; labels are integer ranks ``0 … n-1``.
        embedding_dim: ``d``, the encoder's output size.
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
    """

    def __init__(self, encoder: nn.Module, num_ranks: int, embedding_dim: int, *, lr: float = 1e-3,
                 weight_decay: Optional[float] = None, normalize_embeddings: bool = True,
                 embed_batch_size: Optional[int] = None, **head_options: Any) -> None:
        super().__init__()
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"encoder must be a torch.nn.Module mapping inputs to embeddings "
                            f"[B, embedding_dim], got {type(encoder).__name__}")
        if embed_batch_size is not None and (not isinstance(embed_batch_size, int) or embed_batch_size < 1):
            raise ValueError(f"embed_batch_size must be a positive integer or None, got {embed_batch_size!r}")
        self.save_hyperparameters(ignore=["encoder"])
        self.encoder = encoder
        self.head = SOLHead(num_ranks, embedding_dim, **head_options)
        self.lr = float(lr)
        self.weight_decay = 0.01 * self.head.num_ranks if weight_decay is None else float(weight_decay)
        self.normalize_embeddings = normalize_embeddings
        self.embed_batch_size = embed_batch_size
        self._updated_epoch = -1  # the last epoch whose end-of-epoch step ran
        self._val_predictions: list[torch.Tensor] = []
        self._val_labels: list[torch.Tensor] = []

    # -- what users may override -------------------------------------------------------------
    def split_batch(self, batch: Any) -> tuple[Any, torch.Tensor]:
        """``(inputs, ranks [B])`` of a batch; the default takes a batch ``(inputs, ranks)``."""
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

    # -- training ------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, labels = self.split_batch(batch)
        h = self.embed(inputs)
        if _distributed(None):  # the global batch's loss, all its pairs; DDP averages the gradients
            criterion = DistributedStochasticOrderLoss(self.head.criterion)
            loss = criterion(h, labels, self.head.centroids.detach().to(h.dtype))
        else:
            loss = self.head.loss(h, labels)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(labels))
        return loss

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
        (across the processes under a data-parallel strategy)."""
        update_head(self.head, *self.embed_training_set())
        self._updated_epoch = self.current_epoch

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
                ranks.append(torch.as_tensor(labels, device=self.device))
        finally:
            self.encoder.train(was_training)
        if not embeddings:  # more processes than samples: an empty share
            return (torch.empty(0, self.head.embedding_dim, device=self.device),
                    torch.empty(0, dtype=torch.int64, device=self.device))
        return torch.cat(embeddings), torch.cat(ranks)

    # -- validation and prediction -----------------------------------------------------------
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not bool(self.head.has_readout):  # the sanity check before the first epoch
            return
        inputs, labels = self.split_batch(batch)
        self._val_predictions.append(self.head.predict(self.embed(inputs).float()))
        self._val_labels.append(torch.as_tensor(labels, device=self.device))

    def on_validation_epoch_end(self) -> None:
        if not bool(self.head.has_readout):
            return
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        predictions = gather_all(torch.cat(self._val_predictions) if self._val_predictions else empty)
        labels = gather_all(torch.cat(self._val_labels).long() if self._val_labels else empty)
        self._val_predictions, self._val_labels = [], []
        if len(labels) == 0:
            return
        pred, true = predictions.cpu().numpy(), labels.cpu().numpy()
        scores = {"val_mae": metrics.mae(pred, true), "val_macro_mae": metrics.macro_mae(pred, true),
                  "val_qwk": metrics.quadratic_weighted_kappa(pred, true, self.head.num_ranks)}
        # the same values on every process (of the gathered set): the mean over processes keeps them
        self.log_dict(scores, prog_bar=True, sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """``[B]`` ranks of a batch ``(inputs, ranks)`` or of a batch of inputs alone (a ``TensorDataset(x)``
        gives it as the 1-tuple ``[x]``)."""
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            inputs = self.split_batch(batch)[0]
        elif isinstance(batch, (tuple, list)) and len(batch) == 1:
            inputs = batch[0]
        else:
            inputs = batch
        return self.predict_ranks(inputs)

    @torch.no_grad()
    def predict_ranks(self, inputs: Any) -> torch.Tensor:
        """``[B]`` int64 ranks of a batch of inputs (the head's read-out; encoder in eval mode)."""
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            return self.head.predict(self.embed(inputs).float())
        finally:
            self.encoder.train(was_training)

    def forward(self, inputs: Any) -> torch.Tensor:
        """Embeddings ``[B, d]`` of a batch of inputs (:meth:`embed`)."""
        return self.embed(inputs)
