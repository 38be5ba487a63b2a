"""sol_ext.driver.sklearn.SOLRanker: scikit-learn's estimator checks, and the estimator on small ordinal problems."""

import dataclasses
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from sol_ext.driver.config import PAPER_SETTINGS, SIGMA_GRID, TrainConfig  # noqa: E402
from sol_ext.driver.model import TrainedModel, model_from_state  # noqa: E402
from sol_ext.driver.sklearn import CONFIG_PARAMS, EXPECTED_FAILED_CHECKS, SOLRanker  # noqa: E402
from sol_ext.driver.train import validation_split  # noqa: E402

# small and quick: one training per fit (no sigma search), a tiny MLP
SMALL = dict(epochs=2, sigma=1.0, hidden=(16,), embedding_dim=4)

# the settings of text runs (sol-ext train --text-column), which arrays have no use for
TEXT_SETTINGS = {"text_column", "text_encoder", "max_length", "train_layers", "text_lr", "warmup"}


SUBSET_INVARIANCE = "check_methods_subset_invariance"


def _subset_invariance_holds_within_float32_rounding(estimator) -> None:
    """What the reason for the expected failure of check_methods_subset_invariance says: predictions on
    batches of rows equal those on all rows at once, and the probabilities differ by float32 rounding only."""
    from sklearn.datasets import make_blobs

    X, y = make_blobs(n_samples=30, centers=3, n_features=3, random_state=0)
    fitted = clone(estimator).fit(3 * (X - X.min()), y)
    X = 3 * (X - X.min())
    batches = np.array_split(np.arange(len(X)), 3)
    assert np.array_equal(np.concatenate([fitted.predict(X[b]) for b in batches]), fitted.predict(X))
    np.testing.assert_allclose(np.concatenate([fitted.predict_proba(X[b]) for b in batches]),
                               fitted.predict_proba(X), rtol=0, atol=1e-5)


# scikit-learn's subset-invariance check asks the probabilities of a row to agree to 1e-7 however the rows
# are batched; whether float32 products round alike across batch sizes depends on the CPU's BLAS kernels.
# Where the check passes, it passes; where it does not, what holds instead is tested (the reason users read).
@parametrize_with_checks([SOLRanker(**SMALL)], expected_failed_checks=lambda _est: {
    name: reason for name, reason in EXPECTED_FAILED_CHECKS.items() if name != SUBSET_INVARIANCE})
def test_sklearn_estimator_checks(estimator, check, monkeypatch):
    name = getattr(check, "func", check).__name__
    # scikit-learn checks array-API input (here: numpy's namespace) only where SciPy's switch is set
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    if name != SUBSET_INVARIANCE:
        check(estimator)
        return
    try:
        check(estimator)
    except AssertionError:
        _subset_invariance_holds_within_float32_rounding(estimator)


def test_batched_rows_predict_as_all_rows_at_once():
    """The property the expected failure's reason states holds on every machine, whether or not the
    strict check passes here."""
    _subset_invariance_holds_within_float32_rounding(SOLRanker(**SMALL))


