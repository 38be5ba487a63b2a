"""Outputs of a finished run: plots, ``results.json`` (written last) and the printed table.

Every file is replaced atomically when the run has finished: until then the folder keeps the
last complete results (a resumed run that is interrupted leaves those of the run it continued).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .checkpoint import atomic_write_text
from .options import note
from .prepare import PreparedData

if TYPE_CHECKING:  # the names of the run files are needed without the training loop (outputs.py)
    from .fit import RunOutcome

__all__ = ["RESULTS_NAME", "PLOT_NAMES", "write_outputs", "clear_results", "format_table"]

RESULTS_NAME = "results.json"
# the last, the reliability diagram, is drawn where the results hold a calibration (sol_ext.driver.calibration)
PLOT_NAMES = ("learning_curves.png", "cs_curve.png", "embeddings_pca.png", "reliability.png")


def noise_label(noise: str, kappa: float) -> str:
    """``"gaussian kappa=0.3"``; ``"none"`` when no noise is added (kappa then means nothing)."""
    return "none" if noise == "none" else f"{noise} kappa={kappa:g}"


def clear_results(out_dir: Path) -> None:
    """Remove a run's results and plots (``train --overwrite`` discards the run in a run
    folder; a resumed run keeps them until it writes its own)."""
    for name in (RESULTS_NAME, *PLOT_NAMES):
        (out_dir / name).unlink(missing_ok=True)


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
        decode = data.encoder.decode
        if data.test_ranks.numel():  # the test set's plots (--test-fraction 0: there is none)
            errors = decode(outcome.test_pred) - decode(data.test_ranks)
            plot_cs_curve(errors, out_dir / PLOT_NAMES[1], f"CS curve ({cfg['method']})",
                          float(data.encoder.step))
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
