"""``sol-ext predict``: the prediction CSV and the scores against labels the data carry. Nothing of
the training loop is imported here."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from ..metrics import macro_mae, mae, quadratic_weighted_kappa
from .data.frames import string_array
from .model import Prediction, TrainedModel

__all__ = ["prediction_csv", "score_prediction", "format_scores", "predict_command", "calibrate_from_args"]


_NEEDS_QUOTES = re.compile(r'[,"\r\n]')


def _csv_cell(text: str) -> str:
    """``text`` as one CSV cell: quoted (quotes doubled) when it holds a comma, a quote or a line break."""
    if _NEEDS_QUOTES.search(text):
        return '"' + text.replace('"', '""') + '"'
    return text


def _numbers(values: np.ndarray, dtype: type) -> pa.Array:
    """A numpy column as an arrow array of ``dtype``, from its buffer (``pa.array`` imports pandas)."""
    column = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(column.dtype), len(column), [None, pa.py_buffer(column)])


def _label_values(values: np.ndarray) -> np.ndarray:
    """Predictions on a grid, each as its 12 significant digits (``2.1 + 3 * 0.1`` is written
    ``2.4``, not ``2.4000000000000004``); whole numbers as they are."""
    if values.dtype.kind != "f":
        return values
    distinct, index = np.unique(values, return_inverse=True)  # a grid has few values
    return np.array([float(f"{v:.12g}") for v in distinct])[index]


def _ten_digits(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to 10 significant digits of the largest of them: the text of each is then
    at most that long, and values near the largest (labels such as years) keep their precision."""
    largest = float(np.max(np.abs(values[np.isfinite(values)]), initial=0.0))
    if largest == 0.0:
        return values
    return np.round(values, max(0, min(22, 9 - int(np.floor(np.log10(largest))))))


def prediction_csv(prediction: Prediction, interval: Optional[tuple[np.ndarray, np.ndarray]] = None) -> bytes:
    """One row per input: ``id`` (or the run's id column), ``prediction`` and ``expected`` (label units),
    ``lower`` and ``upper`` (label units) when ``interval`` is given, ``label`` when the data have one, and
    ``p_<value>`` for each label value, as UTF-8 CSV.

    Numbers are written in the shortest form that reads back to the value written: the prediction
    as its label value (whole numbers on an integer grid), ``expected`` rounded to 10 significant
    digits of the largest, the data's labels as read, and the probabilities as float32, the
    precision of the dissimilarities they come from (so a probability below 1.4e-45 reads 0).
    """
    header = [prediction.id_name, "prediction", "expected"]
    predicted = _label_values(prediction.prediction)
    columns = [string_array(prediction.ids), _numbers(predicted, predicted.dtype),
               _numbers(_ten_digits(prediction.expected), np.float64)]
    if interval is not None:
        header += ["lower", "upper"]
        # a row without a prediction has no interval either: its cells are emptied below with the rest
        columns += [_numbers(_label_values(np.where(np.isfinite(bound), bound, prediction.label_values[0])),
                             predicted.dtype) for bound in interval]
    if prediction.values is not None:
        header.append("label")
        columns.append(_numbers(prediction.values, np.float64))
    header += [f"p_{v:g}" for v in prediction.label_values]
    columns += [_numbers(prediction.probabilities[:, q], np.float32)
                for q in range(prediction.probabilities.shape[1])]
    if prediction.incomplete is not None and prediction.incomplete.any():
        # a row with a missing feature value gets empty cells, not a prediction from filled-in values
        empty = pa.array(prediction.incomplete)
        columns = [col if k == 0 or header[k] == "label" else pc.if_else(empty, pa.nulls(len(col), col.type), col)
                   for k, col in enumerate(columns)]
    table = pa.Table.from_arrays(columns, names=[f"c{k}" for k in range(len(columns))])
    # Arrow quotes every text cell (the ids) or none: none unless an id holds a comma, a quote or a
    # line break (image paths may; row numbers never do). The header by hand, quoted only where needed.
    options = pa_csv.WriteOptions(include_header=False, quoting_style=(
        "needed" if _NEEDS_QUOTES.search("".join(prediction.ids)) else "none"))

    def rows_text(part: pa.Table) -> bytes:
        out = pa.BufferOutputStream()
        pa_csv.write_csv(part, out, options)
        return out.getvalue().to_pybytes()

    # Arrow's writer formats on one thread and releases the GIL: slices of 50,000 rows on the cores
    slices = [table.slice(start, 50_000) for start in range(0, table.num_rows, 50_000)] or [table]
    with ThreadPoolExecutor(max_workers=min(len(slices), os.cpu_count() or 1)) as pool:
        parts = list(pool.map(rows_text, slices))
    return (",".join(_csv_cell(h) for h in header) + "\n").encode("utf-8") + b"".join(parts)


