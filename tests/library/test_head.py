"""SOLHead: the centroid rule, read-out and state of SOL in a plain training loop."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sol_ext
from sol_ext.centroids import compute_centroids, damp_centroids, embed
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.prepare import prepare_data
from sol_ext.driver.train import train
from sol_ext.readout import fit_rank_posterior, median_ranks


def clustered(n=5, d=3, per_rank=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(n).repeat_interleave(per_rank)
    centers = torch.randn(n, d, generator=g, dtype=torch.float64) * 3
    h = centers[ranks] + 0.3 * torch.randn(ranks.numel(), d, generator=g, dtype=torch.float64)
    return F.normalize(h, dim=1), ranks


def test_update_is_the_damped_centroid_rule_and_the_posterior_fit():
    h, y = clustered()
    head = sol_ext.SOLHead(5, 3, sigma=0.7, momentum=0.5)
    first = head.update_centroids(h, y).clone()
    kernel = sol_ext.noise_kernel(5, 0.7)
    torch.testing.assert_close(first, F.normalize(compute_centroids(h, y, kernel), dim=1))
    h2 = h.roll(1, dims=1)
    head.update(h2, y)
    rule = compute_centroids(h2, y, kernel, previous=first)
    torch.testing.assert_close(head.centroids, damp_centroids(first, rule, 0.5, normalize=True))
    d = sol_ext.stochastic_dissimilarity(h2, head.centroids, sigma=0.7)
    fit = fit_rank_posterior(d, y, 5)
    assert float(head.temperature) == fit.temperature
    torch.testing.assert_close(head.log_prior, fit.log_prior.double())
    assert torch.equal(head.predict(h2), median_ranks(head.predict_proba(h2)))
    assert torch.equal(head.predict(h2, readout="nearest"), d.argmin(dim=1))


def test_predictions_recover_clusters_and_probabilities_are_distributions():
    h, y = clustered(seed=3)
    head = sol_ext.SOLHead(5, 3, sigma=0.5)
    head.update(h, y)
    p = head.predict_proba(h)
    assert p.shape == (150, 5) and p.dtype == torch.float64
    torch.testing.assert_close(p.sum(1), torch.ones(150, dtype=torch.float64))
    assert (head.predict(h) == y).double().mean() > 0.9
    expected = head.expected_rank(h)
    assert torch.all((expected >= 0) & (expected <= 4))


def test_validation_split_fits_the_temperature_with_the_training_prior():
    h, y = clustered(seed=1)
    val_h, val_y = clustered(seed=2, per_rank=4)
    head = sol_ext.SOLHead(5, 3)
    head.update(h, y, val_h, val_y)
    d = sol_ext.stochastic_dissimilarity(val_h, head.centroids)
    fit = fit_rank_posterior(d, val_y, 5, prior_labels=y)
    assert float(head.temperature) == fit.temperature
    with pytest.raises(ValueError, match="together"):
        head.update(h, y, val_h)


def test_state_dict_round_trip_restores_every_prediction():
    h, y = clustered(seed=4)
    head = sol_ext.SOLHead(5, 3, sigma=0.5)
    head.update(h, y)
    again = sol_ext.SOLHead(5, 3, sigma=0.5)
    again.load_state_dict(head.state_dict())
    assert torch.equal(again.predict(h), head.predict(h))
    assert torch.equal(again.predict_proba(h), head.predict_proba(h))
    assert torch.equal(again.centroids, head.centroids)
    assert torch.equal(again.cuts, head.cuts)
    assert set(head.state_dict()) == {"centroids", "log_prior", "temperature", "cuts", "has_centroids",
                                      "has_readout", "_extra_state"}  # the settings


def test_loss_is_the_stochastic_order_loss_against_its_centroids_and_leaves_them_fixed():
    h, y = clustered(seed=5)
    head = sol_ext.SOLHead(5, 3, sigma=1.0, tau=1, margin=0.25)
    head.update_centroids(h, y)
    x = h.clone().requires_grad_(True)
    loss = head.loss(x, y)
    expected = sol_ext.StochasticOrderLoss(5, sigma=1.0, tau=1, margin=0.25)(h, y, head.centroids)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert x.grad is not None and head.centroids.grad is None


def test_bad_use_raises_clear_errors():
    head = sol_ext.SOLHead(4, 2)
    with pytest.raises(RuntimeError, match="update"):
        head.predict(torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="update"):
        head.loss(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="embedding_dim"):
        head.update_centroids(torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="momentum"):
        sol_ext.SOLHead(4, 2, momentum=1.0)
    with pytest.raises(TypeError, match="momentum must be a real number, got None"):
        sol_ext.SOLHead(4, 2, momentum=None)
    with pytest.raises(TypeError, match="momentum must be a real number, got '0.5'"):
        sol_ext.SOLHead(4, 2, momentum="0.5")
    with pytest.raises(ValueError, match="readout"):
        sol_ext.SOLHead(4, 2, readout="mode")
    head.update(torch.randn(8, 2, dtype=torch.float64), torch.arange(8) % 4)
    with pytest.raises(RuntimeError, match="fit_readout|update"):
        _ = sol_ext.SOLHead(4, 2).posterior


class Normalized(nn.Module):
    """An encoder whose embeddings are L2-normalized, as SOL keeps them."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, x):
        return F.normalize(self.encoder(x), dim=1)


