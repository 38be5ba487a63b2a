"""``sol-ext predict``: the prediction CSV and the scores against labels the data carry."""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from ..metrics import macro_mae, mae, quadratic_weighted_kappa
from .model import Prediction, TrainedModel

__all__ = ["prediction_csv", "score_prediction", "format_scores"]


_NEEDS_QUOTES = re.compile(r'[,"\r\n]')


def _csv_cell(text: str) -> str:
    """``text`` as one CSV cell: quoted (quotes doubled) when it holds a comma, a quote or a line break."""
    if _NEEDS_QUOTES.search(text):
        return '"' + text.replace('"', '""') + '"'
    return text


def prediction_csv(prediction: Prediction) -> str:
    """One row per input: ``id``, ``prediction`` and ``expected`` (label units), ``label`` when the
    data have one, and ``p_<value>`` for each label value; numbers written as ``%.10g``."""
    header = ["id", "prediction", "expected"]
    columns = [prediction.prediction, prediction.expected]
    if prediction.values is not None:
        header.append("label")
        columns.append(prediction.values)
    header += [f"p_{v:g}" for v in prediction.label_values]
    n = len(prediction.ids)
    numbers = np.empty((n, len(columns) + prediction.probabilities.shape[1]), dtype=np.float64)
    for k, column in enumerate(columns):
        numbers[:, k] = column
    numbers[:, len(columns):] = prediction.probabilities
    # one format per row, applied by C code: several times faster than formatting cell by cell
    row = "%s," + ",".join(["%.10g"] * numbers.shape[1]) + "\n"
    ids = [str(i) for i in prediction.ids]
    if _NEEDS_QUOTES.search("".join(ids)):
        ids = [_csv_cell(i) for i in ids]  # image paths may hold commas; row numbers never do
    lines = [row % (row_id, *values) for row_id, values in zip(ids, numbers.tolist())]
    return ",".join(_csv_cell(h) for h in header) + "\n" + "".join(lines)


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