def score_prediction(model: TrainedModel, prediction: Prediction) -> Optional[dict[str, float]]:
    """MAE and macro-MAE in label units and QWK on the run's rank grid, against the data's labels;
    ``None`` when the data have none. QWK is left out (NaN) when a label lies off the grid. Rows
    with a missing feature value are not scored."""
    if prediction.values is None:
        return None
    if prediction.incomplete is not None:
        prediction = rows_of(prediction, ~prediction.incomplete)
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


def _intervals(args: argparse.Namespace, model: TrainedModel, prediction: Prediction
               ) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """``--interval``: calibrate on ``--calibration`` and bound every row of ``prediction``."""
    from .errors import UsageError

    if args.interval is None:
        for flag, value in (("--calibration", args.calibration), ("--label-noise", args.label_noise)):
            if value is not None:
                raise UsageError(f"{flag} applies to --interval only; add --interval COVERAGE or leave {flag} out.")
        return None
    if not 0 < args.interval < 1:
        raise UsageError(f"--interval {args.interval:g}: expected a coverage strictly between 0 and 1, e.g. 0.9.")
    if (args.interval_target == "clean") != (args.label_noise is not None):
        raise UsageError("--interval-target clean needs --label-noise STD (the labels' noise, label units), "
                         "and --label-noise applies to it only.")
    calibrate_from_args(args, model, score=args.interval_score, target=args.interval_target,
                        label_noise=args.label_noise)
    return model.intervals_of(prediction, args.interval)


def calibrate_from_args(args: argparse.Namespace, model: TrainedModel, **options) -> None:
    """Calibrate ``model``'s intervals for ``--interval``: on the ``--calibration`` file when one is
    given, else on the validation split the run stored (``options`` as
    :meth:`~sol_ext.driver.model.TrainedModel.calibrate_intervals`).

    Raises:
        UsageError: no ``--calibration`` and the run stored no calibration rows.
    """
    from .errors import UsageError

    if args.calibration is not None:
        model.calibrate_intervals(args.calibration, **options)
    elif model.stored_calibration is not None:
        model.calibrate_intervals_on_validation(**options)
    else:
        raise UsageError(f"--interval: the run in {args.run_dir} holds no calibration (it was trained without a "
                         f"validation split, --val-fraction 0, or by an earlier version of sol_ext); pass "
                         f"--calibration FILE: held-out rows with labels that the run did not train on.")


def _interval_summary(coverage: float, interval: tuple[np.ndarray, np.ndarray],
                      values: Optional[np.ndarray]) -> str:
    lower, upper = interval
    known = np.isfinite(lower)
    line = f"intervals at {coverage:.0%}: mean width {np.mean(upper[known] - lower[known]):.4g} (label units)"
    if values is not None:
        held = np.mean((values[known] >= lower[known]) & (values[known] <= upper[known]))
        line += f", holding the data's label in {held:.1%} of {int(known.sum())} rows"
    return line


