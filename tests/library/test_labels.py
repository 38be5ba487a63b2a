"""sol_ext.labels: the label grid between label values and ranks."""

import numpy as np
import pytest
import torch

import sol_ext
from sol_ext.labels import LabelGrid, infer_step


def test_grid_round_trip_integer_ages():
    ages = [16, 20, 33, 77]
    enc = LabelGrid.fit(ages)
    assert enc == LabelGrid(16.0, 1.0, 62)
    assert enc.max_value == 77.0
    ranks = enc.encode(ages)
    assert ranks.dtype == torch.int64 and ranks.tolist() == [0, 4, 17, 61]
    assert enc.decode(ranks).tolist() == [16.0, 20.0, 33.0, 77.0]
    assert enc.decode(ranks).dtype == torch.float64


def test_grid_decodes_expected_ranks_and_scalars():
    enc = LabelGrid(0.0, 0.01, 101)
    assert enc.decode(torch.tensor([2.5])).tolist() == pytest.approx([0.025])
    assert float(enc.decode(100)) == pytest.approx(1.0)
    assert enc.values().shape == (101,)


def test_grid_infers_decimal_step_through_float_error():
    scores = np.round(np.arange(0, 101) * 0.01, 2) + 1e-12  # 0.00 … 1.00 with round-off
    enc = LabelGrid.fit(scores)
    assert enc.step == 0.01 and enc.num_ranks == 101
    assert torch.equal(enc.encode(scores), torch.arange(101))


@pytest.mark.parametrize("values,step", [
    ([0, 2, 5, 9], 1.0),            # gaps 2, 3, 4: the common step is 1, not the smallest gap
    ([0.0, 0.3, 0.5], 0.1),
    ([10, 20, 40], 10.0),
    ([0.0, 0.25, 1.0], 0.25),
    ([0, 1 / 3, 1], 0.333333),
])
def test_infer_step(values, step):
    assert infer_step(values) == pytest.approx(step)


def test_grid_with_given_bounds_and_step():
    enc = LabelGrid.fit([3, 5], step=1, min_value=0, max_value=10)
    assert enc == LabelGrid(0.0, 1.0, 11)
    # the given bounds join the step inference: 0 and 10 with labels 4, 6 -> step 2
    assert LabelGrid.fit([4, 6], min_value=0, max_value=10).step == 2.0


def test_grid_rounds_off_grid_values_half_up():
    enc = LabelGrid(0.0, 1.0, 10)
    assert enc.encode([0.4, 0.5, 1.49, 8.6]).tolist() == [0, 1, 1, 9]


def test_grid_keeps_input_shape():
    enc = LabelGrid(0.0, 1.0, 10)
    assert enc.encode(torch.zeros(2, 3)).shape == (2, 3)


def test_grid_out_of_range_names_the_value():
    enc = LabelGrid(1.0, 1.0, 29)
    with pytest.raises(ValueError, match=r"label value 31 \(index 1\) is outside the rank grid 1 … 29"):
        enc.encode([3, 31])
    with pytest.raises(ValueError, match="outside"):
        LabelGrid.fit([1, 5, 9], min_value=2)


@pytest.mark.parametrize("values,kwargs,match", [
    ([4, 4, 4], {}, "one rank"),
    ([4, 4], {"step": 1}, "one rank"),
    ([], {}, "empty"),
    ([1.0, float("nan")], {}, "finite"),
    (np.random.default_rng(0).random(50) * 80, {}, "continuous.*pass step="),
    ([1, 2], {"step": -1}, "step"),
    ([1, 2], {"min_value": 5, "max_value": 3}, "below"),
])
def test_grid_bad_fit(values, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LabelGrid.fit(values, **kwargs)


def test_continuous_labels_with_explicit_step():
    rng = np.random.default_rng(0)
    enc = LabelGrid.fit(rng.random(50) * 80 + 3, step=1.0)
    assert enc.step == 1.0 and enc.num_ranks <= 81


def test_grid_direct_construction_validates():
    with pytest.raises(ValueError, match="step"):
        LabelGrid(0.0, 0.0, 3)
    with pytest.raises(ValueError, match="num_ranks"):
        LabelGrid(0.0, 1.0, 0)


def test_a_grid_fitted_with_a_given_step_may_merge_labels():
    # the user asked for that grid: 1.2 joins rank 0 as they said
    enc = LabelGrid.fit([1, 1.2, 2, 3], step=1)
    assert enc.encode([1, 1.2, 2, 3]).tolist() == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="one rank"):
        LabelGrid.fit([*range(1, 11), 1e15])


def test_labels_equal_up_to_round_off_still_share_a_rank():
    assert LabelGrid.fit([0.1, 0.2, 0.1 + 0.2, 0.3]).num_ranks == 3
    assert LabelGrid.fit([0.0, 0.1 + 0.2 - 0.3, 1.0, 2.0]).num_ranks == 3
    assert LabelGrid.fit([1e15, 1e15 + 2e15, 2e15]).num_ranks == 3


def test_label_grid_is_exported_at_the_top_level():
    assert sol_ext.LabelGrid is LabelGrid and "LabelGrid" in sol_ext.__all__
