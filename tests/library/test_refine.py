"""Outlier detection and relabeling (docs/math.md §8) on hand-made cases and the label-noise model and its fit."""

import pytest
import torch

from sol_ext import refine
from sol_ext.refine import detect_outliers, refine_labels, relabel, relabel_step

T = torch.tensor


def test_outliers_per_label_group():
    labels = T([2, 2, 2, 5, 5])
    pred = T([2, 0, 1, 5, 9])           # |dev| = 0, 2, 1 | 0, 4
    flags = detect_outliers(labels, pred, 10, beta=0.9)
    assert flags.tolist() == [False, True, False, False, True]


def test_beta_edge_counts_as_outlier():
    labels = T([2, 2, 2])
    pred = T([2, 0, 1])                 # max |dev| = 2; beta * 2 = 1 exactly
    assert detect_outliers(labels, pred, 4, beta=0.5).tolist() == [False, True, True]
    assert detect_outliers(labels, pred, 4, beta=0.51).tolist() == [False, True, False]


def test_zero_deviation_is_never_an_outlier():
    labels = T([1, 1, 3])
    pred = T([1, 1, 3])                 # max |dev| of each group is 0: 0 >= beta*0 but dev == 0
    assert not detect_outliers(labels, pred, 4, beta=0.9).any()
    ref = refine_labels(labels, pred, 4, beta=0.9)
    assert ref.num_outliers == 0 and ref.step == 0.0 and torch.equal(ref.labels, labels)


def test_groups_are_separate():
    # group 0 has a huge deviation; group 1's small one is still its own maximum
    labels = T([0, 0, 1])
    pred = T([0, 9, 2])
    assert detect_outliers(labels, pred, 10, beta=0.9).tolist() == [False, True, True]


def test_relabel_step_and_direction():
    labels = T([2, 2, 2, 5, 5])
    pred = T([2, 0, 1, 5, 9])
    ref = refine_labels(labels, pred, 10, beta=0.9)
    assert ref.step == pytest.approx(0.5 * (0 + 2 + 1 + 0 + 4) / 5)   # 0.7
    # r=2, dev=+2: round(2 - 0.7) = 1; r=5, dev=-4: round(5 + 0.7) = 6
    assert ref.labels.tolist() == [2, 1, 2, 5, 6]
    assert ref.num_outliers == 2 and ref.num_relabeled == 2
    assert ref.deviation.tolist() == [0, 2, 1, 0, -4]


def test_relabel_clips_to_rank_range():
    new = relabel(T([0, 3]), T([-5, 4]), T([True, True]), num_ranks=4, step=2.0)
    # dev = r - pred: dev < 0 moves up (0 -> 2), dev > 0 moves down (3 -> 1)
    assert new.tolist() == [2, 1]
    clipped = relabel(T([0, 3]), T([5, -5]), T([True, True]), num_ranks=4, step=2.0)
    assert clipped.tolist() == [0, 3]   # would leave 0..3: clipped, so unchanged


def test_flagged_sample_with_tiny_step_is_not_counted_as_relabeled():
    labels = T([4, 4, 4, 4])
    pred = T([4, 4, 4, 3])             # mean |dev| = 0.25, step 0.125: round(3.875) = 4
    ref = refine_labels(labels, pred, 8, beta=0.9)
    assert ref.num_outliers == 1 and ref.num_relabeled == 0


def test_floor_step_as_in_official_code():
    dev = T([3, -3, 1, 0])
    assert relabel_step(dev) == pytest.approx(0.875)
    assert relabel_step(dev, floor=True) == 0.0


def test_relabels_accumulate_across_rounds():
    labels = T([0, 0, 0, 8, 8])
    pred = T([0, 0, 0, 0, 8])           # sample 3 sits far from its label
    first = refine_labels(labels, pred, 10, beta=0.9)
    # step = 0.5 * 8 / 5 = 0.8 -> round(8 - 0.8) = 7
    assert first.labels.tolist() == [0, 0, 0, 7, 8]
    second = refine_labels(first.labels, pred, 10, beta=0.9)
    # now in group 7 alone: dev 7, step = 0.5 * 7 / 5 = 0.7 -> round(6.3) = 6
    assert second.labels.tolist() == [0, 0, 0, 6, 8]


def test_bad_beta_and_shapes():
    with pytest.raises(ValueError, match="beta"):
        detect_outliers(T([0]), T([0]), 2, beta=0.0)
    with pytest.raises(ValueError, match="same shape"):
        detect_outliers(T([0, 1]), T([0]), 2, beta=0.9)
    with pytest.raises(ValueError, match="0..1"):
        detect_outliers(T([0, 2]), T([0, 0]), 2, beta=0.9)


# -- the posterior rule (the driver's default; not in the paper) -----------------------------------