def ordinal_problem(n=400, seed=0):
    """y = round(3 x0 + x1 + noise) + 10: an ordinal label on integer ranks, two informative features."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    y = np.clip(np.round(3 * X[:, 0] + X[:, 1] + rng.normal(0, 0.5, n)), -6, 6).astype(np.int64) + 10
    return X, y


@pytest.fixture(scope="module")
def problem():
    X, y = ordinal_problem()
    return X[:300], y[:300], X[300:], y[300:]


def test_defaults_are_the_drivers():
    params = SOLRanker().get_params()
    defaults = TrainConfig()
    for name in CONFIG_PARAMS:
        want = getattr(defaults, name)
        assert params[name] == (tuple(want) if isinstance(want, tuple) else want), name
    assert params["paper"] is False and params["verbose"] == 0
    assert params["random_state"] == defaults.seed and not {"seed", "inference", "centroid_momentum"} & set(params)
    # every TrainConfig field is a parameter, or left out on purpose (data, noise, encoder, test metric,
    # text runs)
    left_out = {f.name for f in dataclasses.fields(TrainConfig)} - set(CONFIG_PARAMS) - TEXT_SETTINGS
    assert left_out == {"seed", "data", "test_data", "label_column", "delimiter", "test_fraction", "noise",
                        "kappa", "noise_fraction", "encoder", "weights", "image_size", "augment",
                        "workers", "cs_theta", "test_label_column", "label_min", "label_max", "label_step",
                        "id_column", "feature_columns", "drop_columns", "categorical", "missing", "encoding"}


def test_fit_predict_beats_the_median(problem):
    X, y, X_test, y_test = problem
    ranker = SOLRanker(epochs=8, hidden=(32,), embedding_dim=8)  # sigma "auto": three trainings
    assert ranker.fit(X, y) is ranker
    assert isinstance(ranker.model_, TrainedModel) and ranker.n_features_in_ == 4
    pred = ranker.predict(X_test)
    mae = np.abs(pred - y_test).mean()
    baseline = np.abs(np.median(y) - y_test).mean()
    assert mae < 0.5 * baseline, (mae, baseline)
    assert ranker.score(X_test, y_test) == pytest.approx(-mae)
    assert np.isin(pred, ranker.classes_).all()
    np.testing.assert_array_equal(ranker.classes_, np.arange(y.min(), y.max() + 1))
    assert ranker.classes_.dtype == y.dtype
    # the run: no test set, sigma picked on the validation split
    history = ranker.history_
    assert history["test"] is None and history["data"]["n_test"] == 0
    assert history["sigma_selected"] in SIGMA_GRID
    assert history["data"]["n_train"] + history["data"]["n_val"] == len(y)
    # probabilities: one column per class, rows sum to 1; the expected label lies inside the grid
    proba = ranker.predict_proba(X_test)
    assert proba.shape == (len(X_test), len(ranker.classes_))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-9)
    assert (proba >= 0).all()
    expected = ranker.expected(X_test)
    np.testing.assert_allclose(expected, proba @ ranker.classes_, atol=1e-6)
    # the kept model is the driver's: it predicts the same from the raw features
    np.testing.assert_array_equal(ranker.model_.predict(X_test), pred)
    pre = ranker.model_.preprocessing
    assert set(pre) == {"kind", "schema", "feature_names", "input_shape", "delimiter", "scaling", "grid"}
    np.testing.assert_allclose(pre["scaling"]["mean"].numpy(), X.astype(np.float32).mean(axis=0), atol=1e-6)
    assert pre["grid"] == {"min_value": float(y.min()), "step": 1.0, "num_ranks": int(np.ptp(y)) + 1}


def test_pipeline_and_grid_search(problem):
    X, y, X_test, y_test = problem
    pipe = Pipeline([("scale", StandardScaler()), ("sol", SOLRanker(**{**SMALL, "epochs": 4}))])
    pipe.fit(X * 100 + 5, y)
    assert np.isin(pipe.predict(X_test * 100 + 5), pipe[-1].classes_).all()
    assert pipe.score(X_test * 100 + 5, y_test) > -np.abs(np.median(y) - y_test).mean()

    search = GridSearchCV(SOLRanker(**SMALL), param_grid={"margin": [0.1, 0.25]}, cv=2)
    search.fit(X, y)
    assert search.best_params_["margin"] in (0.1, 0.25)
    scores = search.cv_results_["mean_test_score"]
    assert scores.shape == (2,) and (scores <= 0).all()  # negative MAE
    assert search.best_estimator_.margin == search.best_params_["margin"]
    assert search.predict(X_test).shape == y_test.shape


def test_get_and_set_params_round_trip():
    ranker = SOLRanker(margin=0.1, hidden=(8, 8), method="l1")
    params = ranker.get_params()
    assert params["margin"] == 0.1 and params["hidden"] == (8, 8) and params["method"] == "l1"
    other = SOLRanker().set_params(**params)
    assert other.get_params() == params
    copy = clone(ranker)
    assert copy.get_params() == params and copy is not ranker
    assert ranker.set_params(tau=2) is ranker and ranker.tau == 2


@pytest.mark.parametrize("units", ["3..8", "halves", "negative"])
def test_labels_in_their_own_units(problem, units):
    X, y, X_test, _ = problem
    ranks = np.clip(y - 10, -2, 3) + 2                    # 0 … 5
    labels = {"3..8": ranks + 3, "halves": ranks * 0.5, "negative": ranks * 2 - 20}[units]
    ranker = SOLRanker(**{**SMALL, "epochs": 4}).fit(X, labels)
    grid = np.unique(labels)
    np.testing.assert_allclose(ranker.classes_, grid)
    pred = ranker.predict(X_test)
    assert np.isin(pred, ranker.classes_).all()
    assert pred.dtype == (np.float64 if units == "halves" else labels.dtype)
    assert ranker.predict_proba(X_test).shape == (len(X_test), len(grid))


def test_gaps_in_the_labels_are_classes_too(problem):
    X, y, X_test, _ = problem
    labels = np.where(y >= 10, 4, 1)                     # labels 1 and 4: the grid 1, 4 (step 3)
    assert list(SOLRanker(**SMALL).fit(X, labels).classes_) == [1, 4]
    labels = np.select([y < 9, y < 11], [1, 2], 4)       # 1, 2, 4: grid step 1 includes 3
    ranker = SOLRanker(**SMALL).fit(X, labels)
    assert list(ranker.classes_) == [1, 2, 3, 4]
    assert ranker.predict_proba(X_test).shape[1] == 4


@pytest.mark.parametrize("method", ["l1", "ce", "sol-no-noise"])
def test_baselines_fit_and_predict(problem, method):
    X, y, X_test, y_test = problem
    ranker = SOLRanker(**{**SMALL, "epochs": 10, "lr": 1e-2, "method": method}).fit(X, y)
    assert ranker.model_.method == method
    pred = ranker.predict(X_test)
    assert np.isin(pred, ranker.classes_).all()
    proba = ranker.predict_proba(X_test)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-9)
    assert np.abs(pred - y_test).mean() < np.abs(np.median(y) - y_test).mean()


@pytest.mark.parametrize("labels", [np.array(["low", "mid", "high"] * 10),
                                    np.array(["low", "mid", "high"] * 10, dtype=object),
                                    np.array([1, "2", 3] * 10, dtype=object)])
def test_string_labels_are_refused(labels):
    X = np.random.default_rng(0).normal(size=(len(labels), 3))
    with pytest.raises(ValueError, match="labels must be numbers on an ordered scale"):
        SOLRanker(**SMALL).fit(X, labels)


def test_bad_labels_and_parameters_are_refused_in_fit():
    X = np.random.default_rng(0).normal(size=(40, 3))
    y = np.arange(40) % 4
    with pytest.raises(ValueError, match="continuous") as refused:
        SOLRanker(**SMALL).fit(X, np.random.default_rng(1).normal(size=40))
    assert "step=" not in str(refused.value)  # SOLRanker has no step parameter to advise
    with pytest.raises(ValueError, match="one class"):
        SOLRanker(**SMALL).fit(X, np.ones(40))
    with pytest.raises(ValueError, match="val_fraction"):
        SOLRanker(**SMALL).fit(X[:4], y[:4])
    for bad, match in [(dict(method="svm"), "unknown method 'svm'"), (dict(epochs=0), "epochs"),
                       (dict(sigma=-1.0), "sigma"), (dict(tau=-1), "tau"), (dict(hidden=(0,)), "hidden"),
                       (dict(hidden=(1.5,)), "hidden"), (dict(epochs="ten"), "wrong type"),
                       (dict(threads=-1), "threads")]:
        ranker = SOLRanker(**{**SMALL, **bad})          # __init__ only stores
        with pytest.raises(ValueError, match=match):
            ranker.fit(X, y)
    SOLRanker(**{**SMALL, "val_fraction": 0.0}).fit(X[:4], y[:4])  # no split: four samples are enough


def test_same_seed_same_model_and_pickle(problem):
    X, y, X_test, _ = problem
    a = SOLRanker(**SMALL, random_state=3).fit(X, y)
    b = SOLRanker(**SMALL, random_state=3).fit(X, y)
    np.testing.assert_array_equal(a.predict(X_test), b.predict(X_test))
    np.testing.assert_array_equal(a.predict_proba(X_test), b.predict_proba(X_test))
    restored = pickle.loads(pickle.dumps(a))
    assert isinstance(restored.model_, TrainedModel) and hasattr(a, "model_")
    np.testing.assert_array_equal(restored.predict_proba(X_test), a.predict_proba(X_test))
    np.testing.assert_array_equal(restored.predict(X_test), a.predict(X_test))
    assert restored.history_ == a.history_
    # a model fitted on a GPU unpickles onto the CPU where there is none
    if not torch.cuda.is_available():
        a.model_.config = dataclasses.replace(a.model_.config, device="cuda")
        moved = pickle.loads(pickle.dumps(a))
        assert moved.model_.device == torch.device("cpu")
        np.testing.assert_array_equal(moved.predict(X_test), restored.predict(X_test))


def test_paper_settings(problem):
    X, y, _, _ = problem
    config = SOLRanker(paper=True).train_config()
    for name, value in PAPER_SETTINGS.items():
        if name in TEXT_SETTINGS:  # text runs are sol-ext train's (--text-column), not SOLRanker's
            continue
        assert getattr(config, name) == value, name
    # a parameter changed from its default wins over the paper's value, as on the command line
    config = SOLRanker(paper=True, tau=2, margin=0.5).train_config()
    assert config.tau == 2 and config.margin == 0.5 and config.relabel == "outlier"
    # ... and one set to its default value counts as unchanged (documented)
    assert SOLRanker(paper=True, readout="cuts").train_config().readout == "nearest"
    ranker = SOLRanker(**{**SMALL, "paper": True}).fit(X, y)
    assert ranker.model_.config.readout == "nearest" and ranker.history_["data"]["n_val"] == 0


def test_core_does_not_import_sklearn_and_the_module_says_how_to_get_it():
    code = ("import sys; import sol_ext, sol_ext.driver.train, sol_ext.driver.model, sol_ext.driver.cli; "
            "assert 'sklearn' not in sys.modules, 'sol_ext imported sklearn'; "
            "sys.modules['sklearn'] = None\n"
            "try:\n    import sol_ext.driver.sklearn\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'sol_ext[train]'" in out.stdout


@pytest.mark.parametrize("sigma", [1.0, "auto"])
def test_fit_trains_in_memory_and_writes_nothing(sigma, problem, tmp_path, monkeypatch):
    """fit in a working folder it must not write to, with no usable temp dir and torch.save refused:
    it trains (a sigma search too), predicts as a fit that could write, and the folder stays empty."""
    X, y, X_test, _ = problem
    expected = SOLRanker(**{**SMALL, "sigma": sigma}).fit(X, y).predict_proba(X_test)
    work = tmp_path / "read-only"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "no-such-temp-dir"))

    def refused(*args, **kwargs):
        raise PermissionError("this test allows no file to be written")

    monkeypatch.setattr(torch, "save", refused)
    ranker = SOLRanker(**{**SMALL, "sigma": sigma}).fit(X, y)
    np.testing.assert_array_equal(ranker.predict_proba(X_test), expected)
    assert list(work.iterdir()) == []


def test_rank_intervals_after_calibrating_on_held_out_rows():
    """calibrate_intervals on rows fit did not see, then predict_interval: intervals on the label grid
    that hold at least the requested share of the calibration rows' own labels."""
    X, y = ordinal_problem(600, seed=3)
    ranker = SOLRanker(**SMALL, val_fraction=0.0).fit(X[:400], y[:400])  # no validation split to calibrate on
    with pytest.raises(RuntimeError, match=r"calibrate_intervals\(X_cal, y_cal\)"):
        ranker.predict_interval(X[400:])
    assert ranker.calibrate_intervals(X[400:], y[400:], score="cumulative") is ranker
    lower, upper = ranker.predict_interval(X[400:], coverage=0.9)
    assert np.all(lower <= upper) and set(np.unique(np.r_[lower, upper])) <= set(ranker.classes_)
    assert np.mean((y[400:] >= lower) & (y[400:] <= upper)) >= 0.9


