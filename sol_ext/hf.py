"""Fine-tune a Hugging Face ``transformers`` encoder with SOL (extra ``hf``).

Three pieces:

- :class:`SOLTextModel` wraps an encoder (``AutoModel.from_pretrained(...)``, no task head) with a
  :class:`~sol_ext.SOLHead`: its embeddings are the pooled last hidden states, L2-normalized.
- :class:`SOLTrainer`, a ``transformers.Trainer`` whose ``compute_loss`` is SOL's loss against the
  head's centroids (under data-parallel training, that of the global batch with all its pairs) and
  whose evaluation and ``predict`` give the head's ranks, scored by MAE, macro-MAE and QWK.
- :class:`SOLCallback`, which the trainer adds to itself: SOL's end-of-epoch step. Before the first
  epoch (unless the head has centroids, e.g. resumed from a checkpoint) and at the end of every epoch,
  before that epoch's evaluation and checkpoint, the whole training set is embedded with the model in
  eval mode and the head updated (damped centroid rule, read-out); under data parallelism each process
  embeds its :func:`~sol_ext.distributed.shard` and :func:`sol_ext.distributed.update_head` all-reduces
  the update, so every process holds the same head.

::

    from transformers import AutoModel, TrainingArguments
    from sol_ext.hf import SOLTextModel, SOLTrainer

    model = SOLTextModel(AutoModel.from_pretrained("distilbert-base-uncased"), num_ranks=5)
    trainer = SOLTrainer(model=model, args=TrainingArguments("out", num_train_epochs=3),
                         train_dataset=train, eval_dataset=test)   # rows: input_ids, attention_mask, labels
    trainer.train()
    ranks = trainer.predict(test).predictions

The head is a submodule of the model, so the trainer's checkpoints save it and
``trainer.train(resume_from_checkpoint=...)`` resumes with it. Labels (``labels``) are integer ranks
``0 … num_ranks-1``.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset

try:
    from transformers import EvalPrediction, Trainer, TrainerCallback
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("sol_ext.hf needs Hugging Face transformers: pip install 'sol_ext[hf]' "
                      "(or pip install transformers accelerate)") from error

from . import metrics
from .distributed import DistributedStochasticOrderLoss, _distributed, shard, update_centroids, update_head
from .head import SOLHead

__all__ = ["SOLTextModel", "SOLTrainer", "SOLCallback", "POOLINGS", "rank_metrics"]

# "mean": the mean of the last hidden states over the attention mask; "cls": the first token's state.
POOLINGS = ("mean", "cls")
# the encoder inputs SOLTextModel.forward passes on (and keeps in a dataset's columns)
_ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "inputs_embeds")


class SOLTextModel(nn.Module):
    """A ``transformers`` encoder whose pooled embeddings a :class:`~sol_ext.SOLHead` turns into ranks.

    Args:
        encoder: a model without a task head (``AutoModel``), whose outputs have
            ``last_hidden_state [B, L, hidden_size]``.
        num_ranks: ``n``; labels are integer ranks ``0 … n-1``.
        pooling: ``"mean"`` (over the attention mask; default) or ``"cls"`` (the first token).
        normalize_embeddings: L2-normalize the pooled embeddings (SOL's embeddings are).
        **head_options: settings of the :class:`~sol_ext.SOLHead` (``sigma``, ``tau``, ``momentum``, …);
            its ``embedding_dim`` is the encoder's ``config.hidden_size``.
    """

    def __init__(self, encoder: nn.Module, num_ranks: int, *, pooling: str = "mean",
                 normalize_embeddings: bool = True, **head_options: Any) -> None:
        super().__init__()
        hidden = getattr(getattr(encoder, "config", None), "hidden_size", None)
        if not isinstance(encoder, nn.Module) or not isinstance(hidden, int):
            raise TypeError(f"encoder must be a transformers model with config.hidden_size (e.g. "
                            f"AutoModel.from_pretrained(...)), got {type(encoder).__name__}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, got {pooling!r}")
        self.encoder = encoder
        self.head = SOLHead(num_ranks, hidden, **head_options)
        self.pooling = pooling
        self.normalize_embeddings = normalize_embeddings

    def embed(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
              token_type_ids: Optional[torch.Tensor] = None,
              inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Embeddings ``[B, hidden_size]`` float32 of a batch of token ids ``[B, L]`` (or ``inputs_embeds``)."""
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                 "inputs_embeds": inputs_embeds}
        states = self.encoder(**{k: v for k, v in given.items() if v is not None}).last_hidden_state
        if self.pooling == "cls":
            pooled = states[:, 0]
        else:
            mask = (torch.ones(states.shape[:2], device=states.device) if attention_mask is None
                    else attention_mask.to(states.dtype)).unsqueeze(-1)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        pooled = pooled.float()  # the head's float32 centroids; float32 under mixed precision too
        return F.normalize(pooled, dim=1) if self.normalize_embeddings else pooled

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, inputs_embeds: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """``{"embeddings": [B, d]}``, plus ``"loss"`` (this batch's SOL loss) when ``labels`` are given."""
        h = self.embed(input_ids, attention_mask, token_type_ids, inputs_embeds)
        out = {"embeddings": h}
        if labels is not None:
            out["loss"] = self.head.loss(h, labels)
        return out

    @torch.no_grad()
    def predict(self, **inputs: torch.Tensor) -> torch.Tensor:
        """``[B]`` int64 ranks of a batch (the head's read-out; the model in eval mode)."""
        return self.head.predict(self._eval_embed(inputs))

    @torch.no_grad()
    def predict_proba(self, **inputs: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` float64 rank probabilities of a batch."""
        return self.head.predict_proba(self._eval_embed(inputs))

    def _eval_embed(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        was_training = self.training
        self.eval()
        try:
            return self.embed(**{k: v for k, v in inputs.items() if k in _ENCODER_INPUTS})
        finally:
            self.train(was_training)


def rank_metrics(num_ranks: int):
    """A ``compute_metrics`` for ``Trainer``: ``mae``, ``macro_mae`` and ``qwk`` of predicted ranks."""

    def compute(prediction: EvalPrediction) -> dict[str, float]:
        pred = np.asarray(prediction.predictions).reshape(-1)
        true = np.asarray(prediction.label_ids).reshape(-1)
        return {"mae": metrics.mae(pred, true), "macro_mae": metrics.macro_mae(pred, true),
                "qwk": metrics.quadratic_weighted_kappa(pred, true, num_ranks)}

    return compute


class SOLCallback(TrainerCallback):
    """SOL's end-of-epoch step for a :class:`SOLTrainer` (it adds one to itself): the first centroids
    when training begins (unless the head has some), then :meth:`SOLTrainer.update_head` at the end of
    every epoch, before that epoch's evaluation and checkpoint."""

    def __init__(self, trainer: "SOLTrainer") -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if not bool(self.trainer.sol_model.head.has_centroids):
            self.trainer.update_head(centroids_only=True)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.trainer.update_head()


class SOLTrainer(Trainer):
    """A ``transformers.Trainer`` for a :class:`SOLTextModel`: SOL's loss, SOL's end-of-epoch step
    (:class:`SOLCallback`), and the head's ranks as predictions.

    Takes ``Trainer``'s arguments; ``model`` must be a :class:`SOLTextModel`. Without a
    ``compute_metrics``, evaluation reports ``mae``, ``macro_mae`` and ``qwk`` (:func:`rank_metrics`).
    ``train_dataset`` must be map-style (it is read again, in order, at the end of every epoch); its
    rows hold the encoder inputs and ``labels``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, SOLTextModel):
            raise TypeError(f"SOLTrainer's model must be a sol_ext.hf.SOLTextModel, got "
                            f"{type(self.model).__name__}; wrap the encoder: SOLTextModel(encoder, num_ranks)")
        if self.compute_metrics is None:
            self.compute_metrics = rank_metrics(self.model.head.num_ranks)
        self.add_callback(SOLCallback(self))

    @property
    def sol_model(self) -> SOLTextModel:
        """The :class:`SOLTextModel` (not wrapped for data parallelism)."""
        return self.model

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None):
        """SOL's loss of the batch against the head's centroids; of the global batch (all processes'
        pairs) under data-parallel training."""
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)  # through the data-parallel wrapper: it averages the gradients
        h = outputs["embeddings"]
        head = self.sol_model.head
        if _distributed(None):
            loss = DistributedStochasticOrderLoss(head.criterion)(h, labels, head.centroids.detach().to(h.dtype))
        else:
            loss = head.loss(h, labels)
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: Optional[list[str]] = None):
        """``(loss, ranks [B], labels [B])``: the batch's SOL loss and the head's ranks (the nearest
        centroid before the read-out is first fitted)."""
        inputs = dict(self._prepare_inputs(inputs))
        labels = inputs.pop("labels", None)
        sol = self.sol_model
        head = sol.head
        with torch.no_grad():
            h = sol.embed(**{k: v for k, v in inputs.items() if k in _ENCODER_INPUTS})
            loss = head.loss(h, labels).detach() if labels is not None and bool(head.has_centroids) else None
            if prediction_loss_only:
                return loss, None, None
            readout = None if bool(head.has_readout) else "nearest"
            ranks = head.predict(h, readout=readout) if bool(head.has_centroids) else None
        return loss, ranks, labels

    def embedding_dataloader(self) -> DataLoader:
        """This process's share of the training set (:func:`sol_ext.distributed.shard`), in order,
        batched with the trainer's collator, for the end-of-epoch pass."""
        dataset = self.train_dataset
        if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError("SOLTrainer's end-of-epoch step embeds the whole training set again, which needs "
                            f"a map-style train_dataset (with len and indexing), got {type(dataset).__name__}")
        if hasattr(dataset, "column_names"):  # a datasets.Dataset: keep the columns the model takes
            dataset = self._remove_unused_columns(dataset, description="training")
        part = shard(len(dataset))
        return DataLoader(Subset(dataset, range(part.start, part.stop)),
                          batch_size=self.args.per_device_eval_batch_size, shuffle=False,
                          collate_fn=self.data_collator, num_workers=self.args.dataloader_num_workers)

    @torch.no_grad()
    def embed_training_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h [N_r, d], ranks [N_r])`` of this process's share of the training set, model in eval mode."""
        sol = self.sol_model
        device = next(sol.parameters()).device
        embeddings, ranks = [], []
        was_training = sol.training
        sol.eval()
        try:
            for batch in self.embedding_dataloader():
                batch = dict(self._prepare_inputs(batch))
                ranks.append(batch.pop("labels").to(device))
                embeddings.append(sol.embed(**{k: v for k, v in batch.items() if k in _ENCODER_INPUTS}))
        finally:
            sol.train(was_training)
        if not embeddings:  # more processes than samples: an empty share
            return (torch.empty(0, sol.head.embedding_dim, device=device),
                    torch.empty(0, dtype=torch.int64, device=device))
        return torch.cat(embeddings), torch.cat(ranks)

    def update_head(self, centroids_only: bool = False) -> None:
        """SOL's end-of-epoch step: embed the training set, update the head's centroids and (unless
        ``centroids_only``) its read-out, across the processes under data-parallel training."""
        h, labels = self.embed_training_set()
        if centroids_only:
            update_centroids(self.sol_model.head, h, labels)
        else:
            update_head(self.sol_model.head, h, labels)
