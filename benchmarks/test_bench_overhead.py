"""Smoke test of benchmarks/bench_overhead.py: a short run writes its table and JSON, and counts the
operations a fused step dispatches."""
from __future__ import annotations

import json

from common import load_benchmark


def test_short_run_reports_time_and_dispatched_operations(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    assert load_benchmark("bench_overhead").main(["--steps", "20", "--repeats", "2", "--json", str(out)]) == 0
    assert "operations dispatched per step" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    unchecked, checked = rows
    assert unchecked["check_values"] is False and checked["check_values"] is True
    assert unchecked["dispatched"] == len(unchecked["ops"])
    # the loss op, its backward op and autograd's seed gradient: nothing else per step
    assert sorted(unchecked["ops"]) == sorted(["sol_ext.stochastic_order_loss.default", "aten.ones_like.default",
                                               "sol_ext._stochastic_order_loss_backward.default"])
    assert checked["dispatched"] > unchecked["dispatched"]  # the value checks read the inputs
    assert 0 < unchecked["us_fastest"] <= unchecked["us_per_step"]
