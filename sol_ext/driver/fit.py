"""One training run of SOL (paper Algorithm 1) or of a baseline, with checkpoints: a :class:`Fit`.

The entry point is :func:`sol_ext.driver.train.train`, which checks the settings, plans the fits
(one per sigma candidate where sigma is ``"auto"``, :class:`sol_ext.driver.train.SigmaSearch`) and
trains each, epoch by epoch; :func:`train_run` trains one whole fit.

Per epoch:
1. train the encoder on shuffled batches of the current labels, with the centroids fixed;
2. (SOL) the head's own end-of-epoch update (:meth:`sol_ext.SOLHead.update`): the centroid rule
   over the whole training set (eval mode, no gradient), damped with the previous centroids
   (``momentum``; 0 is the paper's wholesale replacement), then its read-out fitted;
3. read out ranks (the expected rank against cuts fitted to the training labels by default, the
   posterior median with ``readout="posterior"``, eq. 6 with ``readout="nearest"``) and
   (SOL) relabel training labels: by the posterior rule from the given labels (default; its
   corrected labels are the run's output, and the encoder keeps training on the given labels),
   or by the paper's outlier rule, whose relabels are trained on and accumulate;
4. score the validation split (drawn, stratified, from the noisy training data) against its own
   noisy labels; the best epoch so far is the model (``best.pt``); evaluate on the test set
   against clean labels (reported, never used for any choice); save a checkpoint.

The centroids are also computed once before the first epoch. With ``val_fraction=0`` (the
paper) there is no split and the last epoch is the model.

Under ``torchrun`` (:class:`sol_ext.driver.parallel.Parallel`) each of the ``W`` processes trains on its
share of every global batch of ``W * batch_size`` samples through ``DistributedDataParallel`` and
:class:`sol_ext.distributed.DistributedStochasticOrderLoss`, so a step is that of one process on the
global batch. Whole-training-set passes are split the same way, by the library's own helpers: each
process embeds its :func:`sol_ext.distributed.shard` (gathered by
:func:`~sol_ext.distributed.gather_all`), and :func:`sol_ext.distributed.update_head` runs
``SOLHead.update`` over the shards (the centroid rule all-reduces the per-label sums and counts, the
read-out is fitted on the gathered embeddings); rank 0's labels and model-selection decisions are
broadcast, so every process holds the same state after every epoch. Rank 0 alone logs and writes
checkpoints.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from .. import distributed
from ..centroids import centroid_span, embed
from ..distributed import DistributedStochasticOrderLoss
from ..head import SOLHead
from ..metrics import per_rank_mae, summarize
from ..readout import median_ranks, rank_posterior
from ..refine import (
    LabelNoiseFit,
    fit_label_noise,
    fit_through_label_noise,
    posterior_relabel,
    refine_labels,
)
from .checkpoint import (
    BEST_NAME,
    CHECKPOINT_NAME,
    CheckpointMismatch,
    EpochState,
    ResumePoint,
    load_checkpoint,
    predictor_record,
    resumable_state,
    save_checkpoint,
    selected_state,
)
from .config import WEIGHT_EMA_SHARE, TrainConfig
from .data import split_indices
from .device import resolve_device
from .loader import RunInputs, auto_workers, embedding_batch_size, training_transform
from .methods import RankModel, build_model, encoder_name, head_loss, head_ranks, make_sol_head
from .pairs import balanced_pairs, sample_references
from .parallel import Parallel
from .prepare import PreparedData
from .synthetic_noise import noise_statistics

__all__ = ["RunOutcome", "Fit", "FitContext", "train_run", "resolve_device", "cs_theta_of",
           "validation_split", "run_results", "WeightAverage"]


@dataclass
class RunOutcome:
    """What a finished run hands to reporting.

    Attributes:
        results: JSON-ready summary (configuration, final metrics, per-epoch history).
        test_embeddings: ``[M, d]`` final test embeddings (CPU).
        test_pred: ``[M]`` predicted test ranks.
        train_pred: ``[N]`` predicted training ranks (final model and centroids).
        labels: ``[N]`` the run's corrected training ranks: the posterior rule's corrections
            (the encoder trained on the given labels), or the outlier rule's relabeled labels.
        best_state: the selected epoch's state, what ``best.pt`` holds, for a run trained in
            memory (no output folder; :func:`sol_ext.driver.model.model_from_state` makes it a
            model); ``None`` for a run with a folder, which has it in ``best.pt``.
    """

    results: dict[str, Any]
    test_embeddings: torch.Tensor
    test_pred: torch.Tensor
    train_pred: torch.Tensor
    labels: torch.Tensor
    best_state: Optional[dict[str, Any]] = None


def cs_theta_of(config: TrainConfig, data: PreparedData) -> float:
    """CS threshold in label units: ``config.cs_theta`` or 2 rank steps."""
    return float(config.cs_theta) if config.cs_theta is not None else 2.0 * float(data.encoder.step)


def _label_stats(labels: torch.Tensor, clean: Optional[torch.Tensor]) -> Optional[dict[str, float]]:
    return None if clean is None else noise_statistics(labels, clean)


def _test_metrics(config: TrainConfig, data: PreparedData,
                  pred: torch.Tensor) -> Optional[dict[str, float]]:
    """Metrics against the clean test labels, in label units; ``None`` without a test set."""
    if pred.numel() == 0:
        return None
    decode = data.encoder.decode
    return summarize(decode(pred.cpu()), decode(data.test_ranks), cs_theta_of(config, data))


class _Progress:
    """A tqdm bar over the batches of an epoch, or nothing when ``enabled`` is False."""

    def __init__(self, enabled: bool, total: int, desc: str):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)

    def update(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class WeightAverage:
    """An exponential moving average of a model's weights over the training steps (``weight_ema``).

    ``model`` is a copy of the trained model. After ``t`` calls of :meth:`update` its parameters and
    floating-point buffers are ``sum_{s <= t} (1 - d) d^(t-s) w_s / (1 - d^t)`` for the trained
    weights ``w_s`` after step ``s`` and ``d = decay``: the average with Adam's bias correction, so
    the first epochs are averages of what has been trained, not pulled towards the initial weights
    (on small data sets an epoch has few steps: 18 on wine-red, where ``0.99^18 = 0.83`` of an
    uncorrected average would still be the initialization after the first epoch). Other buffers,
    such as batch norm's step count, are copied. Every process of a torchrun run holds the same
    trained weights after each step (DDP), hence the same average.

    With ``share`` instead of ``decay`` (``weight_ema="auto"``) the decay of step ``t`` is
    ``1 - 1 / max(share * t, 1)``: the average spans about the last ``share`` of the steps so far,
    so it follows a network that still learns fast early on and averages longer as training
    settles, whatever the data set's size and the run's length. It depends on the step alone, so
    a resumed run continues the average an unbroken run would have.
    """

    def __init__(self, model: torch.nn.Module, decay: Optional[float] = None, steps: int = 0,
                 share: Optional[float] = None):
        if (decay is None) == (share is None):
            raise ValueError("WeightAverage takes a decay or a share, not both or neither.")
        if decay is not None and not 0.0 < decay < 1.0:
            raise ValueError(f"weight_ema must be in (0, 1) for an average, got {decay}.")
        if share is not None and not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}.")
        self.decay = None if decay is None else float(decay)
        self.share = None if share is None else float(share)
        self.steps = int(steps)  # updates so far (saved in checkpoint.pt for a resumed run)
        self.model = copy.deepcopy(model)
        self.model.requires_grad_(False)

    def _keep(self) -> float:
        """The weight of step ``self.steps`` on the previous average."""
        t = self.steps
        if self.share is not None:
            return 1.0 - 1.0 / max(self.share * t, 1.0)
        d = self.decay
        # the bias-corrected average's: d (1 - d^(t-1)) / (1 - d^t)
        return d * (1.0 - d ** (t - 1)) / (1.0 - d ** t)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.steps += 1
        keep = self._keep()
        for mine, theirs in zip(self.model.parameters(), model.parameters()):
            mine.lerp_(theirs.detach(), 1.0 - keep)
        for mine, theirs in zip(self.model.buffers(), model.buffers()):
            if mine.is_floating_point():
                mine.lerp_(theirs.detach(), 1.0 - keep)
            else:
                mine.copy_(theirs)


def _weight_average(config: TrainConfig, model: torch.nn.Module) -> Optional[WeightAverage]:
    """The moving average of ``config.weight_ema`` over ``model``'s weights, or None for none."""
    if config.weight_ema == "auto":
        return WeightAverage(model, share=WEIGHT_EMA_SHARE) if config.uses_centroids else None
    return WeightAverage(model, decay=config.weight_ema) if config.weight_ema > 0 else None


