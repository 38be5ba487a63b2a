"""sol_ext.intervals and SOLHead.predict_interval: split conformal rank intervals.

A model that is calibrated by construction (labels drawn from its own probabilities) has a known answer:
each score's intervals hold the label at the requested rate, and the clean-rank target holds the clean
rank at that rate where the labels carry exactly the noise it is told.
"""
from __future__ import annotations

import io
import math

import pytest
import torch

import sol_ext
from sol_ext.intervals import (
    SCORES,
    IntervalCalibration,
    calibrate_intervals,
    fitted_deconvolution,
    noise_std_from_pairs,
    nonconformity_scores,
    rank_intervals,
)
from sol_ext.ops import noise_kernel

N_RANKS = 12


def calibrated_model(rows: int, seed: int):
    """Rank probabilities of peaked, unequally wide rows, and a label drawn from each row."""
    gen = torch.Generator().manual_seed(seed)
    centre = torch.randint(0, N_RANKS, (rows,), generator=gen).double()
    width = 0.5 + 2 * torch.rand(rows, generator=gen, dtype=torch.float64)
    p = (-((torch.arange(N_RANKS)[None] - centre[:, None]) ** 2) / (2 * width[:, None] ** 2)).softmax(dim=1)
    return p, torch.multinomial(p, 1, generator=gen)[:, 0]


