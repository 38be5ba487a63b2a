"""sol_ext.driver.synthetic_noise, the label-noise generators (docs/math.md section 9): statistics, seeding,
partial noise, clipping, bad input; and their former path sol_ext.noise."""

import math

import numpy as np
import pytest
import torch

from sol_ext.driver.synthetic_noise import (
    NOISE_TYPES,
    PEAK_FRACTION,
    WIDTH_FRACTION,
    add_label_noise,
    default_peak_width,
    input_dependent_scale,
    noise_scale,
    noise_statistics,
)

N_RANKS = 2001


@pytest.fixture(scope="module")
def clean():
    # Ranks far from both ends, so nothing is clipped; sigma_X = std of U{900..1100} ≈ 58.
    rng = np.random.default_rng(123)
    return torch.from_numpy(rng.integers(900, 1101, size=200_000))


def _diff(labels):
    return (labels.noisy - labels.clean).double().numpy()


def test_scale_is_kappa_times_population_std(clean):
    labels = add_label_noise(clean, N_RANKS, "gaussian", kappa=0.1)
    assert labels.scale == pytest.approx(0.1 * float(clean.double().std(unbiased=False)))
    assert noise_scale(clean, 0.1) == pytest.approx(labels.scale)


def test_gaussian_statistics(clean):
    labels = add_label_noise(clean, N_RANKS, "gaussian", kappa=0.1, seed=1)
    s, d = labels.scale, _diff(labels)
    assert abs(d.mean()) < 0.05
    # Rounding to the grid adds variance 1/12 (Sheppard's correction); the MAE barely moves for s >> 1.
    assert d.std() == pytest.approx(math.sqrt(s**2 + 1 / 12), rel=0.01)
    assert np.abs(d).mean() == pytest.approx(s * math.sqrt(2 / math.pi), rel=0.01)


def test_laplacian_statistics(clean):
    labels = add_label_noise(clean, N_RANKS, "laplacian", kappa=0.1, seed=2)
    s, d = labels.scale, _diff(labels)
    assert d.std() == pytest.approx(math.sqrt(2 * s**2 + 1 / 12), rel=0.015)
    assert np.abs(d).mean() == pytest.approx(s, rel=0.015)


def test_uniform_statistics_and_bounds(clean):
    labels = add_label_noise(clean, N_RANKS, "uniform", kappa=0.1, seed=3)
    s, d = labels.scale, _diff(labels)
    assert np.abs(d).max() <= math.floor(s + 0.5)
    assert d.std() == pytest.approx(math.sqrt(s**2 / 3 + 1 / 12), rel=0.01)
    assert np.abs(d).mean() == pytest.approx(s / 2, rel=0.02)


def test_skewed_has_positive_mean(clean):
    labels = add_label_noise(clean, N_RANKS, "skewed", kappa=0.1, seed=4)
    s, d = labels.scale, _diff(labels)
    delta = 5 / math.sqrt(26)
    assert d.mean() > 0
    assert d.mean() == pytest.approx(s * delta * math.sqrt(2 / math.pi), rel=0.02)
    assert d.std() == pytest.approx(math.sqrt(s**2 * (1 - 2 * delta**2 / math.pi) + 1 / 12), rel=0.02)
    assert (d < 0).mean() < 0.1  # a = 5 puts little mass below 0


def test_input_dependent_is_larger_at_the_peak():
    n = 201
    clean = torch.tensor([100] * 50_000 + [20] * 50_000)
    labels = add_label_noise(clean, n, "input-dependent", kappa=0.1, seed=5, peak=100, width=10)
    s, d = labels.scale, _diff(labels)
    at_peak, far = d[:50_000], d[50_000:]
    assert at_peak.std() == pytest.approx(math.sqrt((2 * s) ** 2 + 1 / 12), rel=0.02)
    assert far.std() == pytest.approx(math.sqrt(s**2 + 1 / 12), rel=0.02)


def test_input_dependent_defaults_reproduce_the_paper_on_morph():
    # MORPH II: ages 16..77 (62 ranks), r_peak = 40 years -> rank 24, w = 15 years.
    peak, width = default_peak_width(62)
    assert peak == pytest.approx(24.0)
    assert width == pytest.approx(15.0)
    assert default_peak_width(29) == pytest.approx((PEAK_FRACTION * 28, WIDTH_FRACTION * 28))


def test_input_dependent_scale_doubles_at_the_peak():
    scale = input_dependent_scale(np.array([24.0, 24.0 + 15.0, 1000.0]), 0.5, 24.0, 15.0)
    assert scale == pytest.approx([1.0, 0.5 * (1 + math.exp(-0.5)), 0.5])