def rows_of(prediction: Prediction, keep: np.ndarray) -> Prediction:
    """The rows ``keep`` ([N] bool) of ``prediction``."""
    return dataclasses.replace(
        prediction, ids=[i for i, k in zip(prediction.ids, keep) if k], ranks=prediction.ranks[keep],
        prediction=prediction.prediction[keep], expected=prediction.expected[keep],
        probabilities=prediction.probabilities[keep],
        values=None if prediction.values is None else prediction.values[keep],
        incomplete=None if prediction.incomplete is None else prediction.incomplete[keep])


def format_scores(scores: dict[str, float]) -> str:
    qwk = "n/a (labels off the run's grid)" if np.isnan(scores["qwk"]) else f"{scores['qwk']:.4f}"
    return (f"against the data's labels ({int(scores['n'])} rows): MAE {scores['mae']:.4f}, "
            f"macro-MAE {scores['macro_mae']:.4f}, QWK {qwk}")


def predict_command(args: argparse.Namespace) -> int:
    """``sol-ext predict``: the prediction CSV of ``--data`` by the run in ``args.run_dir`` (to a
    file or stdout), and its scores where the data carry labels."""
    from pathlib import Path

    from .checkpoint import atomic_write_bytes
    from .device import resolve_device
    from .errors import UsageError
    from .loader import auto_workers
    from .model import load_run
    from .options import run_data, warn
    from .outputs import check_output

    if args.workers is not None and args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}.")
    to_stdout = args.output == "-"
    model = load_run(args.run_dir, device=resolve_device(args.device),
                     workers=auto_workers() if args.workers is None else args.workers)
    default = args.run_dir / "predictions.csv"  # a rerun replaces it
    inputs = [("the --data file", args.data), *run_data(args.run_dir, model)]
    path = None if to_stdout else check_output(
        str(default) if args.output is None else args.output, "--output", inputs=inputs,
        replaceable=[default], overwrite=args.overwrite)
    if args.delimiter is not None:
        from .data.tables import table_format

        read = Path(args.data) / "labels.csv" if Path(args.data).is_dir() else Path(args.data)
        if table_format(read) != "csv":  # as train refuses it
            raise UsageError(f"--delimiter {args.delimiter} applies to CSV files only; {args.data} is not one: "
                             f"leave --delimiter out.")
        model.preprocessing = {**model.preprocessing, "delimiter": args.delimiter}
    if args.encoding is not None:
        schema = model.preprocessing.get("schema", {})
        model.preprocessing = {**model.preprocessing, "schema": {**schema, "encoding": args.encoding}}
    prediction = model.predict_table(args.data)
    if prediction.incomplete is not None and prediction.incomplete.any():
        n_incomplete = int(prediction.incomplete.sum())
        if args.skip_missing:
            prediction = rows_of(prediction, ~prediction.incomplete)
        warn(f"{args.data}: {n_incomplete} of {len(prediction.incomplete)} rows have a missing feature "
             f"value; " + ("they are left out (--skip-missing)." if args.skip_missing else
                           "their predictions are left empty (--skip-missing leaves them out)."))
    interval = _intervals(args, model, prediction)
    csv_bytes = prediction_csv(prediction, interval)
    scores = score_prediction(model, prediction)
    if interval is not None:  # beside the CSV on stdout, on stderr
        print(_interval_summary(args.interval, interval, prediction.values),
              file=sys.stderr if to_stdout else sys.stdout)
    if to_stdout:
        sys.stdout.flush()
        sys.stdout.buffer.write(csv_bytes)
        sys.stdout.buffer.flush()
        if scores is not None:
            print(format_scores(scores), file=sys.stderr)
        return 0
    atomic_write_bytes(path, csv_bytes)
    print(f"{len(prediction.ids)} predictions ({model.method}) -> {path}")
    if scores is not None:
        print(format_scores(scores))
    return 0