def _saved(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def covered(lower, upper, ranks) -> float:
    return ((ranks >= lower) & (ranks <= upper)).double().mean().item()


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("coverage", [0.8, 0.9])
def test_intervals_hold_the_label_at_the_requested_rate(score, coverage):
    calibration = calibrate_intervals(*calibrated_model(3000, seed=0), score=score)
    p, labels = calibrated_model(30000, seed=1)
    lower, upper = rank_intervals(p, calibration, coverage)
    assert bool((lower <= upper).all()) and lower.min() >= 0 and upper.max() <= N_RANKS - 1
    # split conformal's guarantee is in expectation over calibration sets: +-2 points at these sizes
    assert abs(covered(lower, upper, labels) - coverage) <= 0.02


@pytest.mark.parametrize("score", SCORES)
def test_intervals_are_contiguous_and_nested_in_the_coverage(score):
    p, _ = calibrated_model(500, seed=2)
    scores = nonconformity_scores(p, score)
    for t in (0.1, 0.5, 0.9, 2.0):
        inside = scores <= t
        first = torch.where(inside, torch.arange(N_RANKS), N_RANKS).min(dim=1).values
        last = torch.where(inside, torch.arange(N_RANKS), -1).max(dim=1).values
        counted = inside.sum(dim=1)
        assert bool(((counted == 0) | (counted == last - first + 1)).all()), t  # no hole in any interval
    calibration = calibrate_intervals(*calibrated_model(500, seed=3), score=score)
    narrow, wide = rank_intervals(p, calibration, 0.5), rank_intervals(p, calibration, 0.95)
    assert bool(((wide[0] <= narrow[0]) & (narrow[1] <= wide[1])).all())


def test_the_threshold_is_the_finite_sample_quantile():
    p, labels = calibrated_model(9, seed=4)
    calibration = calibrate_intervals(p, labels, score="absolute")
    scores = nonconformity_scores(p, "absolute").gather(1, labels[:, None])[:, 0].sort().values
    assert calibration.threshold(0.9) == pytest.approx(float(scores[8]))  # ceil(10 * 0.9) = 9th of 9
    assert calibration.threshold(0.5) == pytest.approx(float(scores[4]))  # ceil(10 * 0.5) = 5th
    assert math.isinf(calibration.threshold(0.95))  # ceil(10 * 0.95) = 10 > 9 rows: every rank
    saved = torch.load(_saved(calibration.to_state()), weights_only=True)
    assert IntervalCalibration.from_state(saved).threshold(0.5) == calibration.threshold(0.5)
    lower, upper = rank_intervals(p, calibration, 0.95)
    assert bool((lower == 0).all() and (upper == N_RANKS - 1).all())


def noisy_calibration_case(learned: str, sigma: float = 1.5):
    """A model calibrated by construction whose labels are the clean rank with SOL's discrete Gaussian
    noise; the model learned either the noisy labels' distribution exactly (``p = π L``) or the clean
    rank's (``p = π``). Returns the calibration rows' ``p`` and noisy labels, the new rows' ``p`` and
    clean ranks."""
    likelihood = noise_kernel(N_RANKS, sigma)
    pi_cal, clean_cal = calibrated_model(3000, seed=5)
    noisy_cal = torch.multinomial(likelihood[clean_cal], 1, generator=torch.Generator().manual_seed(6))[:, 0]
    pi, clean = calibrated_model(30000, seed=7)
    p_cal, p = (pi_cal @ likelihood, pi @ likelihood) if learned == "noisy labels" else (pi_cal, pi)
    return p_cal, noisy_cal, p, clean


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("learned", ["noisy labels", "clean ranks"])
def test_the_clean_target_covers_the_clean_rank_where_the_noise_is_the_models(score, learned):
    """Whichever of the two the model learned, the clean target (its default, fitted deconvolution),
    calibrated on the noisy labels, covers the clean rank at the requested rate, with narrower
    intervals than plain split conformal on those labels."""
    sigma = 1.5
    p_cal, noisy_cal, p, clean = noisy_calibration_case(learned, sigma)
    plain = rank_intervals(p, calibrate_intervals(p_cal, noisy_cal, score=score), 0.9)
    aimed = rank_intervals(p, calibrate_intervals(p_cal, noisy_cal, score=score, target="clean",
                                                  label_noise=sigma), 0.9)
    assert abs(covered(*aimed, clean) - 0.9) <= 0.02
    assert covered(*plain, clean) > 0.93  # calibrated on noisier labels: wider than it needs to be
    assert (aimed[1] - aimed[0]).double().mean() < (plain[1] - plain[0]).double().mean()


def test_the_deconvolution_goes_as_far_as_the_labels_say():
    """The fitted deconvolution keeps a model of the clean rank nearly as it is, and takes a model of
    the noisy labels most of the way back to the clean rank's distribution. ``deconvolve=False`` reads
    the probabilities as the clean rank's: right for the first, over-covering for the second."""
    sigma = 1.5
    likelihood = noise_kernel(N_RANKS, sigma)
    p_cal, noisy_cal, p, clean = noisy_calibration_case("clean ranks", sigma)
    kept, kept_iterations = fitted_deconvolution(p_cal, noisy_cal, sigma)
    blurred, blurred_iterations = fitted_deconvolution(p_cal @ likelihood, noisy_cal, likelihood)
    assert kept_iterations <= 3 < 20 <= blurred_iterations
    assert (kept - p_cal).abs().sum(dim=1).mean() < 0.05
    assert (blurred - p_cal).abs().sum(dim=1).mean() < 0.5 * (p_cal @ likelihood - p_cal).abs().sum(dim=1).mean()
    assert torch.allclose(blurred.sum(dim=1), torch.ones(len(blurred), dtype=blurred.dtype)) and (blurred >= 0).all()
    for learned, p_cal_read, p_read in (("clean ranks", p_cal, p),
                                        ("noisy labels", p_cal @ likelihood, p @ likelihood)):
        as_given = calibrate_intervals(p_cal_read, noisy_cal, target="clean", label_noise=sigma, deconvolve=False)
        held = covered(*rank_intervals(p_read, as_given, 0.9), clean)
        assert abs(held - 0.9) <= 0.02 if learned == "clean ranks" else held > 0.93, (learned, held)


@pytest.mark.parametrize("spread", [3, 30])
def test_a_twice_labelled_subset_gives_the_noise_std(spread):
    """Two independent noisy labels of each item: sqrt(mean((first - second)^2) / 2) is the noise's std,
    however widely the clean values spread."""
    gen = torch.Generator().manual_seed(11)
    clean = torch.randint(0, spread, (20000,), generator=gen).double()
    first, second = (clean + 1.3 * torch.randn(20000, generator=gen, dtype=torch.float64) for _ in range(2))
    assert abs(noise_std_from_pairs(first, second) - 1.3) < 0.03
    assert abs(noise_std_from_pairs(first.tolist(), second.numpy()) - 1.3) < 0.03  # lists and arrays too
    assert noise_std_from_pairs(clean, clean) == 0.0
    # no noise: the clean target's refusal names the target that applies
    probabilities = torch.full((4, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="label_noise=0: .*target='labels'"):
        calibrate_intervals(probabilities, torch.tensor([0, 1, 2, 1]), target="clean",
                            label_noise=noise_std_from_pairs(clean, clean))


def test_a_raters_constant_bias_counts_as_noise():
    """The second rater always says one more than the first, who says the clean value: a square error
    of 0 and 1, 1/2 per label, which the mean square keeps (std sqrt(1/2)); the std of the differences
    would be 0."""
    clean = torch.arange(100, dtype=torch.float64)
    assert noise_std_from_pairs(clean, clean + 1) == pytest.approx(math.sqrt(0.5))


@pytest.mark.parametrize("first, second, error, names", [
    ([1, 2, 3], [1, 2], ValueError, "same items"),
    ([1], [2], ValueError, "at least 2"),
    ([1, float("nan")], [1, 2], ValueError, "first"),
    ([1, 2], [1, float("inf")], ValueError, "second"),
    (["a", "b"], [1, 2], TypeError, "first"),
    ([[1, 2], [3, 4]], [1, 2, 3, 4], ValueError, "first must be 1-D"),
])
def test_bad_pairs_are_refused_by_name(first, second, error, names):
    with pytest.raises(error, match=names):
        noise_std_from_pairs(first, second)


@pytest.mark.parametrize("call, error, names", [
    (lambda p, y: calibrate_intervals(p, y, score="widest"), ValueError, "score"),
    (lambda p, y: calibrate_intervals(p, y, target="clean"), ValueError, "label_noise"),
    (lambda p, y: calibrate_intervals(p, y, label_noise=1.0), ValueError, "label_noise"),
    (lambda p, y: calibrate_intervals(p, y, target="clean", label_noise=torch.eye(3)), ValueError, "label_noise"),
    (lambda p, y: calibrate_intervals(p, y, target="clean", label_noise=1.0, deconvolve="no"), TypeError,
     "deconvolve"),
    (lambda p, y: calibrate_intervals(p * 2, y), ValueError, "probabilities"),
    (lambda p, y: fitted_deconvolution(p, y, None), ValueError, "label_noise"),
    (lambda p, y: fitted_deconvolution(p[:0], y[:0], 1.0), ValueError, "no rows"),
    (lambda p, y: fitted_deconvolution(p, y[:-1], 1.0), ValueError, "ranks"),
    (lambda p, y: calibrate_intervals(p, y + N_RANKS), ValueError, "ranks"),
    (lambda p, y: rank_intervals(p, calibrate_intervals(p, y), coverage=1.0), ValueError, "coverage"),
    (lambda p, y: rank_intervals(p, "0.9"), TypeError, "calibration"),
    (lambda p, y: rank_intervals(p[:, :6].softmax(1), calibrate_intervals(p, y)), ValueError,
     "probabilities have 6 ranks, but the calibration was made on 12"),
    (lambda p, y: calibrate_intervals(p, y, target="clean", label_noise=torch.ones(2)), ValueError,
     r"label_noise must be a number \(the noise std in ranks\) or a matrix \[n, n\] = \[12, 12\]"),
])
def test_bad_arguments_are_refused_by_name(call, error, names):
    p, labels = calibrated_model(20, seed=8)
    with pytest.raises(error, match=names):
        call(p, labels)


def test_a_head_calibrates_predicts_intervals_and_saves_the_calibration():
    gen = torch.Generator().manual_seed(9)
    n, d = 8, 6
    x = torch.nn.functional.normalize(torch.randn(900, d, generator=gen, dtype=torch.float64), dim=1)
    labels = ((x[:, 0] + 1) / 2 * (n - 1)).round().long()
    head = sol_ext.SOLHead(n, d, sigma=1.0)
    head.update(x[:600], labels[:600])
    with pytest.raises(RuntimeError, match="calibrate_intervals"):
        head.predict_interval(x[600:])
    calibration = head.calibrate_intervals(x[600:750], labels[600:750], score="cumulative")
    lower, upper = head.predict_interval(x[750:], coverage=0.9)
    expected = rank_intervals(head.predict_proba(x[750:]), calibration, 0.9)
    assert torch.equal(lower, expected[0]) and torch.equal(upper, expected[1])

    restored = sol_ext.SOLHead(n, d, sigma=1.0)
    restored.load_state_dict(head.state_dict())
    assert restored.interval_calibration.score == "cumulative" and restored.interval_calibration.count == 150
    assert all(torch.equal(a, b) for a, b in zip(restored.predict_interval(x[750:]), (lower, upper)))
    # a state saved before calibrating leaves a calibrated head without one
    plain = sol_ext.SOLHead(n, d, sigma=1.0)
    plain.update(x[:600], labels[:600])
    restored.load_state_dict(plain.state_dict())
    assert restored.interval_calibration is None


def test_numpy_reals_and_a_std_in_a_0_d_tensor_are_taken_as_numbers():
    """coverage=np.float32(0.9) is a real number between 0 and 1, and label_noise=torch.tensor(1.0) a
    std, not a matrix of the wrong shape."""
    import numpy as np

    p, labels = calibrated_model(200, seed=3)
    calibration = calibrate_intervals(p, labels)
    as_float = rank_intervals(p, calibration, coverage=float(np.float32(0.9)))
    for given in (np.float32(0.9), np.float64(float(np.float32(0.9)))):
        assert all(torch.equal(a, b) for a, b in zip(rank_intervals(p, calibration, coverage=given), as_float))
    in_tensor = calibrate_intervals(p, labels, target="clean", label_noise=torch.tensor(1.0))
    as_number = calibrate_intervals(p, labels, target="clean", label_noise=1.0)
    assert torch.equal(in_tensor.scores, as_number.scores)
    assert torch.equal(in_tensor.cumulative_weights, as_number.cumulative_weights)


def test_a_calibration_keeps_its_number_of_ranks_through_its_state():
    p, labels = calibrated_model(50, seed=4)
    calibration = calibrate_intervals(p, labels)
    assert calibration.num_ranks == N_RANKS
    again = IntervalCalibration.from_state(torch.load(_saved(calibration.to_state()), weights_only=True))
    assert again.num_ranks == N_RANKS
    with pytest.raises(ValueError, match="calibration was made on 12"):
        rank_intervals(torch.full((3, 9), 1 / 9, dtype=torch.float64), again)


def _fitted_head(n: int = 8, d: int = 6):
    gen = torch.Generator().manual_seed(9)
    x = torch.nn.functional.normalize(torch.randn(900, d, generator=gen, dtype=torch.float64), dim=1)
    labels = ((x[:, 0] + 1) / 2 * (n - 1)).round().long()
    head = sol_ext.SOLHead(n, d, sigma=1.0)
    head.update(x[:600], labels[:600])
    return head, x, labels


def test_a_head_calibrated_on_too_few_rows_warns_as_sol_ext_predict_does():
    """One calibration row cannot calibrate 90 %: every interval is the whole scale, and the head
    says so with the line `sol-ext predict --interval 0.9` prints (coverage= is --interval there);
    the 9 rows it names are enough."""
    import warnings

    from sol_ext.intervals import CalibrationSizeWarning

    head, x, labels = _fitted_head()
    head.calibrate_intervals(x[600:601], labels[600:601])
    with pytest.warns(CalibrationSizeWarning, match=r"^coverage=0\.9: 1 calibration row cannot calibrate 90% "
                                                    r"\(it needs at least 9\); every interval is the whole scale"):
        lower, upper = head.predict_interval(x[750:760], coverage=0.9)
    assert bool((lower == 0).all()) and bool((upper == 7).all())
    head.calibrate_intervals(x[600:609], labels[600:609])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationSizeWarning)
        lower, upper = head.predict_interval(x[750:760], coverage=0.9)
    assert bool((upper - lower < 7).any())


@pytest.mark.parametrize("coverage", [0.8, 0.9, 0.95, 0.99, 0.999])
def test_the_minimum_of_calibration_rows_is_where_the_threshold_turns_finite(coverage):
    import warnings

    from sol_ext.intervals import CalibrationSizeWarning, minimum_calibration_rows

    rows = minimum_calibration_rows(coverage)
    p, labels = calibrated_model(rows, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationSizeWarning)
        assert math.isfinite(calibrate_intervals(p, labels).threshold(coverage))
    with pytest.warns(CalibrationSizeWarning, match=f"it needs at least {rows}\\)"):
        assert math.isinf(calibrate_intervals(p[1:], labels[1:]).threshold(coverage))


def test_a_heads_calibration_holds_its_number_of_ranks():
    """The head's calibration, taken out of it (or out of a saved state), refuses probabilities of
    another number of ranks, as a calibration of calibrate_intervals does."""
    head, x, labels = _fitted_head()
    head.calibrate_intervals(x[600:750], labels[600:750])
    restored = sol_ext.SOLHead(8, 6, sigma=1.0)
    restored.load_state_dict(head.state_dict())
    for calibration in (head.interval_calibration, restored.interval_calibration):
        assert calibration.num_ranks == 8
        with pytest.raises(ValueError, match="probabilities have 9 ranks, but the calibration was made on 8"):
            rank_intervals(torch.full((3, 9), 1 / 9, dtype=torch.float64), calibration)
