"""Metrics on hand-made cases, checked against formulas written out here."""

import json
import math
import warnings

import numpy as np
import pytest
import torch

from sol_ext import metrics
from sol_ext.metrics import (
    cs_curve,
    cumulative_score,
    macro_mae,
    mae,
    maximum_mae,
    pearson,
    per_rank_mae,
    quadratic_weighted_kappa,
    ranked_probability_score,
    spearman,
    summarize,
)


def test_mae_hand_case():
    assert mae([1, 2, 3], [2, 2, 5]) == pytest.approx((1 + 0 + 2) / 3)
    assert isinstance(mae([1.0], [1.0]), float)


def test_inputs_tensor_numpy_list_agree():
    p, t = [1.5, 2.0, 7.0, 4.0], [1.0, 3.0, 6.0, 4.0]
    ref = mae(p, t)
    assert mae(torch.tensor(p, dtype=torch.float32), torch.tensor(t)) == pytest.approx(ref)
    assert mae(np.array(p), torch.tensor(t)) == pytest.approx(ref)
    assert mae(torch.tensor(p)[:, None], t) == pytest.approx(ref)  # [N, 1] predictions are accepted


def test_cumulative_score_counts_boundary():
    pred, true = [0, 1, 2, 3, 10], [0, 0, 0, 0, 0]  # errors 0, 1, 2, 3, 10
    assert cumulative_score(pred, true, 2) == pytest.approx(60.0)
    assert cumulative_score(pred, true, 0) == pytest.approx(20.0)
    assert cumulative_score(pred, true, 100) == pytest.approx(100.0)


def test_cumulative_score_decimal_threshold_is_inclusive():
    # 0.55 - 0.30 is 0.25000000000000006 in binary floating point; it is within 0.25.
    assert cumulative_score([0.55, 0.9], [0.30, 0.3], 0.25) == pytest.approx(50.0)


def test_cs_curve_matches_pointwise():
    pred = np.array([0.0, 1.5, 3.0, 4.0])
    true = np.zeros(4)
    thetas = [0, 1, 1.5, 3, 5]
    assert cs_curve(pred, true, thetas) == pytest.approx([cumulative_score(pred, true, t) for t in thetas])
    assert cs_curve(pred, true, thetas) == pytest.approx([25.0, 25.0, 50.0, 75.0, 100.0])


def test_pearson_against_formula():
    x = np.array([1.0, 2.0, 4.0, 7.0, 11.0])
    y = np.array([2.0, 1.0, 5.0, 6.0, 13.0])
    xc, yc = x - x.mean(), y - y.mean()
    expected = (xc @ yc) / math.sqrt((xc @ xc) * (yc @ yc))
    assert pearson(x, y) == pytest.approx(expected)
    assert pearson(x, 3 * x + 1) == pytest.approx(1.0)
    assert pearson(x, -x) == pytest.approx(-1.0)


def test_spearman_monotone_and_ties():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)  # monotone, not linear
    assert pearson(x, np.exp(x)) < 0.95
    # With ties, Spearman is Pearson of average ranks: [1, 2.5, 2.5, 4] vs [1, 2, 3, 4].
    a, b = np.array([10.0, 20.0, 20.0, 30.0]), np.array([1.0, 2.0, 3.0, 4.0])
    ra, rb = np.array([1, 2.5, 2.5, 4]), np.array([1, 2, 3, 4.0])
    rac, rbc = ra - ra.mean(), rb - rb.mean()
    assert spearman(a, b) == pytest.approx((rac @ rbc) / math.sqrt((rac @ rac) * (rbc @ rbc)))


def test_correlation_of_constant_is_nan():
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(spearman([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]))


def test_summarize_keys_and_values():
    pred, true = [1.0, 2.0, 3.0, 9.0], [1.0, 2.0, 4.0, 5.0]
    out = summarize(pred, true, theta=1)
    assert set(out) == {"mae", "cs", "pearson", "spearman", "macro_mae", "qwk"}
    assert out["mae"] == pytest.approx(mae(pred, true))
    assert out["cs"] == pytest.approx(75.0)
    assert out["macro_mae"] == pytest.approx(macro_mae(pred, true))
    assert out["qwk"] == pytest.approx(quadratic_weighted_kappa(pred, true))
    assert all(isinstance(v, float) for v in out.values())


