"""A scikit-learn estimator around the training driver: :class:`SOLRanker`.

``SOLRanker().fit(X, y)`` trains SOL (or a baseline, ``method=``) on a feature array ``X [N, F]``
and labels ``y [N]`` on an ordered numeric scale, exactly as ``sol-ext train`` trains on a table
(same defaults, same standardization, same validation split and model selection), and predicts
in the labels' own units::

    from sol_ext.driver.sklearn import SOLRanker

    ranker = SOLRanker().fit(X_train, ages)          # ages 16 … 77, possibly noisy
    ranker.predict(X_test)                           # ages (least-MAE read-out)
    ranker.predict_proba(X_test)                     # [M, 62] p(age | x), columns ranker.classes_
    ranker.score(X_test, true_ages)                  # -MAE (higher is better)

The labels are taken as given (no noise is added: they may be noisy already; SOL is built for
that). The run's summary (selected epoch, sigma search, relabeling counts, per-epoch history) is
``history_``.

This module needs scikit-learn (``pip install 'sol_ext[train]'``); the rest of the package does not.
"""

from __future__ import annotations

try:
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.utils import check_random_state
    from sklearn.utils.validation import (
        assert_all_finite,
        check_consistent_length,
        check_is_fitted,
        column_or_1d,
        validate_data,
    )
except ImportError as exc:  # validate_data is scikit-learn >= 1.6
    raise ImportError("sol_ext.driver.sklearn needs scikit-learn >= 1.6: pip install 'sol_ext[train]' "
                      "(or pip install scikit-learn).") from exc

import contextlib
import numbers
import re
from typing import Any, Iterator, Optional

import numpy as np
import torch

from ..intervals import DEFAULT_SCORE
from ..labels import LabelGrid
from .calibration import store_validation_calibration, validation_probabilities
from .config import PAPER_SETTINGS, TrainConfig
from .data import OrdinalDataset, apply_scaling, feature_scaling
from .data.frames import (
    TableOrigin,
    as_arrow_table,
    fill_missing,
    fill_values,
    has_column_names,
    is_table_like,
    table_features,
    text_columns,
)
from .model import model_from_state
from .prepare import PreparedData, preprocessing_record
from .train import check_run, fit_run, validation_split

__all__ = ["SOLRanker", "EXPECTED_FAILED_CHECKS", "CONFIG_PARAMS"]

# The estimator's parameters that are TrainConfig fields, with TrainConfig's defaults; the seed is
# random_state, scikit-learn's name for it. Left out: the data options (data, test_data,
# label_column, delimiter, test_fraction: the estimator gets arrays and has no test set), the
# label noise added to training labels (noise, kappa, noise_fraction: labels are taken as given),
# the encoder and the image options (arrays are vectors: always the MLP; weights, image_size,
# augment, workers) and cs_theta (a test-set metric).
CONFIG_PARAMS = (
    "method", "epochs", "batch_size", "lr", "weight_decay", "embedding_dim", "hidden", "sigma",
    "tau", "margin", "val_fraction", "device", "T", "disc_weight", "beta", "convention",
    "pairs", "pairs_per_class", "refine", "relabel", "relabel_mass", "label_noise", "readout",
    "momentum", "patience", "normalize", "amp", "backend", "weight_ema",
)

# sklearn.utils.estimator_checks checks that SOLRanker cannot pass, with the reason; the tests
# pass this as ``expected_failed_checks`` (check_estimator / parametrize_with_checks).
EXPECTED_FAILED_CHECKS = {
    "check_classifiers_classes":
        "string class labels ('one', 'two', …) are refused: an ordinal ranker needs labels that are "
        "numbers on an ordered scale",
    "check_classifiers_train":
        "asserts predict == argmax(predict_proba): SOL's read-out aims at the least absolute error "
        "(the expected rank against cuts fitted to the labels, or the median of predict_proba), which "
        "differs on make_blobs' three unordered classes (2 epochs also stay below its 0.83 training "
        "accuracy)",
    "check_dataframe_column_names_consistency":
        "a data frame's columns are taken by name, as load_run's models take them: the training "
        "columns in another order are reordered, not refused (unseen or missing names are refused)",
    "check_methods_subset_invariance":
        "the encoder runs in float32: a matrix product over a batch of another size rounds "
        "differently (~1e-7), above the check's tolerance of 1e-7 on predict_proba (predictions agree)",
}

