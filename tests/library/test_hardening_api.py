"""Bad input at the Python API: SOLHead's labels and saved settings, SOLRanker's parameters and
score, find_label_issues' arguments. Each is refused with one error naming the argument."""

import io
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sol_ext
from sol_ext.driver.model import model_from_state
from sol_ext.driver.train import validation_split
from sol_ext.label_issues import find_label_issues, label_issue_scores

try:
    from sklearn.base import clone

    from sol_ext.sklearn import SOLRanker
except ImportError:  # the sklearn extra is not installed: the SOLRanker tests skip
    clone = SOLRanker = None

needs_sklearn = pytest.mark.skipif(SOLRanker is None, reason="needs scikit-learn (the sklearn extra)")

N_RANKS, DIM = 5, 8


def clustered(per_rank=20, seed=0):
    """``h [N, DIM]`` L2-normalized embeddings around one center per rank, and their ranks ``[N]``."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(N_RANKS).repeat_interleave(per_rank)
    centers = torch.randn(N_RANKS, DIM, generator=g) * 3
    return F.normalize(centers[ranks] + 0.3 * torch.randn(ranks.numel(), DIM, generator=g), dim=1), ranks


@pytest.fixture
def trained():
    h, labels = clustered()
    head = sol_ext.SOLHead(N_RANKS, DIM)
    head.update(h, labels)
    return head, h, labels


# -- SOLHead: labels -------------------------------------------------------------------------


def test_update_refuses_validation_labels_of_another_length_and_changes_nothing(trained):
    head, h, labels = trained
    before = head.state_dict()
    with pytest.raises(ValueError, match="val_labels must hold one rank per row of val_h: val_h has 10 rows, "
                                         "val_labels has 3"):
        head.update(h, labels, h[:10], labels[:3])
    # checked before the centroid rule runs: a refused update leaves the head as it was
    for name, value in head.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_update_and_fit_readout_refuse_labels_of_another_length(trained):
    head, h, labels = trained
    with pytest.raises(ValueError, match="labels must hold one rank per row of h: h has 50 rows, "
                                         "labels has 20 values"):
        head.fit_readout(h[:50], labels[:20])
    with pytest.raises(ValueError, match="labels must hold one rank per row of h"):
        head.update(h, labels[:-1])
    with pytest.raises(ValueError, match="labels must hold one rank per row of h"):
        head.update_centroids(h[:-1], labels)


def test_fit_readout_refuses_float_and_out_of_range_labels(trained):
    head, h, labels = trained
    with pytest.raises(TypeError, match="labels must be an integer tensor of 0-based ranks"):
        head.fit_readout(h, labels + 0.5)
    with pytest.raises(ValueError, match=r"labels must lie in 0 … 4 .* got values in 7 … 11"):
        head.fit_readout(h, labels + 7)
    with pytest.raises(ValueError, match="prior_labels must lie in 0 … 4"):
        head.fit_readout(h, labels, prior_labels=labels + 1)
    with pytest.raises(ValueError, match="val_labels must lie in 0 … 4"):
        head.update(h, labels, h, labels - 1)


def test_numpy_labels_are_taken_as_tensors(trained):
    head, h, labels = trained
    other = sol_ext.SOLHead(N_RANKS, DIM)
    other.update(h, labels.numpy())
    assert torch.equal(other.centroids, head.centroids)
    assert float(other.temperature) == float(head.temperature)
    torch.testing.assert_close(other.loss(h, labels.numpy()), head.loss(h, labels))
    with pytest.raises(TypeError, match="labels must be integer ranks"):
        other.update(h, np.array(["a"] * len(h)))


def test_update_centroids_refuses_non_finite_embeddings_and_keeps_its_centroids(trained):
    head, h, labels = trained
    before = head.centroids.clone()
    bad = h.clone()
    bad[3, 0] = float("nan")
    with pytest.raises(ValueError, match="h contains 1 NaN or inf"):
        head.update_centroids(bad, labels)
    assert torch.equal(head.centroids, before)
    with pytest.raises(TypeError, match="h must be a torch.Tensor of embeddings"):
        head.update(h.numpy(), labels)


# -- SOLHead: settings in the state dict ------------------------------------------------------


def test_state_dict_carries_the_settings_and_from_state_dict_rebuilds_the_head():
    h, labels = clustered()
    head = sol_ext.SOLHead(N_RANKS, DIM, sigma=0.5, tau=2, margin=0.1, T=2, disc_weight=0.5,
                           convention="official", momentum=0.2, normalize=False, readout="nearest")
    head.update(h, labels)
    buffer = io.BytesIO()
    torch.save({k: v.cpu() for k, v in head.state_dict().items()}, buffer)  # entries move like tensors
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    again = sol_ext.SOLHead.from_state_dict(state)
    assert again.settings() == head.settings()
    assert again.settings()["sigma"] == 0.5 and again.readout == "nearest"
    assert torch.equal(again.predict_proba(h), head.predict_proba(h))
    assert torch.equal(again.predict(h), head.predict(h))


@pytest.mark.parametrize("setting, value", [
    ("sigma", 0.25), ("tau", 3), ("margin", 0.5), ("T", 2), ("disc_weight", 0.0), ("convention", "official"),
    ("momentum", 0.0), ("normalize", False), ("readout", "nearest")])
def test_load_state_dict_refuses_a_head_saved_with_other_settings(trained, setting, value):
    head, h, _ = trained
    other = sol_ext.SOLHead(N_RANKS, DIM, **{setting: value})
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=f"{setting} .* saved, {value!r} here"):
            other.load_state_dict(head.state_dict(), strict=strict)
    assert not bool(other.has_centroids)  # nothing was loaded


def test_load_state_dict_names_another_number_of_ranks(trained):
    head, _, _ = trained
    with pytest.raises(RuntimeError, match="num_ranks 5 saved, 6 here"):
        sol_ext.SOLHead(6, DIM).load_state_dict(head.state_dict())


def test_state_dicts_saved_without_settings_still_load(trained):
    head, h, _ = trained
    old = {k: v for k, v in head.state_dict().items() if k != "_extra_state"}
    again = sol_ext.SOLHead(N_RANKS, DIM)
    again.load_state_dict(old)  # strict: the missing settings are not a missing key
    assert torch.equal(again.predict_proba(h), head.predict_proba(h))
    with pytest.raises(ValueError, match="no saved settings"):
        sol_ext.SOLHead.from_state_dict(old)


def test_a_head_inside_a_model_is_checked_under_its_prefix(trained):
    head, _, _ = trained
    model = torch.nn.ModuleDict({"head": head})
    other = torch.nn.ModuleDict({"head": sol_ext.SOLHead(N_RANKS, DIM, sigma=2.0)})
    assert "head._extra_state" in model.state_dict()
    with pytest.raises(RuntimeError, match="sigma 1.0 saved, 2.0 here"):
        other.load_state_dict(model.state_dict())


# -- SOLRanker ---------------------------------------------------------------------------------

SMALL = dict(epochs=2, sigma=1.0, hidden=(16,), embedding_dim=4)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = np.clip(np.round(2 * X[:, 0]) + 5, 0, 9).astype(np.int64)
    return X, y


@pytest.fixture(scope="module")
def fitted(problem):
    return SOLRanker(**SMALL).fit(*problem)


@needs_sklearn
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


@needs_sklearn
def test_seed_is_a_deprecated_alias_of_random_state():
    with pytest.warns(FutureWarning, match="seed is deprecated.*random_state"):
        assert SOLRanker(seed=3).train_config().seed == 3
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="random_state=4 and seed=3"):
        SOLRanker(seed=3, random_state=4).train_config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SOLRanker(random_state=3).train_config()  # no warning without seed


@needs_sklearn
def test_verbose_prints_the_training_progress(problem, capsys):
    SOLRanker(**SMALL, verbose=1).fit(*problem)
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("epoch")]) == SMALL["epochs"]
    SOLRanker(**SMALL).fit(*problem)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="verbose must be an integer >= 0"):
        SOLRanker(**SMALL, verbose=-1).fit(*problem)


@needs_sklearn
def test_score_refuses_nan_labels_and_labels_of_another_length(problem, fitted):
    X, y = problem
    with_nan = y.astype(np.float64)
    with_nan[3] = np.nan
    with pytest.raises(ValueError, match="y holds 1 NaN or infinite label.*index 3"):
        fitted.score(X, with_nan)
    with pytest.raises(ValueError, match="y holds 1 NaN or infinite"):
        fitted.score(X, np.where(np.arange(len(y)) == 0, np.inf, y))
    with pytest.raises(ValueError, match=r"y must hold one label per sample of X \(200\), got shape \(1,\)"):
        fitted.score(X, y[:1])  # would broadcast
    with pytest.raises(ValueError, match="sample_weight must hold one weight per sample"):
        fitted.score(X, y, sample_weight=np.ones(3))
    assert fitted.score(X, y) == pytest.approx(fitted.score(X, y, sample_weight=np.ones(len(y))))


@needs_sklearn
def test_a_validation_split_that_leaves_too_little_to_train_on_is_refused(problem):
    X, y = problem
    with pytest.raises(ValueError, match="val_fraction=0.99 of 200 samples leaves 2 sample"):
        SOLRanker(**SMALL, val_fraction=0.99).fit(X, y)


@needs_sklearn
def test_a_validation_split_that_leaves_one_rank_to_train_on_is_refused(problem):
    X, _ = problem
    y = np.zeros(40, dtype=np.int64)
    y[0] = 1  # one sample of rank 1: find a seed whose split holds it out
    seed = next(s for s in range(100)
                if 0 not in validation_split(torch.from_numpy(y), 0.3, s).fit.tolist())
    with pytest.raises(ValueError, match=r"leaves 28 sample\(s\) of 1 rank\(s\) to train on"):
        SOLRanker(**SMALL, val_fraction=0.3, random_state=seed).fit(X[:40], y)


@needs_sklearn
def test_a_run_saved_before_heads_saved_their_settings_still_loads(problem, fitted):
    X, _ = problem
    state = fitted.model_.to_state()
    assert "_extra_state" in state["head"]
    del state["head"]["_extra_state"]
    np.testing.assert_array_equal(model_from_state(state).predict(X), fitted.model_.predict(X))


# -- find_label_issues -------------------------------------------------------------------------

PROBS = np.array([[0.2, 0.8], [0.9, 0.1]])


@pytest.mark.parametrize("argument, call", [
    ("labels", lambda: find_label_issues(["a", "b"], PROBS)),
    ("labels", lambda: label_issue_scores([{}, {}], PROBS)),
    ("pred_probs", lambda: find_label_issues([0, 1], [["a", "b"], [0.5, 0.5]])),
    ("pred_probs", lambda: find_label_issues([0, 1], [[0.2, 0.8], [1.0]])),
    ("pred_probs", lambda: find_label_issues([0, 1], PROBS.astype(np.complex128))),
    ("pred_probs", lambda: find_label_issues([0, 1], torch.tensor(PROBS, dtype=torch.complex64))),
    ("noise_kernel", lambda: find_label_issues([0, 1], PROBS, noise_kernel="gaussian")),
])
def test_find_label_issues_names_an_argument_that_is_not_numbers(argument, call):
    with pytest.raises(ValueError, match=f"^{argument} must"):
        call()


def test_find_label_issues_refuses_an_unknown_ranking():
    with pytest.raises(ValueError, match="return_indices_ranked_by must be None"):
        find_label_issues([0, 1], PROBS, return_indices_ranked_by="no")
