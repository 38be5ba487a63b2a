"""Metrics on hand-made cases, checked against formulas written out here."""

import math

import numpy as np
import pytest
import torch

from sol_ext.metrics import cs_curve, cumulative_score, mae, pearson, spearman, summarize


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
    assert set(out) == {"mae", "cs", "pearson", "spearman"}
    assert out["mae"] == pytest.approx(mae(pred, true))
    assert out["cs"] == pytest.approx(75.0)
    assert all(isinstance(v, float) for v in out.values())


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
