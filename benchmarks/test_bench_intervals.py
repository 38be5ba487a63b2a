"""Smoke test of benchmarks/bench_intervals.py: one seed of one cell, 2 epochs, writes every method and
target at both coverages, and what the seed's model was."""
from __future__ import annotations

import json

from common import load_benchmark


def test_smoke_run_reports_every_method_and_target(tmp_path, capsys):
    bench = load_benchmark("bench_intervals")
    assert bench.main(["--smoke", "--output", str(tmp_path)]) == 0
    assert "| abalone gaussian | cumulative | clean |" in capsys.readouterr().out
    result = json.loads((tmp_path / "intervals.json").read_text())
    assert result["cells"] == ["abalone gaussian"] and result["kappa"] == bench.KAPPA
    found = {(r["method"], r["target"], r["coverage"]) for r in result["summary"]}
    for coverage in bench.COVERAGES:
        for score in bench.SCORES:
            assert {(score, target, coverage) for target in (
                "labels", "clean", "clean, deconvolve=False", "clean, SOL's sigma")} <= found
        assert {("lac", "labels", coverage), ("aps", "labels", coverage)} <= found
    for row in result["rows"]:
        assert 0 <= row["noisy_coverage"] <= 1 and 0 <= row["clean_coverage"] <= 1 and row["width"] >= 1
    (model,) = result["models"]
    assert 0 <= model["clean_accuracy"] <= 1 and model["deconvolution_iterations"] >= 0 and model["sol_sigma"] > 0
    assert (tmp_path / "intervals.md").read_text().startswith("| cell | method | target |")
