"""Smoke test of benchmarks/bench_onnx.py: a small run times the .pt2 program and onnxruntime on the
same rows and thread count and writes its JSON."""
from __future__ import annotations

import json

import pytest

from common import load_benchmark


def test_smoke_run_reports_both_throughputs_on_equal_threads(tmp_path, capsys):
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "onnx.json"
    assert load_benchmark("bench_onnx").main(["--smoke", "--threads", "1", "--json", str(out)]) == 0
    assert "onnxruntime / program" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["rows"] == 5_000 and result["threads"] == 1
    assert result["pt2_rows_per_s"] > 0 and result["onnx_rows_per_s"] > 0
    assert result["onnx_vs_pt2"] == pytest.approx(result["onnx_rows_per_s"] / result["pt2_rows_per_s"])
    assert result["ranks_equal"] == 1.0 and result["max_probability_difference"] < 1e-5
    assert set(result["targets"]) == {"onnx_vs_pt2"}
