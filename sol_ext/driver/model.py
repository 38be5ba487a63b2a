"""A trained run as a model: :func:`load_run` reads a ``sol-ext train`` output folder and predicts on
new data, in the data's own label units.

The run's selected model (``best.pt``, else the last ``checkpoint.pt``) holds everything a
prediction needs: the encoder's settings and weights, the SOL head (centroids and the fitted
read-out) or the baseline's output head, the feature preprocessing (columns, one-hot categories,
the training set's mean and std) and the label grid.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ..head import SOLHead
from ..intervals import DEFAULT_SCORE, IntervalCalibration, calibrate_intervals, rank_intervals
from ..labels import LabelGrid
from .checkpoint import BEST_NAME, CHECKPOINT_NAME, load_checkpoint
from .config import TrainConfig
from .data import ImageFiles, TextRows, apply_scaling, read_inputs
from .data.frames import (
    FLOAT32_MAX,
    TableOrigin,
    as_arrow_table,
    cell_texts,
    fill_missing,
    is_table_like,
    table_features,
    text_cells,
)
from .data.inputs import SLICE_ROWS, table_slices
from .device import resolve_device
from .loader import RunInputs, embedding_batch_size
from .methods import RankModel, build_model, head_probabilities, head_ranks, make_sol_head
from .text import TEXT_ENCODER_DIR, check_text_encoder

__all__ = ["TrainedModel", "Prediction", "load_run", "model_from_state", "CALIBRATION_KEY"]

# the entry of best.pt holding the rows intervals are calibrated on by default (the validation split)
CALIBRATION_KEY = "interval_calibration"
# the entry of TrainedModel.to_state holding the calibration in use (calibrate_intervals' last)
INTERVALS_KEY = "intervals"

DataLike = Any  # a data spec (built-in name, file or folder path), a data frame or raw features [N, ...]

_DATA_KINDS = ("a file or folder name, a built-in data name, an array of real numbers [N, F] (or images "
               "[N, C, H, W]), or a data frame (pandas, polars, pyarrow.Table)")


def _real_array(data: Any) -> torch.Tensor:
    """``data`` (a tensor, numpy array or nested sequence of real numbers) as float32; ValueError naming
    ``data`` for anything else, and for finite values beyond float32's range."""
    if isinstance(data, torch.Tensor):
        if data.is_complex() or data.dtype == torch.bool or not (data.is_floating_point() or data.dtype in (
                torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)):
            raise ValueError(f"data: expected real numbers, got a tensor of {data.dtype}")
        a = data.detach().cpu().numpy() if data.dtype != torch.bfloat16 else data.detach().cpu().float().numpy()
    else:
        if data is None or isinstance(data, (Mapping, bytes, set, numbers.Number, np.generic)):
            raise ValueError(f"data: expected {_DATA_KINDS}; got {type(data).__name__}")
        try:
            a = np.asarray(data)
        except (ValueError, TypeError) as err:  # rows of different lengths
            raise ValueError(f"data: expected {_DATA_KINDS}; it could not be read as one array ({err})") from None
        if a.dtype.kind not in "iuf" or a.ndim == 0:
            what = "a single value" if a.ndim == 0 else f"an array of {a.dtype}"
            raise ValueError(f"data: expected {_DATA_KINDS}; got {what}")
    if a.size and a.dtype.kind == "f" and a.dtype.itemsize > 4:
        big = np.isfinite(a) & (np.abs(a) > FLOAT32_MAX)
        if big.any():
            where = np.unravel_index(int(np.flatnonzero(big)[0]), a.shape)
            raise ValueError(f"data: the value {float(a[where]):g} at index {list(map(int, where))} overflows "
                             f"float32 (largest magnitude {FLOAT32_MAX:.4g}), the model's input type; rescale "
                             "such features")
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _integer_grid(grid: LabelGrid) -> bool:
    """Whether every label value of the grid is a whole number (integer minimum and step)."""
    return float(grid.min_value).is_integer() and float(grid.step).is_integer()