def _batches(n: int, batch_size: int, generator: torch.Generator,
             smallest: int = 2) -> list[torch.Tensor]:
    """Shuffled index batches; a last batch of fewer than ``smallest`` samples is dropped (one
    sample has no pair, and batch norm cannot train on it)."""
    perm = torch.randperm(n, generator=generator)
    out = list(perm.split(batch_size))
    if len(out) > 1 and out[-1].numel() < smallest:
        out.pop()
    return out


@dataclass
class _Split:
    """Row numbers of the training data the encoder fits (``fit``) and of the validation split."""

    fit: torch.Tensor
    val: Optional[torch.Tensor]


def validation_split(given: torch.Tensor, fraction: float, seed: int) -> _Split:
    """A split of the training rows, stratified by their (noisy) given ranks; ``fraction`` 0:
    every row is fitted and there is no validation split."""
    if fraction <= 0:
        return _Split(fit=torch.arange(given.numel()), val=None)
    fit, val = split_indices(given.cpu(), test_fraction=fraction, seed=seed + 7919)
    return _Split(fit=fit, val=val)


@dataclass
class _Readout:
    """What one epoch's model says about every sample (ranks in ``0 … n-1``)."""

    fit_pred: torch.Tensor
    val_pred: Optional[torch.Tensor]
    test_pred: torch.Tensor
    test_h: torch.Tensor
    fit_probabilities: Optional[torch.Tensor]   # [N_fit, n] p(q|x) when a posterior is fitted
    val_probabilities: Optional[torch.Tensor]
    # the posterior relabeling rule's noise model (estimated or given) and p(q|x) of the true
    # rank fitted through it
    noise: Optional[LabelNoiseFit] = None
    fit_rank_probabilities: Optional[torch.Tensor] = None
    val_rank_probabilities: Optional[torch.Tensor] = None


