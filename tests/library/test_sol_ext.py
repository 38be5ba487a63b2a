"""The package namespace: what ``import sol_ext`` offers, and the names it retired warning for one release."""

import importlib

import pytest

import sol_ext


def test_the_top_level_holds_what_users_call_and_no_more_than_fifteen_names():
    assert len(sol_ext.__all__) <= 15
    assert {"StochasticOrderLoss", "SOLHead", "LabelGrid", "load_run", "find_label_issues",
            "get_label_quality_scores", "cuda_kernels_available", "order_loss", "disc_loss",
            "stochastic_dissimilarity"} <= set(sol_ext.__all__)
    for name in sol_ext.__all__:
        assert getattr(sol_ext, name) is not None


@pytest.mark.parametrize("name, module", [
    ("order_loss_block", "sol_ext.ops"),
    ("ordering_probability_table", "sol_ext.ops"),
    ("label_issue_scores", "sol_ext.label_issues"),
])
def test_a_building_block_still_works_from_the_top_level_and_warns(name, module):
    assert name not in sol_ext.__all__
    with pytest.warns(DeprecationWarning, match=rf"sol_ext\.{name} is deprecated.*{module}\.{name}"):
        old = getattr(sol_ext, name)
    assert old is getattr(importlib.import_module(module), name)


def test_submodules_stay_reachable_without_a_warning(recwarn):
    assert sol_ext.grouped is importlib.import_module("sol_ext.grouped")
    assert sol_ext.reference is importlib.import_module("sol_ext.reference")
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        sol_ext.no_such_name  # noqa: B018