@pytest.mark.parametrize("noise", NOISE_TYPES)
def test_seed_reproducibility_and_types(noise):
    clean = torch.arange(50).repeat(20)
    a = add_label_noise(clean, 50, noise, kappa=0.3, seed=7)
    b = add_label_noise(clean, 50, noise, kappa=0.3, seed=7)
    assert torch.equal(a.noisy, b.noisy)
    assert a.noisy.dtype == torch.int64 and a.noisy.shape == clean.shape
    assert torch.equal(a.clean, clean)
    assert int(a.noisy.min()) >= 0 and int(a.noisy.max()) <= 49
    if noise != "none":
        c = add_label_noise(clean, 50, noise, kappa=0.3, seed=8)
        assert not torch.equal(a.noisy, c.noisy)


def test_partial_fraction():
    clean = torch.arange(100).repeat(50)  # 5000 samples
    full = add_label_noise(clean, 100, "gaussian", kappa=0.3, seed=9)
    part = add_label_noise(clean, 100, "gaussian", kappa=0.3, seed=9, fraction=0.2)
    assert int(part.selected.sum()) == 1000
    assert torch.equal(part.noisy[~part.selected], clean[~part.selected])
    # The noise of a selected sample is the one it gets with fraction=1 (independent streams).
    assert torch.equal(part.noisy[part.selected], full.noisy[part.selected])
    assert bool(full.selected.all())
    none = add_label_noise(clean, 100, "gaussian", kappa=0.3, seed=9, fraction=0.0)
    assert torch.equal(none.noisy, clean)


def test_clipping_at_both_ends():
    clean = torch.tensor([0] * 5000 + [9] * 5000)
    labels = add_label_noise(clean, 10, "gaussian", kappa=1.0, seed=10)
    assert int(labels.noisy.min()) == 0 and int(labels.noisy.max()) == 9
    low = labels.noisy[:5000]
    # Half of the draws go below 0 and are clipped there: about 60 % stay at rank 0 (50 % + rounding).
    assert 0.5 < float((low == 0).double().mean()) < 0.7


@pytest.mark.parametrize("kwargs", [{"noise": "none"}, {"kappa": 0.0}])
def test_clean_copy(kwargs):
    clean = torch.arange(10)
    labels = add_label_noise(clean, 10, **kwargs)
    assert torch.equal(labels.noisy, clean)
    assert labels.noisy.data_ptr() != clean.data_ptr()  # a copy, safe to relabel in place
    assert labels.scale == 0.0 and not bool(labels.selected.any())


def test_accepts_numpy_lists_and_spelling_variants():
    a = add_label_noise(np.arange(20), 20, "Input_Dependent", seed=1)
    b = add_label_noise(list(range(20)), 20, "input-dependent", seed=1)
    assert torch.equal(a.noisy, b.noisy)


def test_noise_statistics_hand_case():
    stats = noise_statistics(torch.tensor([1, 2, 5, 3]), torch.tensor([1, 3, 3, 3]))
    assert stats["mae"] == pytest.approx(0.75)
    assert stats["mean"] == pytest.approx(0.25)
    assert stats["std"] == pytest.approx(np.std([0, -1, 2, 0]))
    assert stats["fraction_wrong"] == pytest.approx(0.5)
    assert stats["max_abs"] == 2.0


@pytest.mark.parametrize("kwargs,match", [
    ({"kappa": -0.1}, "kappa"),
    ({"kappa": float("nan")}, "kappa"),
    ({"noise": "cauchy"}, "unknown noise type 'cauchy'"),
    ({"fraction": 1.5}, "fraction"),
    ({"noise": "gaussian", "peak": 3.0}, "input-dependent"),
    ({"noise": "input-dependent", "width": 0.0}, "width"),
    ({"seed": -1}, "seed"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        add_label_noise(torch.arange(10), 10, **kwargs)


def test_bad_ranks():
    with pytest.raises(ValueError, match="0 … 9"):
        add_label_noise(torch.tensor([0, 10]), 10)
    with pytest.raises(ValueError, match="integer ranks"):
        add_label_noise(torch.tensor([0.5, 1.0]), 10)
    with pytest.raises(ValueError, match="1-D"):
        add_label_noise(torch.zeros(2, 2, dtype=torch.long), 10)
    with pytest.raises(ValueError, match="num_ranks"):
        add_label_noise(torch.tensor([0]), 0)
