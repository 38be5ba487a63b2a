"""--weight-ema: an exponential moving average of the weights is the model every pass over the
data, model selection and the checkpoints use; the trained weights keep training and resume."""

import dataclasses

import pytest
import torch

import sol_ext.driver.run as run_module
from sol_ext.driver.checkpoint import BEST_NAME, CHECKPOINT_NAME, load_checkpoint
from sol_ext.driver.cli import build_parser
from sol_ext.driver.config import PAPER_SETTINGS, WEIGHT_EMA_EPOCHS, TrainConfig
from sol_ext.driver.run import WeightAverage
from sol_ext.driver.train import train
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


def test_auto_averages_over_a_fixed_number_of_epochs_for_sol_and_not_for_the_baselines():
    for steps in (1, 18, 57, 900):
        decay = TrainConfig().weight_ema_decay(steps)
        assert decay == pytest.approx(1.0 - 1.0 / (WEIGHT_EMA_EPOCHS * steps))
        # the average's horizon, 1 / (1 - decay) steps, is the same number of epochs at any size
        assert 1.0 / (1.0 - decay) / steps == pytest.approx(WEIGHT_EMA_EPOCHS)
    assert TrainConfig(method="sol-no-noise").weight_ema_decay(57) > 0
    for method in ("l1", "ce", "corn"):
        assert TrainConfig(method=method).weight_ema_decay(57) == 0.0
    assert TrainConfig(weight_ema=0.9).weight_ema_decay(57) == 0.9
    assert TrainConfig(method="corn", weight_ema=0.9).weight_ema_decay(57) == 0.9  # asked for: given
    assert TrainConfig(weight_ema=0.0).weight_ema_decay(57) == 0.0


def test_a_default_sol_run_trains_with_the_average_and_a_baseline_without(tmp_path, monkeypatch):
    data = tiny_data()
    cfg = dataclasses.replace(BASE, sigma=1.0)
    assert cfg.weight_ema == "auto"
    decays = []

    class Spy(run_module.WeightAverage):
        def __init__(self, model, decay, steps=0):
            decays.append(decay)
            super().__init__(model, decay, steps)

    monkeypatch.setattr(run_module, "WeightAverage", Spy)
    train(cfg, data, tmp_path / "sol", log=quiet)
    assert decays == [pytest.approx(1.0 - 1.0 / (WEIGHT_EMA_EPOCHS * 6))]  # epochs of 6 steps
    state = load_checkpoint(tmp_path / "sol" / CHECKPOINT_NAME)
    assert state["weight_ema_steps"] == 2 * 6  # 2 epochs of 6 steps
    assert any(not torch.equal(state["model"][k], state["trained_model"][k]) for k in state["model"])
    train(dataclasses.replace(cfg, method="l1"), data, tmp_path / "l1", log=quiet)
    assert "trained_model" not in load_checkpoint(tmp_path / "l1" / CHECKPOINT_NAME)

