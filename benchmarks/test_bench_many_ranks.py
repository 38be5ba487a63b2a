"""Smoke test of benchmarks/bench_many_ranks.py: its data and its --quick run (two methods, one seed,
2 epochs) in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from common import REPO_ROOT, load_benchmark

ROOT = str(REPO_ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_many_ranks.py")


def _bench():
    return load_benchmark("bench_many_ranks")


def test_the_data_is_fixed_and_its_annotator_errs_more_on_older_ages():
    bench = _bench()
    data, again = bench.make_data(), bench.make_data()
    assert all(np.array_equal(data[k], again[k]) for k in data)
    low, high = bench.AGE_RANGE
    for key in ("true ages", "annotator", "test"):
        assert data[key].min() >= low and data[key].max() <= high
    assert len(np.unique(data["true ages"])) > 40  # many ranks
    error = data["annotator"] - data["true ages"]
    young, old = data["true ages"] < 35, data["true ages"] > 50
    assert 2 * np.abs(error[young]).mean() < np.abs(error[old]).mean()


def test_spread_features_keep_the_ages_and_every_feature_linearly():
    bench = _bench()
    data, spread = bench.make_data(), bench.make_data(feature_dim=40)
    for key in ("true ages", "annotator", "test"):
        assert np.array_equal(data[key], spread[key])
    assert spread["x_train"].shape == (bench.TRAIN_SIZE, 40) and spread["x_test"].shape == (bench.TEST_SIZE, 40)
    for part in ("x_train", "x_test"):  # a rotation: the 12 features are a linear read of the 40
        coef, *_ = np.linalg.lstsq(spread[part], data[part], rcond=None)
        np.testing.assert_allclose(spread[part] @ coef, data[part], atol=1e-8)
    with pytest.raises(ValueError, match="feature_dim"):
        bench.make_data(feature_dim=5)


def test_fit_to_noise_tells_a_memorizing_prediction_from_the_true_ages():
    bench = _bench()
    data = bench.make_data()
    true, annotator = data["true ages"], data["annotator"]
    exact = bench.fit_to_noise(true.astype(float), true, annotator)
    assert exact == {"train_mae_true": 0.0, "error_corr": 0.0}  # no error at all
    copied = bench.fit_to_noise(annotator.astype(float), true, annotator)  # the labels learnt by heart
    assert copied["error_corr"] == 1.0 or abs(copied["error_corr"] - 1.0) < 1e-12
    assert abs(copied["train_mae_true"] - np.abs(annotator - true).mean()) < 1e-12
    rng = np.random.default_rng(0)
    blind = bench.fit_to_noise(true + rng.normal(0, 2, true.size), true, annotator)  # errors of its own
    assert abs(blind["error_corr"]) < 0.1


def test_band_mae_covers_every_age_once():
    bench = _bench()
    true = np.arange(16, 78)
    bands = bench.band_mae(true + 1.0, true)
    assert list(bands) == ["16-30", "31-45", "46-60", "61-77"] and all(v == 1.0 for v in bands.values())
    assert sum(hi - lo + 1 for lo, hi in bench.AGE_BANDS) == true.size


def test_sol_options_are_config_fields():
    bench = _bench()
    assert bench.parse_options(["weight_ema=0.99", "sigma=auto", "refine=false"]) == {
        "weight_ema": 0.99, "sigma": "auto", "refine": False}
    for bad in (["nonsense=1"], ["weight_ema"]):
        with pytest.raises(ValueError, match="--sol-option"):
            bench.parse_options(bad)


def test_quick_run_writes_a_table_of_both_label_sets(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, SCRIPT, "--quick", "--output", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    records = json.loads((out / "many_ranks.json").read_text())
    assert sorted((r["labels"], r["method"]) for r in records) == [
        ("annotator", "l1"), ("annotator", "sol"), ("true ages", "l1"), ("true ages", "sol")]
    for r in records:
        assert set(r["band_mae"]) == {"16-30", "31-45", "46-60", "61-77"}
        assert r["train_mae_true"] >= 0 and -1 <= r["error_corr"] <= 1
    md = (out / "many_ranks.md").read_text()
    assert "| method | true ages | annotator |" in md and "| sol |" in md and "| l1 |" in md
    assert "annotator as training labels: test MAE by true-age band" in md
    assert "| corr(error, annotator's error) |" in md
    assert sorted(p.name for p in out.iterdir()) == ["many_ranks.json", "many_ranks.md"]  # runs elsewhere


def test_a_sol_option_that_is_no_training_field_or_invalid_is_refused_before_any_run(tmp_path):
    for bad, needle in (("foo=1", "--sol-option 'foo=1'"), ("weight_ema=2", "weight EMA decay must be 'auto' or in [0, 1)")):
        result = subprocess.run([sys.executable, SCRIPT, "--sol-option", bad, "--output", str(tmp_path / "o")],
                                capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert result.returncode == 2 and needle in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and not (tmp_path / "o").exists()


def test_a_method_without_a_validation_split_is_measured_on_every_training_row(tmp_path):
    # sol-paper fits all 4000 rows (no split): the fit to the noise is taken on all of them
    records = _bench().run(["sol-paper"], [0], 1, tmp_path, log=lambda _line: None)
    assert [r["labels"] for r in records] == ["true ages", "annotator"]
    annotator = records[1]
    assert annotator["train_mae_true"] >= 0 and -1 <= annotator["error_corr"] <= 1
