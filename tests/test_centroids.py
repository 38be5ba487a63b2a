"""Centroid rule (docs/math.md §8) and nearest-expectation inference (docs/math.md §3)."""

import pytest
import torch

import sol_ext
from sol_ext.centroids import compute_centroids, embed, fill_missing_centroids, fit_label_noise, predict_ranks
from sol_ext.driver.config import NO_NOISE_SIGMA


def explicit_centroids(h, labels, P):
    """mu_q = sum_x P[r_x, q] h_x / sum_x P[r_x, q], one sample at a time."""
    n, d = P.shape[0], h.shape[1]
    mu = torch.zeros(n, d, dtype=torch.float64)
    for q in range(n):
        num = torch.zeros(d, dtype=torch.float64)
        den = 0.0
        for x in range(h.shape[0]):
            w = float(P[labels[x], q])
            num += w * h[x].double()
            den += w
        mu[q] = num / den
    return mu


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.5])
def test_centroid_rule_matches_explicit_sum(sigma):
    g = torch.Generator().manual_seed(0)
    n, N, d = 7, 40, 5
    h = torch.randn(N, d, generator=g, dtype=torch.float64)
    labels = torch.randint(0, n, (N,), generator=g)
    P = sol_ext.noise_kernel(n, sigma)
    got = compute_centroids(h, labels, P)
    torch.testing.assert_close(got, explicit_centroids(h, labels, P), rtol=1e-12, atol=1e-12)


def test_centroid_rule_keeps_dtype():
    h = torch.randn(10, 3)
    labels = torch.arange(10) % 4
    mu = compute_centroids(h, labels, sol_ext.noise_kernel(4, 1.0))
    assert mu.dtype == torch.float32 and mu.shape == (4, 3)


def test_zero_weight_rank_keeps_previous_centroid():
    # P = identity: rank 2 has no sample, so no weight at all
    P = sol_ext.noise_kernel(4, NO_NOISE_SIGMA)
    h = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 3.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 3])
    previous = torch.full((4, 2), 7.0, dtype=torch.float64)
    mu = compute_centroids(h, labels, P, previous=previous)
    torch.testing.assert_close(mu[2], previous[2])
    torch.testing.assert_close(mu[[0, 1, 3]], h)


def test_missing_centroids_without_previous_are_interpolated():
    P = sol_ext.noise_kernel(5, NO_NOISE_SIGMA)
    h = torch.tensor([[0.0], [4.0]], dtype=torch.float64)
    mu = compute_centroids(h, torch.tensor([1, 3]), P)
    # rank 0 copies rank 1, rank 2 is halfway, rank 4 copies rank 3
    torch.testing.assert_close(mu.flatten(), torch.tensor([0.0, 0.0, 2.0, 4.0, 4.0], dtype=torch.float64))


def test_fill_missing_requires_one_defined_rank():
    with pytest.raises(ValueError, match="no rank"):
        fill_missing_centroids(torch.zeros(3, 2), torch.zeros(3, dtype=torch.bool))


def test_bad_labels_are_rejected():
    with pytest.raises(ValueError, match="0..2"):
        compute_centroids(torch.zeros(2, 2), torch.tensor([0, 3]), sol_ext.noise_kernel(3, 1.0))


def test_no_noise_sigma_gives_identity_kernel_and_hard_probabilities():
    n = 12
    P = sol_ext.noise_kernel(n, NO_NOISE_SIGMA)
    assert torch.equal(P, torch.eye(n, dtype=torch.float64))
    rx, ry = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    pr = sol_ext.ordering_probabilities(rx.flatten(), ry.flatten(), n, sigma=NO_NOISE_SIGMA, tau=2)
    assert torch.equal(pr, pr.round())  # every probability exactly 0 or 1
    diff = (rx - ry).flatten()
    want = torch.stack([diff < -2, diff.abs() <= 2, diff > 2], dim=1).to(pr.dtype)
    assert torch.equal(pr, want)


