"""sol_ext.readout: rank posteriors, their median, and cuts on the expected rank (docs/math.md §3, §12)."""

import pytest
import torch

import sol_ext
from sol_ext.centroids import compute_centroids


def test_eq6_inference_ignores_the_label_prior_and_the_posterior_option_does_not():
    """Why nearest expectation is over-dispersed on bunched, overlapping ranks (abalone): a
    1-D embedding that *is* the clean rank plus noise, ranks bunched around the middle.
    argmin_q D (paper eq. 6) reads the likelihood only, so it predicts rare ranks far more
    often than they occur; the posterior median with the label-frequency prior
    (``--readout posterior``) does not, and has a lower MAE."""
    from sol_ext.readout import dissimilarities, fit_rank_posterior, median_ranks, rank_posterior

    g = torch.Generator().manual_seed(0)
    n, N = 20, 4000
    r = (9 + 3 * torch.randn(N, generator=g)).round().clamp(0, n - 1).long()
    h = (r.double() + 2.0 * torch.randn(N, generator=g, dtype=torch.float64))[:, None]
    mu = compute_centroids(h, r, sol_ext.noise_kernel(n, 1.0))
    d = dissimilarities(h, mu, 1.0, backend="reference")
    nearest = d.argmin(dim=1)
    post = fit_rank_posterior(d, r, n)
    median = median_ranks(rank_posterior(d, post))

    def mae(p):
        return float((p - r).abs().double().mean())

    def extreme(p):
        return int(((p <= 2) | (p >= 17)).sum())

    assert extreme(nearest) > 3 * extreme(r)          # eq. 6: many predictions at rare ranks
    assert extreme(median) < extreme(r)
    assert mae(median) < mae(nearest) - 0.25
    assert post.temperature > 0 and torch.isclose(post.log_prior.exp().sum(),
                                                  torch.tensor(1.0, dtype=post.log_prior.dtype))


def test_posterior_median_is_the_first_rank_reaching_half_of_the_mass():
    from sol_ext.readout import RankPosterior, median_ranks, rank_posterior

    n = 4
    flat = RankPosterior(log_prior=torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])), temperature=1.0)
    # equal D: the posterior is the prior, cumulative 0.1, 0.3, 0.6, 1.0 -> median rank 2
    assert median_ranks(rank_posterior(torch.zeros(2, n), flat)).tolist() == [2, 2]
    # one rank far closer than the others: the posterior concentrates there
    d = torch.tensor([[0.0, 50.0, 50.0, 50.0], [50.0, 50.0, 50.0, 0.0]])
    assert median_ranks(rank_posterior(d, flat)).tolist() == [0, 3]


def test_posterior_fitted_through_the_noise_model_is_sharper():
    """With a noise kernel the likelihood is sum_q p(q|x) P[q, r]: the labels' spread is partly
    the noise's, so the fitted posterior of the rank is sharper (a lower temperature)."""
    from sol_ext import noise_kernel
    from sol_ext.readout import fit_rank_posterior

    g = torch.Generator().manual_seed(0)
    n = 12
    truth = torch.randint(2, n - 2, (400,), generator=g)
    d = (torch.arange(n)[None, :] - truth[:, None]).double() ** 2
    noisy = (truth + torch.randint(-1, 2, (400,), generator=g)).clamp(0, n - 1)
    plain = fit_rank_posterior(d, noisy, n)
    through = fit_rank_posterior(d, noisy, n, noise_kernel=noise_kernel(n, 1.0, dtype=torch.float64))
    assert through.temperature < plain.temperature


# --------------------------------------------------------------------------------------------------
# the cuts read-out