# The validation split must leave at least this many samples to train on (unless it holds out
# fewer: a data set of 10 samples still trains on 9), of at least two ranks.
MIN_FIT_SAMPLES = 10

_NOT_NUMBERS = ("SOLRanker: labels must be numbers on an ordered scale (ranks, ages, scores, "
                "grades as numbers); got {what}. An ordinal ranker needs the order of the labels: "
                "map named levels to numbers first, e.g. {{'low': 0, 'mid': 1, 'high': 2}}.")


class SOLRanker(ClassifierMixin, BaseEstimator):
    """Stochastic Order Learning (rank estimation from noisy labels) as a scikit-learn estimator.

    ``fit`` runs the training driver (:func:`sol_ext.driver.train.train`, what ``sol-ext train``
    runs) on the arrays: ``X`` is standardized with the training set's mean and std (kept in the
    model and applied to new data), ``y`` is put on its label grid (``LabelGrid.fit``: ranks
    ``min(y), min(y) + step, …, max(y)`` with the step inferred from the labels), a stratified
    ``val_fraction`` of the samples picks the epoch (and ``sigma="auto"``), and the selected model
    is kept as ``model_``.

    It is a classifier over ordered classes (as ``mord.LogisticAT`` is): ``classes_`` are the
    label values of the grid's ranks, ``predict_proba`` gives ``p(label | x)`` over them and
    ``predict`` one of them. Unlike a plain classifier it uses the order: the default SOL read-out
    thresholds the expected rank under ``p(label | x)`` at cuts fitted to the training labels for
    least absolute error (``readout="posterior"``: the *median* of ``p(label | x)``, the label of
    least expected absolute error), not its most probable label, and ``score`` is the negative mean
    absolute error.

    Parameters are the options of ``sol-ext train`` (:class:`sol_ext.driver.config.TrainConfig`)
    that apply to arrays, with the same defaults and meaning; see docs/driver.md.
    They are checked in ``fit`` (``TrainConfig.validate``: a ``ValueError`` naming the option).

    Args:
        method: ``"sol"``, ``"sol-no-noise"`` (plain order learning), or a baseline with the same
            encoder and budget: ``"l1"``, ``"ce"``, ``"corn"`` (needs ``coral-pytorch``).
        epochs, batch_size, lr: Adam's training budget.
        weight_decay: Adam's L2 weight decay; ``"auto"``, the default: 0.01 x the number of ranks
            for the SOL methods (the estimator's encoder is an MLP), 5e-4 for the baselines (see
            ``sol-ext train --weight-decay``).
        weight_ema: decay per step of a moving average of the weights that becomes the model
            (0: off; ``"auto"``, the default: over the last tenth of the steps so far for the SOL
            methods, off for the baselines; see ``sol-ext train --weight-ema``).
        embedding_dim, hidden: the MLP encoder's embedding size and hidden widths.
        sigma: std in ranks of SOL's noise model, or ``"auto"``: picked from 0.25, 0.5 and 1 on the
            validation split, one training per candidate (3 trainings).
        tau, margin, T, disc_weight, beta, convention, pairs, pairs_per_class: SOL's loss and
            relabeling settings (docs/math.md §1, §8, §11, §12).
        val_fraction: share of the samples held out (stratified) to pick the epoch of best MAE on
            their given labels; 0: the last epoch is the model (then ``sigma="auto"`` is 1).
        random_state: seeds the split, the initialization and the shuffling: the same integer,
            the same data, the same model (on the same machine and torch version). ``None`` or a
            ``numpy.random.RandomState`` draw the driver's seed (from numpy's global generator, or
            from the given one) at each ``fit``; ``history_["config"]["seed"]`` records it.
        device: ``"auto"`` (the default: CUDA when available, else the CPU), ``"cpu"``, ``"cuda"`` or
            ``"cuda:N"``; the model is kept there.
        paper: the paper's Algorithm 1 (``sol-ext train --paper``): each setting of
            ``sol_ext.driver.config.PAPER_SETTINGS`` takes the paper's value unless its parameter
            was changed from the default (as options given beside ``--paper`` still apply; a
            parameter set to its default value counts as unchanged).
        refine, relabel, relabel_mass, label_noise: the relabeling of training labels (``sol``).
            The default posterior rule leaves the model as it is (the encoder trains on the given
            labels; ``history_`` counts the labels it would correct); the paper's ``"outlier"``
            rule trains on its relabels.
        readout: ``"cuts"`` (the expected rank under ``p(q|x)`` against cuts fitted to the
            training labels; the default, as ``sol-ext train``'s), ``"posterior"`` (median of
            ``p(q|x)``) or ``"nearest"`` (paper eq. 6).
        momentum, patience, normalize, amp, backend: as ``sol-ext train``.
        threads: torch CPU threads during ``fit`` and prediction (restored after): 0 is 1 thread,
            as ``sol-ext train --threads 0`` uses for the MLP (its small products lose more to
            thread hand-offs than they gain).
        verbose: 0 or False (default): ``fit`` prints nothing; 1 or more, or True: it prints the
            training driver's progress, one line per epoch, as ``sol-ext train`` does.
        handle_unknown: a category of a data frame's text column that ``fit`` did not see, at
            prediction: ``"error"`` (default) names it; ``"ignore"`` encodes it as none of its
            column's categories (its one-hot features all 0), as ``OneHotEncoder`` does.
        missing: a missing feature value (NaN, or an empty cell of a data frame): ``"error"``
            (default) refuses it; ``"impute"`` fills it with its column's median (a text column's
            most common value) among ``fit``'s rows, in ``fit`` and at prediction alike, as
            ``sol-ext train --missing impute`` does.

    ``X`` may be a dense array, a scipy sparse matrix (what ``OneHotEncoder`` gives by default; it
    is made dense, since the encoder is an MLP) or a data frame.

    Attributes:
        model_: the trained :class:`sol_ext.driver.model.TrainedModel` (it predicts from raw
            feature arrays; ``model_.embed(X)`` gives the embeddings).
        classes_: ``[n]`` the label value of every rank of the grid, ascending: the columns of
            :meth:`predict_proba`, and every prediction is one of them. They are the grid's values,
            not ``np.unique(y)``: labels 1, 2, 4 give classes 1, 2, 3, 4, since an ordinal model
            may predict a rank between seen labels. In ``y``'s dtype when that holds them exactly
            (integer labels), else float64.
        n_features_in_, feature_names_in_: as every scikit-learn estimator.
        history_: the run's results (``results.json`` of ``sol-ext train``: configuration, the
            selected epoch, validation MAE, sigma search, relabeling counts, per-epoch history);
            its ``"test"`` is ``None`` (no test set).
    """

    def __init__(self, method: str = "sol", epochs: int = 20, batch_size: int = 64, lr: float = 1e-3,
                 weight_decay: float | str = "auto", embedding_dim: int = 16,
                 hidden: tuple[int, ...] = (128, 128), sigma: float | str = "auto", tau: int = 1,
                 margin: float = 0.25, val_fraction: float = 0.1,
                 random_state: int | np.random.RandomState | None = 0,
                 device: str = "auto", paper: bool = False, T: int = 1, disc_weight: float = 1.0,
                 beta: float = 0.9, convention: str = "paper", pairs: str = "all",
                 pairs_per_class: int = 32, refine: Optional[bool] = None,
                 relabel: str = "posterior", relabel_mass: float = 0.98,
                 label_noise: float | str = "auto", readout: str = "cuts",
                 momentum: float = 0.5, patience: Optional[int] = None,
                 normalize: bool = True, amp: bool = False, backend: str = "auto", threads: int = 0,
                 weight_ema: float | str = "auto", verbose: int = 0,
                 handle_unknown: str = "error", missing: str = "error"):
        self.method = method
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.weight_ema = weight_ema
        self.embedding_dim = embedding_dim
        self.hidden = hidden
        self.sigma = sigma
        self.tau = tau
        self.margin = margin
        self.val_fraction = val_fraction
        self.random_state = random_state
        self.device = device
        self.paper = paper
        self.T = T
        self.disc_weight = disc_weight
        self.beta = beta
        self.convention = convention
        self.pairs = pairs
        self.pairs_per_class = pairs_per_class
        self.refine = refine
        self.relabel = relabel
        self.relabel_mass = relabel_mass
        self.label_noise = label_noise
        self.readout = readout
        self.momentum = momentum
        self.patience = patience
        self.normalize = normalize
        self.amp = amp
        self.backend = backend
        self.threads = threads
        self.verbose = verbose
        self.handle_unknown = handle_unknown
        self.missing = missing

    # -- configuration ---------------------------------------------------------------------
    def train_config(self) -> TrainConfig:
        """The driver configuration of these parameters, checked (``ValueError`` naming a bad one)."""
        values = {name: getattr(self, name) for name in CONFIG_PARAMS}
        if self.paper:
            defaults = TrainConfig()
            for name, value in PAPER_SETTINGS.items():
                # a setting SOLRanker has no parameter for (a text run's text_lr) is the command line's
                if name in values and _same(values[name], getattr(defaults, name)):
                    values[name] = value
        try:
            hidden = values["hidden"]
            values["hidden"] = ((hidden,) if isinstance(hidden, numbers.Integral) else tuple(hidden))
            if not all(isinstance(h, numbers.Integral) and not isinstance(h, bool)
                       for h in values["hidden"]):
                raise ValueError(f"hidden widths must be integers >= 1, got {hidden!r}.")
            config = TrainConfig(data="array", noise="none", encoder="auto", seed=self._seed(), **values)
            return config.validate()
        except TypeError as err:  # a value of the wrong type, e.g. epochs="ten"
            raise ValueError(f"SOLRanker: a parameter has a value of the wrong type: {err}") from None

    def _seed(self) -> int:
        """The driver's seed of ``random_state``."""
        state = self.random_state
        if isinstance(state, numbers.Integral) and not isinstance(state, (bool, np.bool_)):
            if not 0 <= state <= np.iinfo(np.uint32).max:
                raise ValueError(f"random_state must be an integer in 0 … 2**32 - 1, got {state}.")
            return int(state)
        if state is None or isinstance(state, np.random.RandomState):
            return int(check_random_state(state).randint(np.iinfo(np.int32).max))
        raise ValueError(f"random_state must be None, an integer >= 0 or a numpy.random.RandomState, "
                         f"got {state!r}.")

    def _threads(self) -> int:
        t = self.threads
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
            raise ValueError(f"threads must be an integer >= 0, got {t!r}.")
        return int(t) or 1

    # -- fitting -----------------------------------------------------------------------------
    def fit(self, X: Any, y: Any) -> "SOLRanker":
        """Train on features ``X [N, F]`` and labels ``y [N]`` (numbers on an ordered scale, on a
        grid: integers, or e.g. 0, 0.5, 1.0, …). Returns ``self``."""
        config = self.train_config()
        threads = self._threads()
        verbose = self.verbose
        if not isinstance(verbose, numbers.Integral) or verbose < 0:  # bools are integers here
            raise ValueError(f"verbose must be an integer >= 0 or a bool (0: silent), got {verbose!r}.")
        impute = self._imputes()
        if is_table_like(X) and has_column_names(X):  # columns by name; text columns one-hot
            X, y, names, schema = self._frame_inputs(X, y)
        else:
            X, y = validate_data(self, X, y, dtype=[np.float64, np.float32], accept_sparse=True,
                                 ensure_all_finite="allow-nan" if impute else True)
            X = _dense(X)
            names = (list(map(str, self.feature_names_in_)) if hasattr(self, "feature_names_in_")
                     else [f"x{i}" for i in range(X.shape[1])])
            schema = {"format": "array"}
            if impute:  # each column's median among the rows present, kept for prediction
                fill = _column_medians(X)
                X = np.where(np.isnan(X), fill[None, :], X)
                schema.update(missing="impute", fill_values=dict(zip(names, map(float, fill))))
        values, label_dtype = _numeric_labels(y)
        if values.size == 0:
            raise ValueError("SOLRanker.fit: X and y have no rows (an empty data set); expected at least "
                             "two samples of two distinct labels.")
        if np.unique(values).size < 2:
            raise ValueError(f"SOLRanker needs at least two distinct labels (classes) to rank; got "
                             f"one class, {values[0]:g}.")
        try:
            encoder = LabelGrid.fit(values)
        except ValueError as err:  # e.g. continuous labels: no grid
            # SOLRanker takes no step=: its advice is to round y, not the LabelGrid's own options
            advice = re.sub(r" \(in Python: [^)]*\)", "", str(err))
            raise ValueError(f"SOLRanker: {advice}") from None
        ranks = encoder.encode(values)
        split = None  # checked here; the run's checks decide the same split
        if config.val_fraction > 0:
            try:
                split = validation_split(ranks, config.val_fraction, config.seed)
                fit_rows = split.fit
            except ValueError:
                raise ValueError(f"val_fraction={config.val_fraction:g} of {len(values)} samples leaves "
                                 f"an empty validation split or nothing to train on; give more "
                                 f"samples or val_fraction=0 (then the last epoch is the model).") from None
            n_fit, n_val = len(fit_rows), len(values) - len(fit_rows)
            fit_ranks = ranks[fit_rows].unique().numel()
            if (n_fit < MIN_FIT_SAMPLES and n_fit < n_val) or fit_ranks < 2:
                raise ValueError(f"val_fraction={config.val_fraction:g} of {len(values)} samples leaves "
                                 f"{n_fit} sample(s) of {fit_ranks} rank(s) to train "
                                 f"on (and {n_val} to validate); training needs at least "
                                 f"{MIN_FIT_SAMPLES} samples of two ranks or more: lower val_fraction, or "
                                 f"0 (then the last epoch is the model).")
        # float32 (a copy: X may be read-only), as the driver holds a table's features
        dataset = OrdinalDataset(torch.tensor(X, dtype=torch.float32), ranks, encoder, "array",
                                 "tabular", feature_names=tuple(names), schema=schema)
        data = _prepared(dataset)
        with _torch_threads(threads):  # in memory: nothing is written, not even to a temp dir
            config.validate()
            log = print if verbose else lambda _line: None
            outcome = fit_run(check_run(config, data, None, False, log=log))
            model = model_from_state(outcome.best_state, device=config.device)
            # as a run does: the validation split's probabilities calibrate predict_interval
            store_validation_calibration(model, validation_probabilities(model, data, split and split.val))
        self.model_ = model
        self.classes_ = _classes(encoder, label_dtype)
        self.history_ = outcome.results
        return self

    def _frame_inputs(self, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray, list[str], dict[str, Any]]:
        """A data frame's features ``[N, F]`` (its text columns one-hot, categories sorted), the
        labels, the feature names and the schema that reads new frames by column name; sets
        ``feature_names_in_`` and ``n_features_in_`` (the frame's columns)."""
        table = as_arrow_table(X, "X")
        columns = table.column_names
        categorical = {c: [] for c in text_columns(table)}
        origin = TableOrigin("X", file=False)
        fill = None
        if self._imputes():
            fill = fill_values(table, columns, categorical, origin)
            table, _ = fill_missing(table, columns, categorical, origin, "impute", fill)
        x, names, used = table_features(table, columns, categorical, origin)
        y = column_or_1d(np.asarray(y), warn=True)
        if y.dtype.kind in "fc":
            assert_all_finite(y, input_name="y")
        check_consistent_length(x, y)
        self.feature_names_in_ = np.asarray(columns, dtype=object)
        self.n_features_in_ = len(columns)
        schema = {"format": "table", "columns": columns, "categorical": used, "label_column": None}
        if fill is not None:
            schema.update(missing="impute", fill_values=fill)
        return x, y, names, schema

    def _imputes(self) -> bool:
        """Whether ``missing`` is "impute" (checked: "error" or "impute")."""
        if self.missing not in ("error", "impute"):
            raise ValueError(f"missing={self.missing!r}; expected 'error' or 'impute'")
        return self.missing == "impute"

    # -- prediction --------------------------------------------------------------------------
    def _table(self, X: Any):
        check_is_fitted(self, "model_")
        if self.handle_unknown not in ("error", "ignore"):
            raise ValueError(f"handle_unknown={self.handle_unknown!r}; expected 'error' or 'ignore'")
        self.model_.handle_unknown = self.handle_unknown
        self.model_.missing = "impute" if self._imputes() else "error"
        schema = self.model_.preprocessing.get("schema", {})
        if is_table_like(X) and has_column_names(X) and "columns" in schema:  # by name, as fitted
            with _torch_threads(self._threads()):
                return self.model_.predict_table(X)
        if schema.get("categorical"):
            raise ValueError(f"X: SOLRanker was fitted on a data frame with categorical columns "
                             f"{sorted(schema['categorical'])}; pass a data frame with its columns "
                             f"{list(schema['columns'])}, not an array")
        if is_table_like(X) and not type(X).__module__.startswith("pandas"):
            table = as_arrow_table(X, "X")  # polars, pyarrow: by position, as an array
            X = table_features(table, table.column_names, {}, TableOrigin("X", file=False))[0]
        X = _dense(validate_data(self, X, reset=False, dtype=[np.float64, np.float32], accept_sparse=True,
                                 ensure_all_finite="allow-nan" if self._imputes() else True))
        with _torch_threads(self._threads()):
            return self.model_.predict_table(X)

    def predict(self, X: Any) -> np.ndarray:
        """``[N]`` predicted labels, each one of ``classes_``: the run's read-out (for SOL by
        default the expected rank under :meth:`predict_proba` against cuts fitted to the training
        labels; ``readout="posterior"``: its median, ``"nearest"``: paper eq. 6; baselines:
        their head's prediction)."""
        table = self._table(X)  # checks that the estimator is fitted
        if table.incomplete is not None and table.incomplete.any():  # not after missing="impute"
            raise ValueError("X: rows with a missing value; pass missing='impute' or fill them first")
        return self.classes_[table.ranks]

    def predict_proba(self, X: Any) -> np.ndarray:
        """``[N, len(classes_)]`` probability of each label value ``classes_``; rows sum to 1."""
        p = self._table(X).probabilities
        return p / p.sum(axis=1, keepdims=True)

    def expected(self, X: Any) -> np.ndarray:
        """``[N]`` float64 expected label ``sum_k classes_[k] * p_k(x)`` (label units)."""
        return self._table(X).expected

    def calibrate_intervals(self, X: Any, y: Any, *, score: str = DEFAULT_SCORE, target: str = "labels",
                            label_noise: Any = None, deconvolve: bool = True) -> "SOLRanker":
        """Calibrate :meth:`predict_interval` by split conformal prediction on held-out rows ``X`` with
        labels ``y`` (rows :meth:`fit` did not train on); options as
        :meth:`sol_ext.driver.model.TrainedModel.calibrate_intervals` (docs/intervals.md). Returns
        ``self``."""
        table = self._table(X)
        self.model_.calibrate_intervals_of(table, _true_labels(y, len(table.ids)), score=score, target=target,
                                           label_noise=label_noise, deconvolve=deconvolve)
        return self

    def predict_interval(self, X: Any, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)``: ``[N]`` label values bounding an interval per row that holds its label with
        probability ``coverage``: calibrated by :meth:`fit` on its validation split (the default score,
        labels as given), or by the last :meth:`calibrate_intervals`, which replaces it."""
        check_is_fitted(self)
        if self.model_.intervals is None:
            raise RuntimeError("SOLRanker.predict_interval: no interval calibration, since fit had no validation "
                               "split (val_fraction=0); call calibrate_intervals(X_cal, y_cal) with held-out rows "
                               "and their labels first")
        lower, upper = self.model_.intervals_of(self._table(X), coverage)
        if self.classes_.dtype.kind in "iu" and np.isfinite(lower).all() and np.isfinite(upper).all():
            # integer labels: the bounds are classes, in predict's dtype
            return lower.astype(self.classes_.dtype), upper.astype(self.classes_.dtype)
        return lower, upper

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Negative mean absolute error of :meth:`predict` against ``y``, in label units.

        Higher is better, as scikit-learn's model selection (``GridSearchCV``, ``cross_val_score``)
        expects of ``score``. The MAE is what rank estimation is judged by and what the default
        read-out is fitted for (the cuts are those of least MAE on the training labels);
        a classifier's accuracy would count a prediction one rank off the same as one ten ranks off.
        """
        predicted = self.predict(X).astype(np.float64)
        y_true = _true_labels(y, len(predicted))
        weights = None if sample_weight is None else _sample_weights(sample_weight, len(predicted))
        return -float(np.average(np.abs(predicted - y_true), weights=weights))

    # -- scikit-learn metadata -----------------------------------------------------------------
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = self.missing == "impute"
        tags.input_tags.sparse = True
        tags.target_tags.required = True
        tags.classifier_tags.multi_class = True
        tags.classifier_tags.multi_label = False
        return tags

    # -- pickling ------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The fitted model travels as its state dicts (portable across devices), not as modules."""
        state = dict(super().__getstate__())  # a copy: object.__getstate__ gives __dict__ itself
        model = state.pop("model_", None)
        if model is not None:
            state["_model_state"] = model.to_state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        saved = state.pop("_model_state", None)
        super().__setstate__(state)
        if saved is not None:
            device = saved["predictor"]["config"]["device"]
            if device.startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"  # a model fitted on a GPU, unpickled where there is none
            self.model_ = model_from_state(saved, device)


