"""--weight-decay auto: Adam's L2 weight decay grows with the number of ranks for the SOL methods
with the MLP encoder (their loss sums over the ranks) and stays the paper's 5e-4 for the baselines
and the image encoders."""

import dataclasses

import pytest

from sol_ext.driver.checkpoint import CHECKPOINT_NAME, load_checkpoint
from sol_ext.driver.cli import build_parser
from sol_ext.driver.config import (
    BASELINE_WEIGHT_DECAY,
    PAPER_SETTINGS,
    SOL_WEIGHT_DECAY_PER_RANK,
    TrainConfig,
)
from sol_ext.driver.train import train
from test_train import BASE, quiet, tiny_data


def trained_weight_decay(cfg: TrainConfig, data, folder) -> float:
    """The weight decay the run's optimizer stepped with, read back from its checkpoint."""
    train(cfg, data, folder, log=quiet)
    groups = load_checkpoint(folder / CHECKPOINT_NAME)["optimizer"]["param_groups"]
    assert len({g["weight_decay"] for g in groups}) == 1
    return groups[0]["weight_decay"]


def test_auto_resolves_per_method_and_number_of_ranks():
    assert TrainConfig().weight_decay == "auto"
    assert PAPER_SETTINGS["weight_decay"] == 5e-4  # the paper's Adam
    for method in ("sol", "sol-no-noise"):
        cfg = TrainConfig(method=method)
        assert cfg.weight_decay_for(62, "mlp") == pytest.approx(SOL_WEIGHT_DECAY_PER_RANK * 62)
        assert cfg.weight_decay_for(6, "mlp") == pytest.approx(SOL_WEIGHT_DECAY_PER_RANK * 6)
    for method in ("l1", "ce", "corn"):
        assert TrainConfig(method=method).weight_decay_for(62, "mlp") == BASELINE_WEIGHT_DECAY
    for encoder in ("cnn", "vgg16bn", "resnet18"):  # image encoders, pretrained ones among them
        assert TrainConfig(method="sol").weight_decay_for(62, encoder) == BASELINE_WEIGHT_DECAY
    # a number is used as given, whatever the method
    assert TrainConfig(method="sol", weight_decay=0.0).weight_decay_for(62, "mlp") == 0.0
    assert TrainConfig(method="l1", weight_decay=0.2).weight_decay_for(62, "mlp") == 0.2


@pytest.mark.parametrize("method,paper,expected", [
    ("sol", False, SOL_WEIGHT_DECAY_PER_RANK * 8),
    ("sol", True, 5e-4),
    ("l1", False, BASELINE_WEIGHT_DECAY),
])
def test_the_optimizer_steps_with_the_resolved_decay(tmp_path, method, paper, expected):
    data = tiny_data()  # 8 ranks
    cfg = dataclasses.replace(BASE, method=method, sigma=1.0)
    if paper:
        cfg = dataclasses.replace(cfg, **PAPER_SETTINGS)
    assert trained_weight_decay(cfg, data, tmp_path) == pytest.approx(expected)


def test_option_checks_and_command_line():
    for bad in (-0.1, float("nan"), float("inf"), "strong", True, None):
        with pytest.raises(ValueError, match="weight.decay"):
            TrainConfig(weight_decay=bad).validate()
    for text, value in (("auto", "auto"), ("0.3", 0.3), ("0", 0.0)):
        args = build_parser().parse_args(["train", "--data", "abalone", "--weight-decay", text])
        assert args.weight_decay == value
    args = build_parser().parse_args(["train", "--data", "abalone"])
    assert args.weight_decay is None  # not given: the configuration's default ("auto"), or --paper's
