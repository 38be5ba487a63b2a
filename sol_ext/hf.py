"""Fine-tune a Hugging Face ``transformers`` encoder with SOL (extra ``hf``).

Three pieces:

- :class:`SOLTextModel`, a ``PreTrainedModel``: an encoder (``AutoModel.from_pretrained(...)``, no task
  head) with a :class:`~sol_ext.SOLHead`; its embeddings are the pooled last hidden states,
  L2-normalized. Its :class:`SOLTextConfig` holds the encoder's config and the head's settings, so
  ``save_pretrained`` / ``from_pretrained`` (and ``AutoModel.from_pretrained`` once ``sol_ext.hf`` is
  imported, and ``push_to_hub``) keep the encoder, the head's state and its settings together.
  ``forward`` returns a :class:`SOLTextOutput` whose ``logits`` are the rank log-probabilities, and
  ``config.id2label`` names each rank by its label, so ``pipeline("text-classification", model=...)``
  gives each text its most probable rank's label and probability. The encoder keeps its attention
  implementation and gets the attention mask: padding never changes a prediction. Labels are ranks
  ``0 … n-1``, or, with ``label_values=[...]``, values of that grid, mapped to ranks for you.
- :class:`SOLTrainer`, a ``transformers.Trainer`` whose ``compute_loss`` is SOL's loss against the
  head's centroids (under data-parallel training, that of the global batch with all its pairs) and
  whose evaluation and ``predict`` give the rank probabilities (``predictions``, ``[N, n]``) and the
  head's ranks (``ranks`` of ``predict``'s output), scored by MAE, macro-MAE and QWK.
- :class:`SOLCallback`, which the trainer adds to itself: SOL's end-of-epoch step. Before the first
  epoch (unless the head has centroids, e.g. resumed from a checkpoint) and at the end of every epoch,
  before that epoch's evaluation and checkpoint, the whole training set is embedded with the model in
  eval mode and the head updated (damped centroid rule, read-out); under data parallelism each process
  embeds its :func:`~sol_ext.distributed.shard` and :func:`sol_ext.distributed.update_head` all-reduces
  the update, so every process holds the same head. With ``SOLTrainer(...,
  centroid_updates_per_epoch=k)`` (default 1), the centroids alone are also updated that way ``k - 1``
  times inside every epoch, after each ``1/k`` of it, so they follow the encoder as it moves. An
  evaluation or ``predict`` after training steps the head has not seen (``eval_strategy="steps"``,
  ``max_steps`` inside an epoch) updates the head the same way first, so it scores the model as it
  is, and the checkpoint saved with that evaluation holds that head.

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
``0 … num_ranks-1``, or values of ``label_values``. Importing this module registers the model type
``sol_text`` with ``AutoConfig``, ``AutoModel`` and ``AutoModelForSequenceClassification``; a process
that loads a saved model through them without importing it gets transformers' "does not recognize
this architecture" error.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset

try:
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForSequenceClassification,
        EvalPrediction,
        PreTrainedModel,
        Trainer,
        TrainerCallback,
    )
    from transformers.trainer_utils import PredictionOutput
    from transformers.utils import ModelOutput
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("sol_ext.hf needs Hugging Face transformers: pip install 'sol_ext[hf]' "
                      "(or pip install transformers accelerate)") from error
try:
    from transformers import PreTrainedConfig
except ImportError:  # transformers 4 spells it PretrainedConfig
    from transformers import PretrainedConfig as PreTrainedConfig

from . import _validation as check
from . import metrics
from .distributed import DistributedStochasticOrderLoss, is_distributed, shard, update_centroids, update_head
from .head import SETTINGS, SOLHead
from .readout import cut_ranks, expected_ranks, log_posterior, median_ranks

__all__ = ["SOLTextConfig", "SOLTextModel", "SOLTextOutput", "SOLTrainer", "SOLCallback", "SOLPredictionOutput",
           "POOLINGS", "pool_states", "rank_metrics", "ranks_from_probabilities"]

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
        label_values: the label of each rank, in increasing order (``None``: the labels are the ranks
            ``0 … n-1``).

    ``id2label`` and ``label2id`` name the ranks by their labels (``{0: "1", 1: "2", …}`` for 1 … 5
    stars), so ``num_labels`` is the number of ranks and a ``text-classification`` pipeline names
    each text's rank by its label; pass ``id2label`` of your own (one name per rank) to name them
    otherwise.
    """

    model_type = "sol_text"
    sub_configs = {"encoder_config": AutoConfig}

    def __init__(self, encoder_config: Any = None, head_settings: Optional[dict[str, Any]] = None,
                 pooling: str = "mean", normalize_embeddings: bool = True,
                 label_values: Optional[Sequence[float]] = None, **kwargs: Any) -> None:
        if isinstance(encoder_config, dict):
            encoder_config = AutoConfig.for_model(**encoder_config)
        self.encoder_config = encoder_config
        self.head_settings = dict(head_settings or {})
        self.pooling = pooling
        self.normalize_embeddings = normalize_embeddings
        self.label_values = None if label_values is None else [float(v) for v in label_values]
        num_ranks = self.head_settings.get("num_ranks")
        given = kwargs.get("id2label")
        if num_ranks is not None and (given is None or len(given) != num_ranks):
            names = _label_names(self.label_values if self.label_values is not None else range(num_ranks))
            kwargs["id2label"] = dict(enumerate(names))
            kwargs["label2id"] = {name: rank for rank, name in enumerate(names)}
        # PreTrainedConfig.__init__ sets its attention implementation (None unless given) on every
        # sub-config, which would take the encoder's own ("sdpa") away and, with it, the attention mask
        kept_attention = None if encoder_config is None or "attn_implementation" in kwargs else \
            encoder_config._attn_implementation_internal
        super().__init__(**kwargs)
        if kept_attention is not None:
            encoder_config._attn_implementation_internal = kept_attention

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
    the weights loaded after). The encoder keeps its attention implementation (``sdpa``, ``eager``,
    …) and is given the batch's ``attention_mask``, so padding never changes an embedding.

    Args:
        encoder: a model without a task head (``AutoModel``), whose outputs have
            ``last_hidden_state [B, L, hidden_size]``; or a :class:`SOLTextConfig`.
        num_ranks: ``n``; labels are integer ranks ``0 … n-1`` (not with a config). May be ``None``
            with ``label_values``.
        label_values: the label grid, one value per rank in increasing order (``range(1, 6)`` for 1 … 5
            stars, ``range(-4, 5)``, ``[0.5, 1.0, 1.5]``): ``labels`` are then values of that grid,
            mapped to ranks for you (:meth:`to_ranks`), and ``config.id2label`` names each rank by its
            value. Default: the labels are the ranks.
        pooling: ``"mean"`` (over the attention mask; default) or ``"cls"`` (the first token).
        normalize_embeddings: L2-normalize the pooled embeddings (SOL's embeddings are).
        **head_options: settings of the :class:`~sol_ext.SOLHead` (``sigma``, ``tau``, ``momentum``, …);
            its ``embedding_dim`` is the encoder's ``config.hidden_size``.

    Attributes:
        encoder, head: the modules.
        label_values: ``[n]`` float64 label grid (``0 … n-1`` without ``label_values``).
    """

    config_class = SOLTextConfig
    base_model_prefix = "sol"
    main_input_name = "input_ids"
    # from_pretrained(..., attn_implementation=...) reaches the encoder, which checks what it supports
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True

    def __init__(self, encoder: Any, num_ranks: Optional[int] = None, *,
                 label_values: Optional[Sequence[float]] = None, pooling: str = "mean",
                 normalize_embeddings: bool = True, **head_options: Any) -> None:
        if isinstance(encoder, SOLTextConfig):
            config = encoder
            if num_ranks is not None or label_values is not None or head_options:
                raise TypeError("SOLTextModel(config) takes its settings from the config; pass num_ranks, "
                                "label_values and head settings only with an encoder: "
                                "SOLTextModel(encoder, num_ranks, ...)")
            missing = [name for name in SETTINGS if name not in config.head_settings]
            if config.encoder_config is None or missing:
                raise ValueError(f"SOLTextConfig lacks the encoder's config or the head settings "
                                 f"{', '.join(missing)}; build SOLTextModel(encoder, num_ranks, ...) instead")
            encoder = AutoModel.from_config(config.encoder_config)
            settings = dict(config.head_settings)
            grid = _label_grid(config.label_values, settings["num_ranks"])
        else:
            hidden = getattr(getattr(encoder, "config", None), "hidden_size", None)
            if not isinstance(encoder, nn.Module) or not isinstance(hidden, int):
                raise TypeError(f"encoder must be a transformers model with config.hidden_size (e.g. "
                                f"AutoModel.from_pretrained(...)), got {type(encoder).__name__}")
            if num_ranks is None and label_values is None:
                raise TypeError("SOLTextModel(encoder, num_ranks) needs num_ranks, the number of ranks "
                                "(labels 0 … num_ranks-1), or label_values=[...], the label of each rank")
            if pooling not in POOLINGS:
                raise ValueError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, got {pooling!r}")
            grid = _label_grid(label_values, num_ranks)
            settings = SOLHead(len(grid), hidden, **head_options).settings()  # checked here, by name
            config = SOLTextConfig(encoder_config=encoder.config, head_settings=settings, pooling=pooling,
                                   normalize_embeddings=normalize_embeddings,
                                   label_values=None if label_values is None else grid)
        super().__init__(config)
        self.encoder = encoder
        backend = {k: head_options[k] for k in ("backend", "check_values") if k in head_options}
        self.head = SOLHead(settings["num_ranks"], settings["embedding_dim"], **backend,
                            **{name: settings[name] for name in SETTINGS[2:]})
        self._grid = grid  # a list, not a buffer: from_pretrained builds the model on the meta device
        self.pooling = config.pooling
        self.normalize_embeddings = config.normalize_embeddings
        self.post_init()

    @property
    def label_values(self) -> torch.Tensor:
        """``[n]`` float64 label grid (``0 … n-1`` without ``label_values``), on the CPU."""
        return torch.tensor(self._grid, dtype=torch.float64)

    def to_ranks(self, labels: Any, name: str = "labels") -> torch.Tensor:
        """``[B]`` int64 ranks of a batch's labels: integer ranks ``0 … n-1`` as they are, or, with
        ``label_values``, the rank of each value on the grid. Anything else (a label off the grid, a
        float rank such as 2.5) is refused with an error naming it."""
        labels = torch.as_tensor(labels)
        if self.config.label_values is None:
            if labels.is_floating_point():
                raise TypeError(f"{name} must be integer ranks 0 … {self.head.num_ranks - 1}, got dtype "
                                f"{labels.dtype}; give whole ranks as integers, or build "
                                f"SOLTextModel(encoder, label_values=[...]) for labels on another grid")
            return check.check_ranks(name, labels.reshape(-1), self.head.num_ranks)
        grid = self.label_values.to(labels.device)
        values = labels.to(torch.float64).reshape(-1)
        nearer, i = check.nearest_grid_ranks(values, grid)
        if i is not None:
            raise ValueError(f"{name} must be values of label_values ({_describe_grid(grid)}), got "
                             f"{float(values[i]):g} at index {i}; fix or drop such rows, or build the model "
                             f"with label_values that hold them")
        return nearer

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
        pooled = pool_states(states, attention_mask, self.pooling)
        return F.normalize(pooled, dim=1) if self.normalize_embeddings else pooled

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, inputs_embeds: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None, **unused: Any) -> SOLTextOutput:
        """A :class:`SOLTextOutput`: the embeddings, the rank log-probabilities as ``logits`` once the
        head has a read-out, and ``loss`` (this batch's SOL loss) when ``labels`` are given."""
        h = self.embed(input_ids, attention_mask, token_type_ids, inputs_embeds)
        logits = self.rank_log_probabilities(h) if bool(self.head.has_readout) else None
        loss = self.head.loss(h, self.to_ranks(labels).to(h.device)) if labels is not None else None
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


# Importing sol_ext.hf is what lets the Auto classes (and pipeline) load a saved SOLTextModel: a
# process that has not imported it meets transformers' own "does not recognize this architecture".
AutoConfig.register(SOLTextConfig.model_type, SOLTextConfig, exist_ok=True)
AutoModel.register(SOLTextConfig, SOLTextModel, exist_ok=True)
AutoModelForSequenceClassification.register(SOLTextConfig, SOLTextModel, exist_ok=True)


def pool_states(states: torch.Tensor, attention_mask: Optional[torch.Tensor], pooling: str = "mean") -> torch.Tensor:
    """``[B, hidden]`` float32 pooled embeddings of an encoder's last hidden states ``[B, L, hidden]``:
    their mean over the attention mask ``[B, L]`` (``"mean"``; every position without a mask), so
    padding never changes an embedding, or the first token's state (``"cls"``)."""
    if pooling == "cls":
        pooled = states[:, 0]
    else:
        mask = (torch.ones(states.shape[:2], device=states.device) if attention_mask is None
                else attention_mask.to(states.dtype)).unsqueeze(-1)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    return pooled.float()  # the head's float32 centroids; float32 under mixed precision too


def _label_grid(label_values: Optional[Sequence[float]], num_ranks: Optional[int]) -> list[float]:
    """The label grid, one float per rank: ``label_values`` checked (finite, strictly increasing, ``n`` of
    them if ``num_ranks`` is given), or ``0 … num_ranks-1``."""
    if label_values is None:
        return [float(rank) for rank in range(check.check_num_ranks(num_ranks))]
    try:
        grid = [float(value) for value in label_values]
    except (TypeError, ValueError) as error:
        raise ValueError(f"label_values must be a sequence of numbers (the label of each rank, increasing), "
                         f"got {label_values!r}") from error
    if len(grid) < 2 or not all(math.isfinite(v) for v in grid) or any(b <= a for a, b in zip(grid, grid[1:])):
        raise ValueError(f"label_values must be finite numbers in strictly increasing order, one per rank "
                         f"(at least two), got {label_values!r}")
    if num_ranks is not None and num_ranks != len(grid):
        raise ValueError(f"num_ranks ({num_ranks!r}) must equal the number of label_values ({len(grid)}); "
                         f"leave num_ranks out to take it from label_values")
    return grid


def _label_names(values: Sequence[float]) -> list[str]:
    """The name of each rank in ``id2label``: its label value, written as a whole number where it is one."""
    return [str(int(v)) if float(v).is_integer() else f"{float(v):g}" for v in values]


def _describe_grid(grid: torch.Tensor) -> str:
    values = _label_names(grid.tolist())
    return ", ".join(values) if len(values) <= 6 else f"{', '.join(values[:3])}, …, {values[-1]}"


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


def rank_metrics(num_ranks: int, head: Optional[SOLHead] = None, to_ranks: Optional[Any] = None):
    """A ``compute_metrics`` for ``Trainer``: ``mae``, ``macro_mae`` and ``qwk`` of predicted ranks, in
    rank units.

    The predictions may be ranks ``[N]`` or rank probabilities ``[N, n]``; the latter are turned into
    ranks by ``head``'s read-out (:func:`ranks_from_probabilities`), or by their median without one.
    The labels are ranks, or, with ``to_ranks`` (:meth:`SOLTextModel.to_ranks`), labels it maps to ranks."""

    def compute(prediction: EvalPrediction) -> dict[str, float]:
        pred = np.asarray(prediction.predictions)
        if pred.ndim == 2 and pred.shape[1] == num_ranks:
            pred = ranks_from_probabilities(head, pred) if head is not None else \
                median_ranks(torch.as_tensor(pred, dtype=torch.float64)).numpy()
        pred = pred.reshape(-1)
        true = np.asarray(prediction.label_ids).reshape(-1)
        if to_ranks is not None:
            true = to_ranks(torch.as_tensor(true), "evaluation labels").cpu().numpy()
        return {"mae": metrics.mae(pred, true), "macro_mae": metrics.macro_mae(pred, true),
                "qwk": metrics.quadratic_weighted_kappa(pred, true, num_ranks)}

    return compute


class SOLPredictionOutput(PredictionOutput):
    """``Trainer.predict``'s ``(predictions, label_ids, metrics)`` (it unpacks as those three), with
    ``predictions`` the rank probabilities ``[N, n]`` (rows sum to 1: what ``cleanlab`` takes as
    ``pred_probs``), ``ranks``, the head's ranks ``[N]``, and ``labels``, those ranks as label values
    (``label_values[ranks]``; the ranks themselves without a label grid). ``label_ids`` are the
    dataset's labels as given."""

    ranks: np.ndarray
    labels: np.ndarray


class SOLCallback(TrainerCallback):
    """SOL's end-of-epoch step for a :class:`SOLTrainer` (it adds one to itself): the first centroids
    when training begins (unless the head has some), then :meth:`SOLTrainer.update_head` at the end of
    every epoch (unless an evaluation at that step already updated it), before that epoch's evaluation
    and checkpoint. With ``centroid_updates_per_epoch`` ``k > 1``, the centroids alone are updated
    too after the optimizer step that passes each of ``1/k, 2/k, … (k-1)/k`` of an epoch (unless an
    evaluation at that step updates the whole head)."""

    def __init__(self, trainer: "SOLTrainer") -> None:
        self.trainer = trainer
        self.epoch_before_step = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.epoch_before_step = state.epoch or 0.0

    def on_step_end(self, args, state, control, **kwargs):
        updates = self.trainer.centroid_updates_per_epoch
        if updates == 1 or control.should_evaluate:
            return
        # the number of 1/k-epoch marks passed before and after this step (a small slack for the
        # rounding of state.epoch, epoch + steps / steps_in_epoch)
        before = math.floor(self.epoch_before_step * updates + 1e-6)
        after = math.floor((state.epoch or 0.0) * updates + 1e-6)
        if after > before and after % updates != 0:  # a whole epoch's mark is on_epoch_end's
            self.trainer.update_head(centroids_only=True)

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

    Args:
        centroid_updates_per_epoch: how many times every epoch updates the centroids, each time from
            the whole training set embedded in eval mode by the damped centroid rule: ``1``, at the
            epoch's end only (with the read-out); ``k > 1``, also after each ``1/k`` of the epoch (the
            centroids only; each costs one pass over the training set without gradients). Default 1.

    Attributes:
        head_step: the training step (``state.global_step``) at which the head was last updated.
    """

    def __init__(self, *args: Any, centroid_updates_per_epoch: int = 1, **kwargs: Any) -> None:
        if isinstance(centroid_updates_per_epoch, bool) or not isinstance(centroid_updates_per_epoch, int) \
                or centroid_updates_per_epoch < 1:
            raise ValueError(f"centroid_updates_per_epoch must be a whole number of updates, at least 1 (the "
                             f"end of the epoch), got {centroid_updates_per_epoch!r}")
        self.centroid_updates_per_epoch = centroid_updates_per_epoch
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, SOLTextModel):
            raise TypeError(f"SOLTrainer's model must be a sol_ext.hf.SOLTextModel, got "
                            f"{type(self.model).__name__}; wrap the encoder: SOLTextModel(encoder, num_ranks)")
        if self.compute_metrics is None:
            self.compute_metrics = rank_metrics(self.model.head.num_ranks, self.model.head, self.model.to_ranks)
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
        labels = self.sol_model.to_ranks(_training_labels(inputs, "train"))
        outputs = model(**inputs)  # through the data-parallel wrapper: it averages the gradients
        h = outputs["embeddings"]
        labels = labels.to(h.device)
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
            loss = (head.loss(h, sol.to_ranks(labels, "evaluation labels").to(h.device)).detach()
                    if labels is not None else None)
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
        grid = self.sol_model.label_values.numpy()
        result.labels = result.ranks if self.sol_model.config.label_values is None else grid[result.ranks]
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
                ranks.append(sol.to_ranks(_training_labels(batch, "train")).to(device))
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


def _training_labels(batch: dict[str, Any], what: str) -> Any:
    """The ``labels`` of a training batch, taken out of it; refused by name where the rows have none."""
    if "labels" not in batch:
        raise ValueError(f"SOLTrainer.{what}: the training rows have no 'labels' (they hold "
                         f"{', '.join(sorted(batch)) or 'nothing'}); give every row its rank (0 … n-1, or a "
                         f"value of label_values) as 'labels', e.g. dataset.rename_column('rating', 'labels')")
    return batch.pop("labels")
