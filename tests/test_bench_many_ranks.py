"""Smoke test of benchmarks/bench_many_ranks.py: its data and its --quick run (two methods, one seed,
2 epochs) in a subprocess."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_many_ranks.py")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_many_ranks", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


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


def test_quick_run_writes_a_table_of_both_label_sets(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, SCRIPT, "--quick", "--output", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    records = json.loads((out / "many_ranks.json").read_text())
    assert sorted((r["labels"], r["method"]) for r in records) == [
        ("annotator", "l1"), ("annotator", "sol"), ("true ages", "l1"), ("true ages", "sol")]
    md = (out / "many_ranks.md").read_text()
    assert "| method | true ages | annotator |" in md and "| sol |" in md and "| l1 |" in md
    assert sorted(p.name for p in out.iterdir()) == ["many_ranks.json", "many_ranks.md"]  # runs elsewhere
