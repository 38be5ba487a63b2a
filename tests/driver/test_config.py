"""The settings of a run (sol_ext.driver.config.TrainConfig): their checks, the paper's values, and
what a resumed run may change."""

import dataclasses

import pytest

from common import TINY_SETTINGS
from sol_ext.driver.config import PAPER_SETTINGS, READOUTS, SIGMA_GRID, TrainConfig, config_mismatches

BASE = TrainConfig(**TINY_SETTINGS)


def test_a_run_searches_sigma_only_where_a_validation_split_can_pick_it():
    assert TrainConfig().searches_sigma and SIGMA_GRID
    assert not TrainConfig(sigma=1.0).searches_sigma
    assert not TrainConfig(val_fraction=0.0).searches_sigma  # the paper's sigma then
    assert not TrainConfig(method="sol-no-noise").searches_sigma


def test_the_readouts_are_solhead_s_and_others_are_refused():
    from sol_ext import SOLHead

    assert READOUTS == ("posterior", "nearest", "cuts")
    for readout in READOUTS:
        TrainConfig(readout=readout).validate()
        SOLHead(num_ranks=4, embedding_dim=2, readout=readout)
    with pytest.raises(ValueError, match="unknown readout 'mean'; expected one of posterior, nearest, cuts"):
        TrainConfig(readout="mean").validate()


def test_more_epochs_device_and_backend_may_change_on_resume():
    a = TrainConfig()
    assert config_mismatches(a, dataclasses.replace(a, epochs=50, backend="reference")) == []
    assert config_mismatches(a, dataclasses.replace(a, method="l1")) == ["method: 'sol' -> 'l1'"]


def test_bad_configuration_values_name_the_field():
    with pytest.raises(ValueError, match="kappa"):
        TrainConfig(kappa=-0.1).validate()
    with pytest.raises(ValueError, match="unknown method"):
        TrainConfig(method="svm").validate()
    with pytest.raises(ValueError, match="beta"):
        TrainConfig(beta=1.5).validate()
    for bad in (-0.5, float("nan"), float("inf"), "high", True):
        with pytest.raises(ValueError, match="label noise must be 'auto' or a finite std"):
            TrainConfig(label_noise=bad).validate()
    with pytest.raises(ValueError, match="label noise std .* does not apply to relabel rule 'outlier'"):
        TrainConfig(label_noise=1.0, relabel="outlier").validate()
    TrainConfig(relabel="outlier").validate()  # the default 'auto' is the posterior rule's only


def test_defaults_differ_from_the_paper_only_where_paper_settings_say():
    """`--paper` (PAPER_SETTINGS) restores Algorithm 1: eq. 6, the outlier rule every epoch,
    undamped centroids, no validation split (last epoch), and the paper's loss settings."""
    ours, paper = TrainConfig(), dataclasses.replace(TrainConfig(), **PAPER_SETTINGS)
    assert (ours.readout, paper.readout) == ("cuts", "nearest")
    assert (ours.relabel, paper.relabel) == ("posterior", "outlier")
    assert paper.momentum == 0 and paper.val_fraction == 0 and paper.patience is None
    assert (paper.sigma, paper.tau, paper.margin, paper.T, paper.beta) == (1.0, 3, 0.25, 1, 0.9)
    assert not paper.selects_model and ours.selects_model
    with pytest.raises(ValueError, match="readout"):
        dataclasses.replace(BASE, readout="mean").validate()
    with pytest.raises(ValueError, match="relabel"):
        dataclasses.replace(BASE, relabel="always").validate()


def test_every_setting_of_a_fixed_set_of_values_refuses_another():
    """A value outside a setting's choices (which the parser holds the command line to) is refused by
    validate too, as a --config file or Python gives it: missing="drop", or "mark", which is
    prediction's."""
    with_choices = [f for f in dataclasses.fields(TrainConfig) if f.metadata.get("choices")]
    assert {f.name for f in with_choices} >= {"missing", "backend", "method", "augment"}
    for field in with_choices:
        with pytest.raises(ValueError, match=field.name.replace("_", "[ _]") + "|" + "unknown"):
            TrainConfig(**{field.name: "drop"}).validate()
    with pytest.raises(ValueError, match="missing='mark' is not one of skip, impute, error"):
        TrainConfig(missing="mark").validate()
    missing = next(f for f in with_choices if f.name == "missing")
    for choice in missing.metadata["choices"]:
        TrainConfig(missing=choice).validate()