def test_summarize_qwk_on_label_values_is_qwk_of_ranks():
    # The driver passes decoded values min + step * rank; the kappa of those is the kappa of the ranks.
    pred_ranks = np.array([0, 1, 2, 4, 4, 3, 1])
    true_ranks = np.array([0, 2, 2, 3, 4, 4, 0])
    out = summarize(torch.tensor(3.0 + 0.5 * pred_ranks), 3.0 + 0.5 * true_ranks, theta=0.5)
    assert out["qwk"] == pytest.approx(quadratic_weighted_kappa(pred_ranks, true_ranks), abs=1e-12)
    assert out["mae"] == pytest.approx(0.5 * mae(pred_ranks, true_ranks))


# -- quadratic weighted kappa ---------------------------------------------------------------------------


def _qwk_by_table(pred, true, k):
    """Cohen's kappa written out: observed and chance confusion tables, weights (i - j)^2 / (K - 1)^2."""
    observed = np.zeros((k, k))
    np.add.at(observed, (true, pred), 1.0)
    chance = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    i, j = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    w = (i - j) ** 2 / (k - 1) ** 2
    return 1.0 - (w * observed).sum() / (w * chance).sum()


def test_qwk_hand_case():
    pred, true = np.array([0, 1, 2, 2, 3]), np.array([0, 2, 2, 1, 3])
    assert quadratic_weighted_kappa(pred, true) == pytest.approx(_qwk_by_table(pred, true, 4))
    assert quadratic_weighted_kappa(pred, true, num_ranks=10) == pytest.approx(_qwk_by_table(pred, true, 10))


def test_qwk_matches_sklearn_on_random_cases():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    checked = 0
    for case in range(400):
        k = int(rng.integers(2, 12))
        n = int(rng.integers(1, 80))
        # imbalanced truth (Dirichlet class weights), predictions near the truth or anywhere, and
        # predictions that never use some ranks
        weights = rng.dirichlet(np.full(k, 0.5))
        true = rng.choice(k, size=n, p=weights)
        if case % 3 == 0:
            pred = rng.integers(0, k, n)
        elif case % 3 == 1:
            pred = np.clip(true + rng.integers(-1, 2, n), 0, k - 1)
        else:
            pred = rng.choice(np.arange(0, k, 2), size=n)
        with warnings.catch_warnings():
            # sklearn warns where it returns nan (both inputs the same single rank)
            warnings.simplefilter("ignore")
            expected = sklearn_metrics.cohen_kappa_score(true, pred, weights="quadratic", labels=np.arange(k))
        got = quadratic_weighted_kappa(pred, true, num_ranks=k)
        if math.isnan(expected):
            assert math.isnan(got), (pred, true)
            continue
        assert got == pytest.approx(expected, abs=1e-10), (pred, true)
        assert got == pytest.approx(_qwk_by_table(pred, true, k), abs=1e-10)
        if np.array_equal(np.union1d(pred, true), np.arange(min(pred.min(), true.min()),
                                                            max(pred.max(), true.max()) + 1)):
            # sklearn's default labels number the ranks present; the same when those are consecutive
            assert got == pytest.approx(sklearn_metrics.cohen_kappa_score(true, pred, weights="quadratic"),
                                        abs=1e-10)
        checked += 1
    assert checked > 350


def test_qwk_perfect_chance_and_degenerate_cases():
    true = np.array([0, 1, 2, 3, 4, 4, 2])
    assert quadratic_weighted_kappa(true, true) == 1.0
    assert quadratic_weighted_kappa(torch.tensor(true), true.astype(np.float32)) == 1.0  # any dtype of integer values
    assert quadratic_weighted_kappa(4 - true, true) < 0  # reversed order disagrees more than chance
    assert math.isnan(quadratic_weighted_kappa([2, 2, 2], [2, 2, 2]))  # sklearn: nan, as 0 / 0
    assert quadratic_weighted_kappa([1, 1, 1], [2, 2, 2]) == 0.0
    assert quadratic_weighted_kappa([2], [3]) == 0.0


def test_qwk_rejects_non_ranks():
    with pytest.raises(ValueError, match="pred must hold integer ranks"):
        quadratic_weighted_kappa([0.5, 1.0], [0, 1])
    with pytest.raises(ValueError, match="true must hold integer ranks"):
        quadratic_weighted_kappa([0, 1], [0, -1])
    with pytest.raises(ValueError, match="same length"):
        quadratic_weighted_kappa([0, 1, 2], [0, 1])
    with pytest.raises(ValueError, match="at least one"):
        quadratic_weighted_kappa([], [])
    with pytest.raises(ValueError, match="true holds rank 5, outside 0 … num_ranks-1 = 0 … 4"):
        quadratic_weighted_kappa([0, 1], [0, 5], num_ranks=5)
    with pytest.raises(ValueError, match="num_ranks must be an integer >= 1"):
        quadratic_weighted_kappa([0, 1], [0, 1], num_ranks=2.5)


