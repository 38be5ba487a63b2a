"""Outputs of a finished run: plots, ``results.json`` (written last) and the printed table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .checkpoint import atomic_write_text
from .prepare import PreparedData
from .run import RunOutcome

__all__ = ["RESULTS_NAME", "PLOT_NAMES", "write_outputs", "clear_results", "format_table"]

RESULTS_NAME = "results.json"
PLOT_NAMES = ("learning_curves.png", "cs_curve.png", "embeddings_pca.png")


def noise_label(noise: str, kappa: float) -> str:
    """``"gaussian kappa=0.3"``; ``"none"`` when no noise is added (kappa then means nothing)."""
    return "none" if noise == "none" else f"{noise} kappa={kappa:g}"


def clear_results(out_dir: Path) -> None:
    """Remove an earlier run's results and plots, so a failed rerun leaves nothing that looks
    like a result (the checkpoint stays, for ``--resume``)."""
    for name in (RESULTS_NAME, *PLOT_NAMES):
        (out_dir / name).unlink(missing_ok=True)


def write_outputs(outcome: RunOutcome, data: PreparedData, out_dir: Path,
                  plots: bool = True) -> Path:
    """Write the plots, then ``results.json``; return the path of ``results.json``."""
    results = outcome.results
    if plots:
        from .plots import plot_cs_curve, plot_embeddings, plot_learning_curves

        cfg = results["config"]
        title = f"{data.name}: {cfg['method']}, noise {noise_label(cfg['noise'], cfg['kappa'])}"
        plot_learning_curves(results["history"], out_dir / PLOT_NAMES[0], title)
        decode = data.encoder.decode
        errors = decode(outcome.test_pred) - decode(data.test_ranks)
        plot_cs_curve(errors, out_dir / PLOT_NAMES[1], f"CS curve ({cfg['method']})",
                      float(data.encoder.step))
        plot_embeddings(outcome.test_embeddings, decode(data.test_ranks),
                        out_dir / PLOT_NAMES[2], f"test embeddings, PCA ({cfg['method']})")
        results["plots"] = list(PLOT_NAMES)
    path = out_dir / RESULTS_NAME
    atomic_write_text(path, json.dumps(results, indent=2, allow_nan=True) + "\n")
    return path


def _optional(test: dict[str, Any], key: str, fmt: str = "{:.3f}") -> str:
    """A metric of the results table; ``-`` where there is none (no test set, or results of an
    earlier version)."""
    value = test.get(key)
    return "-" if value is None else fmt.format(value)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """A short fixed-width table: one row per run (method, noise, MAE, CS, QWK, macro-MAE, and how many
    training labels
    the run's corrected labels change, with their error against the clean labels where known)."""
    header = ("method", "data", "noise", "test MAE", "CS", "QWK", "macro-MAE", "labels changed",
              "label MAE")
    rows = []
    for r in results:
        cfg, test = r["config"], r["test"] or {}
        given, final = r.get("label_noise_given"), r.get("label_noise_final")
        label_mae = "-" if given is None else f"{given['mae']:.3f}->{final['mae']:.3f}"
        rows.append((cfg["method"], r["data"]["name"], noise_label(cfg["noise"], cfg["kappa"]),
                     _optional(test, "mae"), _optional(test, "cs", "{:.1f}% @" + f"{r['cs_theta']:g}"),
                     _optional(test, "qwk"), _optional(test, "macro_mae"),
                     str(r["labels_changed"]), label_mae))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in rows]
    return "\n".join(lines)
