"""Outputs of a run: its outcome (:class:`RunOutcome`, :func:`run_results`), the line of each epoch,
and, once it has finished, the plots, ``results.json`` (written last) and the printed table.

Every file is replaced atomically when the run has finished: until then the folder keeps the
last complete results (a resumed run that is interrupted leaves those of the run it continued).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..metrics import per_rank_mae, summarize
from .checkpoint import EpochState, atomic_write_text
from .config import TrainConfig
from .console import note
from .prepare import PreparedData
from .synthetic_noise import noise_statistics

__all__ = ["RESULTS_NAME", "PLOT_NAMES", "RunOutcome", "run_results", "cs_theta_of", "label_stats",
           "test_set_metrics", "epoch_line", "write_outputs", "format_table"]

RESULTS_NAME = "results.json"
# the last, the reliability diagram, is drawn where the results hold a calibration (sol_ext.driver.calibration)
PLOT_NAMES = ("learning_curves.png", "cs_curve.png", "embeddings_pca.png", "reliability.png")


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

    def adopted(self, config: TrainConfig, sigma_choice: dict[str, Any], seconds: float) -> RunOutcome:
        """This outcome of a sigma search's trial as that of the run of ``config`` (sigma
        ``"auto"``) that picked it with ``sigma_choice`` and took ``seconds``."""
        results = {**self.results, "config": config.to_dict(), "sigma_selected": sigma_choice["sigma"],
                   "sigma_search": sigma_choice, "seconds": seconds}
        state = (None if self.best_state is None
                 else {**self.best_state, "config": config.to_dict(), "sigma_choice": sigma_choice})
        return dataclasses.replace(self, results=results, best_state=state)


def cs_theta_of(config: TrainConfig, data: PreparedData) -> float:
    """CS threshold in label units: ``config.cs_theta`` or 2 rank steps."""
    return float(config.cs_theta) if config.cs_theta is not None else 2.0 * float(data.grid.step)


def label_stats(labels: torch.Tensor, clean: Optional[torch.Tensor]) -> Optional[dict[str, float]]:
    return None if clean is None else noise_statistics(labels, clean)


def test_set_metrics(config: TrainConfig, data: PreparedData,
                      pred: torch.Tensor) -> Optional[dict[str, float]]:
    """Metrics against the clean test labels, in label units; ``None`` without a test set."""
    if pred.numel() == 0:
        return None
    decode = data.grid.decode
    return summarize(decode(pred.cpu()), decode(data.test_ranks), cs_theta_of(config, data))


def epoch_line(r: dict[str, Any], epochs: int) -> str:
    """The log line of the epoch record ``r`` of a run of ``epochs`` epochs."""
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


def run_results(config: TrainConfig, data: PreparedData, history: list[dict[str, Any]],
                best: EpochState, sigma_choice: Optional[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """``results.json`` of a run of ``config`` on ``data``: its settings, the selected epoch's state
    ``best`` (the processes that trained it among them), its sigma choice, the per-epoch
    ``history`` and the time it took."""
    chosen = history[best.epoch - 1]
    grid, given, clean = data.grid, best.given_labels, best.clean_labels
    return {
        "config": config.to_dict(),
        "world_size": int(best.world_size),
        "data": {"name": data.name, "kind": data.kind, "num_ranks": data.num_ranks,
                 "min_value": float(grid.min_value), "step": float(grid.step),
                 "n_train": int(given.numel()),
                 "n_val": 0 if best.val_rows is None else int(best.val_rows.numel()),
                 "n_test": int(data.test_x.shape[0])},
        "cs_theta": cs_theta_of(config, data),
        "selected_epoch": best.epoch,
        "epochs_run": len(history),
        "selection": "best validation MAE (noisy labels)" if config.selects_model else "last epoch",
        "val_mae": chosen["val_mae"],
        "sigma_selected": None if sigma_choice is None else sigma_choice["sigma"],
        "sigma_search": sigma_choice,
        "test": chosen["test"],
        # MAE of the test samples of each true label value (label units), at the selected epoch
        "test_per_rank_mae": {} if chosen["test"] is None else {f"{v:g}": e for v, e in per_rank_mae(
            grid.decode(best.test_pred), grid.decode(data.test_ranks)).items()},
        "relabeled_total": int(sum(r["relabeled"] for r in history)),
        "labels_changed": int((best.corrected_labels != given).sum()),
        "label_noise_given": label_stats(given, clean),
        "label_noise_final": label_stats(best.corrected_labels, clean),
        "history": history,
        "seconds": seconds,
    }


def noise_label(noise: str, kappa: float) -> str:
    """``"gaussian kappa=0.3"``; ``"none"`` when no noise is added (kappa then means nothing)."""
    return "none" if noise == "none" else f"{noise} kappa={kappa:g}"


def write_outputs(outcome: RunOutcome, data: PreparedData, out_dir: Path,
                  plots: bool = True) -> Path:
    """Write the plots, then ``results.json``; return the path of ``results.json``. Without
    ``plots``, the plots of an earlier state of the run go once the new results are written; without
    matplotlib too, after a note saying so."""
    results = outcome.results
    if plots and importlib.util.find_spec("matplotlib") is None:
        note("matplotlib is not installed, so the run's plots are left out (pip install matplotlib draws "
             "them; --no-plots leaves them out without this note).")
        plots = False
    if plots:
        from .plots import plot_cs_curve, plot_embeddings, plot_learning_curves

        cfg = results["config"]
        title = f"{data.name}: {cfg['method']}, noise {noise_label(cfg['noise'], cfg['kappa'])}"
        plot_learning_curves(results["history"], out_dir / PLOT_NAMES[0], title)
        results["plots"] = [PLOT_NAMES[0]]
        decode = data.grid.decode
        if data.test_ranks.numel():  # the test set's plots (--test-fraction 0: there is none)
            errors = decode(outcome.test_pred) - decode(data.test_ranks)
            plot_cs_curve(errors, out_dir / PLOT_NAMES[1], f"CS curve ({cfg['method']})",
                          float(data.grid.step))
            plot_embeddings(outcome.test_embeddings, decode(data.test_ranks),
                            out_dir / PLOT_NAMES[2], f"test embeddings, PCA ({cfg['method']})")
            results["plots"] += PLOT_NAMES[1:3]
        else:  # from an earlier state of the run
            for name in PLOT_NAMES[1:3]:
                (out_dir / name).unlink(missing_ok=True)
        calibration = results.get("calibration") or {}
        if calibration.get("validation") or calibration.get("test"):
            from .plots import plot_reliability

            plot_reliability(calibration, out_dir / PLOT_NAMES[3], f"reliability ({cfg['method']})")
            results["plots"].append(PLOT_NAMES[3])
        else:  # from an earlier state of the run
            (out_dir / PLOT_NAMES[3]).unlink(missing_ok=True)
    path = out_dir / RESULTS_NAME
    atomic_write_text(path, json.dumps(results, indent=2, allow_nan=True) + "\n")
    if not plots:  # they would show another epoch count than results.json
        for name in PLOT_NAMES:
            (out_dir / name).unlink(missing_ok=True)
    return path


def _optional(test: dict[str, Any], key: str, fmt: str = "{:.3f}") -> str:
    """A metric of the results table; ``-`` where there is none (no test set, or results of an
    earlier version)."""
    value = test.get(key)
    return "-" if value is None else fmt.format(value)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """A short fixed-width table: one row per run (method, noise, MAE, CS, QWK, macro-MAE, and how
    many training labels the run's corrected labels change, with their error against the clean
    labels where known). Every MAE is in label units, as its header says: the training-label MAE
    of ``results.json`` (in ranks) is multiplied by the label step."""
    header = ("method", "data", "noise", "test MAE", "CS", "QWK", "macro-MAE", "labels changed",
              "label MAE")
    rows = []
    for r in results:
        cfg, test = r["config"], r["test"] or {}
        given, final = r.get("label_noise_given"), r.get("label_noise_final")
        step = float(r.get("data", {}).get("step", 1.0))
        label_mae = ("-" if given is None
                     else f"{given['mae'] * step:.3f}->{final['mae'] * step:.3f}")
        rows.append((cfg["method"], r["data"]["name"], noise_label(cfg["noise"], cfg["kappa"]),
                     _optional(test, "mae"), _optional(test, "cs", "{:.1f}% @" + f"{r['cs_theta']:g}"),
                     _optional(test, "qwk"), _optional(test, "macro_mae"),
                     str(r["labels_changed"]), label_mae))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = ["MAE columns in label units (test MAE, macro-MAE, label MAE: the training labels' "
             "error, given -> corrected)", fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in rows]
    return "\n".join(lines)
