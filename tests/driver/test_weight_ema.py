"""--weight-ema: an exponential moving average of the weights is the model every pass over the
data, model selection and the checkpoints use; the trained weights keep training and resume."""

import dataclasses

import pytest
import torch

import sol_ext.driver.weight_ema as weight_ema_module
from sol_ext.driver.checkpoint import BEST_NAME, CHECKPOINT_NAME, load_checkpoint
from sol_ext.driver.cli import build_parser
from sol_ext.driver.config import PAPER_SETTINGS, WEIGHT_EMA_SHARE, TrainConfig
from sol_ext.driver.train import train
from sol_ext.driver.weight_ema import WeightAverage
from test_train import BASE, quiet, tiny_data


def test_the_average_is_the_bias_corrected_moving_average_of_the_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    avg = WeightAverage(model, 0.75)
    seen = []
    for _ in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model.train()(torch.randn(8, 3))  # batch norm's running statistics and step count move
        avg.update(model)
        seen.append([p.detach().clone() for p in model.parameters()])
        if len(seen) == 1:  # the first average is the trained weights, not pulled to the start
            for a, p in zip(avg.model.parameters(), model.parameters()):
                torch.testing.assert_close(a, p.detach())
    t, d = len(seen), 0.75
    for i, a in enumerate(avg.model.parameters()):
        expected = sum((1 - d) * d ** (t - 1 - s) * seen[s][i] for s in range(t)) / (1 - d ** t)
        torch.testing.assert_close(a, expected)
        assert not a.requires_grad
    assert avg.steps == 4
    assert int(avg.model[1].num_batches_tracked) == int(model[1].num_batches_tracked) == 4  # copied
    with pytest.raises(ValueError, match="weight_ema"):
        WeightAverage(model, 1.0)


def test_the_checkpoints_hold_the_average_and_resuming_continues_both(tmp_path):
    data = tiny_data()
    cfg = dataclasses.replace(BASE, weight_ema=0.9, sigma=1.0)
    full = train(cfg, data, tmp_path / "full", log=quiet)
    state = load_checkpoint(tmp_path / "full" / CHECKPOINT_NAME)
    assert set(state["trained_model"]) == set(state["model"])
    assert state["weight_ema_steps"] == 2 * 6  # 2 epochs of 6 steps (86 fitted samples, batch 16)
    assert any(not torch.equal(state["model"][k], state["trained_model"][k]) for k in state["model"])
    assert "trained_model" not in load_checkpoint(tmp_path / "full" / BEST_NAME)
    # without an average, no second copy of the weights
    train(dataclasses.replace(cfg, weight_ema=0.0), data, tmp_path / "plain", log=quiet)
    assert "trained_model" not in load_checkpoint(tmp_path / "plain" / CHECKPOINT_NAME)

    train(dataclasses.replace(cfg, epochs=1), data, tmp_path / "split", log=quiet)
    resumed = train(cfg, data, tmp_path / "split", resume=True, log=quiet)
    again = load_checkpoint(tmp_path / "split" / CHECKPOINT_NAME)
    for key in ("model", "trained_model"):
        for k in state[key]:
            torch.testing.assert_close(again[key][k], state[key][k])
    assert resumed.results["test"] == full.results["test"]


def test_option_checks_and_command_line():
    assert TrainConfig().weight_ema == "auto"
    assert PAPER_SETTINGS["weight_ema"] == 0.0  # the paper trains without an average
    for bad in (-0.1, 1.0, 2.0, float("nan"), "fast", True):
        with pytest.raises(ValueError, match="weight"):
            TrainConfig(weight_ema=bad).validate()
    for text, value in (("0.99", 0.99), ("auto", "auto"), ("0", 0.0)):
        args = build_parser().parse_args(["train", "--data", "abalone", "--weight-ema", text])
        assert args.weight_ema == value


def test_with_a_share_the_average_spans_the_last_share_of_the_steps_so_far():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, bias=False)
    avg = WeightAverage(model, share=0.25)
    seen = []
    for step in range(1, 2001):
        with torch.no_grad():
            model.weight.fill_(float(step))  # the trained weight after step s is s
        avg.update(model)
        seen.append(float(avg.model.weight))
    # decay 1 - 1/max(t/4, 1): the average is the trained weights up to step 4, then, at step t,
    # an average of recent steps that is the same share of the run however long it is
    assert seen[:4] == [1.0, 2.0, 3.0, 4.0]
    keep = 1.0
    expected = 4.0
    for t in range(5, 41):
        keep = 1.0 - 1.0 / (0.25 * t)
        expected = keep * expected + (1.0 - keep) * t
        assert seen[t - 1] == pytest.approx(expected)
    # at step t the average's weights on step k grow as k^(1/share - 1): it lags a steady trend by
    # share / (1 + share) of the steps so far, 0.2 t here, at any t
    for t in (1000, 2000):
        assert (t - seen[t - 1]) / t == pytest.approx(0.25 / 1.25, rel=0.01)
    for bad in ({}, {"decay": 0.9, "share": 0.1}, {"share": 0.0}, {"share": 1.5}):
        with pytest.raises(ValueError):
            WeightAverage(model, **bad)


@pytest.fixture
def averages(monkeypatch):
    """The (decay, share) of every WeightAverage the driver makes."""
    made = []

    class Spy(weight_ema_module.WeightAverage):
        def __init__(self, model, decay=None, steps=0, share=None):
            made.append((decay, share))
            super().__init__(model, decay, steps, share)

    monkeypatch.setattr(weight_ema_module, "WeightAverage", Spy)
    return made


def test_auto_averages_sol_over_a_share_of_the_steps_and_not_the_baselines(tmp_path, averages):
    data = tiny_data()
    cfg = dataclasses.replace(BASE, sigma=1.0)
    assert cfg.weight_ema == "auto"
    train(cfg, data, tmp_path / "sol", log=quiet)
    assert averages == [(None, WEIGHT_EMA_SHARE)]
    state = load_checkpoint(tmp_path / "sol" / CHECKPOINT_NAME)
    assert state["weight_ema_steps"] == 2 * 6  # 2 epochs of 6 steps
    train(dataclasses.replace(cfg, method="sol-no-noise"), data, tmp_path / "no-noise", log=quiet)
    assert averages[-1] == (None, WEIGHT_EMA_SHARE)
    averages.clear()
    for method in ("l1", "ce"):
        train(dataclasses.replace(cfg, method=method), data, tmp_path / method, log=quiet)
        assert "trained_model" not in load_checkpoint(tmp_path / method / CHECKPOINT_NAME)
    train(dataclasses.replace(cfg, method="l1", weight_ema=0.9), data, tmp_path / "l1-asked", log=quiet)
    assert averages == [(0.9, None)]  # asked for: given to a baseline too


def test_a_default_run_resumed_equals_the_unbroken_run(tmp_path):
    data = tiny_data()
    cfg = dataclasses.replace(BASE, sigma=1.0, batch_size=8, epochs=3)
    full = train(cfg, data, tmp_path / "full", log=quiet)
    train(dataclasses.replace(cfg, epochs=1), data, tmp_path / "split", log=quiet)
    resumed = train(cfg, data, tmp_path / "split", resume=True, log=quiet)
    a = load_checkpoint(tmp_path / "full" / CHECKPOINT_NAME)
    b = load_checkpoint(tmp_path / "split" / CHECKPOINT_NAME)
    for key in ("model", "trained_model"):
        for k in a[key]:
            torch.testing.assert_close(b[key][k], a[key][k])
    assert resumed.results["test"] == full.results["test"]
