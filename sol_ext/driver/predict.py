"""``sol-ext predict``: the prediction CSV and the scores against labels the data carry. Nothing of
the training loop is imported here."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from .data.frames import string_array
from .model import Prediction, TrainedModel

__all__ = ["prediction_csv", "write_prediction_csv", "score_prediction", "format_scores", "predict_command",
           "calibrated_coverage", "calibrate_from_args"]


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


def _ten_digits(values: np.ndarray, label_values: np.ndarray) -> np.ndarray:
    """Expected labels ``values`` rounded to 10 significant digits of the largest label value (they lie
    between the smallest and the largest): the text of each is then at most that long, values near
    the largest (labels such as years) keep their precision, and every row is rounded alike whatever
    the other rows are (a file predicted in slices is written as one predicted at once)."""
    largest = float(np.max(np.abs(label_values[np.isfinite(label_values)]), initial=0.0))
    if largest == 0.0:
        return values
    return np.round(values, max(0, min(22, 9 - int(np.floor(np.log10(largest))))))


def prediction_csv(prediction: Prediction, interval: Optional[tuple[np.ndarray, np.ndarray]] = None,
                   header: bool = True) -> bytes:
    """The text of :func:`write_prediction_csv` as bytes."""
    out = io.BytesIO()
    write_prediction_csv(out, prediction, interval, header)
    return out.getvalue()


def write_prediction_csv(out: BinaryIO, prediction: Prediction,
                         interval: Optional[tuple[np.ndarray, np.ndarray]] = None, header: bool = True) -> None:
    """One row per input: ``id`` (or the run's id column), ``prediction`` and ``expected`` (label units),
    ``lower`` and ``upper`` (label units) when ``interval`` is given, ``label`` when the data have one, and
    ``p_<value>`` for each label value, as UTF-8 CSV; after the header line unless ``header`` is False
    (the slices after the first of :meth:`~sol_ext.driver.model.TrainedModel.predict_slices`).

    Numbers are written in the shortest form that reads back to the value written: the prediction
    as its label value (whole numbers on an integer grid), ``expected`` rounded to 10 significant
    digits of the largest label value, the data's labels as read, and the probabilities as float32, the
    precision of the dissimilarities they come from (so a probability below 1.4e-45 reads 0).
    """
    names = [prediction.id_name, "prediction", "expected"]
    predicted = prediction.prediction
    if predicted.dtype.kind == "f" and np.isnan(predicted).any() and np.all(np.mod(prediction.label_values, 1) == 0):
        # the rows without a prediction (NaN) are emptied below: the others stay whole numbers
        predicted = np.where(np.isnan(predicted), prediction.label_values[0], predicted).astype(np.int64)
    predicted = _label_values(predicted)
    columns = [string_array(prediction.ids), _numbers(predicted, predicted.dtype),
               _numbers(_ten_digits(prediction.expected, prediction.label_values), np.float64)]
    if interval is not None:
        names += ["lower", "upper"]
        # a row without a prediction has no interval either: its cells are emptied below with the rest
        columns += [_numbers(_label_values(np.where(np.isfinite(bound), bound, prediction.label_values[0])),
                             predicted.dtype) for bound in interval]
    if prediction.values is not None:
        names.append("label")
        columns.append(_numbers(prediction.values, np.float64))
    names += [f"p_{v:g}" for v in prediction.label_values]
    columns += [_numbers(prediction.probabilities[:, q], np.float32)
                for q in range(prediction.probabilities.shape[1])]
    if prediction.incomplete is not None and prediction.incomplete.any():
        # a row with a missing feature value gets empty cells, not a prediction from filled-in values
        empty = pa.array(prediction.incomplete)
        columns = [col if k == 0 or names[k] == "label" else pc.if_else(empty, pa.nulls(len(col), col.type), col)
                   for k, col in enumerate(columns)]
    table = pa.Table.from_arrays(columns, names=[f"c{k}" for k in range(len(columns))])
    # Arrow quotes every text cell (the ids) or none: none unless an id holds a comma, a quote or a
    # line break (image paths may; row numbers never do). The header by hand, quoted only where needed.
    quoted = prediction.ids_need_quotes
    if quoted is None:
        quoted = bool(_NEEDS_QUOTES.search("".join(prediction.ids)))
    options = pa_csv.WriteOptions(include_header=False, quoting_style="needed" if quoted else "none")

    def rows_text(part: pa.Table) -> pa.Buffer:
        text = pa.BufferOutputStream()
        pa_csv.write_csv(part, text, options)
        return text.getvalue()

    if header:
        out.write((",".join(_csv_cell(h) for h in names) + "\n").encode("utf-8"))
    # Arrow's writer formats on one thread and releases the GIL: slices of 50,000 rows on the cores;
    # each slice's text goes to ``out`` from Arrow's buffer as it is, not copied into one string
    slices = [table.slice(start, 50_000) for start in range(0, table.num_rows, 50_000)] or [table]
    with ThreadPoolExecutor(max_workers=min(len(slices), os.cpu_count() or 1)) as pool:
        for text in pool.map(rows_text, slices):
            out.write(text)


def score_prediction(model: TrainedModel, prediction: Prediction) -> Optional[dict[str, float]]:
    """MAE and macro-MAE in label units and QWK on the run's rank grid, against the data's labels;
    ``None`` when the data have none. QWK is left out (NaN) when a label lies off the grid. Rows
    with a missing feature value are not scored."""
    totals = _ScoreTotals(model)
    totals.add(prediction)
    return totals.scores()


class _ScoreTotals:
    """:func:`score_prediction` of rows that come in slices: what the scores need of each slice is
    summed as it comes (absolute errors, overall and by label value; the counts of each pair of
    predicted and true rank, for QWK), so that scoring a long file keeps no per-row arrays."""

    def __init__(self, model: TrainedModel):
        self.model = model
        self.n = 0
        self.absolute = 0.0
        self.by_value: dict[float, list[float]] = {}  # label value -> [sum of absolute errors, rows]
        self.pairs: Optional[np.ndarray] = np.zeros((model.num_ranks, model.num_ranks), np.int64)
        self.labelled = False

    def add(self, part: Prediction) -> None:
        if part.values is None:
            return
        self.labelled = True
        predicted, ranks, true = part.prediction, part.ranks, part.values
        if part.incomplete is not None and part.incomplete.any():
            keep = ~part.incomplete
            predicted, ranks, true = predicted[keep], ranks[keep], true[keep]
        if true.size == 0:
            return
        error = np.abs(predicted.astype(np.float64) - true)
        self.n += int(true.size)
        self.absolute += float(np.sum(error))
        values, group = np.unique(true, return_inverse=True)
        sums = np.bincount(group, weights=error, minlength=values.size)
        counts = np.bincount(group, minlength=values.size)
        for v, total, count in zip(values.tolist(), sums.tolist(), counts.tolist()):
            entry = self.by_value.setdefault(v, [0.0, 0])
            entry[0] += total
            entry[1] += count
        if self.pairs is not None:
            encoder = self.model.grid
            try:
                true_ranks = encoder.encode(true).numpy()
            except ValueError:
                true_ranks = None
            if true_ranks is None or not np.allclose(encoder.decode(true_ranks).numpy(), true, rtol=0,
                                                     atol=1e-9 * encoder.step):
                self.pairs = None  # a label off the grid: no QWK
            else:
                np.add.at(self.pairs, (ranks.astype(np.int64), true_ranks), 1)

    def scores(self) -> Optional[dict[str, float]]:
        """The scores of every row added; ``None`` when the data have no labels."""
        if not self.labelled or self.n == 0:  # no labels, or no row with a prediction to score
            return None
        per_value = [total / count for _, (total, count) in sorted(self.by_value.items())]
        return {"n": float(self.n), "mae": self.absolute / self.n, "macro_mae": float(np.mean(per_value)),
                "qwk": float("nan") if self.pairs is None else _kappa(self.pairs)}


def _kappa(pairs: np.ndarray) -> float:
    """Quadratic weighted kappa of the counts ``pairs[predicted rank, true rank]``, as
    :func:`sol_ext.metrics.quadratic_weighted_kappa` gives it for the rows counted."""
    n = pairs.sum()
    ranks = np.arange(pairs.shape[0], dtype=np.float64)
    predicted, true = pairs.sum(axis=1), pairs.sum(axis=0)
    if np.count_nonzero(predicted) == 1 and np.count_nonzero(true) == 1:  # both constant
        return float("nan") if np.argmax(predicted) == np.argmax(true) else 0.0
    observed = float((pairs * (ranks[:, None] - ranks[None, :]) ** 2).sum()) / n
    mean_p, mean_t = float(predicted @ ranks) / n, float(true @ ranks) / n
    chance = (float(predicted @ (ranks - mean_p) ** 2) / n + float(true @ (ranks - mean_t) ** 2) / n
              + (mean_p - mean_t) ** 2)
    return float(1.0 - observed / chance)


def calibrated_coverage(args: argparse.Namespace, model: TrainedModel) -> Optional[float]:
    """``--interval`` of predict and export: check the interval options, calibrate ``model``
    (:func:`calibrate_from_args`) and return the coverage; None without ``--interval``."""
    from .errors import UsageError

    clean_options = "--interval-target clean --label-noise STD"
    if args.interval is None:
        for flag, value, needs in (("--calibration", args.calibration, ""),
                                   ("--interval-score", args.interval_score, ""),
                                   ("--interval-target", args.interval_target, ""),
                                   ("--label-noise", args.label_noise, f" {clean_options}"),
                                   ("--no-deconvolve", None if args.deconvolve else False, f" {clean_options}")):
            if value is not None:
                raise UsageError(f"{flag} applies to --interval only; add --interval COVERAGE{needs} or leave "
                                 f"{flag} out.")
        return None
    if not 0 < args.interval < 1:
        raise UsageError(f"--interval {args.interval:g}: expected a coverage strictly between 0 and 1, e.g. 0.9.")
    target = args.interval_target or "labels"
    if (target == "clean") != (args.label_noise is not None):
        raise UsageError("--interval-target clean needs --label-noise STD (the labels' noise, label units), "
                         "and --label-noise applies to it only.")
    if args.label_noise is not None and not (math.isfinite(args.label_noise) and args.label_noise > 0):
        raise UsageError(f"--label-noise {args.label_noise:g}: expected the std of the labels' noise, a number "
                         f"> 0 in label units (e.g. 0.5).")
    if not args.deconvolve and target != "clean":
        raise UsageError(f"--no-deconvolve applies to the clean target only; add {clean_options} or leave "
                         f"--no-deconvolve out.")
    from ..intervals import DEFAULT_SCORE

    calibrate_from_args(args, model, score=args.interval_score or DEFAULT_SCORE, target=target,
                        label_noise=args.label_noise, deconvolve=args.deconvolve)
    _warn_about_the_calibration(args, model)
    return args.interval


def _warn_about_the_calibration(args: argparse.Namespace, model: TrainedModel) -> None:
    """One warning line where the intervals cannot be what ``--interval`` asks: too few calibration
    rows for the coverage (every interval is then the whole scale), or a --calibration file that is
    the run's training data (intervals come out too narrow)."""
    from pathlib import Path

    from .checkpoint import run_data
    from .console import warn

    # too few rows: the library's CalibrationSizeWarning, the line SOLHead and load_run users see too
    model.intervals.threshold(args.interval)
    if args.calibration is not None:
        for what, given in run_data(args.run_dir, model)[:1]:  # the training data, not the test data
            if given and Path(given).is_file() and Path(args.calibration).is_file() \
                    and os.path.samefile(given, args.calibration):
                warn(f"--calibration {args.calibration}: is {what}, rows the run trained on; intervals "
                     f"calibrated on them come out too narrow: calibrate on held-out rows.")


def calibrate_from_args(args: argparse.Namespace, model: TrainedModel, **options) -> None:
    """Calibrate ``model``'s intervals for ``--interval``: on the ``--calibration`` file when one is
    given, else on the validation split the run stored (``options`` as
    :meth:`~sol_ext.driver.model.TrainedModel.calibrate_intervals`).

    Raises:
        UsageError: no ``--calibration`` and the run stored no calibration rows.
    """
    from .errors import UsageError

    if args.calibration is not None:
        try:
            model.calibrate_intervals(args.calibration, **options)
        except ValueError as err:  # the file's labels: say which option gave it
            message = re.sub(r" \(in Python: [^)]*\)", "", str(err))  # no keyword the command lacks
            if not message.startswith(str(args.calibration)):
                message = f"{args.calibration}: {message}"
            raise UsageError(f"--calibration {message}") from None
    elif model.stored_calibration is not None:
        model.calibrate_intervals_on_validation(**options)
    elif model.stored_calibration_problem is not None:
        raise UsageError(f"--interval: {model.stored_calibration_problem}.")
    else:
        raise UsageError(f"--interval: the run in {args.run_dir} holds no calibration (it was trained without a "
                         f"validation split, --val-fraction 0, or by an earlier version of sol_ext); pass "
                         f"--calibration FILE: held-out rows with labels that the run did not train on.")


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

    from .checkpoint import atomic_write_stream, run_data
    from .console import warn
    from .errors import UsageError
    from .loader import auto_workers
    from .model import load_run
    from .outputs import check_output

    if args.workers is not None and args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}.")
    to_stdout = args.output == "-"
    model = load_run(args.run_dir, device=args.device,  # the device is resolved (and checked) there
                     workers=auto_workers() if args.workers is None else args.workers,
                     handle_unknown=args.handle_unknown)
    missing = _missing_policy(args, model)
    default = args.run_dir / "predictions.csv"  # a rerun replaces it
    inputs = [("the --data file", args.data), *run_data(args.run_dir, model)]
    path = None if to_stdout else check_output(
        str(default) if args.output is None else args.output, "--output", inputs=inputs,
        replaceable=[default], overwrite=args.overwrite)
    _read_as_told(args, model)
    from .data import inputs as data_inputs

    # a table file is read once and predicted and written a slice at a time; the first slice meets
    # any problem of the file before anything is written
    with _system_memory_pool():
        slices = model.predict_slices(args.data, data_inputs.SLICE_ROWS)
        first = next(slices)
        written = _Written(model, calibrated_coverage(args, model), missing == "skip")

        def write(f) -> None:
            for part in itertools.chain([first], slices):
                written.write(f, part)

        if to_stdout:
            sys.stdout.flush()
            try:
                write(sys.stdout.buffer)
                sys.stdout.buffer.flush()
            except KeyboardInterrupt:
                if not written.started:  # no line of the CSV has been written yet
                    raise
                # rows have reached stdout: a pipe reading them must not take them for the whole
                raise KeyboardInterrupt(f"interrupted; the CSV on stdout is incomplete: {written.rows:,} rows "
                                        f"were written in full, then it stops (maybe in a line).") from None
        else:
            atomic_write_stream(path, write)
    if written.incomplete:
        warn(f"{args.data}: {written.incomplete} of {written.read} rows have a missing feature value; "
             + ("they are left out (--missing skip)." if missing == "skip" else
                "their predictions are left empty (--missing skip leaves them out, --missing impute fills "
                "them with the training file's values)."))
    report = sys.stderr if to_stdout else sys.stdout  # beside the CSV on stdout, on stderr
    if written.coverage is not None:
        print(written.interval_summary(), file=report)
    if not to_stdout:
        print(f"{written.rows} predictions ({model.method}) -> {path}")
    scores = written.scores.scores()
    if scores is not None:
        print(format_scores(scores), file=report)
    return 0


