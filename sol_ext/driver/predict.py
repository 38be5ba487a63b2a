"""``sol-ext predict``: the prediction CSV and the scores against labels the data carry."""

from __future__ import annotations

import csv
import io
from typing import Optional

import numpy as np

from ..metrics import macro_mae, mae, quadratic_weighted_kappa
from .model import Prediction, TrainedModel

__all__ = ["prediction_csv", "score_prediction", "format_scores"]


def _fmt(x: float) -> str:
    return f"{x:.10g}"


def prediction_csv(prediction: Prediction) -> str:
    """One row per input: ``id``, ``prediction`` and ``expected`` (label units), ``label`` when the
    data have one, and ``p_<value>`` for each label value."""
    header = ["id", "prediction", "expected"]
    if prediction.values is not None:
        header.append("label")
    header += [f"p_{v:g}" for v in prediction.label_values]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for i, row_id in enumerate(prediction.ids):
        row = [row_id, _fmt(prediction.prediction[i]), _fmt(prediction.expected[i])]
        if prediction.values is not None:
            row.append(_fmt(prediction.values[i]))
        row += [_fmt(p) for p in prediction.probabilities[i]]
        writer.writerow(row)
    return buf.getvalue()


def score_prediction(model: TrainedModel, prediction: Prediction) -> Optional[dict[str, float]]:
    """MAE and macro-MAE in label units and QWK on the run's rank grid, against the data's labels;
    ``None`` when the data have none. QWK is left out (NaN) when a label lies off the grid."""
    if prediction.values is None:
        return None
    true = prediction.values
    scores = {"n": float(true.size), "mae": mae(prediction.prediction, true),
              "macro_mae": macro_mae(prediction.prediction, true), "qwk": float("nan")}
    try:
        true_ranks = model.encoder.encode(true).numpy()
    except ValueError:
        return scores
    if np.allclose(model.encoder.decode(true_ranks).numpy(), true, rtol=0, atol=1e-9 * model.encoder.step):
        scores["qwk"] = quadratic_weighted_kappa(prediction.ranks, true_ranks, model.num_ranks)
    return scores


def format_scores(scores: dict[str, float]) -> str:
    qwk = "n/a (labels off the run's grid)" if np.isnan(scores["qwk"]) else f"{scores['qwk']:.4f}"
    return (f"against the data's labels ({int(scores['n'])} rows): MAE {scores['mae']:.4f}, "
            f"macro-MAE {scores['macro_mae']:.4f}, QWK {qwk}")