def test_predict_ranks_is_argmin_of_explicit_dissimilarity():
    g = torch.Generator().manual_seed(1)
    n, d = 6, 4
    h = torch.randn(50, d, generator=g, dtype=torch.float64)
    mu = torch.randn(n, d, generator=g, dtype=torch.float64)
    P = sol_ext.noise_kernel(n, 1.0)
    D = torch.stack([(P[q][None, :] * ((h[:, None, :] - mu[None]) ** 2).sum(-1)).sum(1)
                     for q in range(n)], dim=1)
    assert torch.equal(predict_ranks(h, mu, 1.0, batch_size=7), D.argmin(dim=1))


def test_predict_ranks_takes_first_minimum_on_ties():
    mu = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    h = torch.tensor([[0.0, 5.0], [5.0, 0.0]], dtype=torch.float64)
    # identity kernel: ranks 1 and 2 (and 0 and 3) tie exactly; the lower rank wins
    assert predict_ranks(h, mu, NO_NOISE_SIGMA).tolist() == [1, 0]


def test_embed_restores_training_mode_and_keeps_no_graph():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5))
    model.train()
    x = torch.randn(9, 3)
    out = embed(model, x, batch_size=4)
    assert model.training and not out.requires_grad and out.shape == (9, 2)
    torch.testing.assert_close(out, model[0](x).detach())  # eval mode: dropout off


def test_eq6_inference_ignores_the_label_prior_and_the_posterior_option_does_not():
    """Why nearest expectation is over-dispersed on bunched, overlapping ranks (abalone): a
    1-D embedding that *is* the clean rank plus noise, ranks bunched around the middle.
    argmin_q D (paper eq. 6) reads the likelihood only, so it predicts rare ranks far more
    often than they occur; the posterior median with the label-frequency prior
    (``--readout posterior``) does not, and has a lower MAE."""
    from sol_ext.centroids import dissimilarities, fit_rank_posterior, posterior_median_ranks

    g = torch.Generator().manual_seed(0)
    n, N = 20, 4000
    r = (9 + 3 * torch.randn(N, generator=g)).round().clamp(0, n - 1).long()
    h = (r.double() + 2.0 * torch.randn(N, generator=g, dtype=torch.float64))[:, None]
    mu = compute_centroids(h, r, sol_ext.noise_kernel(n, 1.0))
    d = dissimilarities(h, mu, 1.0, backend="reference")
    nearest = d.argmin(dim=1)
    post = fit_rank_posterior(d, r, n)
    median = posterior_median_ranks(d, post)
    def mae(p):
        return float((p - r).abs().double().mean())

    def extreme(p):
        return int(((p <= 2) | (p >= 17)).sum())

    assert torch.equal(nearest, predict_ranks(h, mu, 1.0, backend="reference"))
    assert extreme(nearest) > 3 * extreme(r)          # eq. 6: many predictions at rare ranks
    assert extreme(median) < extreme(r)
    assert mae(median) < mae(nearest) - 0.25
    assert post.temperature > 0 and torch.isclose(post.log_prior.exp().sum(),
                                                  torch.tensor(1.0, dtype=post.log_prior.dtype))


def test_posterior_median_is_the_first_rank_reaching_half_of_the_mass():
    from sol_ext.centroids import RankPosterior, posterior_median_ranks

    n = 4
    flat = RankPosterior(log_prior=torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])), temperature=1.0)
    # equal D: the posterior is the prior, cumulative 0.1, 0.3, 0.6, 1.0 -> median rank 2
    assert posterior_median_ranks(torch.zeros(2, n), flat).tolist() == [2, 2]
    # one rank far closer than the others: the posterior concentrates there
    d = torch.tensor([[0.0, 50.0, 50.0, 50.0], [50.0, 50.0, 50.0, 0.0]])
    assert posterior_median_ranks(d, flat).tolist() == [0, 3]


def test_damped_centroids_average_with_the_previous_ones_then_normalize():
    from sol_ext.centroids import centroid_span, damp_centroids

    old, rule = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    mixed = damp_centroids(old, rule, 0.5, normalize=True)
    torch.testing.assert_close(mixed[0], torch.tensor([0.5, 0.5]) / 0.5 ** 0.5)
    assert torch.equal(damp_centroids(old, rule, 0.0, normalize=False), rule)  # the paper's rule
    assert torch.equal(damp_centroids(None, rule, 0.5, normalize=False), rule)
    assert centroid_span(old) == pytest.approx(2 ** 0.5)
    with pytest.raises(ValueError, match="momentum"):
        damp_centroids(old, rule, 1.0, normalize=True)


