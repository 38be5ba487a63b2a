"""The training loop of SOL (paper Algorithm 1) and of the baselines, with checkpoints.

Per epoch:
1. train the encoder on shuffled batches of the current labels, with the centroids fixed;
2. (SOL) recompute the centroids over the whole training set (eval mode, no gradient);
3. predict every training sample; (SOL, refinement on) detect outliers and relabel them;
4. evaluate on the test set against clean labels; save a checkpoint.

The centroids are also computed once before the first epoch. The relabeled labels feed the
next epoch, so relabels accumulate; they are kept in the checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from .centroids import compute_centroids, embed
from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .metrics import summarize
from .methods import RankModel, build_model, fit_posterior, make_sol_loss, predict, training_loss
from .noise import noise_statistics
from .ops import noise_kernel
from .pairs import balanced_pairs, sample_references
from .prepare import PreparedData
from .refine import refine_labels

__all__ = ["RunOutcome", "train", "resolve_device", "cs_theta_of"]


@dataclass
class RunOutcome:
    """What a finished run hands to reporting.

    Attributes:
        results: JSON-ready summary (configuration, final metrics, per-epoch history).
        test_embeddings: ``[M, d]`` final test embeddings (CPU).
        test_pred: ``[M]`` predicted test ranks.
        train_pred: ``[N]`` predicted training ranks (final model and centroids).
        labels: ``[N]`` current (relabeled) training ranks.
    """

    results: dict[str, Any]
    test_embeddings: torch.Tensor
    test_pred: torch.Tensor
    train_pred: torch.Tensor
    labels: torch.Tensor


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use --device cpu.")
    return dev


def cs_theta_of(config: TrainConfig, data: PreparedData) -> float:
    """CS threshold in label units: ``config.cs_theta`` or 2 rank steps."""
    return float(config.cs_theta) if config.cs_theta is not None else 2.0 * float(data.encoder.step)


def _label_stats(labels: torch.Tensor, clean: Optional[torch.Tensor]) -> Optional[dict[str, float]]:
    return None if clean is None else noise_statistics(labels, clean)


def _test_metrics(config: TrainConfig, data: PreparedData, pred: torch.Tensor) -> dict[str, float]:
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


def _batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches; a last batch of one sample is dropped (no pair, and batch norm
    cannot train on it)."""
    perm = torch.randperm(n, generator=generator)
    out = list(perm.split(batch_size))
    if len(out) > 1 and out[-1].numel() < 2:
        out.pop()
    return out