# ----------------------------------------------------------------------------------------------
# helpers


def _dense(X: Any) -> np.ndarray:
    """``X`` as a dense array (a scipy sparse matrix made dense: the MLP takes dense rows)."""
    return X.toarray() if hasattr(X, "toarray") else X


def _column_medians(X: np.ndarray) -> np.ndarray:
    """Each column's median over its values present (0 for a column without any), as
    ``sol-ext train --missing impute`` fills a table's cells."""
    present = ~np.isnan(X)
    medians = np.zeros(X.shape[1])
    for j in range(X.shape[1]):
        if present[:, j].any():
            medians[j] = float(np.median(X[present[:, j], j]))
    return medians


def _same(a: Any, b: Any) -> bool:
    """Whether parameter value ``a`` is the default ``b`` (``paper=True`` overrides only those)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return tuple(a) == tuple(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _numeric_labels(y: np.ndarray) -> tuple[np.ndarray, np.dtype]:
    """``y`` as float64 ``[N]`` and the dtype predictions should come back in; ValueError for
    labels that are not numbers (strings, categories)."""
    y = np.asarray(y)
    if y.dtype.kind in "USV" or (y.dtype.kind == "O" and any(
            isinstance(v, (str, bytes)) or not isinstance(v, numbers.Real) for v in y.reshape(-1))):
        bad = next((v for v in y.reshape(-1) if not isinstance(v, numbers.Real)
                    or isinstance(v, (str, bytes))), None)
        what = f"{type(bad).__name__} labels such as {bad!r}" if bad is not None else f"{y.dtype} labels"
        raise ValueError(_NOT_NUMBERS.format(what=what))
    if y.dtype.kind == "c":
        raise ValueError(_NOT_NUMBERS.format(what="complex numbers"))
    values = y.astype(np.float64).reshape(-1)
    dtype = y.dtype if y.dtype.kind in "iub" else np.dtype(np.float64)
    return values, dtype


def _true_labels(y: Any, n: int) -> np.ndarray:
    """``score``'s ``y`` as float64 ``[n]``: numbers, one per sample of ``X``, finite."""
    array = np.asarray(y)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1 or array.shape[0] != n:
        raise ValueError(f"SOLRanker.score: y must hold one label per sample of X ({n}), got shape "
                         f"{array.shape}.")
    values, _ = _numeric_labels(array)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(f"SOLRanker.score: y holds {int(bad.sum())} NaN or infinite label(s) (the first at "
                         f"index {int(np.flatnonzero(bad)[0])}); expected the true labels as finite numbers.")
    return values