def test_counted_cuts_give_the_rows_least_mae_and_never_skip_a_rank():
    from sol_ext.readout import cut_ranks, fit_rank_cuts

    gen = torch.Generator().manual_seed(0)
    ranks = torch.randint(0, 5, (400,), generator=gen)
    score = ranks + 0.6 * torch.randn(400, generator=gen, dtype=torch.float64) + 0.7  # offset: rounding is off
    cuts = fit_rank_cuts(score, ranks, 5, fit="count")
    pred = cut_ranks(score, cuts)
    assert cuts.shape == (4,) and cuts.dtype == torch.float64 and bool((cuts.diff() >= 0).all())
    fitted_mae = (pred - ranks).abs().double().mean()
    assert fitted_mae < (score.round().clamp(0, 4) - ranks).abs().mean()
    for shift in (-0.2, -0.05, 0.05, 0.2):  # no cut moved alone does better
        for k in range(4):
            moved = cuts.clone()
            moved[k] += shift
            assert (cut_ranks(score, moved) - ranks).abs().double().mean() >= fitted_mae - 1e-12
    ordered = ranks * 2.0
    assert torch.equal(cut_ranks(ordered, fit_rank_cuts(ordered, ranks, 5, fit="count")), ranks)  # no error to make
    # a rank no label reaches: its cut lies above every score, and the read-out never predicts it
    far = fit_rank_cuts(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0, 1, 2]), 5, fit="count")
    assert far[2:].tolist() == [float("inf")] * 2
    assert fit_rank_cuts(torch.tensor([0.3]), torch.tensor([0]), 1).shape == (0,)  # one rank: no cut


def test_counted_cuts_never_split_equal_scores_and_keep_a_default_without_rows():
    from sol_ext.readout import cut_ranks, fit_rank_cuts

    # the best split of "above 0" lies at the edge of a run of equal scores, not inside it
    score = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    labels = torch.tensor([1, 0, 0, 1, 1])
    cuts = fit_rank_cuts(score, labels, 2, fit="count")
    assert (cut_ranks(score, cuts) != labels).sum() == 2  # the least possible: all above, or split before 1.0
    # neighbouring floats: the cut still separates them
    a = torch.tensor([1.0], dtype=torch.float64)
    b = torch.nextafter(a, torch.tensor([2.0], dtype=torch.float64))
    tight = torch.cat([a, b])
    assert cut_ranks(tight, fit_rank_cuts(tight, torch.tensor([0, 1]), 2, fit="count")).tolist() == [0, 1]
    # no rows: the expected rank rounded
    for fit in ("count", "logistic"):
        assert fit_rank_cuts(torch.zeros(0), torch.zeros(0, dtype=torch.long), 3, fit=fit).tolist() == [0.5, 1.5]
        with pytest.raises(ValueError, match=r"labels must be ranks in 0 … 2, got values from 0 to 3"):
            fit_rank_cuts(torch.zeros(2), torch.tensor([0, 3]), 3, fit=fit)
    # the default is the count
    noisy = torch.tensor([0, 1, 0, 1, 1])
    assert torch.equal(fit_rank_cuts(score, noisy, 2), fit_rank_cuts(score, noisy, 2, fit="count"))
    assert not torch.equal(fit_rank_cuts(score, noisy, 2), fit_rank_cuts(score, noisy, 2, fit="logistic"))


def test_logistic_cuts_are_where_the_maximum_likelihood_curve_of_each_question_crosses_one_half():
    from sol_ext.readout import fit_rank_cuts

    sklearn_linear = pytest.importorskip("sklearn.linear_model")
    gen = torch.Generator().manual_seed(1)
    true = torch.rand(3000, generator=gen, dtype=torch.float64) * 6
    labels = (true + 1.2 * torch.randn(3000, generator=gen, dtype=torch.float64)).round().clamp(0, 6).long()
    score = 3.0 * true + 0.5 * torch.randn(3000, generator=gen, dtype=torch.float64) - 4.0  # any scale and offset
    cuts = fit_rank_cuts(score, labels, 7, fit="logistic")
    for k in range(6):  # an independent maximum-likelihood fit, next to unpenalized
        curve = sklearn_linear.LogisticRegression(C=1e10, tol=1e-12, max_iter=10_000).fit(
            score.numpy()[:, None], (labels > k).numpy())
        assert float(cuts[k]) == pytest.approx(-curve.intercept_[0] / curve.coef_[0, 0], abs=1e-5)