@dataclass
class Prediction:
    """Predictions for every row of some data.

    Attributes:
        ids: one id per row: the run's id column (``id_name``), a data frame's own index, or else the
            data row number from 0, or the image path.
        ranks: ``[N]`` int64 predicted ranks ``0 … n-1``.
        prediction: ``[N]`` predicted labels, in label units: int64 on a grid of whole numbers
            (integer minimum and step), else float64; float64 with NaN for the rows of
            ``incomplete`` where there are any.
        expected: ``[N]`` float64 expected label ``sum_q value_q p(q | x)`` (NaN: ``incomplete``).
        probabilities: ``[N, n]`` float64 ``p(q | x)``, columns in the order of ``label_values``
            (NaN: ``incomplete``).
        label_values: ``[n]`` float64 the label value of each rank.
        values: ``[N]`` float64 the data's own labels, when it has a label column; else ``None``.
    """

    ids: list[str]
    ranks: np.ndarray
    prediction: np.ndarray
    expected: np.ndarray
    probabilities: np.ndarray
    label_values: np.ndarray
    values: Optional[np.ndarray] = None
    id_name: str = "id"  # the name of the ids: the run's id column, else "id"
    incomplete: Optional[np.ndarray] = None  # [N] bool: rows with a missing feature value (no prediction)
    # whether an id of the data needs quotes in a CSV (set for every slice of TrainedModel.predict_slices,
    # from all its ids); None: look at these ids
    ids_need_quotes: Optional[bool] = None


