"""Smoke test of benchmarks/bench_accuracy.py: its --quick grid (abalone, one seed, 2 epochs).

The full grid takes about an hour on 2 cores; this runs a few methods of the quick grid in a
subprocess and checks the tables it writes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from common import REPO_ROOT, load_benchmark

ROOT = str(REPO_ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_accuracy.py")


def test_quick_grid_writes_the_tables_and_keeps_the_known_noise_row_out_of_the_test_tables(tmp_path):
    result = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--methods", "sol,l1,sol-noise-known",
         "--output", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    records = json.loads((tmp_path / "accuracy.json").read_text())
    assert len(records) == 4 * 3  # clean, gaussian 0.3 and 1, laplacian 0.3; three methods
    md = (tmp_path / "accuracy.md").read_text()
    test_table, label_table = md.split("training-label MAE against the clean labels")[:2]
    assert "| sol |" in test_table and "| l1 |" in test_table
    assert "sol-noise-known" not in test_table  # it trains as sol does
    assert "| sol-noise-known |" in label_table
    # told the noise std, the corrected labels are closer to the truth at gaussian 1 (here after
    # 2 epochs only); told nothing, sol moves (almost) none
    told = {r["kappa"]: r for r in records if r["method"] == "sol-noise-known" and r["noise"] == "gaussian"}
    assert told[1.0]["label_mae_final"] < told[1.0]["label_mae_given"]
    assert told[0.0]["label_mae_final"] == told[0.0]["label_mae_given"] == 0.0
    assert (tmp_path / "accuracy.png").stat().st_size > 0


def test_a_grid_of_the_known_noise_method_alone_gets_its_label_table():
    bench = load_benchmark("bench_accuracy")
    record = {"data": "abalone", "noise": "gaussian", "kappa": 1.0, "method": bench.KNOWN_NOISE,
              "seed": 0, "mae": 1.5, "cs": 80.0, "pearson": 0.7, "cs_theta": 2.0,
              "label_mae_given": 2.5, "label_mae_final": 1.6}
    md, misses = bench.tables([record])
    assert "test MAE" not in md and misses == []
    assert "| sol-noise-known | 2.500 → 1.600 ± 0.000 |" in md