def test_fit_calibrates_intervals_on_its_validation_split_without_changing_the_fit(monkeypatch):
    """After fit, predict_interval works: calibrated on the validation split, as calibrating on those
    rows by hand; calibrate_intervals still replaces it; and the fitted probabilities are those of a fit
    that stores no calibration."""
    from sol_ext.driver.fit import validation_split
    from sol_ext.intervals import DEFAULT_SCORE
    from sol_ext.labels import LabelGrid

    X, y = ordinal_problem(400, seed=5)
    ranker = SOLRanker(**SMALL, random_state=2).fit(X, y)
    lower, upper = ranker.predict_interval(X, coverage=0.9)
    val = validation_split(LabelGrid.fit(y.astype(np.float64)).encode(y.astype(np.float64)),
                           ranker.val_fraction, ranker.train_config().seed).val.numpy()
    by_hand = SOLRanker(**SMALL, random_state=2).fit(X, y).calibrate_intervals(X[val], y[val])
    np.testing.assert_array_equal(by_hand.predict_interval(X, coverage=0.9), (lower, upper))
    assert np.mean((y[val] >= lower[val]) & (y[val] <= upper[val])) >= 0.9
    assert ranker.model_.intervals.score == DEFAULT_SCORE and ranker.model_.intervals.count == len(val)
    ranker.calibrate_intervals(X[:40], y[:40], score="absolute")  # an explicit calibration replaces it
    assert ranker.model_.intervals.score == "absolute" and ranker.model_.intervals.count == 40
    monkeypatch.setattr("sol_ext.driver.sklearn.store_validation_calibration", lambda model, validation: None)
    uncalibrated = SOLRanker(**SMALL, random_state=2).fit(X, y)
    np.testing.assert_array_equal(uncalibrated.predict_proba(X), ranker.predict_proba(X))