def _sol_readout(config: TrainConfig, head: SOLHead, fit_h: torch.Tensor, fit_labels: torch.Tensor,
                 val: Optional[tuple[torch.Tensor, torch.Tensor]], test_h: torch.Tensor) -> _Readout:
    """The end of an epoch of the SOL methods: the head's own update (centroid rule, then the
    read-out, :meth:`sol_ext.SOLHead.update`; :func:`sol_ext.distributed.update_head` under
    torchrun), then its rank read-out of every sample: the expected rank against cuts (default),
    the posterior median, or eq. 6. ``val``: the validation split's embeddings and labels."""
    n = head.num_ranks
    val_h, val_labels = (None, None) if val is None else val
    # The temperature is fitted on held-out samples when there are any: on the samples the
    # encoder was fitted to, the posterior comes out over-confident. The prior is the rank
    # frequency of the training labels; the cuts are fitted on the training split, never the
    # validation's. Under torchrun each process passes its shard, and the update gathers them.
    fit_part = distributed.shard(fit_h.shape[0])
    val_part = None if val_h is None else distributed.shard(val_h.shape[0])
    distributed.update_head(head, fit_h[fit_part], fit_labels[fit_part],
                            None if val_h is None else val_h[val_part],
                            None if val_h is None else val_labels[val_part])
    d_fit = head.dissimilarity(fit_h)
    d_val = None if val_h is None else head.dissimilarity(val_h)
    d_test = head.dissimilarity(test_h)
    p_fit = head.probabilities(d_fit)
    p_val = None if d_val is None else head.probabilities(d_val)
    probabilities = dict(fit_probabilities=p_fit, val_probabilities=p_val)
    if config.refines and config.relabel == "posterior":
        # The read-out's posterior describes the noisy label; as the prior of the true rank it
        # would count the noise twice. Relabeling uses one fitted through the noise model.
        on_d, on_labels = (d_fit, fit_labels) if d_val is None else (d_val, val_labels)
        noise = _label_noise_fit(config, on_d, on_labels, n, fit_labels)
        probabilities.update(
            noise=noise, fit_rank_probabilities=rank_posterior(d_fit, noise.posterior),
            val_rank_probabilities=None if d_val is None else rank_posterior(d_val, noise.posterior))
    # the head's read-out (config.readout): posterior median, eq. 6, or cuts
    return _Readout(fit_pred=head.ranks(d_fit, p_fit),
                    val_pred=None if d_val is None else head.ranks(d_val, p_val),
                    test_pred=head.ranks(d_test), test_h=test_h, **probabilities)


def _label_noise_fit(config: TrainConfig, d: torch.Tensor, labels: torch.Tensor, n: int,
                     prior_labels: torch.Tensor) -> LabelNoiseFit:
    """The relabeling rule's noise model: estimated (``label_noise="auto"``) or the given std."""
    if config.label_noise == "auto":
        return fit_label_noise(d, labels, n, prior_labels=prior_labels)
    return fit_through_label_noise(d, labels, n, float(config.label_noise), prior_labels)


def _relabel(config: TrainConfig, given: torch.Tensor, probabilities: torch.Tensor,
             noise: LabelNoiseFit):
    """The posterior rule on ``given``: a given noise std moves every label to its posterior
    median (the estimate of least expected absolute error); an estimated one only where
    ``relabel_mass`` of the posterior lies on one side of the label."""
    mass = config.relabel_mass if config.label_noise == "auto" else 0.5
    return posterior_relabel(given, probabilities, noise.kernel, mass)


def _head_readout(config: TrainConfig, model: RankModel, n: int, fit_h: torch.Tensor,
                  val_h: Optional[torch.Tensor], test_h: torch.Tensor) -> _Readout:
    """Predictions of the baselines with an output head (l1, ce, corn)."""

    def pred(h: torch.Tensor) -> torch.Tensor:
        return head_ranks(config.method, model, h, n)

    return _Readout(fit_pred=pred(fit_h), val_pred=None if val_h is None else pred(val_h),
                    test_pred=pred(test_h), test_h=test_h, fit_probabilities=None,
                    val_probabilities=None)


def _rank_mae(pred: torch.Tensor, labels: torch.Tensor) -> float:
    return float((pred.long().cpu() - labels.long().cpu()).abs().double().mean())


def _embed_all(model: RankModel, inputs: RunInputs, batch_size: int, device: torch.device,
               par: Parallel) -> torch.Tensor:
    """Embeddings of every row of ``inputs``: each process embeds its shard, then the shards are
    gathered, so every process holds the same ``[N, d]``."""
    count = len(inputs)
    if count == 0:  # no test set: [0, d] (the width from one zero input)
        return embed(model, torch.zeros(1, *inputs.sample_shape), batch_size, device)[:0]
    if not par.enabled:
        return inputs.embed(model, batch_size)
    shard = distributed.shard(count)
    size = shard.stop - shard.start
    # an empty shard (fewer rows than processes) still needs the width d for the gather
    local = inputs.embed(model, batch_size, shard if size else slice(0, 1))[:size]
    return distributed.gather_all(local)


