"""Centroid rule (docs/math.md §8), and the read-outs that lived in sol_ext.centroids until sol_ext.readout."""


import pytest
import torch

import sol_ext
from sol_ext.centroids import compute_centroids, embed, fill_missing_centroids
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


def test_dissimilarities_in_batches_are_the_explicit_dissimilarity():
    from sol_ext.readout import dissimilarities

    g = torch.Generator().manual_seed(1)
    n, d = 6, 4
    h = torch.randn(50, d, generator=g, dtype=torch.float64)
    mu = torch.randn(n, d, generator=g, dtype=torch.float64)
    P = sol_ext.noise_kernel(n, 1.0)
    D = torch.stack([(P[q][None, :] * ((h[:, None, :] - mu[None]) ** 2).sum(-1)).sum(1)
                     for q in range(n)], dim=1)
    torch.testing.assert_close(dissimilarities(h, mu, 1.0, batch_size=7), D)  # in batches of 7 rows


def test_embed_restores_training_mode_and_keeps_no_graph():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5))
    model.train()
    x = torch.randn(9, 3)
    out = embed(model, x, batch_size=4)
    assert model.training and not out.requires_grad and out.shape == (9, 2)
    torch.testing.assert_close(out, model[0](x).detach())  # eval mode: dropout off


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