# --------------------------------------------------------------------------------------------------
# Bad input: parameters, score's labels, validation splits, runs saved by older versions

@pytest.fixture(scope="module")
def small_problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = np.clip(np.round(2 * X[:, 0]) + 5, 0, 9).astype(np.int64)
    return X, y


@pytest.fixture(scope="module")
def small_fitted(small_problem):
    return SOLRanker(**SMALL).fit(*small_problem)


def test_random_state_is_the_seed_and_clones():
    ranker = SOLRanker(random_state=7)
    assert ranker.get_params()["random_state"] == 7 and clone(ranker).random_state == 7
    assert ranker.train_config().seed == 7
    # a RandomState draws the driver's seed from itself: the same state, the same seed
    assert (SOLRanker(random_state=np.random.RandomState(1)).train_config().seed
            == SOLRanker(random_state=np.random.RandomState(1)).train_config().seed)
    assert isinstance(SOLRanker(random_state=None).train_config().seed, int)
    for bad in (-1, "a", 1.5, True):
        with pytest.raises(ValueError, match="random_state must be"):
            SOLRanker(random_state=bad).train_config()


def test_verbose_prints_the_training_progress(small_problem, capsys):
    SOLRanker(**SMALL, verbose=1).fit(*small_problem)
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("epoch")]) == SMALL["epochs"]
    SOLRanker(**SMALL).fit(*small_problem)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="verbose must be an integer >= 0"):
        SOLRanker(**SMALL, verbose=-1).fit(*small_problem)