def _centroids(config: TrainConfig, model: RankModel, data: PreparedData, labels: torch.Tensor,
               kernel: torch.Tensor, previous: Optional[torch.Tensor], device: torch.device,
               batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training embeddings ``[N, d]`` and the centroids ``[n, d]`` by the centroid rule."""
    h = embed(model, data.train_x, batch_size, device)
    mu = compute_centroids(h, labels.to(device), kernel, previous=previous)
    if config.normalize:
        mu = F.normalize(mu, dim=1)  # as the embeddings (SPEC §10.4)
    return h, mu


def train(config: TrainConfig, data: PreparedData, out_dir: Path, resume: bool = False,
          progress: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Train ``config.method`` on ``data``; checkpoint to ``out_dir/checkpoint.pt`` every epoch.

    Args:
        config: the run's settings (validated here).
        data: from :func:`sol_ext.prepare.prepare_data`.
        out_dir: folder of the checkpoint (created).
        resume: continue from the checkpoint in ``out_dir`` (same configuration and data, else
            :class:`sol_ext.checkpoint.CheckpointMismatch`); ``config.epochs`` may be larger.
        progress: show a progress bar per epoch.
        log: receives one line per epoch.
    """
    config.validate()
    device = resolve_device(config.device)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / CHECKPOINT_NAME
    n = data.num_ranks
    eval_bs = max(256, config.batch_size)
    start = time.perf_counter()

    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed + 1)  # shuffling and pair sampling
    model = build_model(config, data.input_shape, data.kind, n).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    kernel = (noise_kernel(n, config.kernel_sigma, dtype=torch.float64, device=device)
              if config.uses_centroids else None)
    sol_loss = make_sol_loss(config, n) if config.uses_centroids else None
    train_x = data.train_x.to(device)
    test_x = data.test_x.to(device)
    fingerprint = data.fingerprint()

    history: list[dict[str, Any]] = []
    centroids: Optional[torch.Tensor] = None
    labels = data.train_given.clone().to(device)
    first_epoch = 1
    elapsed_before = 0.0
    state: Optional[dict[str, Any]] = None
    if resume:
        state = load_checkpoint(ckpt_path, config, fingerprint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        centroids = None if state["centroids"] is None else state["centroids"].to(device)
        labels = state["labels"].to(device)
        history = state["history"]
        first_epoch = state["epoch"] + 1
        elapsed_before = float(state.get("elapsed_s", 0.0))
        torch.set_rng_state(state["torch_rng"])
        gen.set_state(state["generator_rng"])
        log(f"resuming {out_dir} after epoch {state['epoch']}")
    elif config.uses_centroids:
        _, centroids = _centroids(config, model, data, labels, kernel, None, device, eval_bs)

    train_pred = test_pred = test_h = None
    for epoch in range(first_epoch, config.epochs + 1):
        # 1. network training, centroids fixed
        loss = _train_epoch(config, model, optimizer, train_x, labels, n, centroids, sol_loss,
                            gen, progress, epoch)

        # 2. centroid rule; 3. predictions, outliers, relabeling
        record: dict[str, Any] = {"epoch": epoch, "train_loss": loss}
        if config.uses_centroids:
            train_h, centroids = _centroids(config, model, data, labels, kernel, centroids,
                                            device, eval_bs)
        else:
            train_h = embed(model, train_x, eval_bs, device)
        posterior = fit_posterior(config, train_h, labels, n, centroids)
        train_pred = predict(config, model, train_h, n, centroids, posterior)
        record["train_mae_vs_labels"] = float((train_pred - labels).abs().float().mean())
        record["labels_before"] = _label_stats(labels, data.train_clean)
        if config.refines:
            ref = refine_labels(labels, train_pred, n, config.beta,
                                floor_step=config.convention == "official")
            labels = ref.labels
            record.update(outliers=ref.num_outliers, relabeled=ref.num_relabeled, step=ref.step)
        else:
            record.update(outliers=0, relabeled=0, step=0.0)
        record["labels_after"] = _label_stats(labels, data.train_clean)

        # 4. test evaluation against clean labels
        test_h = embed(model, test_x, eval_bs, device)
        test_pred = predict(config, model, test_h, n, centroids, posterior)
        record["test"] = _test_metrics(config, data, test_pred)
        history.append(record)
        log(_epoch_line(record, config.epochs))

        save_checkpoint(ckpt_path, {
            "config": config.to_dict(), "fingerprint": fingerprint, "epoch": epoch,
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "centroids": None if centroids is None else centroids.cpu(),
            "labels": labels.cpu(), "given_labels": data.train_given.cpu(),
            "clean_labels": None if data.train_clean is None else data.train_clean.cpu(),
            "train_rows": None if data.train_rows is None else data.train_rows.cpu(),
            "train_pred": train_pred.cpu(), "test_pred": test_pred.cpu(),
            "history": history, "torch_rng": torch.get_rng_state(),
            "generator_rng": gen.get_state(),
            "elapsed_s": elapsed_before + time.perf_counter() - start})

    if test_pred is None:  # resumed a run that had already finished all its epochs
        train_pred, test_pred = state["train_pred"].to(device), state["test_pred"].to(device)
        test_h = embed(model, test_x, eval_bs, device)

    results = _results(config, data, history, labels, elapsed_before + time.perf_counter() - start)
    return RunOutcome(results=results, test_embeddings=test_h.cpu(), test_pred=test_pred.cpu(),
                      train_pred=train_pred.cpu(), labels=labels.cpu())


def _train_epoch(config: TrainConfig, model: RankModel, optimizer: torch.optim.Optimizer,
                 train_x: torch.Tensor, labels: torch.Tensor, n: int,
                 centroids: Optional[torch.Tensor], sol_loss: Optional[torch.nn.Module],
                 gen: torch.Generator, progress: bool, epoch: int) -> float:
    """One pass over shuffled batches of the current ``labels`` ``[N]`` with the centroids
    fixed; returns the mean batch loss."""
    model.train()
    batches = _batches(labels.numel(), config.batch_size, gen)
    bar = _Progress(progress, len(batches), f"epoch {epoch}/{config.epochs}")
    total = 0.0
    for idx in batches:
        idx = idx.to(train_x.device)
        x, y, pairs = train_x[idx], labels[idx], None
        if config.pairs == "balanced":
            ref = sample_references(y, labels, config.tau, gen).to(train_x.device)
            x, y = torch.cat([x, train_x[ref]]), torch.cat([y, labels[ref]])
            pairs = balanced_pairs(y, config.tau, config.pairs_per_class, gen)
        loss = training_loss(config, model, model(x), y, n, centroids, sol_loss, pairs)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"the training loss became {float(loss)} in epoch {epoch}; lower --lr, or keep "
                f"embeddings normalized (the default).")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
        bar.update(float(loss.detach()))
    bar.close()
    return total / max(len(batches), 1)


def _epoch_line(r: dict[str, Any], epochs: int) -> str:
    t = r["test"]
    line = (f"epoch {r['epoch']:>3}/{epochs}  loss {r['train_loss']:.4f}  "
            f"test MAE {t['mae']:.3f}  CS {t['cs']:.1f}%")
    if r["relabeled"] or r["outliers"]:
        line += f"  outliers {r['outliers']}  relabeled {r['relabeled']}"
    if r["labels_after"] is not None:
        line += f"  label MAE {r['labels_before']['mae']:.3f}->{r['labels_after']['mae']:.3f}"
    return line


def _results(config: TrainConfig, data: PreparedData, history: list[dict[str, Any]],
             labels: torch.Tensor, seconds: float) -> dict[str, Any]:
    final = history[-1]
    enc = data.encoder
    return {
        "config": config.to_dict(),
        "data": {"name": data.name, "kind": data.kind, "num_ranks": data.num_ranks,
                 "min_value": float(enc.min_value), "step": float(enc.step),
                 "n_train": int(data.train_x.shape[0]), "n_test": int(data.test_x.shape[0])},
        "cs_theta": cs_theta_of(config, data),
        "test": final["test"],
        "relabeled_total": int(sum(r["relabeled"] for r in history)),
        "labels_changed": int((labels.cpu() != data.train_given.cpu()).sum()),
        "label_noise_given": _label_stats(data.train_given, data.train_clean),
        "label_noise_final": _label_stats(labels.cpu(), data.train_clean),
        "history": history,
        "seconds": seconds,
    }