def test_posterior_fitted_through_the_noise_model_is_sharper():
    """With a noise kernel the likelihood is sum_q p(q|x) P[q, r]: the labels' spread is partly
    the noise's, so the fitted posterior of the rank is sharper (a lower temperature)."""
    from sol_ext import noise_kernel
    from sol_ext.centroids import fit_rank_posterior

    g = torch.Generator().manual_seed(0)
    n = 12
    truth = torch.randint(2, n - 2, (400,), generator=g)
    d = (torch.arange(n)[None, :] - truth[:, None]).double() ** 2
    noisy = (truth + torch.randint(-1, 2, (400,), generator=g)).clamp(0, n - 1)
    plain = fit_rank_posterior(d, noisy, n)
    through = fit_rank_posterior(d, noisy, n, noise_kernel=noise_kernel(n, 1.0, dtype=torch.float64))
    assert through.temperature < plain.temperature


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
    fit = fit_label_noise(_sharp_dissimilarities(true, n), noisy, n)
    assert 0.7 * std <= fit.std <= 1.4 * std
    assert fit.kernel.shape == (n, n) and fit.posterior.temperature > 0
    # exact labels: no noise, and the kernel is the identity
    exact = fit_label_noise(_sharp_dissimilarities(true, n), true, n)
    assert exact.std == 0.0 and torch.equal(exact.kernel, torch.eye(n, dtype=torch.float64))


def test_label_noise_kernel_is_the_law_of_rounded_and_clipped_gaussian_noise():
    """P[q, r] of label_noise_kernel against the frequencies of sol_ext.noise's Gaussian noise (added,
    rounded, clipped to the scale): an error past an end lands on the end rank."""
    from sol_ext.centroids import label_noise_kernel
    from sol_ext.noise import add_label_noise, noise_scale

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


# --------------------------------------------------------------------------------------------------
# the cuts read-out


def test_counted_cuts_give_the_rows_least_mae_and_never_skip_a_rank():
    from sol_ext.centroids import cut_ranks, fit_rank_cuts

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
    from sol_ext.centroids import cut_ranks, fit_rank_cuts

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
    from sol_ext.centroids import fit_rank_cuts

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
    from sol_ext.centroids import cut_ranks, fit_rank_cuts

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
    from sol_ext.centroids import fit_rank_cuts

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
    import sol_ext.centroids as centroids

    gen = torch.Generator().manual_seed(2)
    score = torch.rand(5000, generator=gen, dtype=torch.float64) * 5
    labels = (score + 0.8 * torch.randn(5000, generator=gen, dtype=torch.float64)).round().clamp(0, 4).long()
    every_row = centroids.fit_rank_cuts(score, labels, 5, fit="logistic")
    limit = centroids._LOGISTIC_ROWS
    try:
        centroids._LOGISTIC_ROWS = 2500  # every second row in score order
        half = centroids.fit_rank_cuts(score, labels, 5, fit="logistic")
        order = torch.argsort(score, stable=True)[1::2]
        centroids._LOGISTIC_ROWS = limit
        assert torch.allclose(half, centroids.fit_rank_cuts(score[order], labels[order], 5, fit="logistic"),
                              rtol=0, atol=1e-9)
    finally:
        centroids._LOGISTIC_ROWS = limit
    assert (half - every_row).abs().max() < 0.15  # about the same curve from half the rows
    # a rank only rows left out of the fit reach: its question is answered by the majority, not fitted
    rare = labels.clone()
    rare[torch.argsort(score)[-2]] = 5  # the second highest score: not among the rows spread over the scores
    try:
        centroids._LOGISTIC_ROWS = 2500
        assert centroids.fit_rank_cuts(score, rare, 6, fit="logistic")[-1] == float("inf")
    finally:
        centroids._LOGISTIC_ROWS = limit