def test_score_refuses_nan_labels_and_labels_of_another_length(small_problem, small_fitted):
    X, y = small_problem
    with_nan = y.astype(np.float64)
    with_nan[3] = np.nan
    with pytest.raises(ValueError, match="y holds 1 NaN or infinite label.*index 3"):
        small_fitted.score(X, with_nan)
    with pytest.raises(ValueError, match="y holds 1 NaN or infinite"):
        small_fitted.score(X, np.where(np.arange(len(y)) == 0, np.inf, y))
    with pytest.raises(ValueError, match=r"y must hold one label per sample of X \(200\), got shape \(1,\)"):
        small_fitted.score(X, y[:1])  # would broadcast
    with pytest.raises(ValueError, match="sample_weight must hold one weight per sample"):
        small_fitted.score(X, y, sample_weight=np.ones(3))
    assert small_fitted.score(X, y) == pytest.approx(small_fitted.score(X, y, sample_weight=np.ones(len(y))))


def test_a_validation_split_that_leaves_too_little_to_train_on_is_refused(small_problem):
    X, y = small_problem
    with pytest.raises(ValueError, match="val_fraction=0.99 of 200 samples leaves 2 sample"):
        SOLRanker(**SMALL, val_fraction=0.99).fit(X, y)


def test_a_validation_split_that_leaves_one_rank_to_train_on_is_refused(small_problem):
    X, _ = small_problem
    y = np.zeros(40, dtype=np.int64)
    y[0] = 1  # one sample of rank 1: find a seed whose split holds it out
    seed = next(s for s in range(100)
                if 0 not in validation_split(torch.from_numpy(y), 0.3, s).fit.tolist())
    with pytest.raises(ValueError, match=r"leaves 28 sample\(s\) of 1 rank\(s\) to train on"):
        SOLRanker(**SMALL, val_fraction=0.3, random_state=seed).fit(X[:40], y)