def _run_inputs(config: TrainConfig, data: PreparedData, split: _Split, device: torch.device,
                par: Parallel, progress: bool = False) -> tuple[RunInputs, Optional[RunInputs], RunInputs]:
    """The fitted rows (augmented, for images), the validation split and the test set; with
    ``progress``, the passes that decode image files show a bar."""
    transform = None
    if data.kind == "images":
        transform = training_transform(config.augmentation(data.kind), data.input_shape[1:])
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", par.world_size)) if par.enabled else 1
    workers = auto_workers(per_machine) if config.workers is None else config.workers

    def part(features, what: str, augment=None) -> RunInputs:
        bar = f"embedding the {what}" if progress and par.is_main else ""
        return RunInputs(features, device, augment, workers, progress=bar)

    return (part(data.train_x[split.fit], "training images", transform),
            None if split.val is None else part(data.train_x[split.val], "validation images"),
            part(data.test_x, "test images"))


def _state_digest(labels: torch.Tensor, centroids: Optional[torch.Tensor]) -> torch.Tensor:
    """A few float64 numbers that change with any label or centroid value (position-weighted sums)."""
    weights = torch.arange(1, labels.numel() + 1, dtype=torch.float64, device=labels.device)
    digest = [labels.double().sum(), (labels.double() * weights).sum()]
    if centroids is not None:
        c = centroids.detach().double().flatten()
        digest += [c.sum(), (c * torch.arange(1, c.numel() + 1, dtype=torch.float64, device=c.device)).sum()]
    return torch.stack(digest)


def _check_same_state(par: Parallel, epoch: int, labels: torch.Tensor,
                      centroids: Optional[torch.Tensor]) -> None:
    """Every process must hold rank 0's labels and centroids after an epoch (broadcast and
    all-reduced, so equal by construction); a difference would let the processes drift apart
    silently, so it stops the run."""
    if not par.enabled:
        return
    mine = _state_digest(labels, centroids)
    theirs = par.broadcast(mine.clone())
    if not torch.equal(mine, theirs):
        raise RuntimeError(f"process {par.rank} holds other labels or centroids than rank 0 after "
                           f"epoch {epoch}; the data-parallel run is out of step.")


@dataclass
class FitContext:
    """How a fit runs beside its settings: its place in a torchrun run (default one process), where
    its per-epoch lines go, whether it shows a progress bar per epoch, and what the run's checks
    already worked out (:func:`sol_ext.driver.train.check_run`): the device and the validation
    split, handed down so that no fit works them out again (``None``: the fit does)."""

    parallel: Optional[Parallel] = None
    log: Callable[[str], None] = print
    progress: bool = False
    device: Optional[torch.device] = None
    split: Optional[_Split] = None