def test_a_plain_training_loop_with_the_head_matches_the_driver(tmp_path):
    """The README's drop-in loop, written out: the same seed gives the driver's numbers."""
    # the loop trains and evaluates the same weights: the driver without its weight average
    config = TrainConfig(data="abalone", sigma=1.0, val_fraction=0.0, epochs=2, batch_size=64,
                         refine=False, weight_ema=0.0)
    data = prepare_data(config)
    outcome = train(config, data, tmp_path, log=lambda _line: None)

    torch.manual_seed(config.seed)
    shuffle = torch.Generator().manual_seed(config.seed + 1)
    model = Normalized(nn.Sequential(nn.Linear(10, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                     nn.Linear(128, config.embedding_dim)))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay_for(data.num_ranks, "mlp"))
    head = sol_ext.SOLHead(data.num_ranks, config.embedding_dim, sigma=1.0, readout=config.readout)
    x, labels = data.train_x, data.train_given
    head.update_centroids(embed(model, x, 256), labels)
    for _epoch in range(config.epochs):
        model.train()
        for idx in torch.randperm(labels.numel(), generator=shuffle).split(config.batch_size):
            if idx.numel() < 2:
                continue
            loss = head.loss(model(x[idx]), labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        head.update(embed(model, x, 256), labels)
    test_pred = head.predict(embed(model, data.test_x, 256))

    assert torch.equal(test_pred, outcome.test_pred)
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    assert torch.equal(head.centroids, best["head"]["centroids"])
    mae = (data.encoder.decode(test_pred) - data.encoder.decode(data.test_ranks)).abs().mean()
    assert float(mae) == outcome.results["test"]["mae"]


def test_the_cuts_read_out_thresholds_the_expected_rank_at_cuts_fitted_to_the_training_rows():
    from sol_ext.readout import cut_ranks, fit_rank_cuts

    gen = torch.Generator().manual_seed(3)
    n, d = 5, 8
    labels = torch.randint(0, n, (300,), generator=gen)
    h = torch.nn.functional.normalize(torch.randn(n, d, generator=gen)[labels]
                                      + 0.8 * torch.randn(300, d, generator=gen), dim=1)
    head = sol_ext.SOLHead(n, d, readout="cuts")
    head.update(h[:240], labels[:240], h[240:], labels[240:])
    expected = fit_rank_cuts(head.expected_rank(h[:240]), labels[:240], n)  # the training rows, not the validation's
    assert torch.equal(head.cuts, expected)
    assert torch.equal(head.predict(h), cut_ranks(head.expected_rank(h), expected))
    assert not torch.equal(head.predict(h), head.predict(h, readout="posterior"))
    # the logistic fit, asked for: the same rows, the other placement of each cut
    logistic = fit_rank_cuts(head.expected_rank(h[:240]), labels[:240], n, fit="logistic")
    assert torch.equal(head.fit_cuts(h[:240], labels[:240], fit="logistic"), logistic)
    assert not torch.equal(logistic, expected)
    head.fit_cuts(h[:240], labels[:240])
    # the posterior alone, on other rows: the cuts stay those of the training rows
    head.fit_readout(h[240:], labels[240:], prior_labels=labels[:240], cuts=False)
    assert torch.equal(head.cuts, expected)
    head.fit_readout(h[240:], labels[240:], prior_labels=labels[:240])
    assert not torch.equal(head.cuts, expected)
    # saved and restored with the head; a state saved before the cuts existed loads into other read-outs
    again = sol_ext.SOLHead.from_state_dict(head.state_dict())
    assert torch.equal(again.cuts, head.cuts) and torch.equal(again.predict(h), head.predict(h))
    old = {k: v for k, v in sol_ext.SOLHead(n, d).state_dict().items() if k != "cuts"}
    sol_ext.SOLHead(n, d).load_state_dict(old)
    with pytest.raises(RuntimeError, match="cuts"):
        sol_ext.SOLHead(n, d, readout="cuts").load_state_dict(
            {**old, "_extra_state": sol_ext.SOLHead(n, d, readout="cuts").state_dict()["_extra_state"]})
