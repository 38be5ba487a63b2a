"""SOLHead: the centroid rule, read-out and state of SOL in a plain training loop."""

import io

import numpy as np
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
    mae = (data.grid.decode(test_pred) - data.grid.decode(data.test_ranks)).abs().mean()
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


# --------------------------------------------------------------------------------------------------
# Bad input: labels of another length or type, non-finite embeddings, saved settings

N_RANKS, DIM = 5, 8


def normalized_clusters(per_rank=20, seed=0):
    """``h [N, DIM]`` L2-normalized embeddings around one center per rank, and their ranks ``[N]``."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(N_RANKS).repeat_interleave(per_rank)
    centers = torch.randn(N_RANKS, DIM, generator=g) * 3
    return F.normalize(centers[ranks] + 0.3 * torch.randn(ranks.numel(), DIM, generator=g), dim=1), ranks


@pytest.fixture
def trained():
    h, labels = normalized_clusters()
    head = sol_ext.SOLHead(N_RANKS, DIM)
    head.update(h, labels)
    return head, h, labels


# -- labels -------------------------------------------------------------------------


def test_update_refuses_validation_labels_of_another_length_and_changes_nothing(trained):
    head, h, labels = trained
    before = head.state_dict()
    with pytest.raises(ValueError, match="val_labels must hold one rank per row of val_h: val_h has 10 rows, "
                                         "val_labels has 3"):
        head.update(h, labels, h[:10], labels[:3])
    # checked before the centroid rule runs: a refused update leaves the head as it was
    for name, value in head.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_update_and_fit_readout_refuse_labels_of_another_length(trained):
    head, h, labels = trained
    with pytest.raises(ValueError, match="labels must hold one rank per row of h: h has 50 rows, "
                                         "labels has 20 values"):
        head.fit_readout(h[:50], labels[:20])
    with pytest.raises(ValueError, match="labels must hold one rank per row of h"):
        head.update(h, labels[:-1])
    with pytest.raises(ValueError, match="labels must hold one rank per row of h"):
        head.update_centroids(h[:-1], labels)


def test_fit_readout_refuses_float_and_out_of_range_labels(trained):
    head, h, labels = trained
    with pytest.raises(TypeError, match="labels must be an integer tensor of 0-based ranks"):
        head.fit_readout(h, labels + 0.5)
    with pytest.raises(ValueError, match=r"labels must lie in 0 … 4 .* got values in 7 … 11"):
        head.fit_readout(h, labels + 7)
    with pytest.raises(ValueError, match="prior_labels must lie in 0 … 4"):
        head.fit_readout(h, labels, prior_labels=labels + 1)
    with pytest.raises(ValueError, match="val_labels must lie in 0 … 4"):
        head.update(h, labels, h, labels - 1)


def test_numpy_labels_are_taken_as_tensors(trained):
    head, h, labels = trained
    other = sol_ext.SOLHead(N_RANKS, DIM)
    other.update(h, labels.numpy())
    assert torch.equal(other.centroids, head.centroids)
    assert float(other.temperature) == float(head.temperature)
    torch.testing.assert_close(other.loss(h, labels.numpy()), head.loss(h, labels))
    with pytest.raises(TypeError, match="labels must be integer ranks"):
        other.update(h, np.array(["a"] * len(h)))


def test_update_centroids_refuses_non_finite_embeddings_and_keeps_its_centroids(trained):
    head, h, labels = trained
    before = head.centroids.clone()
    bad = h.clone()
    bad[3, 0] = float("nan")
    with pytest.raises(ValueError, match="h contains 1 NaN or inf"):
        head.update_centroids(bad, labels)
    assert torch.equal(head.centroids, before)
    with pytest.raises(TypeError, match="h must be a torch.Tensor of embeddings"):
        head.update(h.numpy(), labels)


# -- SOLHead: settings in the state dict ------------------------------------------------------


def test_state_dict_carries_the_settings_and_from_state_dict_rebuilds_the_head():
    h, labels = normalized_clusters()
    head = sol_ext.SOLHead(N_RANKS, DIM, sigma=0.5, tau=2, margin=0.1, T=2, disc_weight=0.5,
                           convention="official", momentum=0.2, normalize=False, readout="nearest")
    head.update(h, labels)
    buffer = io.BytesIO()
    torch.save({k: v.cpu() for k, v in head.state_dict().items()}, buffer)  # entries move like tensors
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    again = sol_ext.SOLHead.from_state_dict(state)
    assert again.settings() == head.settings()
    assert again.settings()["sigma"] == 0.5 and again.readout == "nearest"
    assert torch.equal(again.predict_proba(h), head.predict_proba(h))
    assert torch.equal(again.predict(h), head.predict(h))


@pytest.mark.parametrize("setting, value", [
    ("sigma", 0.25), ("tau", 3), ("margin", 0.5), ("T", 2), ("disc_weight", 0.0), ("convention", "official"),
    ("momentum", 0.0), ("normalize", False), ("readout", "nearest")])
def test_load_state_dict_refuses_a_head_saved_with_other_settings(trained, setting, value):
    head, h, _ = trained
    other = sol_ext.SOLHead(N_RANKS, DIM, **{setting: value})
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=f"{setting} .* saved, {value!r} here"):
            other.load_state_dict(head.state_dict(), strict=strict)
    assert not bool(other.has_centroids)  # nothing was loaded


def test_load_state_dict_names_another_number_of_ranks(trained):
    head, _, _ = trained
    with pytest.raises(RuntimeError, match="num_ranks 5 saved, 6 here"):
        sol_ext.SOLHead(6, DIM).load_state_dict(head.state_dict())


def test_state_dicts_saved_without_settings_still_load(trained):
    head, h, _ = trained
    old = {k: v for k, v in head.state_dict().items() if k != "_extra_state"}
    again = sol_ext.SOLHead(N_RANKS, DIM)
    again.load_state_dict(old)  # strict: the missing settings are not a missing key
    assert torch.equal(again.predict_proba(h), head.predict_proba(h))
    with pytest.raises(ValueError, match="no saved settings"):
        sol_ext.SOLHead.from_state_dict(old)


def test_a_head_inside_a_model_is_checked_under_its_prefix(trained):
    head, _, _ = trained
    model = torch.nn.ModuleDict({"head": head})
    other = torch.nn.ModuleDict({"head": sol_ext.SOLHead(N_RANKS, DIM, sigma=2.0)})
    assert "head._extra_state" in model.state_dict()
    with pytest.raises(RuntimeError, match="sigma 1.0 saved, 2.0 here"):
        other.load_state_dict(model.state_dict())


# -- torch.compile ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("centroids_from", ["update_centroids", "load_state_dict"])
def test_a_training_step_through_head_loss_compiles_in_one_graph_and_matches_eager(centroids_from):
    """torch.compile(fullgraph=True) of encoder + head.loss: whether the head has centroids is known without
    reading its has_centroids buffer (which would break the graph), whether they came from the centroid
    rule or from a saved state; loss and gradients are eager's."""
    torch._dynamo.reset()
    h, labels = normalized_clusters(seed=4)
    torch.manual_seed(0)
    encoder = Normalized(nn.Linear(DIM, DIM))
    head = sol_ext.SOLHead(N_RANKS, DIM)
    head.update_centroids(h, labels)
    if centroids_from == "load_state_dict":
        head = sol_ext.SOLHead.from_state_dict(head.state_dict())

    def step(x, y):
        return head.loss(encoder(x), y)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")  # the graph, without inductor's build
    results = []
    for fn in (compiled, step):
        encoder.zero_grad()
        loss = fn(h, labels)
        loss.backward()
        results.append((loss.detach(), encoder.encoder.weight.grad.clone()))
    assert torch.equal(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_compiled_step_of_a_head_without_centroids_names_what_to_call():
    torch._dynamo.reset()
    head = sol_ext.SOLHead(N_RANKS, DIM)
    compiled = torch.compile(lambda x, y: head.loss(x, y), fullgraph=True, backend="aot_eager")
    h, labels = normalized_clusters()
    with pytest.raises(Exception, match=r"no centroids yet; call update_centroids\(\) or update\(\)"):
        compiled(h, labels)