class Fit:
    """One training run of ``config.method`` on ``data`` (Algorithm 1 for SOL), an epoch at a time::

        fit = Fit(config, data, out_dir)
        fit.start(resume=False)
        for epoch in fit.epochs():
            fit.end_of_epoch(epoch, fit.train_one_epoch(epoch))
        outcome = fit.outcome()

    It checkpoints to ``out_dir/checkpoint.pt`` every epoch and the best epoch so far to
    ``out_dir/best.pt``; with ``out_dir=None`` nothing is written and the outcome holds the selected
    epoch's state. ``config`` is the run's configuration as given (saved in the checkpoints); with
    ``sigma="auto"``, ``sigma_choice`` (``{"sigma": value, "val_mae": ...}``) says which sigma the
    run trains with. :func:`sol_ext.driver.train.train` checks the settings and picks sigma first.
    """

    def __init__(self, config: TrainConfig, data: PreparedData, out_dir: Optional[Path],
                 sigma_choice: Optional[dict[str, Any]] = None, context: Optional[FitContext] = None):
        context = context or FitContext()
        self.config, self.data, self.out_dir, self.sigma_choice = config, data, out_dir, sigma_choice
        self.run_config = (config if sigma_choice is None
                           else dataclasses.replace(config, sigma=sigma_choice["sigma"]))
        self.par = context.parallel or Parallel()
        self.log, self.progress = context.log, context.progress
        self.context = context
        self.in_memory = out_dir is None

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        """The split, the inputs, the model, optimizer and head, and the epoch-0 state."""
        config, data, par = self.config, self.data, self.par
        known = self.context  # the run's device and split, where its checks worked them out
        self.device = resolve_device(config.device, par) if known.device is None else known.device
        if par.is_main and not self.in_memory:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.eval_bs = embedding_batch_size(data.kind, config.batch_size)
        self.started = time.perf_counter()
        self.split = (validation_split(data.train_given, config.val_fraction, config.seed)
                      if known.split is None else known.split)
        self.fit_x, self.val_x, self.test_x = _run_inputs(config, data, self.split, self.device, par,
                                                          self.progress)
        self.given = data.train_given[self.split.fit].to(self.device)
        self.clean = None if data.train_clean is None else data.train_clean[self.split.fit]
        self.val_labels = (None if self.split.val is None
                           else data.train_given[self.split.val].to(self.device))
        torch.manual_seed(config.seed)
        self.gen = torch.Generator().manual_seed(config.seed + 1)  # shuffling and pair sampling
        (self.model, self.step_model, self.optimizer, self.head, self.sol_loss,
         self.scaler) = _learner(self.run_config, data, self.device, par)
        # the weights every pass over the data uses (embedding, centroids, read-out, checkpoints'
        # "model"): the trained ones, or their moving average (weight_ema)
        self.averaged = _weight_average(config, self.model)
        self.eval_model = self.model if self.averaged is None else self.averaged.model
        self.fingerprint = data.fingerprint()
        self.history: list[dict[str, Any]] = []
        self.labels = self.given.clone()
        self.first_epoch, self.elapsed_before = 1, 0.0
        self.best: Optional[dict[str, Any]] = None

    def resume(self) -> None:
        """Continue from ``out_dir/checkpoint.pt`` (checked against the configuration and data)."""
        if self.in_memory:
            raise ValueError("a run trained in memory (no output folder) has no checkpoint to resume.")
        par, ckpt_path = self.par, self.out_dir / CHECKPOINT_NAME
        state = par.broadcast_object(load_checkpoint(ckpt_path, self.config, self.fingerprint)
                                     if par.is_main else None)
        _check_same_world(state, par, ckpt_path)
        # with weight_ema, "model" holds the averaged weights and "trained_model" the trained ones
        self.model.load_state_dict(state.get("trained_model", state["model"]))
        if self.averaged is not None:
            self.averaged.model.load_state_dict(state["model"])
            self.averaged.steps = int(state["weight_ema_steps"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.head is not None:
            self.head.load_state_dict(state["head"])
        self.labels = state["labels"].to(self.device)
        self.history = state["history"]
        self.first_epoch = state["epoch"] + 1
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        self.sigma_choice = state.get("sigma_choice", self.sigma_choice)
        torch.set_rng_state(state["torch_rng"])
        self.gen.set_state(state["generator_rng"])
        self.best = par.broadcast_object(load_checkpoint(self.out_dir / BEST_NAME) if par.is_main else None)
        self.log(f"resuming {self.out_dir} after epoch {state['epoch']}")

    def start(self, resume: bool = False) -> None:
        """:meth:`setup`, then :meth:`resume`, or (SOL) the centroids of the untrained encoder."""
        self.setup()
        if resume:
            self.resume()
        elif self.head is not None:
            _centroid_rule(self.head, self._embed(self.fit_x), self.labels)

    def epochs(self) -> Iterator[int]:
        """The epochs still to train; ``patience`` epochs without a better one end them early."""
        for epoch in range(self.first_epoch, self.config.epochs + 1):
            if self.best is not None and self.config.patience is not None \
                    and epoch - 1 - self.best["epoch"] >= self.config.patience:
                return  # also a resumed run that had already stopped early
            yield epoch

    def _embed(self, inputs: RunInputs) -> torch.Tensor:
        return _embed_all(self.eval_model, inputs, self.eval_bs, self.device, self.par)

    # -- an epoch ------------------------------------------------------------------------------
    def _batch_plan(self) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """``(rows of this process's share, rows with the references, global batch size)`` of each
        step of an epoch, drawn from the shuffling generator (and, with ``--pairs balanced``, the
        reference samples)."""
        config, labels, world = self.run_config, self.labels, self.par.world_size
        plan = []
        for idx in _batches(labels.numel(), config.batch_size * world, self.gen, smallest=2 * world):
            global_count = idx.numel()
            if self.par.enabled:
                idx = idx[distributed.shard(global_count)]
            rows = idx
            if config.pairs == "balanced":
                ref = sample_references(labels[idx.to(labels.device)], labels, config.tau, self.gen).cpu()
                rows = torch.cat([idx, ref])
            plan.append((idx, rows, global_count))
        return plan

    def train_one_epoch(self, epoch: int) -> float:
        """One pass over shuffled batches of the current labels with the centroids fixed; returns
        the mean batch loss. With ``amp`` the forward passes run under autocast (float16 with loss
        scaling on CUDA, bfloat16 on the CPU); the loss computes in float32 either way.

        Under torchrun, batches are global batches of ``W * batch_size`` samples drawn as one
        process would draw them, each process taking its contiguous share through DDP; a last
        global batch of fewer than ``2 W`` samples is dropped, so no process steps on fewer than
        two. With ``weight_ema``, the moving average follows every step."""
        self._epoch_started = time.perf_counter()
        config, par, labels, model = self.run_config, self.par, self.labels, self.model
        model.train()
        device = labels.device
        amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        centroids = None if self.head is None else self.head.centroids
        plan = self._batch_plan()
        inputs = self.fit_x.training_batches([rows for _, rows, _ in plan], self.gen)
        bar = _Progress(self.progress, len(plan), f"epoch {epoch}/{config.epochs}")
        total = 0.0
        for (idx, rows, global_count), x in zip(plan, inputs):
            y, pairs = labels[rows.to(device)], None
            if config.pairs == "balanced":
                pairs = balanced_pairs(y, config.tau, config.pairs_per_class, self.gen)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=config.amp):
                out = self.step_model(x)
                if not bool(torch.isfinite(out).all()):  # weights blown up by the previous step
                    raise FloatingPointError(_diverged(config, epoch, "the network's outputs"))
                loss = (head_loss(config.method, model, out, y, self.data.num_ranks)
                        if self.sol_loss is None else self.sol_loss(out, y, centroids, pairs=pairs))
            value = self._step(loss, idx.numel() / global_count, epoch)
            total += float(value)
            bar.update(float(loss.detach()))  # the bar shows this process's batch loss
        bar.close()
        if par.enabled and self.sol_loss is None:
            total = float(distributed.all_reduce_sum()(torch.tensor([total], dtype=torch.float64,
                                                                    device=device)))
        # the last step may have blown up the weights: say so here, not as NaN centroids or metrics
        if not bool(torch.stack([p.isfinite().all() for p in model.parameters()]).all()):
            raise FloatingPointError(_diverged(config, epoch, "the weights"))
        return total / max(len(plan), 1)

    def _step(self, loss: torch.Tensor, share: float, epoch: int) -> torch.Tensor:
        """One optimizer step on ``loss``; returns the value the epoch's mean adds up."""
        value = loss.detach()
        if self.par.enabled and self.sol_loss is None:
            # a head's loss is the mean over this process's samples: weighted so that DDP's
            # average over the processes is the mean over the global batch; the logged value is
            # this process's share of that mean, summed over the processes once per epoch
            value = value.float() * share
            loss = loss * (share * self.par.world_size)
        if not torch.isfinite(value):
            raise FloatingPointError(_diverged(self.run_config, epoch, f"the loss ({float(value)})"))
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:  # float16: scale the loss so small gradients do not flush to 0
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        if self.averaged is not None:
            self.averaged.update(self.model)
        return value

    def end_of_epoch(self, epoch: int, loss: float) -> None:
        """After the steps: the head's update and the read-out, relabeling, :meth:`evaluate` and
        :meth:`save`."""
        steps_done = time.perf_counter()
        record: dict[str, Any] = {"epoch": epoch, "train_loss": loss}
        out = self._read_out(record)
        corrected, suggestion = self._relabel(record, out)
        record["labels_after"] = _label_stats(corrected.cpu(), self.clean)
        self.evaluate(record, out, steps_done)
        self.save(epoch, record, out, (corrected, suggestion))

    def _read_out(self, record: dict[str, Any]) -> _Readout:
        """2. the head's update (centroid rule, read-out); 3. the read-out of every sample."""
        fit_h = self._embed(self.fit_x)
        val_h = None if self.val_x is None else self._embed(self.val_x)
        test_h = self._embed(self.test_x)
        config, n = self.run_config, self.data.num_ranks
        if self.head is not None:
            out = _sol_readout(config, self.head, fit_h, self.labels,
                               None if val_h is None else (val_h, self.val_labels), test_h)
            record["centroid_span"] = centroid_span(self.head.centroids)
        else:
            out = _head_readout(config, self.eval_model, n, fit_h, val_h, test_h)
        record["train_mae_vs_labels"] = _rank_mae(out.fit_pred, self.labels)
        record["labels_before"] = _label_stats(self.labels.cpu(), self.clean)
        return out

    def _relabel(self, record: dict[str, Any], out: _Readout):
        """The relabeling rule of the run; returns the corrected labels and the posterior rule's
        suggestion (``None`` for the other rules). Every process ends with rank 0's labels."""
        config, par = self.config, self.par
        suggestion = None
        if config.refines and config.relabel == "posterior":
            suggestion = _relabel(config, self.given, out.fit_rank_probabilities, out.noise)
            # The corrected labels are the run's output; the encoder keeps training on the given
            # ones. Trained on, corrections would teach it its own predictions (abalone, kappa 1,
            # told the noise: test MAE 1.53 -> 1.66 while the label MAE fell 2.51 -> 1.63).
            corrected = suggestion.labels
            record.update(outliers=suggestion.num_relabeled, relabeled=suggestion.num_relabeled,
                          step=0.0, label_noise_std=out.noise.std)
        elif config.refines:
            ref = refine_labels(self.labels, out.fit_pred, self.data.num_ranks, config.beta,
                                floor_step=config.convention == "official")
            self.labels = ref.labels
            record.update(outliers=ref.num_outliers, relabeled=ref.num_relabeled, step=ref.step)
        else:
            record.update(outliers=0, relabeled=0, step=0.0)
        self.labels = par.broadcast(self.labels.contiguous())  # every process trains on rank 0's labels
        corrected = self.labels if suggestion is None else par.broadcast(corrected.contiguous())
        _check_same_state(par, record["epoch"], corrected,
                          None if self.head is None else self.head.centroids)
        return corrected, suggestion

    def evaluate(self, record: dict[str, Any], out: _Readout, steps_done: float) -> None:
        """4. the validation MAE (model selection) and the test metrics (reported only); the
        epoch's record joins the history and its line is logged."""
        record["val_mae"] = None if out.val_pred is None else _rank_mae(out.val_pred, self.val_labels)
        record["test"] = _test_metrics(self.config, self.data, out.test_pred)
        # the training steps, and the passes over every sample that follow them (embedding,
        # centroid rule, read-out, relabeling, validation and test)
        record["seconds"] = {"steps": steps_done - self._epoch_started,
                             "end_of_epoch": time.perf_counter() - steps_done}
        self.history.append(record)
        self.log(_epoch_line(record, self.config.epochs))

    def save(self, epoch: int, record: dict[str, Any], out: _Readout, relabeled) -> None:
        """The best epoch so far (``best.pt``, or kept in memory) and the checkpoint."""
        config, data, par, split = self.config, self.data, self.par, self.split
        corrected, suggestion = relabeled
        improved = par.agree(self.best is None or record["val_mae"] is None
                             or record["val_mae"] < self.best["val_mae"], self.device)
        snapshot = EpochState.of_epoch(
            config, self.eval_model, self.head, fingerprint=self.fingerprint, epoch=epoch,
            world_size=par.world_size, predictor=predictor_record(self.run_config, data),
            labels=self.labels, corrected_labels=corrected, given_labels=self.given,
            clean_labels=self.clean, train_rows=_rows(data, split.fit),
            val_rows=None if split.val is None else _rows(data, split.val), train_pred=out.fit_pred,
            test_pred=out.test_pred, val_mae=record["val_mae"], sigma_choice=self.sigma_choice,
            label_noise_std=record.get("label_noise_std")).to_dict()
        if improved:
            self.best = selected_state(snapshot, test_embeddings=out.test_h,
                                       audit=_audit_arrays(config, data, split, out, suggestion))
            if self.in_memory:  # the state holds the live weights: keep the selected epoch's
                self.best = _copied(self.best)
            elif par.is_main:
                save_checkpoint(self.out_dir / BEST_NAME, self.best)
        if par.is_main and not self.in_memory:
            averaged = self.averaged
            save_checkpoint(self.out_dir / CHECKPOINT_NAME, resumable_state(snapshot, ResumePoint(
                self.optimizer, self.gen, self.history, self.best["epoch"],
                self.elapsed_before + time.perf_counter() - self.started,
                trained_model=None if averaged is None else self.model,
                averaged_steps=None if averaged is None else averaged.steps)))

    def outcome(self) -> RunOutcome:
        """The selected epoch's outcome (the best validation MAE, or the last epoch)."""
        best = self.best
        results = run_results(self.config, self.data, self.history, best, self.sigma_choice,
                              self.elapsed_before + time.perf_counter() - self.started)
        return RunOutcome(results=results, test_embeddings=best["test_embeddings"],
                          test_pred=best["test_pred"], train_pred=best["train_pred"],
                          labels=corrected_labels(best), best_state=best if self.in_memory else None)


def train_run(config: TrainConfig, data: PreparedData, out_dir: Optional[Path], resume: bool = False,
              sigma_choice: Optional[dict[str, Any]] = None,
              context: Optional[FitContext] = None) -> RunOutcome:
    """A whole :class:`Fit`: every epoch of one training run (see there)."""
    fit = Fit(config, data, out_dir, sigma_choice, context)
    fit.start(resume)
    for epoch in fit.epochs():
        fit.end_of_epoch(epoch, fit.train_one_epoch(epoch))
    return fit.outcome()


def _copied(value: Any) -> Any:
    """``value`` with every tensor in it (nested dicts and lists) cloned."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(v) for v in value)
    return value


def _learner(config: TrainConfig, data: PreparedData, device: torch.device, par: Parallel):
    """The model (encoder and the baselines' output head), the module its training steps run
    through (DDP under torchrun), the optimizer, the SOL head with its loss (``None`` for the
    baselines), and the float16 loss scaler of ``--amp`` on CUDA (else ``None``)."""
    model = build_model(config, data.input_shape, data.kind, data.num_ranks)
    if par.enabled and device.type == "cuda":  # batch statistics over the global batch
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    # the training steps run through DDP (gradients averaged over the processes); embedding and
    # read-out use the module itself, whose parameters DDP keeps equal on every process
    step_model = (DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                          else None) if par.enabled else model)
    weight_decay = config.weight_decay_for(data.num_ranks, encoder_name(config, data.kind))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=weight_decay)
    # SOL's centroids, loss and read-out (sol_ext.SOLHead); the baselines' heads are in the model
    head = make_sol_head(config, data.num_ranks).to(device) if config.uses_centroids else None
    sol_loss = None if head is None else head.criterion
    if sol_loss is not None and par.enabled:
        sol_loss = DistributedStochasticOrderLoss(sol_loss)
    # float16 autocast on CUDA needs loss scaling; bfloat16 (the CPU's autocast type) does not
    scaler = torch.amp.GradScaler("cuda") if config.amp and device.type == "cuda" else None
    return model, step_model, optimizer, head, sol_loss, scaler


def _check_same_world(state: dict[str, Any], par: Parallel, ckpt_path: Path) -> None:
    """A run resumes with the number of processes it was written with: another would change the
    global batch."""
    saved_world = int(state.get("world_size", 1))
    if saved_world != par.world_size:
        raise CheckpointMismatch(
            f"checkpoint {str(ckpt_path)!r} was written by a run of {saved_world} process(es) and "
            f"this one has {par.world_size}: the global batch would change. Resume with "
            + ("torchrun --nproc-per-node (or --nnodes) giving " if saved_world > 1 else "")
            + f"{saved_world} process(es), or choose another --output.")


def _centroid_rule(head: SOLHead, fit_h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The head's damped centroid rule (docs/math.md §8, §12) over the training set, before the
    first epoch; returns the new centroids ``[n, d]``. Under torchrun each process passes its
    shard (:func:`sol_ext.distributed.update_centroids` all-reduces the per-label sums)."""
    part = distributed.shard(fit_h.shape[0])
    return distributed.update_centroids(head, fit_h[part], labels[part].to(fit_h.device))


def _rows(data: PreparedData, index: torch.Tensor) -> torch.Tensor:
    """Row numbers in the data file of the training samples ``index``."""
    return (index if data.train_rows is None else data.train_rows[index]).cpu()


def _audit_arrays(config: TrainConfig, data: PreparedData, split: _Split, out: _Readout,
                  suggestion) -> Optional[dict[str, torch.Tensor]]:
    """Per-sample suggestions of the posterior relabeling rule over every training row (fitted
    and validation), for ``sol-ext audit``; ``None`` when the run does not use that rule."""
    if not (config.refines and config.relabel == "posterior"):
        return None
    parts = [(split.fit, out.fit_probabilities, suggestion)]
    if split.val is not None:
        val_given = data.train_given[split.val].to(out.val_probabilities.device)
        parts.append((split.val, out.val_probabilities,
                      _relabel(config, val_given, out.val_rank_probabilities, out.noise)))
    index = torch.cat([p[0] for p in parts])
    order = torch.argsort(index)

    def cat(get) -> torch.Tensor:
        return torch.cat([get(p).cpu() for p in parts])[order]

    return {"rows": _rows(data, index[order]),
            "given": data.train_given[index[order]].cpu(),
            "clean": None if data.train_clean is None else data.train_clean[index[order]].cpu(),
            "predicted": cat(lambda p: median_ranks(p[1])),
            "suggested": cat(lambda p: p[2].labels),
            "confidence": cat(lambda p: p[2].confidence).float(),
            "probabilities": cat(lambda p: p[1]).float()}


def _diverged(config: TrainConfig, epoch: int, what: str) -> str:
    return (f"training diverged in epoch {epoch}: {what} became NaN or infinite at learning "
            f"rate {config.lr:g}; lower --lr, or keep embeddings normalized (the default).")


def _epoch_line(r: dict[str, Any], epochs: int) -> str:
    t = r["test"]
    line = f"epoch {r['epoch']:>3}/{epochs}  loss {r['train_loss']:.4f}"
    if r.get("val_mae") is not None:
        line += f"  val MAE {r['val_mae']:.3f}"
    if t is not None:
        line += f"  test MAE {t['mae']:.3f}  CS {t['cs']:.1f}%"
    if r["relabeled"] or r["outliers"]:
        line += f"  relabeled {r['relabeled']}"
    if r["labels_after"] is not None:
        line += f"  label MAE {r['labels_before']['mae']:.3f}->{r['labels_after']['mae']:.3f}"
    return line


def corrected_labels(state: dict[str, Any]) -> torch.Tensor:
    """The run's corrected training labels: the posterior rule's corrections, or the labels
    trained on (the outlier rule's relabels; :func:`~sol_ext.driver.checkpoint.migrated` fills
    them in for checkpoints saved before they were kept apart)."""
    return state["corrected_labels"]


def run_results(config: TrainConfig, data: PreparedData, history: list[dict[str, Any]],
                best: dict[str, Any], sigma_choice: Optional[dict[str, Any]],
                seconds: float) -> dict[str, Any]:
    """``results.json`` of a run of ``config`` on ``data``: its settings, the selected epoch
    ``best`` (its state; the processes that trained it), its sigma choice, the per-epoch
    ``history`` and the time it took."""
    chosen = history[best["epoch"] - 1]
    enc = data.encoder
    given = best["given_labels"]
    clean = best["clean_labels"]
    return {
        "config": config.to_dict(),
        "world_size": int(best.get("world_size", 1)),
        "data": {"name": data.name, "kind": data.kind, "num_ranks": data.num_ranks,
                 "min_value": float(enc.min_value), "step": float(enc.step),
                 "n_train": int(given.numel()),
                 "n_val": 0 if best["val_rows"] is None else int(best["val_rows"].numel()),
                 "n_test": int(data.test_x.shape[0])},
        "cs_theta": cs_theta_of(config, data),
        "selected_epoch": best["epoch"],
        "epochs_run": len(history),
        "selection": "best validation MAE (noisy labels)" if config.selects_model else "last epoch",
        "val_mae": chosen["val_mae"],
        "sigma_selected": None if sigma_choice is None else sigma_choice["sigma"],
        "sigma_search": sigma_choice,
        "test": chosen["test"],
        # MAE of the test samples of each true label value (label units), at the selected epoch
        "test_per_rank_mae": {} if chosen["test"] is None else {f"{v:g}": e for v, e in per_rank_mae(
            data.encoder.decode(best["test_pred"]), data.encoder.decode(data.test_ranks)).items()},
        "relabeled_total": int(sum(r["relabeled"] for r in history)),
        "labels_changed": int((corrected_labels(best) != given).sum()),
        "label_noise_given": _label_stats(given, clean),
        "label_noise_final": _label_stats(corrected_labels(best), clean),
        "history": history,
        "seconds": seconds,
    }
