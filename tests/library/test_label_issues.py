"""find_label_issues / get_label_quality_scores / label_issue_scores: hand-made cases, a synthetic
corruption test, agreement with sol_ext.refine.posterior_relabel (the same rule with a noise kernel)
and with cleanlab where their definitions coincide."""

import numpy as np
import pytest
import torch

from sol_ext.label_issues import (
    DEFAULT_MIN_SCORE,
    confident_joint_counts,
    find_label_issues,
    get_label_quality_scores,
    label_issue_scores,
    sharpen_through_noise,
)
from sol_ext.refine import label_noise_kernel, posterior_relabel


def _ranked(labels, probs, noise_kernel=None, min_score=0.5):
    """Indices flagged by the score rule, most suspicious first, and their scores."""
    idx = find_label_issues(labels, probs, filter_by="min_score", return_indices_ranked_by="label_quality",
                            noise_kernel=noise_kernel, min_score=min_score)
    return idx, label_issue_scores(labels, probs, noise_kernel)[idx]


def _flag_mask(indices, n):
    mask = np.zeros(n, dtype=bool)
    mask[indices] = True
    return mask


def test_confident_far_label_ranks_above_near_one():
    peak = [0.0, 0.0, 0.0, 0.0, 0.05, 0.9, 0.05]  # the model is sure of rank 5 (± 1)
    probs = np.array([peak, peak, peak])
    labels = np.array([4, 2, 5])                    # one rank off, three off, right
    idx, scores = _ranked(labels, probs)
    assert idx.tolist() == [1, 0]
    assert scores == pytest.approx([1.0, 0.95])
    assert idx.dtype == np.int64 and scores.dtype == np.float64


def test_equal_scores_go_to_the_larger_distance_then_the_index():
    sure = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]           # every wrong label has score 1
    probs = np.array([sure] * 5)
    labels = np.array([4, 1, 3, 1, 5])
    idx, scores = _ranked(labels, probs)
    # distances 1, 4, 2, 4 (and 0: not flagged): 4 before 2 before 1, index order within the 4s
    assert idx.tolist() == [1, 3, 2, 0]
    assert scores.tolist() == [1.0] * 4


def test_quality_blends_the_tail_with_the_labels_own_probability():
    # Both labels have 0.7 of the mass below them (score 0.7); the second gets less probability
    # itself (0.1 against 0.3), so it is the more suspect: quality = p[label] + min(below, above) / 2.
    probs = np.array([[0.7, 0.3, 0.0, 0.0], [0.7, 0.1, 0.2, 0.0]])
    labels = np.array([1, 1])
    assert label_issue_scores(labels, probs) == pytest.approx([0.7, 0.7])
    assert get_label_quality_scores(labels, probs) == pytest.approx([0.3, 0.2])
    assert find_label_issues(labels, probs, min_score=0.6, return_indices_ranked_by="label_quality").tolist() == [1, 0]


def test_label_at_the_median_is_not_flagged_however_wide():
    wide = np.array([0.05, 0.1, 0.2, 0.3, 0.2, 0.1, 0.05])  # p[3] is only 0.3, median 3
    probs = np.array([wide] * 3)
    labels = np.array([3, 2, 4])
    scores = label_issue_scores(labels, probs)
    assert scores == pytest.approx([0.35, 0.65, 0.65])  # 0.05+0.1+0.2 below 3; 0.3+0.2+0.1+0.05 above 2
    idx, _ = _ranked(labels, probs)
    assert idx.tolist() == [1, 2]
    # one rank off on this wide posterior: a suspect at the median rule, not where 0.7 is asked for
    assert _ranked(labels, probs, min_score=0.7)[0].size == 0


def test_exact_half_flags_neither_median():
    # Half the mass on each of ranks 0 and 1: both are medians (posterior_relabel would move label 1
    # to the lower one), so neither label is a suspect at min_score 0.5, though both have score 0.5.
    probs = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    labels = np.array([0, 1])
    assert label_issue_scores(labels, probs).tolist() == [0.5, 0.5]
    assert _ranked(labels, probs)[0].tolist() == []