def test_a_run_saved_before_heads_saved_their_settings_still_loads(small_problem, small_fitted):
    X, _ = small_problem
    state = small_fitted.model_.to_state()
    assert "_extra_state" in state["head"]
    del state["head"]["_extra_state"]
    np.testing.assert_array_equal(model_from_state(state).predict(X), small_fitted.model_.predict(X))


def test_fit_trains_on_the_validation_split_it_checked(problem, monkeypatch):
    """SOLRanker.fit checks its validation split, and the run's checks decide the same one."""
    import sol_ext.driver.sklearn as sklearn_module
    import sol_ext.driver.train as train_module

    X, y, _, _ = problem
    checked, decided = [], []

    def counted(*args):
        checked.append(train_module.validation_split(*args))
        return checked[-1]

    def spy(*args, **kwargs):
        run = real_check(*args, **kwargs)
        decided.append(run.context.split)
        return run

    real_check = sklearn_module.check_run
    monkeypatch.setattr(sklearn_module, "validation_split", counted)
    monkeypatch.setattr(sklearn_module, "check_run", spy)
    SOLRanker(epochs=1, batch_size=64, sigma=1.0).fit(X, y)
    assert len(checked) == len(decided) == 1 and len(checked[0].fit) + len(checked[0].val) == 300
    assert torch.equal(checked[0].fit, decided[0].fit) and torch.equal(checked[0].val, decided[0].val)


def test_pickling_keeps_the_calibration_of_calibrate_intervals():
    """A pickled ranker (joblib too) predicts the intervals of its last calibrate_intervals, not the
    validation split's; with val_fraction=0 as well; to_state / model_from_state alike."""
    X, y = ordinal_problem(400, seed=4)
    for val_fraction in (0.1, 0.0):
        ranker = SOLRanker(**SMALL, val_fraction=val_fraction).fit(X[:250], y[:250])
        ranker.calibrate_intervals(X[250:], y[250:], score="hpd")
        again = pickle.loads(pickle.dumps(ranker))
        kept, back = ranker.model_.intervals, again.model_.intervals
        assert (back.score, back.count) == (kept.score, kept.count) == ("hpd", 150)
        np.testing.assert_array_equal(again.predict_interval(X[:50], 0.8), ranker.predict_interval(X[:50], 0.8))
        rebuilt = model_from_state(ranker.model_.to_state())
        assert (rebuilt.intervals.score, rebuilt.intervals.count) == ("hpd", 150)


def test_sparse_input_missing_values_and_interval_dtypes():
    """A scipy sparse X (OneHotEncoder's default) fits and predicts as its dense copy; missing="impute"
    fills NaN with fit's column medians (a row with NaN predicts as the row filled so), where the
    default refuses it; predict_interval gives integer labels in predict's dtype."""
    from scipy import sparse

    X, y = ordinal_problem(300, seed=6)
    y = y.astype(np.int64)
    dense = SOLRanker(**SMALL).fit(X, y)
    sparse_fit = SOLRanker(**SMALL).fit(sparse.csr_matrix(X), y)
    np.testing.assert_array_equal(sparse_fit.predict(sparse.csr_matrix(X)), dense.predict(X))
    np.testing.assert_array_equal(sparse_fit.predict_proba(X), dense.predict_proba(X))
    lower, upper = dense.predict_interval(X[:20], 0.9)
    assert lower.dtype == upper.dtype == dense.predict(X[:2]).dtype == np.int64
    holes = X.copy()
    holes[::5, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        SOLRanker(**SMALL).fit(holes, y)
    imputing = SOLRanker(**SMALL, missing="impute").fit(holes, y)
    median = np.median(X[np.arange(len(X)) % 5 != 0, 1])
    assert imputing.model_.preprocessing["schema"]["fill_values"]["x1"] == pytest.approx(median)
    filled = np.where(np.isnan(holes), median, holes)
    np.testing.assert_array_equal(imputing.predict(holes), imputing.predict(filled))
    again = pickle.loads(pickle.dumps(imputing))
    np.testing.assert_array_equal(again.predict(holes), imputing.predict(filled))
    with pytest.raises(ValueError, match="missing='drop'"):
        SOLRanker(**SMALL, missing="drop").fit(X, y)
