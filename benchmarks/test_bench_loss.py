"""Smoke test of benchmarks/bench_loss.py --algorithms: a short CPU run at two small sizes writes its table and
JSON, times grouped at the default thread count beside one thread, and --busy leaves no spinning process."""
from __future__ import annotations

import json
import subprocess

import pytest

from common import load_benchmark


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_algorithms_run_reports_grouped_pairwise_and_auto(tmp_path, capsys, monkeypatch, busy):
    bench = load_benchmark("bench_loss")
    started, real_popen = [], subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    out = tmp_path / "algorithms.json"
    argv = ["--algorithms", "--device", "cpu", "--sizes", "40,3,8", "300,4,8", "--min-run-time", "0.01",
            "--json", str(out)] + (["--busy"] if busy else [])
    assert bench.main(argv) == 0
    spinners = [p for p in started if "while True: pass" in p.args]
    assert len(spinners) == busy and all(p.poll() is not None for p in spinners)  # the spinner ran and is gone

    printed = capsys.readouterr().out
    assert ("beside one spinning process (--busy)" in printed) == busy
    assert "fused CUDA kernels" not in printed  # that implementation is timed on CUDA only
    rows = json.loads(out.read_text())
    assert [(r["B"], r["n"], r["d"]) for r in rows] == [(40, 3, 8), (300, 4, 8)]
    for r in rows:
        assert r["device"] == "cpu" and r["agreement"] < 1e-10
        assert all(r[how] > 0 for how in ("grouped", "grouped_1_thread", "pairwise", "reference"))
        assert r["auto"] in ("grouped", "pairwise") and r["grouped_memory"] >= 0
        assert f"| cpu | {r['B']}, {r['n']}, {r['d']} |" in printed