# -- macro-averaged and per-rank MAE ----------------------------------------------------------------------


def test_macro_mae_weighs_every_true_rank_equally():
    # Nine samples of rank 0, all right; one of rank 4, predicted 0.
    true = np.array([0] * 9 + [4])
    pred = np.zeros(10)
    assert mae(pred, true) == pytest.approx(0.4)  # 4 / 10
    assert macro_mae(pred, true) == pytest.approx((0.0 + 4.0) / 2)
    assert macro_mae(true, true) == 0.0
    # label units: the groups are the distinct true values
    assert macro_mae([3.5, 3.0, 4.5], [3.0, 3.0, 4.0]) == pytest.approx((0.25 + 0.5) / 2)


def test_per_rank_mae_values_order_and_types():
    pred, true = [1, 0, 3, 2, 2], [0, 0, 3, 1, 3]
    out = per_rank_mae(pred, true)
    assert out == {0: pytest.approx(0.5), 1: pytest.approx(1.0), 3: pytest.approx(0.5)}
    assert list(out) == [0, 1, 3]
    assert all(type(k) is int and type(v) is float for k, v in out.items())
    assert np.mean(list(out.values())) == pytest.approx(macro_mae(pred, true))
    half = per_rank_mae(torch.tensor([3.0, 4.0]), np.array([3.5, 3.0]))
    assert list(half) == [3.0, 3.5] and all(type(k) is float for k in half)
    assert json.loads(json.dumps(out)) == {"0": 0.5, "1": 1.0, "3": 0.5}


@pytest.mark.parametrize("fn", [macro_mae, per_rank_mae])
@pytest.mark.parametrize("pred,true,match", [
    ([1.0, 2.0], [1.0], "same length"),
    ([], [], "at least one"),
    ([1.0, 2.0], [1.0, float("inf")], "true contains a non-finite value"),
])
def test_macro_and_per_rank_mae_bad_inputs(fn, pred, true, match):
    with pytest.raises(ValueError, match=match):
        fn(pred, true)


@pytest.mark.parametrize("pred,true,match", [
    ([1.0, 2.0], [1.0], "same length"),
    ([], [], "at least one"),
    ([1.0, float("nan")], [1.0, 2.0], "non-finite"),
    (np.ones((2, 2)), np.ones((2, 2)), "1-D"),
])
def test_bad_inputs(pred, true, match):
    with pytest.raises(ValueError, match=match):
        mae(pred, true)


def test_bad_theta():
    with pytest.raises(ValueError, match="theta"):
        cumulative_score([1.0], [1.0], -1)
    with pytest.raises(ValueError, match="theta"):
        cs_curve([1.0], [1.0], [0, float("nan")])


def test_cumulative_scores_refuse_a_bad_theta_by_name():
    with pytest.raises(TypeError, match="theta must be a real number, got None"):
        cumulative_score([1, 2], [1, 2], None)
    with pytest.raises(ValueError, match="theta must be a finite number >= 0, got -1"):
        cumulative_score([1, 2], [1, 2], -1)
    with pytest.raises(ValueError, match="every theta of thetas must be a finite number >= 0, got nan"):
        cs_curve([1, 2], [1, 2], [1, float("nan")])


def test_macro_mae_averages_the_ranks_and_maximum_mae_is_the_worst():
    true = np.array([0, 0, 0, 1, 2, 2])
    pred = np.array([0, 0, 1, 3, 2, 1])   # per rank: 1/3, 2, 1/2
    assert macro_mae(pred, true) == pytest.approx((1 / 3 + 2 + 0.5) / 3)
    assert maximum_mae(pred, true) == 2.0
    assert maximum_mae(pred, true) == max(per_rank_mae(pred, true).values())
    assert maximum_mae(true, true) == 0.0


def test_maximum_mae_refuses_what_macro_mae_refuses():
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        maximum_mae([1.0, 2.0], [1.0])