def _sample_weights(sample_weight: Any, n: int) -> np.ndarray:
    """``score``'s ``sample_weight`` as float64 ``[n]``: finite, >= 0, not all 0."""
    try:
        weights = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"SOLRanker.score: sample_weight must be numbers, got "
                         f"{sample_weight!r:.80}.") from None
    if weights.shape != (n,):
        raise ValueError(f"SOLRanker.score: sample_weight must hold one weight per sample of X ({n}), got "
                         f"shape {weights.shape}.")
    if not (np.isfinite(weights).all() and (weights >= 0).all() and weights.sum() > 0):
        raise ValueError("SOLRanker.score: sample_weight must be finite numbers >= 0, not all 0.")
    return weights


def _classes(encoder: LabelGrid, dtype: np.dtype) -> np.ndarray:
    values = encoder.values().numpy()
    if dtype.kind in "iub":
        cast = values.round().astype(dtype)
        if np.array_equal(cast.astype(np.float64), values):
            return cast
    return values.astype(np.float64)


def _prepared(ds: OrdinalDataset) -> PreparedData:
    """The run's data as :func:`sol_ext.driver.prepare.prepare_data` would give them for a table
    with these features and labels as given (no noise), and no test set."""
    scaling = feature_scaling(ds)
    enc = ds.grid
    preprocessing = preprocessing_record(ds)
    n_features = ds.features.shape[1]
    return PreparedData(
        name=ds.name, kind=ds.kind, grid=enc,
        train_x=apply_scaling(ds.features, scaling).float(), train_given=ds.ranks.long(),
        train_clean=None,
        test_x=torch.zeros((0, n_features), dtype=torch.float32),
        test_ranks=torch.zeros(0, dtype=torch.int64),
        train_rows=torch.arange(len(ds)), preprocessing=preprocessing)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != before:
            torch.set_num_threads(before)