def _missing_policy(args: argparse.Namespace, model: TrainedModel) -> str:
    """``--missing`` of ``sol-ext predict`` (default: impute for a run trained with ``--missing
    impute``, else empty), set on ``model`` as the reading it needs; returns the option."""
    from .errors import UsageError

    missing = args.missing or ("impute" if model.missing == "impute" else "empty")
    if missing == "impute" and not model.preprocessing.get("schema", {}).get("fill_values"):
        raise UsageError(f"--missing impute: the run in {args.run_dir} kept no values to fill a missing cell "
                         f"with (it was not trained on a table file, or by an earlier version of sol_ext); "
                         f"use --missing empty or skip, or fill the cells in the file.")
    model.missing = {"empty": "mark", "skip": "mark"}.get(missing, missing)
    return missing


@contextlib.contextmanager
def _system_memory_pool() -> Iterator[None]:
    """Arrow allocates from the C library's allocator meanwhile: what a prediction frees (the CSV's
    parse buffers, the label column once read, each slice's buffers) goes back to the system, where
    Arrow's default pool (mimalloc) keeps it (about 0.5x the feature matrix of a long file)."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _read_as_told(args: argparse.Namespace, model: TrainedModel) -> None:
    """``--delimiter`` and ``--encoding`` of ``sol-ext predict``, set on ``model`` for reading ``--data``."""
    from pathlib import Path

    from .errors import UsageError

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


class _Written:
    """What ``sol-ext predict`` has written, slice by slice: the CSV of each slice (:meth:`write`), and
    what the summary lines need, summed as the slices come (the scores, the intervals' widths)."""

    def __init__(self, model: TrainedModel, coverage: Optional[float], skip_missing: bool):
        self.model, self.coverage, self.skip_missing = model, coverage, skip_missing
        self.read = self.rows = self.incomplete = self.parts_written = 0
        self.started = False  # whether a line may have been written
        self.scores = _ScoreTotals(model)
        self.widths = _IntervalTotals()

    def write(self, f: BinaryIO, part: Prediction) -> None:
        """Write the CSV lines of the slice ``part`` to ``f`` (the header before the first)."""
        self.read += len(part.ids)
        if part.incomplete is not None and part.incomplete.any():
            self.incomplete += int(part.incomplete.sum())
            if self.skip_missing:
                part = rows_of(part, ~part.incomplete)
        interval = None if self.coverage is None else self.model.intervals_of(part, self.coverage)
        self.scores.add(part)
        if interval is not None:
            self.widths.add(interval, part.values, part.incomplete)
        self.started = True
        write_prediction_csv(f, part, interval, header=not self.parts_written)
        self.parts_written += 1
        self.rows += len(part.ids)

    def interval_summary(self) -> str:
        return self.widths.summary(self.coverage)


class _IntervalTotals:
    """The intervals' mean width and how often they held the data's labels, summed slice by slice."""

    def __init__(self):
        self.known = self.held = 0
        self.width = 0.0
        self.labelled = False

    def add(self, interval: tuple[np.ndarray, np.ndarray], values: Optional[np.ndarray],
            incomplete: Optional[np.ndarray]) -> None:
        lower, upper = interval
        known = np.isfinite(lower)  # a row with a missing cell has no interval written either
        if incomplete is not None:
            known &= ~incomplete
        self.known += int(known.sum())
        self.width += float(np.sum(upper[known] - lower[known]))
        if values is not None:
            self.labelled = True
            self.held += int(np.sum((values[known] >= lower[known]) & (values[known] <= upper[known])))

    def summary(self, coverage: float) -> str:
        mean = self.width / self.known if self.known else float("nan")
        line = f"intervals at {coverage:.0%}: mean width {mean:.4g} (upper - lower, label units)"
        if self.labelled:
            line += (f", holding the data's label in {self.held / self.known if self.known else float('nan'):.1%} "
                     f"of {self.known} rows")
        return line