def _one_hot_probs(ranks, n, spread=0.0):
    p = torch.full((len(ranks), n), spread / n, dtype=torch.float64)
    p[torch.arange(len(ranks)), torch.tensor(ranks)] += 1.0 - spread
    return p / p.sum(dim=1, keepdim=True)


def test_posterior_rule_moves_a_label_only_when_the_evidence_is_one_sided():
    from sol_ext import noise_kernel
    from sol_ext.refine import posterior_relabel

    n = 10
    kernel = noise_kernel(n, 1.0, dtype=torch.float64)
    labels = torch.tensor([0, 5, 5])
    # sample 0: the model is sure of rank 4, four ranks above its label -> moves up;
    # sample 1: the model agrees with the label -> stays; sample 2: the model is vague -> stays
    probs = torch.stack([_one_hot_probs([4], n)[0], _one_hot_probs([5], n)[0],
                         torch.full((n,), 1.0 / n, dtype=torch.float64)])
    out = posterior_relabel(labels, probs, kernel, mass=0.98)
    assert out.labels.tolist() == [4, 5, 5] and out.flagged.tolist() == [True, False, False]
    assert out.num_relabeled == 1 and out.confidence[0] > 0.98


def test_posterior_rule_never_moves_labels_under_an_exact_noise_model():
    from sol_ext.refine import posterior_relabel

    n = 6
    probs = torch.softmax(torch.randn(50, n, dtype=torch.float64) * 5, dim=1)
    labels = torch.randint(0, n, (50,))
    out = posterior_relabel(labels, probs, torch.eye(n, dtype=torch.float64), mass=0.5)
    assert out.num_relabeled == 0 and torch.equal(out.labels, labels)


def test_posterior_rule_checks_its_arguments():
    from sol_ext.refine import posterior_relabel

    kernel = torch.eye(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="mass"):
        posterior_relabel(torch.zeros(2, dtype=torch.long), torch.full((2, 4), 0.25), kernel, 0.3)
    with pytest.raises(ValueError, match="rank probabilities"):
        posterior_relabel(torch.zeros(2, dtype=torch.long), torch.full((2, 3), 0.3), kernel)


# --------------------------------------------------------------------------------------------------
# the label-noise model and its fit


def _sharp_dissimilarities(true_ranks, num_ranks):
    """``D`` of an encoder that knows each sample's rank, growing linearly with the rank distance
    (a ``D`` quadratic in it would make temperature and Gaussian noise indistinguishable)."""
    q = torch.arange(num_ranks, dtype=torch.float64)
    return (q[None, :] - true_ranks[:, None].double()).abs() / 0.5


@pytest.mark.parametrize("std", [1.0, 2.0])
def test_label_noise_is_estimated_where_the_encoder_is_sharper_than_the_labels(std):
    g = torch.Generator().manual_seed(0)
    n = 20
    true = torch.randint(0, n, (3000,), generator=g)
    noisy = (true + torch.round(std * torch.randn(3000, generator=g))).clamp(0, n - 1).long()
    fit = refine.fit_label_noise(_sharp_dissimilarities(true, n), noisy, n)
    assert 0.7 * std <= fit.std <= 1.4 * std
    assert fit.kernel.shape == (n, n) and fit.posterior.temperature > 0
    # exact labels: no noise, and the kernel is the identity
    exact = refine.fit_label_noise(_sharp_dissimilarities(true, n), true, n)
    assert exact.std == 0.0 and torch.equal(exact.kernel, torch.eye(n, dtype=torch.float64))


def test_label_noise_kernel_is_the_law_of_rounded_and_clipped_gaussian_noise():
    """P[q, r] of label_noise_kernel against the frequencies of sol_ext.driver.synthetic_noise's Gaussian noise (added,
    rounded, clipped to the scale): an error past an end lands on the end rank."""
    from sol_ext.driver.synthetic_noise import add_label_noise, noise_scale
    from sol_ext.refine import label_noise_kernel

    n, per_rank = 6, 20000
    clean = torch.arange(n).repeat_interleave(per_rank)
    noisy = add_label_noise(clean, n, "gaussian", kappa=0.8, seed=0).noisy
    kernel = label_noise_kernel(n, noise_scale(clean, 0.8))
    counts = torch.zeros(n, n, dtype=torch.float64)
    counts.index_put_((clean, noisy), torch.ones(clean.numel(), dtype=torch.float64), accumulate=True)
    torch.testing.assert_close(kernel, counts / per_rank, atol=0.01, rtol=0)
    torch.testing.assert_close(kernel.sum(dim=1), torch.ones(n, dtype=torch.float64))
    assert kernel[0, 0] > kernel[1, 1]  # the low end collects every error below it
    far = label_noise_kernel(12, 0.5)  # 21 stds from rank 0 to the last bin: about 1e-100
    assert (far > 0).all() and far[0, -1] < 1e-90  # tiny, but not a difference of CDFs rounded to 0
    assert torch.equal(label_noise_kernel(4, 0.0), torch.eye(4, dtype=torch.float64))
