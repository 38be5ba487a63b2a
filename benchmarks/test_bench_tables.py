"""Smoke test of benchmarks/bench_tables.py: a small run times the loads and the prediction and writes
its JSON."""
from __future__ import annotations

import json

from common import load_benchmark


def test_smoke_run_reports_load_times_memory_and_prediction_rate(tmp_path, capsys):
    out = tmp_path / "tables.json"
    assert load_benchmark("bench_tables").main(["--smoke", "--json", str(out)]) == 0
    assert "sol-ext predict" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["rows"] == 20_000 and result["loaded_shape"] == "(20000, 11)"
    assert result["load_csv_s"] > 0 and result["load_parquet_s"] > 0 and result["memory_added_mb"] >= 0
    assert result["predict"]["rows"] == 5_000 and result["predict_rows_per_s"] > 0
    assert set(result["targets"]) == {"csv_vs_pandas", "memory_vs_matrix", "predict_rows_per_s", "wide_predict_s",
                                      "stream_memory_vs_matrix"}
    stream = result["stream"]
    assert stream["rows"] == 20_000 and stream["rows_per_s"] > 0 and stream["memory_added_mb"] >= 0
    wide = result["wide"]
    assert (wide["rows"], wide["columns"]) == (50, 500)
    assert min(wide[k] for k in ("load_s", "train_epoch_s", "train_epoch_50_columns_s", "predict_s")) > 0
