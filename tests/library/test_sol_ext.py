"""The package namespace: what ``import sol_ext`` offers."""

import importlib

import pytest

import sol_ext


def test_the_top_level_holds_what_users_call_and_no_more_than_fifteen_names():
    assert len(sol_ext.__all__) <= 15
    assert {"StochasticOrderLoss", "SOLHead", "LabelGrid", "find_label_issues",
            "get_label_quality_scores", "cuda_kernels_available", "order_loss", "disc_loss",
            "stochastic_dissimilarity"} <= set(sol_ext.__all__)
    for name in sol_ext.__all__:
        assert getattr(sol_ext, name) is not None


def test_trained_runs_and_the_estimator_are_the_programs():
    """``load_run`` and ``SOLRanker`` belong to the program, ``sol_ext.driver``, not the library's namespace."""
    import sol_ext.driver

    assert not {"load_run", "SOLRanker"} & set(sol_ext.__all__)
    assert sol_ext.driver.load_run is importlib.import_module("sol_ext.driver.model").load_run
    assert sol_ext.driver.SOLRanker is importlib.import_module("sol_ext.driver.sklearn").SOLRanker


def test_submodules_are_reachable_from_the_package():
    assert sol_ext.grouped is importlib.import_module("sol_ext.grouped")
    assert sol_ext.reference is importlib.import_module("sol_ext.reference")


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        sol_ext.no_such_name  # noqa: B018
