"""Tests of benchmarks/bench_label_issues.py: its metrics on small arrays, and its --quick run (skipped
without cleanlab)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from common import load_benchmark


def _bench():
    return load_benchmark("bench_label_issues")


def test_flag_quality_counts():
    bench = _bench()
    wrong = np.array([True, True, False, False, True])
    flagged = np.array([True, False, True, False, False])
    q = bench.flag_quality(wrong, flagged)
    assert q["flagged"] == pytest.approx(0.4)
    assert q["precision"] == pytest.approx(0.5) and q["recall"] == pytest.approx(1 / 3)
    assert q["f1"] == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    assert bench.flag_quality(wrong, np.zeros(5, dtype=bool))["f1"] == 0.0


def test_ranking_quality_is_nan_without_both_classes():
    bench = _bench()
    wrong = np.array([False, True, False, True])
    auroc, ap = bench.ranking_quality(wrong, np.array([0.1, 0.9, 0.2, 0.8]))
    assert auroc == 1.0 and ap == 1.0
    assert all(math.isnan(v) for v in bench.ranking_quality(np.zeros(4, dtype=bool), np.arange(4.0)))


def test_noise_std_of_each_cell_kind():
    bench = _bench()
    clean = np.array([0, 1, 2, 3, 4, 5])
    s = bench.noise_scale(clean, 0.3)
    assert bench.noise_std("gaussian0.3", clean, 6) == pytest.approx(s)
    assert bench.noise_std("laplacian0.3", clean, 6) == pytest.approx(s * 2 ** 0.5)
    assert s < bench.noise_std("rank-dependent0.3", clean, 6) < 2 * s  # widened around the peak
    assert bench.noise_std("annotator", np.zeros(3, dtype=int), 62) == pytest.approx(2.0)
    assert bench.noise_std("one_rater", clean, 6) is None


def test_quick_run_writes_both_tools_numbers(tmp_path):
    pytest.importorskip("cleanlab")
    bench = _bench()
    assert bench.main(["--quick", "--output", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "label_issues_quick.json").read_text())
    assert [(r["data"], r["noise"], r["folds"], r["epochs"]) for r in records] == [
        ("wine-red", "clean", 2, 1), ("wine-red", "gaussian1", 2, 1)]
    clean, noisy = records
    assert clean["wrong"] == 0 and 0 < noisy["far"] < noisy["wrong"] < 1
    r = noisy["sol"]
    for tool in ("sol_ext", "cleanlab", "cleanlab_regression"):
        assert 0 <= r[tool]["auroc"] <= 1 and 0 <= r[tool]["auroc_far"] <= 1
    for tool in ("sol_ext", "cleanlab"):
        assert 0 <= r[tool]["f1"] <= 1 and 0 <= r[tool]["flagged"] < 1
    assert 0 < r["cleanlab"]["flagged"]
    # told the noise (std kappa x the clean ranks' std), ours flags more than its default
    told = r["sol_ext"]["told"]
    assert told["std"] > 0 and told["flagged"] > r["sol_ext"]["flagged"] and 0 < told["recall"] <= 1
    assert r["sol_ext"]["estimated"]["std"] >= 0
    # the noisy cell is also judged at the threshold that flags 1 % of the clean cell's rows
    threshold = clean["sol"]["sol_ext"]["suspicion_at_clean_share"]
    assert -1 <= threshold <= 0 and 0 <= r["sol_ext"]["at_clean_share"]["flagged"] <= 1  # on -quality
    assert "at_clean_share" not in clean["sol"]["sol_ext"]
    table = (tmp_path / "label_issues_quick.md").read_text()
    assert "| wine-red | gaussian1 | 2 | sol |" in table and "AUROC cleanlab regression" in table
    assert 0 <= r["sol_ext"]["at_clean_share"]["false_flags"] <= 1
