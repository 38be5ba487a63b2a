"""One training run of SOL (paper Algorithm 1) or of a baseline, with checkpoints: a :class:`Fit`.

The entry point is :func:`sol_ext.driver.train.train`, which checks the settings, plans the fits
(one per sigma candidate where sigma is ``"auto"``, :class:`sol_ext.driver.train.SigmaSearch`) and
trains each, epoch by epoch, in :func:`sol_ext.driver.train.fit_run`.

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
    RunState,
    SelectedEpoch,
    load_checkpoint,
    predictor_record,
    save_checkpoint,
)
from .config import TrainConfig
from .data import split_indices
from .loader import RunInputs, auto_workers, embedding_batch_size, training_transform
from .methods import RankModel, build_model, encoder_name, head_loss, head_ranks, make_sol_head
from .pairs import balanced_pairs, sample_references
from .parallel import Parallel
from .prepare import PreparedData
from .report import RunOutcome, epoch_line, label_stats, run_results, test_set_metrics
from .text import TEXT_ENCODER_DIR, encoder_parameters, save_text_encoder
from .weight_ema import weight_average

__all__ = ["Fit", "FitContext", "Split", "validation_split"]


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
class Split:
    """Row numbers of the training data the encoder fits (``fit``) and of the validation split."""

    fit: torch.Tensor
    val: Optional[torch.Tensor]


def validation_split(given: torch.Tensor, fraction: float, seed: int) -> Split:
    """A split of the training rows, stratified by their (noisy) given ranks; ``fraction`` 0:
    every row is fitted and there is no validation split."""
    if fraction <= 0:
        return Split(fit=torch.arange(given.numel()), val=None)
    fit, val = split_indices(given.cpu(), test_fraction=fraction, seed=seed + 7919)
    return Split(fit=fit, val=val)


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
    if count == 0:  # no test set: [0, d] (the width from one placeholder input)
        return embed(model, inputs.placeholder(), batch_size, device)[:0]
    if not par.enabled:
        return inputs.embed(model, batch_size)
    shard = distributed.shard(count)
    size = shard.stop - shard.start
    # an empty shard (fewer rows than processes) still needs the width d for the gather
    local = inputs.embed(model, batch_size, shard if size else slice(0, 1))[:size]
    return distributed.gather_all(local)


def _run_inputs(config: TrainConfig, data: PreparedData, split: Split, device: torch.device,
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

    noun = "texts" if data.kind == "text" else "images"
    return (part(data.train_x[split.fit], f"training {noun}", transform),
            None if split.val is None else part(data.train_x[split.val], f"validation {noun}"),
            part(data.test_x, f"test {noun}"))


@dataclass
class FitContext:
    """How the fits of a run run beside their settings, as :func:`sol_ext.driver.train.check_run`
    decided it once for all of them: the run's place in a torchrun run, where its per-epoch lines
    go, whether it shows a progress bar per epoch, its device and its validation split."""

    parallel: Parallel
    log: Callable[[str], None]
    progress: bool
    device: torch.device
    split: Split


class Fit:
    """One training run of ``config.method`` on ``data`` (Algorithm 1 for SOL), an epoch at a time::

        fit = Fit(config, data, out_dir, check_run(config, data, out_dir, False).context)
        fit.start(resume=False)
        for epoch in fit.epochs():
            fit.end_of_epoch(epoch, fit.train_one_epoch(epoch))
        outcome = fit.outcome()

    It checkpoints to ``out_dir/checkpoint.pt`` every epoch and the best epoch so far to
    ``out_dir/best.pt``; with ``out_dir=None`` nothing is written and the outcome holds the selected
    epoch's state. ``config.sigma`` is a number: where the run was asked for sigma ``"auto"``,
    ``sigma_choice`` (``{"sigma": value, "val_mae": ...}``) says how it was picked, and the files
    and results record the run as asked (:meth:`config_as_given`).
    :func:`sol_ext.driver.train.train` checks the settings and picks sigma first.
    """

    def __init__(self, config: TrainConfig, data: PreparedData, out_dir: Optional[Path],
                 context: FitContext, sigma_choice: Optional[dict[str, Any]] = None):
        if sigma_choice is not None and config.sigma != sigma_choice["sigma"]:
            raise ValueError(f"sigma={config.sigma!r} is not the picked sigma {sigma_choice['sigma']!r}: "
                             f"a fit trains with its sigma resolved.")
        self.config, self.data, self.out_dir, self.sigma_choice = config, data, out_dir, sigma_choice
        self.par, self.log, self.progress = context.parallel, context.log, context.progress
        self.device, self.split = context.device, context.split
        self.in_memory = out_dir is None

    def config_as_given(self) -> TrainConfig:
        """The run's configuration as it was asked for: sigma ``"auto"`` where a choice picked it
        (what the checkpoints and the results record, and what a resumed run is checked against)."""
        return self.config if self.sigma_choice is None else dataclasses.replace(self.config, sigma="auto")

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        """The inputs, the model, optimizer and head, and the epoch-0 state."""
        config, data, par, split = self.config, self.data, self.par, self.split
        if par.is_main and not self.in_memory:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.eval_bs = embedding_batch_size(data.kind, config.batch_size)
        self.started = time.perf_counter()
        self.fit_x, self.val_x, self.test_x = _run_inputs(config, data, split, self.device, par,
                                                          self.progress)
        self.given = data.train_given[split.fit].to(self.device)
        self.clean = None if data.train_clean is None else data.train_clean[split.fit]
        self.val_labels = None if split.val is None else data.train_given[split.val].to(self.device)
        torch.manual_seed(config.seed)
        self.gen = torch.Generator().manual_seed(config.seed + 1)  # shuffling and pair sampling
        (self.model, self.step_model, self.optimizer, self.head, self.sol_loss,
         self.scaler) = _learner(config, data, self.device, par)
        # the learning rates a text run's schedule scales (a resumed optimizer state holds scaled ones)
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        # the weights every pass over the data uses (embedding, centroids, read-out, checkpoints'
        # "model"): the trained ones, or their moving average (weight_ema)
        self.averaged = weight_average(config, self.model)
        self.eval_model = self.model if self.averaged is None else self.averaged.model
        self.fingerprint = data.fingerprint()
        self.history: list[dict[str, Any]] = []
        self.labels = self.given.clone()
        self.first_epoch, self.elapsed_before = 1, 0.0
        self.best: Optional[SelectedEpoch] = None

    def resume(self) -> None:
        """Continue from ``out_dir/checkpoint.pt`` (checked against the configuration and data)."""
        if self.in_memory:
            raise ValueError("a run trained in memory (no output folder) has no checkpoint to resume.")
        par, ckpt_path = self.par, self.out_dir / CHECKPOINT_NAME
        state = par.broadcast_object(load_checkpoint(ckpt_path, self.config_as_given(), self.fingerprint)
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
        self.elapsed_before = float(state["elapsed_s"])
        torch.set_rng_state(state["torch_rng"])
        self.gen.set_state(state["generator_rng"])
        best = par.broadcast_object(load_checkpoint(self.out_dir / BEST_NAME) if par.is_main else None)
        self.best = SelectedEpoch.from_dict(best)
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
                    and epoch - 1 - self.best.state.epoch >= self.config.patience:
                return  # also a resumed run that had already stopped early
            yield epoch

    def _embed(self, inputs: RunInputs) -> torch.Tensor:
        return _embed_all(self.eval_model, inputs, self.eval_bs, self.device, self.par)

    # -- an epoch ------------------------------------------------------------------------------
    def _batch_plan(self) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """``(rows of this process's share, rows with the references, global batch size)`` of each
        step of an epoch, drawn from the shuffling generator (and, with ``--pairs balanced``, the
        reference samples)."""
        config, labels, world = self.config, self.labels, self.par.world_size
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
        config, par, labels, model = self.config, self.par, self.labels, self.model
        model.train()
        device = labels.device
        amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        centroids = None if self.head is None else self.head.centroids
        plan = self._batch_plan()
        inputs = self.fit_x.training_batches([rows for _, rows, _ in plan], self.gen)
        bar = _Progress(self.progress, len(plan), f"epoch {epoch}/{config.epochs}")
        total = 0.0
        for step, ((idx, rows, global_count), x) in enumerate(zip(plan, inputs)):
            if self.data.kind == "text":
                self._schedule((epoch - 1) * len(plan) + step, config.epochs * len(plan))
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

    def _schedule(self, step: int, steps: int) -> None:
        """A text run's learning rates at training step ``step`` (from 0) of ``steps``: a linear rise
        from 0 over ``config.warmup_share`` of the steps, then a linear fall to 0 at the last (as
        transformers' ``get_linear_schedule_with_warmup``). The step counts from the run's start, so a
        resumed run goes on where it stopped."""
        warm = int(round(self.config.warmup_share * steps))
        factor = step / max(1, warm) if step < warm else max(0.0, (steps - step) / max(1, steps - warm))
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

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
            raise FloatingPointError(_diverged(self.config, epoch, f"the loss ({float(value)})"))
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
        record["labels_after"] = label_stats(corrected.cpu(), self.clean)
        self.evaluate(record, out, steps_done)
        self.save(epoch, record, out, (corrected, suggestion))

    def _read_out(self, record: dict[str, Any]) -> _Readout:
        """2. the head's update (centroid rule, read-out); 3. the read-out of every sample."""
        fit_h = self._embed(self.fit_x)
        val_h = None if self.val_x is None else self._embed(self.val_x)
        test_h = self._embed(self.test_x)
        config, n = self.config, self.data.num_ranks
        if self.head is not None:
            out = _sol_readout(config, self.head, fit_h, self.labels,
                               None if val_h is None else (val_h, self.val_labels), test_h)
            record["centroid_span"] = centroid_span(self.head.centroids)
        else:
            out = _head_readout(config, self.eval_model, n, fit_h, val_h, test_h)
        record["train_mae_vs_labels"] = _rank_mae(out.fit_pred, self.labels)
        record["labels_before"] = label_stats(self.labels.cpu(), self.clean)
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
        par.check_same_state(record["epoch"], corrected, None if self.head is None else self.head.centroids)
        return corrected, suggestion

    def evaluate(self, record: dict[str, Any], out: _Readout, steps_done: float) -> None:
        """4. the validation MAE (model selection) and the test metrics (reported only); the
        epoch's record joins the history and its line is logged."""
        record["val_mae"] = None if out.val_pred is None else _rank_mae(out.val_pred, self.val_labels)
        record["test"] = test_set_metrics(self.config, self.data, out.test_pred)
        # the training steps, and the passes over every sample that follow them (embedding,
        # centroid rule, read-out, relabeling, validation and test)
        record["seconds"] = {"steps": steps_done - self._epoch_started,
                             "end_of_epoch": time.perf_counter() - steps_done}
        self.history.append(record)
        self.log(epoch_line(record, self.config.epochs))

    def save(self, epoch: int, record: dict[str, Any], out: _Readout, relabeled) -> None:
        """The best epoch so far (``best.pt``, or kept in memory) and the checkpoint."""
        config, data, par, split = self.config, self.data, self.par, self.split
        corrected, suggestion = relabeled
        improved = par.agree(self.best is None or record["val_mae"] is None
                             or record["val_mae"] < self.best.state.val_mae, self.device)
        predictor = predictor_record(config, data)
        if data.kind == "text" and improved and par.is_main and not self.in_memory:
            # the selected epoch's encoder and tokenizer, for load_run and for transformers itself;
            # best.pt keeps each file's checksum
            predictor["text_encoder_files"] = save_text_encoder(self.eval_model.encoder,
                                                                self.out_dir / TEXT_ENCODER_DIR)
        snapshot = EpochState.of_epoch(
            self.config_as_given(), self.eval_model, self.head, fingerprint=self.fingerprint,
            epoch=epoch, world_size=par.world_size, predictor=predictor,
            labels=self.labels, corrected_labels=corrected, given_labels=self.given,
            clean_labels=self.clean, train_rows=_rows(data, split.fit),
            val_rows=None if split.val is None else _rows(data, split.val), train_pred=out.fit_pred,
            test_pred=out.test_pred, val_mae=record["val_mae"], sigma_choice=self.sigma_choice,
            label_noise_std=record.get("label_noise_std"))
        if improved:
            self.best = SelectedEpoch(snapshot, out.test_h.detach().cpu(),
                                      _audit_arrays(config, data, split, out, suggestion))
            if self.in_memory:  # the state holds the live weights: keep the selected epoch's
                self.best = SelectedEpoch.from_dict(_copied(self.best.to_dict()))
            elif par.is_main:
                save_checkpoint(self.out_dir / BEST_NAME, self.best)
        if par.is_main and not self.in_memory:
            averaged = self.averaged
            save_checkpoint(self.out_dir / CHECKPOINT_NAME, RunState(
                snapshot, self.optimizer, self.gen, self.history, self.best.state.epoch,
                self.elapsed_before + time.perf_counter() - self.started,
                trained_model=None if averaged is None else self.model,
                averaged_steps=None if averaged is None else averaged.steps))

    def outcome(self) -> RunOutcome:
        """The selected epoch's outcome (the best validation MAE, or the last epoch)."""
        best = self.best
        results = run_results(self.config_as_given(), self.data, self.history, best.state,
                              self.sigma_choice, self.elapsed_before + time.perf_counter() - self.started)
        return RunOutcome(results=results, test_embeddings=best.test_embeddings,
                          test_pred=best.state.test_pred, train_pred=best.state.train_pred,
                          labels=best.state.corrected_labels,
                          best_state=best.to_dict() if self.in_memory else None)


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
    if data.kind == "text":
        # fine-tuning: AdamW, the pretrained encoder at its own (small) learning rate, the layers on
        # top at --lr; both warm up and decay (Fit._schedule)
        text_parameters, others = encoder_parameters(model)
        optimizer = torch.optim.AdamW([{"params": text_parameters, "lr": config.text_lr},
                                       {"params": others, "lr": config.lr}], weight_decay=weight_decay)
    else:
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


def _audit_arrays(config: TrainConfig, data: PreparedData, split: Split, out: _Readout,
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