class TrainedModel:
    """A trained run's encoder, head and preprocessing; see :func:`load_run`.

    ``data`` in the methods below is what ``sol-ext train --data`` accepts (a built-in name, a
    CSV/TSV, Parquet, Feather or ``.npz`` file or an image folder, read with the run's columns and
    categories, the label column optional), a data frame (pandas, polars, ``pyarrow.Table``) read
    by column name the same way, an array of raw features ``[N, F]`` in the training column order
    (after one-hot encoding: :attr:`feature_names`), or images ``[N, C, H, W]`` in [0, 1].
    """

    def __init__(self, config: TrainConfig, model: RankModel, head: Optional[SOLHead],
                 record: dict[str, Any], device: torch.device | str = "cpu", workers: int = 0):
        self.config = config
        # a category of a text column that training did not see: "error", or "ignore" (no
        # category; load_run's handle_unknown= sets it)
        self.handle_unknown = "error"
        # a row with a missing feature value: "mark" (no prediction: NaN), "impute" (filled with the
        # training file's values and predicted; the default of a run trained with --missing impute)
        # or "error"; load_run's missing= sets it
        self.missing = "impute" if record["preprocessing"].get("schema", {}).get("missing") == "impute" else "mark"
        self.device = torch.device(device)
        # DataLoader processes decoding image files for a prediction (0: this process)
        self.workers = int(workers)
        self.model = model.to(self.device).eval()
        self.head = None if head is None else head.to(self.device)
        self.preprocessing = record["preprocessing"]
        self.read_from = record.get("read_from")  # where the run's relative data paths lead
        self.kind = record["kind"]
        self.input_shape = tuple(record["input_shape"])
        grid = self.preprocessing["grid"]
        self.grid = LabelGrid(grid["min_value"], grid["step"], grid["num_ranks"])
        scaling = self.preprocessing["scaling"]
        self.scaling = None if scaling is None else (scaling["mean"].to(torch.float64),
                                                     scaling["std"].to(torch.float64))
        # the calibration of predict_interval (calibrate_intervals), None until there is one
        self.intervals: Optional[IntervalCalibration] = None
        # the held-out rows the run stored to calibrate intervals on (its validation split):
        # {"probabilities": [M, n] float64, "ranks": [M] int64}, or None (set by load_run)
        self.stored_calibration: Optional[dict[str, torch.Tensor]] = None
        # why the stored calibration rows could not be used (a damaged best.pt), or None
        self.stored_calibration_problem: Optional[str] = None

    # -- what the model is -------------------------------------------------------------------
    @property
    def method(self) -> str:
        return self.config.method

    @property
    def num_ranks(self) -> int:
        return self.grid.num_ranks

    @property
    def label_values(self) -> np.ndarray:
        """``[n]`` the label value of each rank (the columns of :meth:`predict_proba`)."""
        return self.grid.values().numpy()

    @property
    def feature_names(self) -> list[str]:
        """The columns of a raw feature array, in order (tabular data; empty otherwise)."""
        return list(self.preprocessing.get("feature_names", []))

    # -- inputs ------------------------------------------------------------------------------
    def features(self, data: DataLike) -> tuple[torch.Tensor | ImageFiles, list[str], Optional[np.ndarray]]:
        """The model's inputs of ``data`` (scaled as in training; image files stay files, decoded
        batch by batch), their ids and labels if any.

        A data frame (pandas, polars) or ``pyarrow.Table`` is read by column name, as a file is:
        the training columns in the training order, categorical ones one-hot with the run's
        categories, a missing column refused by name, other columns ignored; its label column is
        not read. An array must hold exactly the training features ``[N, F]``.
        """
        x, ids, values, _ = self._inputs(data)
        return x, ids, values

    def _inputs(self, data: DataLike) -> tuple[torch.Tensor | ImageFiles, list[str], Optional[np.ndarray],
                                               Optional[np.ndarray]]:
        """:meth:`features`, and the rows of a file with a missing feature value (or None)."""
        incomplete = None
        if isinstance(data, (str, Path)):
            inputs = read_inputs(data, self.preprocessing.get("schema", {}),
                                 delimiter=self.preprocessing.get("delimiter"), handle_unknown=self.handle_unknown,
                                 missing=self.missing)
            x, ids, values, incomplete = inputs.features, inputs.ids, inputs.values, inputs.incomplete
        elif is_table_like(data):
            x, incomplete = self._frame_features(data)
            ids, values = self._frame_ids(data, x.shape[0]), None
        elif self.kind == "text":
            column = self.preprocessing.get("schema", {}).get("text_column")
            raise ValueError(f"data: the run reads texts from a column {column!r}; give a file or a data frame "
                             f"with that column (and the run's other columns), not an array")
        else:
            x = _real_array(data)
            if x.dim() == 1 and len(self.input_shape) == 1:
                x = x[None]
            if self.missing == "impute":
                x = self._imputed_array(x)
            ids, values = [str(i) for i in range(x.shape[0])], None
        return self._model_inputs(data, x), ids, values, incomplete

    def _imputed_array(self, x: torch.Tensor) -> torch.Tensor:
        """Raw features ``x`` [N, F] with a NaN in a numeric column filled with the training file's
        value, as a run trained with ``--missing impute`` fills a file's empty cell (its exported
        program does the same)."""
        fill = self.fill_vector()
        if fill is None or x.dim() != 2 or x.shape[1] != fill.numel():
            return x
        fill = fill.to(x.dtype)
        return torch.where(torch.isnan(x) & ~torch.isnan(fill), fill, x)

    def fill_vector(self) -> Optional[torch.Tensor]:
        """``[F]`` float64: the value a NaN raw feature is imputed with, in :attr:`feature_names`
        order (the training file's median of a numeric column; NaN for a one-hot column, whose
        category is filled before encoding), or None where the run kept no such values."""
        fill = self.preprocessing.get("schema", {}).get("fill_values")
        if not fill or not self.feature_names:
            return None
        return torch.tensor([float(fill[name]) if name in fill and not isinstance(fill[name], str) else float("nan")
                             for name in self.feature_names], dtype=torch.float64)

    def _model_inputs(self, data: DataLike, x: torch.Tensor | ImageFiles) -> torch.Tensor | ImageFiles:
        """Raw inputs ``x`` of ``data`` checked against the run's input shape, finite, and scaled."""
        if tuple(x.shape[1:]) != self.input_shape:
            names = self.feature_names
            detail = f" ({', '.join(names)})" if names and len(names) <= 40 else ""
            raise ValueError(f"data: rows of shape {list(x.shape[1:])}, but the model was trained on "
                             f"{list(self.input_shape)}{detail}")
        if isinstance(x, ImageFiles):
            return x
        if isinstance(x, TextRows):
            return x.with_features(self._model_inputs(data, x.features))
        finite = torch.isfinite(x).flatten(1).all(dim=1)
        if not bool(finite.all()):
            rows = (~finite).nonzero().flatten()
            where = str(data) if isinstance(data, (str, Path)) else "data"
            raise ValueError(f"{where}: {rows.numel()} row(s) have NaN or infinite features, the first row "
                             f"{int(rows[0])} (0-based); drop or impute such rows first")
        return apply_scaling(x, self.scaling)

    def _frame_ids(self, data: Any, n: int) -> list[str]:
        """A data frame's row ids: its cells of the run's id column, else a pandas frame's own
        index where it is not the default 0 … N-1, else the row numbers."""
        id_column = self.preprocessing.get("schema", {}).get("id_column")
        if id_column is not None:
            table = as_arrow_table(data)
            if id_column in table.column_names:
                return cell_texts(table.column(id_column))
        index = getattr(data, "index", None)
        if type(data).__module__.startswith("pandas") and index is not None and not (
                type(index).__name__ == "RangeIndex" and index.start == 0 and index.step == 1):
            return [str(i) for i in index]
        return [str(i) for i in range(n)]

    def _frame_features(self, data: Any) -> tuple[torch.Tensor, Optional[np.ndarray]]:
        """A data frame's features by the run's columns (:func:`~.data.frames.table_features`), and
        its rows with a missing value (as a file's: :attr:`missing`)."""
        schema = self.preprocessing.get("schema", {})
        if "columns" not in schema:
            what = "images" if self.kind == "images" else "arrays without column names"
            # (a text run's schema names its columns: a data frame is read by them)
            raise ValueError(f"data: a data frame gives columns by name, but the model was trained on "
                             f"{what}; pass an array of its {len(self.feature_names) or 'training'} "
                             "features in the training order")
        table = as_arrow_table(data)
        categorical = {k: list(v) for k, v in schema.get("categorical", {}).items()}
        columns, origin = list(schema["columns"]), TableOrigin("data", file=False)
        for name in columns:  # before filling: a missing column is named by table_features
            if name not in table.column_names:
                table_features(table, [name], categorical, origin, self.handle_unknown)
        table, incomplete = fill_missing(table, columns, categorical, origin, self.missing,
                                         schema.get("fill_values") or {})
        text_column = schema.get("text_column")
        if text_column is None:
            x, _, _ = table_features(table, columns, categorical, origin, self.handle_unknown)
            return torch.from_numpy(x), (None if self.missing == "impute" else incomplete)
        if text_column not in table.column_names:
            raise ValueError(f"data has no text column {text_column!r}, which the run reads its texts from; its "
                             f"columns are {table.column_names[:10]}. Give the data that column, by that name")
        x = (table_features(table, columns, categorical, origin, self.handle_unknown)[0] if columns
             else np.zeros((table.num_rows, 0), dtype=np.float32))
        texts = TextRows(text_cells(table.column(text_column), text_column, origin), torch.from_numpy(x))
        return texts, (None if self.missing == "impute" else incomplete)

    # -- predictions -------------------------------------------------------------------------
    @torch.no_grad()
    def embed(self, data: DataLike) -> torch.Tensor:
        """``[N, d]`` embeddings (L2-normalized where the run normalized them)."""
        return self._embed(self.features(data)[0])

    @torch.no_grad()
    def embed_prepared(self, x: torch.Tensor | ImageFiles) -> torch.Tensor:
        """``[N, d]`` embeddings of inputs already preprocessed as the run's (scaled features, or
        images), such as the rows of a training run's prepared data."""
        return self._embed(x)

    def _embed(self, x: torch.Tensor | ImageFiles) -> torch.Tensor:
        batch_size = embedding_batch_size(self.kind, self.config.batch_size)
        inputs = RunInputs(x, self.device, workers=self.workers)
        if self.device.type != "cpu" or self.kind in ("images", "text") or self.config.encoder not in ("auto", "mlp"):
            return inputs.embed(self.model, batch_size)
        # The MLP's passes are many small products, one short parallel region each: beside a busy process
        # the second thread spin-waits on each one (200,000 x 11 rows: 0.37 s on 1 thread, 3.3 s on 2).
        # One thread, as `sol-ext train` uses for the MLP by default; torch's setting is restored after.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return inputs.embed(self.model, batch_size)
        finally:
            torch.set_num_threads(threads)

    @torch.no_grad()
    def predict_table(self, data: DataLike) -> Prediction:
        """Everything :meth:`predict`, :meth:`predict_proba` and the expected value give, at once."""
        return self._predicted(*self._inputs(data))

    def predict_slices(self, data: DataLike, rows_per_slice: int = SLICE_ROWS) -> Iterator[Prediction]:
        """:meth:`predict_table` of ``data`` in consecutive slices of rows, equal row for row to it: a
        table file is read once and converted, embedded and predicted ``rows_per_slice`` rows at a time,
        so that a long file needs the memory of its read and of one slice (``sol-ext predict``); other
        data come as one slice. Each slice's ``ids_need_quotes`` says whether any id of the whole data
        needs CSV quotes. Errors are those of :meth:`predict_table`, raised by the first slice or the
        one that meets the problem."""
        slices = None
        if isinstance(data, (str, Path)):
            try:
                slices = table_slices(data, self.preprocessing.get("schema", {}),
                                      delimiter=self.preprocessing.get("delimiter"),
                                      handle_unknown=self.handle_unknown, rows_per_slice=rows_per_slice,
                                      missing=self.missing)
            except ValueError:
                self._raise_whole_error(data)
                raise
        if slices is None:
            yield self.predict_table(data)
            return
        quoted = slices.ids_need_quotes
        try:
            for inputs in slices:
                x = self._model_inputs(data, inputs.features)
                yield dataclasses.replace(self._predicted(x, inputs.ids, inputs.values, inputs.incomplete),
                                          ids_need_quotes=quoted)
        except ValueError:
            self._raise_whole_error(data)
            raise

    def _raise_whole_error(self, data: DataLike) -> None:
        """The error :meth:`predict_table` gives for ``data``, where reading it in slices met one: a
        slice names its rows from its own start, and reads the labels before the features."""
        self._inputs(data)

    @torch.no_grad()
    def _predicted(self, x: torch.Tensor | ImageFiles, ids: list[str], values: Optional[np.ndarray],
                   incomplete: Optional[np.ndarray]) -> Prediction:
        probabilities, ranks = self.rank_probabilities(self._embed(x))
        label_values = self.grid.values().to(torch.float64)
        probabilities = probabilities.cpu().to(torch.float64)
        expected = (probabilities @ label_values).numpy()
        probabilities = probabilities.numpy()
        prediction = self.grid.decode(ranks.cpu()).numpy()
        if _integer_grid(self.grid):  # whole labels come back as integers, as SOLRanker's do
            prediction = prediction.round().astype(np.int64)
        if incomplete is not None and incomplete.any():
            # a row with a missing feature value has no prediction: NaN, as sol-ext predict leaves it empty
            prediction = np.where(incomplete, np.nan, prediction)
            expected = np.where(incomplete, np.nan, expected)
            probabilities = np.where(incomplete[:, None], np.nan, probabilities)
        return Prediction(ids=ids, ranks=ranks.cpu().numpy(), prediction=prediction,
                          expected=expected, probabilities=probabilities,
                          label_values=label_values.numpy(), values=values,
                          id_name=self.preprocessing.get("schema", {}).get("id_column") or "id",
                          incomplete=incomplete)

    @torch.no_grad()
    def rank_probabilities(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(p [N, n], ranks [N])`` of embeddings ``h`` ``[N, d]`` (:meth:`embed`): the head's rank
        probabilities and its read-out."""
        h = h.to(self.device)
        if self.head is not None:
            d = self.head.dissimilarity(h)
            probabilities = self.head.probabilities(d)
            return probabilities, self.head.ranks(d, probabilities)
        return (head_probabilities(self.method, self.model, h, self.num_ranks),
                head_ranks(self.method, self.model, h, self.num_ranks))

    def predict(self, data: DataLike) -> np.ndarray:
        """``[N]`` predicted labels, in label units (the run's read-out: for SOL by default the
        expected rank against the run's cuts); int64 when the label grid is of whole numbers, else
        float64."""
        return self.predict_table(data).prediction

    def predict_proba(self, data: DataLike) -> np.ndarray:
        """``[N, n]`` probabilities of each label value (:attr:`label_values`)."""
        return self.predict_table(data).probabilities

    def expected(self, data: DataLike) -> np.ndarray:
        """``[N]`` expected label under :meth:`predict_proba`, in label units."""
        return self.predict_table(data).expected

    # -- intervals ---------------------------------------------------------------------------
    def calibrate_intervals(self, data: DataLike, labels: Any = None, *, score: str = DEFAULT_SCORE,
                            target: str = "labels", label_noise: Any = None,
                            deconvolve: bool = True) -> IntervalCalibration:
        """Calibrate :meth:`predict_interval` by split conformal prediction on ``data`` the run did
        not train on, with its labels: a file's label column, or ``labels`` ``[N]`` in label units.
        ``score``, ``target`` and ``deconvolve`` as :func:`sol_ext.intervals.calibrate_intervals`;
        ``label_noise`` (``target="clean"``) is the labels' noise std in label units, or a matrix
        ``[n, n]``. Rows without a prediction (a missing feature value) are left out. The calibration
        is kept on this model (:attr:`intervals`) and returned."""
        table = self.predict_table(data)
        values = table.values if labels is None else np.asarray(labels, dtype=np.float64).reshape(-1)
        file = isinstance(data, (str, Path))
        if values is None:
            column = self.preprocessing.get("schema", {}).get("label_column")
            holds = f"no label column {column!r} (the run's)" if column and file else "no labels"
            raise ValueError(f"{data if file else 'data'}: {holds} to calibrate intervals on; give rows with "
                             f"their labels" + (f" in a column {column!r}" if column else "")
                             + " (in Python: or labels=, one label per row in label units)")
        return self.calibrate_intervals_of(table, values, score=score, target=target, label_noise=label_noise,
                                           deconvolve=deconvolve, where=str(data) if file else "labels",
                                           rows="data row" if file else "index")

    def calibrate_intervals_of(self, table: Prediction, values: np.ndarray, *, where: str = "labels",
                               rows: str = "index", **options: Any) -> IntervalCalibration:
        """:meth:`calibrate_intervals` on rows already predicted (:meth:`predict_table`), with their
        labels ``values`` ``[N]`` in label units; ``options`` as there. A label off the run's grid is
        refused naming ``where`` and its row (``rows``: "data row" for a file, else "index"),
        counted among all of ``table``'s rows."""
        if values.shape[0] != len(table.ids):
            raise ValueError(f"labels: {values.shape[0]} labels for {len(table.ids)} rows of data")
        keep = np.isfinite(table.probabilities).all(axis=1)
        if table.incomplete is not None:
            keep &= ~table.incomplete
        kept = np.flatnonzero(keep)
        try:
            ranks = self.grid.encode(values[keep], position=lambda i: f"{rows} {int(kept[i])}")
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        grid = self.grid
        off = np.flatnonzero(np.abs(grid.decode(ranks).numpy() - values[keep]) > 1e-6 * grid.step)
        if off.size:
            i = int(off[0])
            raise ValueError(f"{where}: label value {values[kept[i]]:g} ({rows} {int(kept[i])}) is not a value of the run's "
                             f"grid {grid.min_value:g} … {grid.max_value:g} (step {grid.step:g}); {off.size} "
                             f"value(s) are not: give the labels in the run's units")
        return self._calibrate(torch.from_numpy(table.probabilities[keep]), ranks, **options)

    def calibrate_intervals_on_validation(self, **options: Any) -> IntervalCalibration:
        """:meth:`calibrate_intervals` on the rows the run stored for it: its validation split, with the
        labels as given (``sol-ext train`` stores them in ``best.pt``; :func:`load_run` calibrates on
        them with the default score). ``options`` as :meth:`calibrate_intervals`.

        Raises:
            RuntimeError: the run stored no calibration rows (it had no validation split, or was
                trained by a version of sol_ext that did not store them).
        """
        if self.stored_calibration is None and self.stored_calibration_problem is not None:
            raise RuntimeError(self.stored_calibration_problem)
        if self.stored_calibration is None:
            raise RuntimeError("the run holds no calibration rows (trained without a validation split, or by "
                               "an earlier version of sol_ext): call calibrate_intervals() on held-out data "
                               "with labels")
        stored = self.stored_calibration
        return self._calibrate(stored["probabilities"], stored["ranks"], **options)

    def _calibrate(self, probabilities: torch.Tensor, ranks: torch.Tensor, *, score: str = DEFAULT_SCORE,
                   target: str = "labels", label_noise: Any = None,
                   deconvolve: bool = True) -> IntervalCalibration:
        """The calibration of ``probabilities [M, n]`` and their label ranks ``[M]``, kept on the model."""
        noise = label_noise
        if isinstance(noise, numbers.Real) and not isinstance(noise, bool):
            noise = float(noise) / self.grid.step  # label units -> ranks
        self.intervals = calibrate_intervals(probabilities, ranks, score=score, target=target,
                                             label_noise=noise, deconvolve=deconvolve)
        return self.intervals

    def predict_interval(self, data: DataLike, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)``: ``[N]`` float64 label values bounding a contiguous interval per row that
        holds its label (or clean rank, by the calibration's target) with probability ``coverage``,
        after :meth:`calibrate_intervals`; NaN for a row without a prediction."""
        return self.intervals_of(self.predict_table(data), coverage)

    def intervals_of(self, table: Prediction, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict_interval` of rows already predicted (:meth:`predict_table`)."""
        if self.intervals is None:
            raise RuntimeError("no interval calibration: the run stored none (trained without a validation "
                               "split, or by an earlier version of sol_ext); call calibrate_intervals() on "
                               "held-out data with labels first")
        keep = np.isfinite(table.probabilities).all(axis=1)
        lower, upper = np.full(len(keep), np.nan), np.full(len(keep), np.nan)
        if keep.any():
            low, high = rank_intervals(torch.from_numpy(table.probabilities[keep]), self.intervals, coverage)
            lower[keep], upper[keep] = self.grid.decode(low).numpy(), self.grid.decode(high).numpy()
        return lower, upper

    def to_state(self) -> dict[str, Any]:
        """The entries of ``best.pt`` that :func:`model_from_state` rebuilds this model from (CPU),
        with the interval calibration in use (that of the last :meth:`calibrate_intervals`, which a
        pickled ``SOLRanker`` keeps)."""
        return {
            "predictor": {"config": self.config.to_dict(), "input_shape": list(self.input_shape),
                          "kind": self.kind, "preprocessing": self.preprocessing, "read_from": self.read_from},
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "head": None if self.head is None else {k: v.detach().cpu()
                                                    for k, v in self.head.state_dict().items()},
            **({} if self.stored_calibration is None else {CALIBRATION_KEY: dict(self.stored_calibration)}),
            **({} if self.intervals is None else {INTERVALS_KEY: self.intervals.to_state()}),
        }

    def __repr__(self) -> str:
        return (f"TrainedModel(method={self.method!r}, kind={self.kind!r}, ranks={self.num_ranks} "
                f"({self.grid.min_value:g} … {self.grid.max_value:g} step {self.grid.step:g}))")


def load_run(path: str | Path, device: torch.device | str = "cpu", workers: int = 0,
             handle_unknown: str = "error", missing: Optional[str] = None) -> TrainedModel:
    """The model of a ``sol-ext train`` run folder (its selected epoch, ``best.pt``; the last
    checkpoint where there is none), ready to predict. Runs of every method load. A run that stored
    its validation split's probabilities (``sol-ext train`` does) comes with its rank intervals
    calibrated on them: :meth:`TrainedModel.predict_interval` needs no data.

    ``handle_unknown``: a category of a text column that training did not see is an error
    (``"error"``, the default) or none of its column's categories (``"ignore"``: its one-hot
    features all 0, as scikit-learn's ``OneHotEncoder(handle_unknown="ignore")``).

    ``missing``: a row of a file or data frame with a missing feature value gets no prediction
    (``"mark"``: NaN prediction, expected, probabilities and interval, as ``sol-ext predict`` leaves
    the row empty), is filled with the training file's median or most common category and predicted
    (``"impute"``; a NaN of a raw feature array too), or is refused (``"error"``). Default: ``"impute"``
    for a run trained with ``--missing impute``, else ``"mark"``.

    Raises:
        FileNotFoundError: ``path`` holds no run.
        ValueError: the run was written by a version of sol_ext that did not save what prediction
            needs (retrain it).
    """
    path = Path(path)
    if path.is_dir():
        file = path / BEST_NAME if (path / BEST_NAME).is_file() else path / CHECKPOINT_NAME
    else:
        file = path
    if not file.is_file():
        raise FileNotFoundError(f"no trained run in {str(path)!r}: expected the output folder of "
                                f"'sol-ext train' (with {BEST_NAME}).")
    if handle_unknown not in ("error", "ignore"):
        raise ValueError(f"handle_unknown={handle_unknown!r}; expected 'error' or 'ignore'")
    if missing not in (None, "mark", "impute", "error"):
        raise ValueError(f"missing={missing!r}; expected 'mark', 'impute' or 'error'")
    model = model_from_state(load_checkpoint(file), device, source=str(file), workers=workers, run_dir=file.parent)
    model.handle_unknown = handle_unknown
    if missing is not None:
        model.missing = missing
    return model


def _stored_calibration_problem(stored: Any, n: int) -> Optional[str]:
    """What is wrong with a run's stored calibration rows (``[M, n]`` probabilities, ``[M]`` ranks in
    ``0 … n-1``), or None."""
    try:
        p, r = stored["probabilities"], stored["ranks"]
        if p.dim() != 2 or p.shape[1] != n or r.shape != (p.shape[0],):
            return f"probabilities {list(p.shape)} and ranks {list(r.shape)} for {n} ranks"
        if r.numel() and (int(r.min()) < 0 or int(r.max()) >= n):
            return f"ranks {int(r.min())} … {int(r.max())}, outside 0 … {n - 1}"
        if not bool(torch.isfinite(p).all()):
            return "probabilities that are not finite"
    except (KeyError, TypeError, AttributeError, RuntimeError) as exc:
        return type(exc).__name__
    return None


def model_from_state(state: dict[str, Any], device: torch.device | str = "cpu",
                     source: str = "the state", workers: int = 0, run_dir: Optional[Path] = None) -> TrainedModel:
    """A :class:`TrainedModel` from the ``predictor``, ``model`` and ``head`` entries of a run's
    ``best.pt`` (or of :meth:`TrainedModel.to_state`). A text run's encoder and tokenizer are those of
    ``run_dir/text_encoder`` (checked against the checksums in ``best.pt``)."""
    record = state.get("predictor")
    if record is None or record.get("preprocessing") is None:
        raise ValueError(f"{source} was written by an earlier version of sol_ext that did not save the "
                         f"preprocessing prediction needs; train the run again.")
    # the weights come from the run: never read a pretrained-weights file again
    config = dataclasses.replace(TrainConfig.from_dict(record["config"]), weights=None)
    n = int(record["preprocessing"]["grid"]["num_ranks"])
    text_encoder = None
    if record["kind"] == "text":
        if run_dir is None:
            raise ValueError(f"{source} is a text run's model, whose encoder and tokenizer are in its run folder: "
                             "load it with sol_ext.driver.load_run(RUN)")
        text_encoder = Path(run_dir) / TEXT_ENCODER_DIR
        check_text_encoder(text_encoder, record.get("text_encoder_files"))
    try:
        model = build_model(config, tuple(record["input_shape"]), record["kind"], n, text_encoder=text_encoder)
        model.load_state_dict(state["model"])
        head = None
        if config.uses_centroids:
            head = make_sol_head(config, n)
            head.load_state_dict(state["head"])
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        # the weights were saved by the settings beside them: a mismatch is a file changed by hand
        raise ValueError(f"{source} does not match its own settings ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}): the file was edited or damaged; "
                         f"restore it from a copy, or train the run again.") from None
    trained = TrainedModel(config, model, head, record, resolve_device(str(device)), workers)
    stored = state.get(CALIBRATION_KEY)
    if stored is not None:  # the run's validation split: intervals need no data
        problem = _stored_calibration_problem(stored, n)
        if problem is None:
            trained.stored_calibration = {"probabilities": stored["probabilities"].to(torch.float64),
                                          "ranks": stored["ranks"].to(torch.int64)}
            trained.calibrate_intervals_on_validation()
        else:  # a prediction without intervals needs none of it
            trained.stored_calibration_problem = (
                f"{source}: its stored calibration rows are damaged ({problem}); restore the file from a "
                f"copy, or calibrate on held-out rows with labels (sol-ext predict --calibration FILE)")
    if state.get(INTERVALS_KEY) is not None:  # to_state's: the calibration that was in use
        trained.intervals = IntervalCalibration.from_state(state[INTERVALS_KEY])
    return trained
