"""PNG figures of a run (matplotlib, Agg backend): learning curves, CS curve, PCA of embeddings,
reliability diagram."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import torch

from .checkpoint import atomic_write_bytes

__all__ = ["pca_2d", "plot_learning_curves", "plot_cs_curve", "plot_embeddings", "plot_reliability",
           "save_figure"]


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install matplotlib "
                          "(or pass --no-plots).") from exc
    matplotlib.use("Agg", force=True)  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Render ``fig`` to PNG and write it atomically; the figure is closed."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def pca_2d(x: torch.Tensor) -> torch.Tensor:
    """First two principal components ``[N, 2]`` of ``x`` ``[N, d]`` (zeros where ``d < 2``)."""
    x = x.detach().to(torch.float64)
    x = x - x.mean(dim=0, keepdim=True)
    out = torch.zeros(x.shape[0], 2, dtype=torch.float64)
    if x.shape[0] < 2:
        return out
    _, _, v = torch.linalg.svd(x, full_matrices=False)
    k = min(2, v.shape[0])
    out[:, :k] = x @ v[:k].T
    return out


def plot_learning_curves(history: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Per epoch: training loss; test MAE, validation MAE and training-label error; relabels;
    and, for the SOL methods, the centroid span ``||mu_last - mu_0||`` (a damped update keeps it
    from oscillating between epochs)."""
    plt = _pyplot()
    epochs = [r["epoch"] for r in history]
    spans = [r.get("centroid_span") for r in history]
    with_span = any(v is not None for v in spans)
    fig, axes = plt.subplots(1, 4 if with_span else 3, figsize=(17 if with_span else 13, 3.6))
    axes[0].plot(epochs, [r["train_loss"] for r in history], marker=".")
    axes[0].set(title="training loss", xlabel="epoch")
    if any(r.get("test") is not None for r in history):  # none without a test set
        axes[1].plot(epochs, [None if r["test"] is None else r["test"]["mae"] for r in history], marker=".",
                     label="test MAE")
    if any(r.get("val_mae") is not None for r in history):
        axes[1].plot(epochs, [r.get("val_mae") for r in history], marker=".",
                     label="validation MAE vs noisy labels (ranks)")
    if history and history[0].get("labels_after") is not None:
        axes[1].plot(epochs, [r["labels_after"]["mae"] for r in history], marker=".",
                     label="training-label MAE vs clean (ranks)")
    axes[1].set(title="errors", xlabel="epoch")
    axes[1].legend(fontsize=8)
    axes[2].bar(epochs, [r["relabeled"] for r in history])
    axes[2].set(title="labels relabeled", xlabel="epoch")
    if with_span:
        axes[3].plot(epochs, spans, marker=".")
        axes[3].set(title="centroid span ||mu_last - mu_0||", xlabel="epoch")
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)  # epochs are whole numbers
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.95))  # keep the subplot titles clear of the figure title
    save_figure(fig, path)


def plot_cs_curve(errors: torch.Tensor, path: Path, title: str, step: float) -> None:
    """Cumulative score (percent of test samples with ``|error| <= theta``) against theta."""
    plt = _pyplot()
    from ..metrics import cs_curve

    errors = errors.detach().to(torch.float64).abs()
    top = max(float(errors.max()) if errors.numel() else 0.0, 10 * step)
    n_steps = int(round(top / step))
    thetas = [i * step for i in range(n_steps + 1)]
    cs = cs_curve(errors, torch.zeros_like(errors), thetas)
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(thetas, cs, marker=".")
    ax.set(title=title, xlabel="error tolerance theta (label units)", ylabel="CS (%)",
           ylim=(0, 100.5))
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_embeddings(embeddings: torch.Tensor, ranks_values: torch.Tensor, path: Path,
                    title: str) -> None:
    """PCA of test embeddings ``[M, d]``, colored by clean label ``[M]`` (label units)."""
    plt = _pyplot()
    xy = pca_2d(embeddings)
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    sc = ax.scatter(xy[:, 0], xy[:, 1], c=ranks_values.to(torch.float64), s=6, cmap="viridis")
    fig.colorbar(sc, ax=ax, label="clean label")
    ax.set(title=title, xlabel="PC 1", ylabel="PC 2")
    save_figure(fig, path)


def plot_reliability(calibration: dict[str, Any], path: Path, title: str) -> None:
    """The reliability diagram of ``results.json``'s ``calibration``: per bin of the most probable
    rank's probability, how often that rank is the label against the mean probability, for the
    validation split (labels as given) and the test set; the diagonal is a calibrated model. The
    points' area follows the bin's rows, and the legend gives each part's ECE."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.2))
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="calibrated")
    for name, part in (("validation", calibration.get("validation")), ("test", calibration.get("test"))):
        if not part:
            continue
        curve = part["reliability"]
        filled = [(c, a, k) for c, a, k in zip(curve["confidence"], curve["accuracy"], curve["count"]) if k > 0]
        confidence, accuracy, count = zip(*filled)
        largest = max(count)
        line, = ax.plot(confidence, accuracy, marker=None, lw=1,
                        label=f"{name} ({part['rows']} rows), ECE {part['ece']:.3f}")
        ax.scatter(confidence, accuracy, s=[12 + 60 * k / largest for k in count], color=line.get_color())
    ax.set(title=title, xlabel="probability of the most probable rank", ylabel="share where it is the label",
           xlim=(0, 1), ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path)
