"""Fine-tune a Hugging Face ``transformers`` encoder with SOL (extra ``hf``).

Three pieces:

- :class:`SOLTextModel`, a ``PreTrainedModel``: an encoder (``AutoModel.from_pretrained(...)``, no task
  head) with a :class:`~sol_ext.SOLHead`; its embeddings are the pooled last hidden states,
  L2-normalized. Its :class:`SOLTextConfig` holds the encoder's config and the head's settings, so
  ``save_pretrained`` / ``from_pretrained`` (and ``AutoModel.from_pretrained`` once ``sol_ext.hf`` is
  imported, and ``push_to_hub``) keep the encoder, the head's state and its settings together.
  ``forward`` returns a :class:`SOLTextOutput` whose ``logits`` are the rank log-probabilities.
- :class:`SOLTrainer`, a ``transformers.Trainer`` whose ``compute_loss`` is SOL's loss against the
  head's centroids (under data-parallel training, that of the global batch with all its pairs) and
  whose evaluation and ``predict`` give the rank probabilities (``predictions``, ``[N, n]``) and the
  head's ranks (``ranks`` of ``predict``'s output), scored by MAE, macro-MAE and QWK.
- :class:`SOLCallback`, which the trainer adds to itself: SOL's end-of-epoch step. Before the first
  epoch (unless the head has centroids, e.g. resumed from a checkpoint) and at the end of every epoch,
  before that epoch's evaluation and checkpoint, the whole training set is embedded with the model in
  eval mode and the head updated (damped centroid rule, read-out); under data parallelism each process
  embeds its :func:`~sol_ext.distributed.shard` and :func:`sol_ext.distributed.update_head` all-reduces
  the update, so every process holds the same head. An evaluation or ``predict`` after training steps
  the head has not seen (``eval_strategy="steps"``, ``max_steps`` inside an epoch) updates the head
  the same way first, so it scores the model as it is, and the checkpoint saved with that evaluation
  holds that head.

::

    from transformers import AutoModel, TrainingArguments
    from sol_ext.hf import SOLTextModel, SOLTrainer

    model = SOLTextModel(AutoModel.from_pretrained("distilbert-base-uncased"), num_ranks=5)
    trainer = SOLTrainer(model=model, args=TrainingArguments("out", num_train_epochs=3),
                         train_dataset=train, eval_dataset=test)   # rows: input_ids, attention_mask, labels
    trainer.train()
    output = trainer.predict(test)     # output.predictions: [N, 5] probabilities; output.ranks: [N]

The head is a submodule of the model, so the trainer's checkpoints save it and
``trainer.train(resume_from_checkpoint=...)`` resumes with it. Labels (``labels``) are integer ranks
``0 … num_ranks-1``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset

try:
    from transformers import AutoConfig, AutoModel, EvalPrediction, PreTrainedModel, Trainer, TrainerCallback
    from transformers.trainer_utils import PredictionOutput
    from transformers.utils import ModelOutput
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("sol_ext.hf needs Hugging Face transformers: pip install 'sol_ext[hf]' "
                      "(or pip install transformers accelerate)") from error
try:
    from transformers import PreTrainedConfig
except ImportError:  # transformers 4 spells it PretrainedConfig
    from transformers import PretrainedConfig as PreTrainedConfig

from . import metrics
from .distributed import DistributedStochasticOrderLoss, is_distributed, shard, update_centroids, update_head
from .head import SETTINGS, SOLHead
from .readout import cut_ranks, expected_ranks, log_posterior, median_ranks

__all__ = ["SOLTextConfig", "SOLTextModel", "SOLTextOutput", "SOLTrainer", "SOLCallback", "SOLPredictionOutput",
           "POOLINGS", "rank_metrics", "ranks_from_probabilities"]

# "mean": the mean of the last hidden states over the attention mask; "cls": the first token's state.
POOLINGS = ("mean", "cls")
# the encoder inputs SOLTextModel.forward passes on (and keeps in a dataset's columns)
_ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "inputs_embeds")


class SOLTextConfig(PreTrainedConfig):
    """The configuration of a :class:`SOLTextModel` (its ``config.json``).

    Args:
        encoder_config: the encoder's configuration (a ``PreTrainedConfig`` or its dict, with its
            ``model_type``), from which ``from_pretrained`` rebuilds the encoder.
        head_settings: the :class:`~sol_ext.SOLHead`'s settings (:meth:`SOLHead.settings
            <sol_ext.SOLHead.settings>`: ``num_ranks``, ``embedding_dim``, ``sigma``, …). The head's state
            (centroids, read-out) is in the weights file with the encoder's.
        pooling, normalize_embeddings: as for :class:`SOLTextModel`.
    """

    model_type = "sol_text"
    sub_configs = {"encoder_config": AutoConfig}

    def __init__(self, encoder_config: Any = None, head_settings: Optional[dict[str, Any]] = None,
                 pooling: str = "mean", normalize_embeddings: bool = True, **kwargs: Any) -> None:
        if isinstance(encoder_config, dict):
            encoder_config = AutoConfig.for_model(**encoder_config)
        self.encoder_config = encoder_config
        self.head_settings = dict(head_settings or {})
        self.pooling = pooling
        self.normalize_embeddings = normalize_embeddings
        super().__init__(**kwargs)

    @property
    def num_ranks(self) -> Optional[int]:
        """``n``, the head's number of ranks."""
        return self.head_settings.get("num_ranks")


@dataclass
class SOLTextOutput(ModelOutput):
    """What :meth:`SOLTextModel.forward` returns.

    Attributes:
        loss: this batch's SOL loss, when ``labels`` were given.
        logits: ``[B, n]`` float64 rank log-probabilities ``log p(q | x)`` (``softmax``/``exp`` give the
            probabilities); ``None`` until the head has a read-out (after the first epoch).
        embeddings: ``[B, d]`` float32 pooled embeddings.
    """

    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    embeddings: Optional[torch.Tensor] = None


class SOLTextModel(PreTrainedModel):
    """A ``transformers`` encoder whose pooled embeddings a :class:`~sol_ext.SOLHead` turns into ranks.

    Build it around an encoder, ``SOLTextModel(encoder, num_ranks, **settings)``, or from a
    :class:`SOLTextConfig` (what ``from_pretrained`` does: the encoder is built from its config and
    the weights loaded after).

    Args:
        encoder: a model without a task head (``AutoModel``), whose outputs have
            ``last_hidden_state [B, L, hidden_size]``; or a :class:`SOLTextConfig`.
        num_ranks: ``n``; labels are integer ranks ``0 … n-1`` (not with a config).
        pooling: ``"mean"`` (over the attention mask; default) or ``"cls"`` (the first token).
        normalize_embeddings: L2-normalize the pooled embeddings (SOL's embeddings are).
        **head_options: settings of the :class:`~sol_ext.SOLHead` (``sigma``, ``tau``, ``momentum``, …);
            its ``embedding_dim`` is the encoder's ``config.hidden_size``.
    """

    config_class = SOLTextConfig
    base_model_prefix = "sol"
    main_input_name = "input_ids"

    def __init__(self, encoder: Any, num_ranks: Optional[int] = None, *, pooling: str = "mean",
                 normalize_embeddings: bool = True, **head_options: Any) -> None:
        if isinstance(encoder, SOLTextConfig):
            config = encoder
            if num_ranks is not None or head_options:
                raise TypeError("SOLTextModel(config) takes its settings from the config; pass num_ranks and "
                                "head settings only with an encoder: SOLTextModel(encoder, num_ranks, ...)")
            missing = [name for name in SETTINGS if name not in config.head_settings]
            if config.encoder_config is None or missing:
                raise ValueError(f"SOLTextConfig lacks the encoder's config or the head settings "
                                 f"{', '.join(missing)}; build SOLTextModel(encoder, num_ranks, ...) instead")
            encoder = AutoModel.from_config(config.encoder_config)
            settings = dict(config.head_settings)
        else:
            hidden = getattr(getattr(encoder, "config", None), "hidden_size", None)
            if not isinstance(encoder, nn.Module) or not isinstance(hidden, int):
                raise TypeError(f"encoder must be a transformers model with config.hidden_size (e.g. "
                                f"AutoModel.from_pretrained(...)), got {type(encoder).__name__}")
            if num_ranks is None:
                raise TypeError("SOLTextModel(encoder, num_ranks) needs num_ranks, the number of ranks")
            if pooling not in POOLINGS:
                raise ValueError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, got {pooling!r}")
            settings = SOLHead(num_ranks, hidden, **head_options).settings()  # checked here, by name
            config = SOLTextConfig(encoder_config=encoder.config, head_settings=settings, pooling=pooling,
                                   normalize_embeddings=normalize_embeddings)
        super().__init__(config)
        self.encoder = encoder
        backend = {k: head_options[k] for k in ("backend", "check_values") if k in head_options}
        self.head = SOLHead(settings["num_ranks"], settings["embedding_dim"], **backend,
                            **{name: settings[name] for name in SETTINGS[2:]})
        self.pooling = config.pooling
        self.normalize_embeddings = config.normalize_embeddings
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing to initialize: the encoder initializes (or loads) its own weights and the head has
        none, only buffers that its training fills."""

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
                labels: Optional[torch.Tensor] = None, **unused: Any) -> SOLTextOutput:
        """A :class:`SOLTextOutput`: the embeddings, the rank log-probabilities as ``logits`` once the
        head has a read-out, and ``loss`` (this batch's SOL loss) when ``labels`` are given."""
        h = self.embed(input_ids, attention_mask, token_type_ids, inputs_embeds)
        logits = self.rank_log_probabilities(h) if bool(self.head.has_readout) else None
        loss = self.head.loss(h, labels) if labels is not None else None
        return SOLTextOutput(loss=loss, logits=logits, embeddings=h)

    def rank_log_probabilities(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, n]`` float64 ``log p(q | x)`` of embeddings ``h [B, d]`` (no gradient)."""
        posterior = self.head.posterior
        return log_posterior(self.head.dissimilarity(h.detach()).to(torch.float64),
                              posterior.log_prior.to(h.device), posterior.temperature)

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


AutoConfig.register(SOLTextConfig.model_type, SOLTextConfig, exist_ok=True)
AutoModel.register(SOLTextConfig, SOLTextModel, exist_ok=True)


def ranks_from_probabilities(head: SOLHead, probabilities: Any) -> np.ndarray:
    """``[N]`` int64 ranks the ``head``'s read-out gives for rank probabilities ``[N, n]`` of its own
    (``predictions`` of :class:`SOLTrainer`): the same ranks as ``head.predict`` of the embeddings.
    ``"nearest"`` is ``argmin_q D[x, q]``, read from the probabilities as ``argmax_q log p_q - log
    prior_q`` (equal up to rounding)."""
    p = torch.as_tensor(np.asarray(probabilities), dtype=torch.float64)
    if head.readout == "cuts":
        ranks = cut_ranks(expected_ranks(p), head.cuts.detach().cpu())
    elif head.readout == "nearest":
        log_p = p.clamp_min(torch.finfo(torch.float64).tiny).log()
        ranks = torch.argmax(log_p - head.log_prior.detach().cpu(), dim=1)
    else:
        ranks = median_ranks(p)
    return ranks.numpy()


def rank_metrics(num_ranks: int, head: Optional[SOLHead] = None):
    """A ``compute_metrics`` for ``Trainer``: ``mae``, ``macro_mae`` and ``qwk`` of predicted ranks.

    The predictions may be ranks ``[N]`` or rank probabilities ``[N, n]``; the latter are turned into
    ranks by ``head``'s read-out (:func:`ranks_from_probabilities`), or by their median without one."""

    def compute(prediction: EvalPrediction) -> dict[str, float]:
        pred = np.asarray(prediction.predictions)
        if pred.ndim == 2 and pred.shape[1] == num_ranks:
            pred = ranks_from_probabilities(head, pred) if head is not None else \
                median_ranks(torch.as_tensor(pred, dtype=torch.float64)).numpy()
        pred = pred.reshape(-1)
        true = np.asarray(prediction.label_ids).reshape(-1)
        return {"mae": metrics.mae(pred, true), "macro_mae": metrics.macro_mae(pred, true),
                "qwk": metrics.quadratic_weighted_kappa(pred, true, num_ranks)}

    return compute


class SOLPredictionOutput(PredictionOutput):
    """``Trainer.predict``'s ``(predictions, label_ids, metrics)`` (it unpacks as those three), with
    ``predictions`` the rank probabilities ``[N, n]`` (rows sum to 1: what ``cleanlab`` takes as
    ``pred_probs``) and ``ranks``, the head's ranks ``[N]``."""

    ranks: np.ndarray


class SOLCallback(TrainerCallback):
    """SOL's end-of-epoch step for a :class:`SOLTrainer` (it adds one to itself): the first centroids
    when training begins (unless the head has some), then :meth:`SOLTrainer.update_head` at the end of
    every epoch (unless an evaluation at that step already updated it), before that epoch's evaluation
    and checkpoint."""

    def __init__(self, trainer: "SOLTrainer") -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if not bool(self.trainer.sol_model.head.has_centroids):
            self.trainer.update_head(centroids_only=True)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.trainer.head_step != state.global_step:
            self.trainer.update_head()


class SOLTrainer(Trainer):
    """A ``transformers.Trainer`` for a :class:`SOLTextModel`: SOL's loss, SOL's end-of-epoch step
    (:class:`SOLCallback`), a head brought up to date before every evaluation and prediction, and the
    rank probabilities as predictions.

    Takes ``Trainer``'s arguments; ``model`` must be a :class:`SOLTextModel`. Without a
    ``compute_metrics``, evaluation reports ``mae``, ``macro_mae`` and ``qwk`` of the head's ranks
    (:func:`rank_metrics`); a ``compute_metrics`` of your own gets the probabilities ``[N, n]`` as
    ``predictions``. ``train_dataset`` must be map-style (it is read again, in order, at the end of
    every epoch); its rows hold the encoder inputs and ``labels``.

    Attributes:
        head_step: the training step (``state.global_step``) at which the head was last updated.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, SOLTextModel):
            raise TypeError(f"SOLTrainer's model must be a sol_ext.hf.SOLTextModel, got "
                            f"{type(self.model).__name__}; wrap the encoder: SOLTextModel(encoder, num_ranks)")
        if self.compute_metrics is None:
            self.compute_metrics = rank_metrics(self.model.head.num_ranks, self.model.head)
        self.head_step = 0
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
        if is_distributed(None):
            loss = DistributedStochasticOrderLoss(head.criterion)(h, labels, head.centroids.detach().to(h.dtype))
        else:
            loss = head.loss(h, labels)
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: Optional[list[str]] = None):
        """``(loss, probabilities [B, n], labels [B])``: the batch's SOL loss and the rank probabilities of
        the head's read-out."""
        inputs = dict(self._prepare_inputs(inputs))
        labels = inputs.pop("labels", None)
        sol = self.sol_model
        head = sol.head
        with torch.no_grad():
            h = sol.embed(**{k: v for k, v in inputs.items() if k in _ENCODER_INPUTS})
            loss = head.loss(h, labels).detach() if labels is not None else None
            if prediction_loss_only:
                return loss, None, None
            probabilities = head.predict_proba(h)
        return loss, probabilities, labels

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Optional[list[str]] = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """``Trainer.evaluate`` with the head brought up to date first (:meth:`ensure_current_head`)."""
        self.ensure_current_head("evaluate")
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset: Any, ignore_keys: Optional[list[str]] = None,
                metric_key_prefix: str = "test") -> SOLPredictionOutput:
        """A :class:`SOLPredictionOutput`: ``predictions`` the rank probabilities ``[N, n]``, ``ranks``
        the head's ranks ``[N]``, and, where ``test_dataset`` has labels, ``label_ids`` and ``metrics``.
        The head is brought up to date first (:meth:`ensure_current_head`)."""
        self.ensure_current_head("predict")
        output = super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        result = SOLPredictionOutput(*output)
        result.ranks = ranks_from_probabilities(self.sol_model.head, output.predictions)
        return result

    def ensure_current_head(self, what: str = "evaluate") -> None:
        """Update the head (:meth:`update_head`, on every process) when the model has trained since it
        was last updated, or when it has centroids but no read-out yet (``eval_on_start``); refuse,
        naming ``what``, a model whose head was never trained."""
        head = self.sol_model.head
        if self.state.global_step != self.head_step or (bool(head.has_centroids) and not bool(head.has_readout)):
            self.update_head()
        elif not bool(head.has_readout):
            raise RuntimeError(f"SOLTrainer.{what}: the model's head is not trained (no centroids or read-out); "
                               f"call trainer.train() first, or load a trained model "
                               f"(SOLTextModel.from_pretrained(folder))")

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
            self.head_step = self.state.global_step