def test_ranked_probability_score_hand_cases():
    # sure and right: 0; sure and one rank off: one step of the cumulative distribution wrong by 1
    assert ranked_probability_score([[0.0, 1.0, 0.0]], [1]) == 0.0
    assert ranked_probability_score([[1.0, 0.0, 0.0]], [1]) == 1.0
    # mass three ranks off costs more than mass one rank off (a log-loss would not tell them apart)
    one_off = ranked_probability_score([[0.0, 0.0, 0.5, 0.5]], [3])
    three_off = ranked_probability_score([[0.5, 0.0, 0.0, 0.5]], [3])
    assert one_off == pytest.approx(0.25) and three_off == pytest.approx(0.75)
    probs = np.array([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1]])
    true = np.array([2, 0])
    by_hand = ((0.2 - 0) ** 2 + (0.7 - 0) ** 2 + 0 + (0.6 - 1) ** 2 + (0.9 - 1) ** 2 + 0) / 2
    assert ranked_probability_score(probs, true) == pytest.approx(by_hand)
    assert ranked_probability_score(torch.tensor(probs, dtype=torch.float32), torch.tensor(true)) == \
        pytest.approx(by_hand, abs=1e-6)


def test_ranked_probability_score_is_dlordinals_sum():
    """The unnormalized sum of dlordinal's ranked_probability_score, written out as it computes it."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(6), size=50)
    true = rng.integers(0, 6, 50)
    onehot = np.zeros_like(probs)
    onehot[np.arange(50), true] = 1
    expected = np.mean(np.sum((probs.cumsum(axis=1) - onehot.cumsum(axis=1)) ** 2, axis=1))
    assert ranked_probability_score(probs, true) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("probs", "true", "match"), [
    ([0.5, 0.5], [0], r"probs must be a 2-D array \[N, K\]"),
    ([[0.5, 0.5]], [0, 1], "same number of samples, got 1 and 2"),
    ([[0.5, 0.5]], [2], "true holds rank 2, outside the K = 2 columns"),
    ([[0.5, 0.5]], [0.5], "true must hold integer ranks"),
    ([[2.0, -1.0]], [0], "row 0 is"),
    ([[0.2, 0.2]], [0], "rows sum to 1"),
    (np.zeros((0, 3)), [], "at least one sample"),
])
def test_ranked_probability_score_bad_inputs(probs, true, match):
    with pytest.raises(ValueError, match=match):
        ranked_probability_score(probs, true)


def test_every_public_name_is_exported():
    assert {"macro_mae", "maximum_mae", "ranked_probability_score"} <= set(metrics.__all__)
    assert all(hasattr(metrics, name) for name in metrics.__all__)


# ---------------------------------------------------------------------------------------------
# Calibration of rank probabilities


def test_reliability_and_ece_of_a_model_calibrated_by_construction_and_of_an_overconfident_one():
    """Labels drawn from the probabilities: accuracy equals confidence up to sampling, ECE near 0.
    The same rows sharpened (overconfident): ECE is the gap, and each filled bin's numbers are its rows'."""
    from sol_ext.metrics import expected_calibration_error, reliability_curve

    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=(40000, 6))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    true = np.array([rng.choice(6, p=row) for row in probs])
    assert expected_calibration_error(probs, true) < 0.01
    sharp = np.exp(3 * logits) / np.exp(3 * logits).sum(axis=1, keepdims=True)
    assert expected_calibration_error(sharp, true) > 0.1
    curve = reliability_curve(sharp, true, bins=10)
    assert curve["count"].sum() == len(true)
    confidence = sharp.max(axis=1)
    top = confidence >= 0.9  # the last bin
    assert curve["count"][-1] == top.sum()
    assert curve["confidence"][-1] == pytest.approx(confidence[top].mean())
    assert curve["accuracy"][-1] == pytest.approx((sharp.argmax(axis=1) == true)[top].mean())
    assert np.isnan(curve["accuracy"][0]) and curve["count"][0] == 0  # no row is that unsure of 6 ranks


@pytest.mark.parametrize("call, names", [
    (lambda m: m.expected_calibration_error([[0.5, 0.5]], [0], bins=0), "bins"),
    (lambda m: m.reliability_curve([[2.0, -1.0]], [0]), "probs"),
    (lambda m: m.expected_calibration_error([[0.5, 0.5]], [2]), "true"),
])
def test_calibration_metrics_refuse_bad_input_by_name(call, names):
    import sol_ext.metrics as m

    with pytest.raises(ValueError, match=names):
        call(m)