def test_min_score_threshold_and_bounds():
    probs = np.array([[0.1, 0.2, 0.7], [0.0, 0.1, 0.9], [0.3, 0.4, 0.3]])
    labels = np.array([0, 0, 1])                    # scores 0.9, 1.0, 0.3
    assert _ranked(labels, probs, min_score=0.5)[0].tolist() == [1, 0]
    assert _ranked(labels, probs, min_score=0.9)[0].tolist() == [1, 0]
    assert _ranked(labels, probs, min_score=0.95)[0].tolist() == [1]
    assert _ranked(labels, probs, min_score=0.999)[0].tolist() == [1]
    for bad in (0.49, 1.0, 1.5, float("nan"), True, "0.6"):
        with pytest.raises(ValueError, match=r"min_score must be a number in \[0.5, 1\)"):
            _ranked(labels, probs, min_score=bad)


def test_torch_and_numpy_inputs_agree():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(200, 9, generator=gen), dim=1)
    labels = torch.randint(0, 9, (200,), generator=gen)
    kernel = label_noise_kernel(9, 0.7)
    for k in (None, kernel):
        ref_idx, ref_scores = _ranked(labels.numpy(), probs.numpy(),
                                                noise_kernel=None if k is None else k.numpy())
        for lab, p in ((labels, probs), (labels.tolist(), probs.float()), (labels.double(), probs.numpy())):
            idx, scores = _ranked(lab, p, noise_kernel=k)
            assert np.array_equal(idx, ref_idx)
            assert np.allclose(scores, ref_scores, rtol=0, atol=1e-6)  # float32 probabilities round
        assert ref_idx.size > 0


def test_scores_of_flagged_match_label_issue_scores():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.full(6, 0.7), size=300)
    labels = rng.integers(0, 6, 300)
    all_scores = label_issue_scores(labels, probs)
    assert all_scores.shape == (300,) and all_scores.dtype == np.float64
    assert np.all((all_scores >= 0) & (all_scores <= 1))
    idx, scores = _ranked(labels, probs, min_score=0.6)
    assert np.array_equal(scores, all_scores[idx])
    assert np.all(np.diff(get_label_quality_scores(labels, probs)[idx]) >= 0)  # lowest quality first
    assert set(idx.tolist()) <= set(np.flatnonzero(all_scores >= 0.6).tolist())


def test_empty_input():
    idx, scores = _ranked(np.zeros(0, dtype=np.int64), np.zeros((0, 4)))
    assert idx.shape == (0,) and scores.shape == (0,)
    assert label_issue_scores([], np.zeros((0, 4))).shape == (0,)