def test_logistic_cuts_follow_noisy_labels_less_than_counted_cuts():
    from sol_ext.readout import cut_ranks, fit_rank_cuts

    # labels = the rank of a score plus wide symmetric noise: the right cuts are k + 1/2, and the error
    # count along the sorted scores is flat there, so its argmin wanders; the fitted curve does not
    wander = {"logistic": [], "count": []}
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        score = torch.rand(600, generator=gen, dtype=torch.float64) * 9 - 0.5
        noisy = (score + 1.5 * torch.randn(600, generator=gen, dtype=torch.float64)).round().clamp(0, 8).long()
        for fit in wander:
            cuts = fit_rank_cuts(score, noisy, 9, fit=fit)
            wander[fit].append(float((cuts[2:6] - torch.arange(2, 6) - 0.5).abs().mean()))  # inner cuts: no clipping
    assert sum(wander["logistic"]) < 0.6 * sum(wander["count"])
    # labels the score orders without error: every cut falls in its gap, and the read-out is exact
    ranks = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    ordered = ranks * 2.0 + torch.linspace(0, 0.5, 8, dtype=torch.float64)
    assert torch.equal(cut_ranks(ordered, fit_rank_cuts(ordered, ranks, 4, fit="logistic")), ranks)


def test_logistic_cuts_of_questions_without_a_rising_curve_answer_by_the_majority():
    from sol_ext.readout import fit_rank_cuts

    inf = float("inf")
    score = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    # every label above 0 / none above 2 (ranks no label reaches): below / above every score
    below, middle, above = fit_rank_cuts(score, torch.tensor([1, 1, 2, 2]), 4, fit="logistic").tolist()
    assert below == -inf and middle == pytest.approx(1.5) and above == inf
    # the score falls as the rank rises: the majority answer for every row
    assert fit_rank_cuts(score, torch.tensor([1, 1, 1, 0]), 2, fit="logistic").tolist() == [-inf]
    assert fit_rank_cuts(score, torch.tensor([1, 0, 0, 0]), 2, fit="logistic").tolist() == [inf]
    # one score for every row
    constant = torch.ones(4, dtype=torch.float64)
    assert fit_rank_cuts(constant, torch.tensor([0, 1, 1, 1]), 2, fit="logistic").tolist() == [-inf]
    with pytest.raises(ValueError, match="fit must be one of count, logistic"):
        fit_rank_cuts(score, torch.tensor([0, 1, 1, 0]), 2, fit="median")


def test_logistic_cuts_of_many_rows_come_from_rows_spread_over_the_scores():
    import sol_ext.readout as readout

    gen = torch.Generator().manual_seed(2)
    score = torch.rand(5000, generator=gen, dtype=torch.float64) * 5
    labels = (score + 0.8 * torch.randn(5000, generator=gen, dtype=torch.float64)).round().clamp(0, 4).long()
    every_row = readout.fit_rank_cuts(score, labels, 5, fit="logistic")
    limit = readout._LOGISTIC_ROWS
    try:
        readout._LOGISTIC_ROWS = 2500  # every second row in score order
        half = readout.fit_rank_cuts(score, labels, 5, fit="logistic")
        order = torch.argsort(score, stable=True)[1::2]
        readout._LOGISTIC_ROWS = limit
        assert torch.allclose(half, readout.fit_rank_cuts(score[order], labels[order], 5, fit="logistic"),
                              rtol=0, atol=1e-9)
    finally:
        readout._LOGISTIC_ROWS = limit
    assert (half - every_row).abs().max() < 0.15  # about the same curve from half the rows
    # a rank only rows left out of the fit reach: its question is answered by the majority, not fitted
    rare = labels.clone()
    rare[torch.argsort(score)[-2]] = 5  # the second highest score: not among the rows spread over the scores
    try:
        readout._LOGISTIC_ROWS = 2500
        assert readout.fit_rank_cuts(score, rare, 6, fit="logistic")[-1] == float("inf")
    finally:
        readout._LOGISTIC_ROWS = limit