@pytest.mark.parametrize("labels,probs,kwargs,match", [
    ([0, 1], [0.5, 0.5], {}, "pred_probs must be a 2-D array"),
    ([0, 1, 1], [[0.5, 0.5], [0.5, 0.5]], {}, r"labels must be a 1-D vector \[N\].*N = 2.*\(3,\)"),
    ([[0, 1], [1, 0]], [[0.5, 0.5], [0.5, 0.5]], {}, "labels must be a 1-D vector"),
    ([0, 2], [[0.5, 0.5], [0.5, 0.5]], {}, "labels must be integer ranks in 0 … n-1 = 0 … 1.*got 2 at index 1"),
    ([-1, 0], [[0.5, 0.5], [0.5, 0.5]], {}, "labels must be integer ranks.*got -1 at index 0"),
    ([0.5, 0], [[0.5, 0.5], [0.5, 0.5]], {}, "labels must be integer ranks.*got 0.5"),
    ([0, 1], [[2.0, -1.0], [0.5, 0.5]], {}, "pred_probs must hold finite, non-negative.*row 0"),
    ([0, 1], [[0.5, float("nan")], [0.5, 0.5]], {}, "pred_probs must hold finite, non-negative"),
    ([0, 1], [[0.5, 0.5], [3.0, 1.0]], {}, "every row of pred_probs must sum to 1.*row 1 sums to 4"),
    ([0, 1], [[0.5, 0.5], [0.5, 0.5]], {"noise_kernel": np.eye(3)}, r"noise_kernel must be \[n, n\] = \[2, 2\]"),
    ([0, 1], [[0.5, 0.5], [0.5, 0.5]], {"noise_kernel": [[0.9, 0.9], [0.1, 0.1]]},
     "every row of noise_kernel must sum to 1.*row 0 sums to 1.8"),
])
def test_bad_inputs(labels, probs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _ranked(labels, probs, **kwargs)
    with pytest.raises(ValueError, match=match):
        label_issue_scores(labels, probs, **kwargs)


def test_rows_within_tolerance_are_accepted():
    probs = np.array([[0.3, 0.3, 0.3995], [0.2, 0.2, 0.6]], dtype=np.float32)
    assert label_issue_scores([0, 2], probs).shape == (2,)
    with pytest.raises(ValueError, match="every row of pred_probs must sum to 1"):
        label_issue_scores([0, 2], np.array([[0.3, 0.3, 0.398], [0.2, 0.2, 0.6]]))
    transposed = label_noise_kernel(3, 1.0).T   # columns of P are not distributions
    with pytest.raises(ValueError, match="every row of noise_kernel must sum to 1"):
        label_issue_scores([0, 2], probs, noise_kernel=transposed)


def _corrupted(seed: int, n: int = 10, size: int = 2000, rate: float = 0.2):
    """True ranks, labels of which ``rate`` moved by 1-3 ranks, and peaked probabilities around the truth."""
    rng = np.random.default_rng(seed)
    true = rng.integers(0, n, size)
    corrupted = rng.random(size) < rate
    offset = rng.choice([-3, -2, -1, 1, 2, 3], size)
    moved = true + offset
    moved = np.where((moved < 0) | (moved >= n), true - offset, moved)  # reflect off the ends
    labels = np.where(corrupted, moved, true)
    # A model that is roughly right: peaks at the true rank (give or take 0.1), of widths 0.5-1.2 ranks.
    center = true + rng.normal(0.0, 0.1, size)
    width = rng.uniform(0.5, 1.2, size)
    q = np.arange(n)
    probs = np.exp(-0.5 * ((q[None, :] - center[:, None]) / width[:, None]) ** 2)
    probs /= probs.sum(axis=1, keepdims=True)
    return labels, probs, corrupted


def _precision_recall(indices, corrupted):
    flagged = _flag_mask(indices, corrupted.size)
    hits = int((flagged & corrupted).sum())
    return hits / max(int(flagged.sum()), 1), hits / int(corrupted.sum())


def test_finds_corrupted_labels():
    labels, probs, corrupted = _corrupted(seed=0)
    assert 0.18 < corrupted.mean() < 0.22
    idx, scores = _ranked(labels, probs)
    precision, recall = _precision_recall(idx, corrupted)
    assert precision >= 0.9, precision
    assert recall >= 0.8, recall
    # Ranking: the most suspicious half of the flagged set is even cleaner.
    top_precision, _ = _precision_recall(idx[: idx.size // 2], corrupted)
    assert top_precision >= precision
    # Asking for more certainty trades recall for precision.
    strict = _ranked(labels, probs, min_score=0.8)[0]
    strict_precision, strict_recall = _precision_recall(strict, corrupted)
    assert strict_precision >= precision and strict_recall < recall
    # Control: the same numbers from another sample's probabilities are at chance (the corruption rate),
    # so the thresholds above can fail.
    idx, _ = _ranked(labels, np.roll(probs, 1, axis=0))
    precision, _ = _precision_recall(idx, corrupted)
    assert precision < 0.3


@pytest.mark.parametrize("mass", [0.5, 0.8, 0.98])
@pytest.mark.parametrize("std", [0.5, 1.5])
def test_agrees_with_posterior_relabel(mass, std):
    gen = torch.Generator().manual_seed(int(10 * std + 100 * mass))
    n, size = 12, 2000
    true = torch.randint(0, n, (size,), generator=gen)
    labels = (true + torch.randint(-3, 4, (size,), generator=gen)).clamp(0, n - 1)
    probs = torch.softmax(-0.5 * (torch.arange(n)[None, :] - true[:, None]).double() ** 2
                          + torch.randn(size, n, generator=gen, dtype=torch.float64), dim=1)
    kernel = label_noise_kernel(n, std)
    ref = posterior_relabel(labels, probs, kernel, mass=mass)
    scores = label_issue_scores(labels, probs, noise_kernel=kernel)
    assert np.array_equal(scores, ref.confidence.numpy())      # the same operations, bit for bit
    idx, flagged_scores = _ranked(labels, probs, noise_kernel=kernel, min_score=mass)
    assert np.array_equal(_flag_mask(idx, size), ref.flagged.numpy())
    assert 0 < idx.size < size
    # The kernel makes the label evidence: fewer suspects than from p(q | x) alone.
    alone = _ranked(labels, probs, min_score=mass)[0]
    assert idx.size <= alone.size


def test_sharpening_through_a_known_noise_recovers_the_rank_and_finds_more_wrong_labels():
    # A model of noisy labels describes them: its p is the rank's own p0 (std 0.6) widened by the noise
    # (std 1.5). Sharpened through the noise kernel it narrows back, and the posterior rule on it
    # finds more of the moved labels than on p itself, which counts the noise twice.
    rng = np.random.default_rng(11)
    n, size, std = 15, 4000, 1.5
    center = rng.uniform(2, n - 3, size)
    p0 = np.exp(-0.5 * ((np.arange(n)[None, :] - center[:, None]) / 0.6) ** 2)
    p0 /= p0.sum(axis=1, keepdims=True)
    kernel = label_noise_kernel(n, std).numpy()
    probs = p0 @ kernel                                            # p(label | x)
    true = (p0.cumsum(axis=1) < rng.uniform(size=(size, 1))).sum(axis=1).clip(max=n - 1)
    labels = (kernel[true].cumsum(axis=1) < rng.uniform(size=(size, 1))).sum(axis=1).clip(max=n - 1)
    sharp = sharpen_through_noise(labels, probs, kernel)
    assert sharp.shape == probs.shape and np.allclose(sharp.sum(axis=1), 1.0)

    def spread(p):
        mean = p @ np.arange(n)
        return np.sqrt(p @ np.arange(n) ** 2 - mean ** 2).mean()
    assert spread(sharp) < 0.7 * spread(probs)
    wrong = labels != true
    plain = find_label_issues(labels, probs, noise_kernel=kernel)
    through = find_label_issues(labels, sharp, noise_kernel=kernel)
    assert (through & wrong).sum() > 1.2 * (plain & wrong).sum()
    assert _precision_recall(np.flatnonzero(through), wrong)[0] >= 0.8
    # labels as exact as the model says (identity kernel, calibrated p): left as they are
    calibrated_labels, calibrated = _calibrated(seed=12, size=3000)
    assert np.allclose(sharpen_through_noise(calibrated_labels, calibrated, np.eye(20)), calibrated)
    with pytest.raises(ValueError, match=r"noise_kernel must be an \[n, n\] label-noise model"):
        sharpen_through_noise(labels, probs, None)
    with pytest.raises(ValueError, match=r"noise_kernel must be \[n, n\] = \[15, 15\]"):
        sharpen_through_noise(labels, probs, np.eye(14))


def test_label_the_kernel_rules_out_falls_back_to_the_model():
    # With a narrow kernel, P[q, 0] underflows to 0 for every rank q the model allows (5-7), so
    # p(q | x, r) has no mass; the model's p(q | x) then decides, and it is sure the rank is above 0.
    kernel = label_noise_kernel(12, 0.1)
    assert float(kernel[5:8, 0].max()) == 0.0
    probs = np.zeros((2, 12))
    probs[:, 5:8] = [0.2, 0.6, 0.2]
    labels = np.array([0, 6])
    scores = label_issue_scores(labels, probs, noise_kernel=kernel)
    assert scores[0] == 1.0 and scores[1] < 0.5
    assert _ranked(labels, probs, noise_kernel=kernel)[0].tolist() == [0]


# -- cleanlab's shape ------------------------------------------------------------------------------

def test_returns_a_mask_by_default_and_ranked_indices_on_request():
    labels, probs, corrupted = _corrupted(seed=3)
    mask = find_label_issues(labels, probs)
    assert mask.dtype == bool and mask.shape == labels.shape
    assert labels[mask].size == int(mask.sum()) > 0        # indexes the labels as cleanlab's does
    ranked = find_label_issues(labels, probs, return_indices_ranked_by="label_quality")
    assert ranked.dtype == np.int64 and sorted(ranked.tolist()) == np.flatnonzero(mask).tolist()
    quality = get_label_quality_scores(labels, probs)
    assert np.all(np.diff(quality[ranked]) >= 0)           # lowest quality first
    by_confidence = find_label_issues(labels, probs, return_indices_ranked_by="self_confidence")
    assert np.all(np.diff(probs[by_confidence, labels[by_confidence]]) >= 0)
    # the mean of the tail from the label outward (1 - score) and p[label]
    assert np.allclose(quality, (1.0 - label_issue_scores(labels, probs) + probs[np.arange(labels.size), labels]) / 2,
                       rtol=0, atol=1e-12)


def _calibrated(seed, size=20000, n=20):
    """Labels drawn from their own probabilities [size, n] (discretized Gaussians, widths 0.5-3 ranks):
    every label is correct in the sense that the model's p(q | x) explains it."""
    rng = np.random.default_rng(seed)
    center, width = rng.uniform(0, n - 1, size), rng.uniform(0.5, 3.0, size)
    probs = np.exp(-0.5 * ((np.arange(n)[None, :] - center[:, None]) / width[:, None]) ** 2)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = (probs.cumsum(axis=1) < rng.uniform(size=(size, 1))).sum(axis=1).clip(max=n - 1)
    return labels, probs


def test_default_flags_few_labels_that_the_probabilities_explain():
    # Labels as fuzzy as the model says they are: the default's false-flag budget (0.5 % at
    # min_score 0.9975) holds, where the confident joint's per-rank counts flag a large share.
    labels, probs = _calibrated(seed=6)
    mask = find_label_issues(labels, probs)
    assert np.array_equal(mask, find_label_issues(labels, probs, filter_by="min_score", min_score=DEFAULT_MIN_SCORE))
    assert mask.mean() <= 0.005, mask.mean()
    assert find_label_issues(labels, probs, filter_by="prune_by_class").mean() > 0.2
    # Labels moved far beyond the model's spread are what it flags, with few false flags among them.
    rng = np.random.default_rng(7)
    moved = rng.uniform(size=labels.size) < 0.05
    median = (probs.cumsum(axis=1) < 0.5).sum(axis=1)
    noisy = np.where(moved, np.where(median < 10, 19, 0), labels)
    mask = find_label_issues(noisy, probs)
    precision, recall = _precision_recall(np.flatnonzero(mask), noisy != labels)
    assert precision >= 0.9 and recall >= 0.9, (precision, recall)


def test_prune_by_class_prunes_each_rank_by_its_confident_joint_count():
    labels, probs, corrupted = _corrupted(seed=4)
    mask = find_label_issues(labels, probs, filter_by="prune_by_class")
    counts = confident_joint_counts(labels, probs)
    median = (np.cumsum(probs, axis=1) < 0.5).sum(axis=1)
    score = label_issue_scores(labels, probs)
    for rank in range(probs.shape[1]):
        rows = labels == rank
        # at most the rank's count, never a label at the median, and the rank's highest scores
        assert mask[rows].sum() <= counts[rank]
        assert not np.any(mask & (median == labels))
        if mask[rows].any() and (~mask[rows]).any():
            candidates = rows & ~mask & (median != labels)
            if candidates.any():
                assert score[mask & rows].min() >= score[candidates].max() - 1e-12
    precision, recall = _precision_recall(np.flatnonzero(mask), corrupted)
    assert precision >= 0.9 and recall >= 0.7, (precision, recall)


def test_with_a_noise_kernel_the_default_is_the_posterior_median_rule():
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(2 * torch.randn(500, 8, generator=gen, dtype=torch.float64), dim=1)
    labels = torch.randint(0, 8, (500,), generator=gen)
    kernel = label_noise_kernel(8, 1.0)
    mask = find_label_issues(labels, probs, noise_kernel=kernel)
    assert np.array_equal(mask, posterior_relabel(labels, probs, kernel, mass=0.5).flagged.numpy())
    assert np.array_equal(mask, find_label_issues(labels, probs, noise_kernel=kernel,
                                                  filter_by="predicted_neq_given"))


@pytest.mark.parametrize("kwargs,match", [
    ({"filter_by": "prune_by_noise_rate"}, r"filter_by must be one of 'prune_by_class'.*got 'prune_by_noise_rate'"),
    ({"filter_by": "both"}, "filter_by must be one of"),
    ({"return_indices_ranked_by": "normalized_margin"},
     r"return_indices_ranked_by must be None \(a boolean mask\) or one of 'label_quality', 'self_confidence'"),
    ({"filter_by": "confident_learning", "min_score": 0.8}, "min_score applies to filter_by='min_score' only"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        find_label_issues([0, 1], [[0.9, 0.1], [0.2, 0.8]], **kwargs)


def _random_case(seed, n, size=400):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, size), rng.dirichlet(np.full(n, 0.8), size=size)


@pytest.mark.parametrize("seed", range(4))
def test_two_ranks_agree_with_cleanlab(seed):
    # With two ranks the mass on the other side of a label is 1 - p[label], the median is the argmax
    # and our quality is cleanlab's self-confidence: scores, flags and orderings coincide.
    cl_filter = pytest.importorskip("cleanlab.filter")
    cl_rank = pytest.importorskip("cleanlab.rank")
    labels, probs = _random_case(seed, 2)
    assert np.allclose(get_label_quality_scores(labels, probs), cl_rank.get_label_quality_scores(labels, probs),
                       rtol=0, atol=1e-12)
    for filter_by in ("predicted_neq_given", "confident_learning"):
        ours = find_label_issues(labels, probs, filter_by=filter_by)
        assert np.array_equal(ours, cl_filter.find_label_issues(labels, probs, filter_by=filter_by)), filter_by
        assert 0 < ours.sum() < labels.size
    for ranking in ("label_quality", "self_confidence"):
        ours = find_label_issues(labels, probs, filter_by="predicted_neq_given", return_indices_ranked_by=ranking)
        theirs = cl_filter.find_label_issues(labels, probs, filter_by="predicted_neq_given",
                                             return_indices_ranked_by="self_confidence")
        assert np.array_equal(ours, theirs), ranking


def test_a_label_at_either_of_two_tied_medians_is_not_flagged():
    """0.5/0.5 over two ranks: both are medians (cleanlab: both argmaxes), so neither label is flagged,
    by any rule; a label beyond the tie is."""
    probs = np.array([[0.5, 0.5], [0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])
    labels = np.array([0, 1, 1, 0])
    for filter_by in ("predicted_neq_given", "confident_learning", "prune_by_class"):
        assert find_label_issues(labels, probs, filter_by=filter_by)[:2].tolist() == [False, False], filter_by
    assert find_label_issues(labels, probs, filter_by="predicted_neq_given").tolist() == [False, False, True, True]
    assert find_label_issues(labels, probs, min_score=0.5).tolist() == [False, False, True, True]
    wide = np.array([[0.25, 0.25, 0.5, 0.0]] * 4)   # the cumulative mass reaches 0.5 at rank 1: medians 1, 2
    assert find_label_issues([0, 1, 2, 3], wide, filter_by="predicted_neq_given").tolist() == \
        [True, False, False, True]
    cl_filter = pytest.importorskip("cleanlab.filter")
    assert np.array_equal(find_label_issues(labels, probs, filter_by="predicted_neq_given"),
                          cl_filter.find_label_issues(labels, probs, filter_by="predicted_neq_given"))


@pytest.mark.parametrize("n", [2, 3, 7])
def test_confident_joint_counts_are_cleanlabs(n):
    """Small cases too: where several ranks pass their thresholds, cleanlab counts the largest p of all
    (which 3 % of 8-sample, 3-rank cases tell apart from the largest above its threshold)."""
    count = pytest.importorskip("cleanlab.count")
    for seed in range(300):
        labels, probs = _random_case(seed, n, size=8 if seed >= 3 else 400)
        joint = count.compute_confident_joint(labels, probs, calibrate=False)  # [given, true]
        expected = joint.sum(axis=1) - np.diag(joint)
        assert np.array_equal(confident_joint_counts(labels, probs), expected)


# --------------------------------------------------------------------------------------------------
# Bad input: each argument that is not numbers is named

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
