"""Smoke tests of benchmarks/bench_loss.py: --algorithms, a short CPU run at two small sizes, writes its table and
JSON, times grouped at the default thread count beside one thread, and --busy leaves no spinning process; the
default run reports each op fused beside the reference, per core, and the CPU kernels that ran."""
from __future__ import annotations

import json
import subprocess

import pytest

import sol_ext
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
        assert all(r[how] > 0 for how in ("grouped", "grouped_1_thread", "grouped_1_thread_cpu", "pairwise", "reference"))
        assert r["auto"] in ("grouped", "pairwise") and r["grouped_memory"] >= 0
        assert f"| cpu | {r['B']}, {r['n']}, {r['d']} |" in printed


def test_default_run_reports_each_op_beside_the_reference_per_core_and_the_capability(tmp_path, capsys):
    bench = load_benchmark("bench_loss")
    out = tmp_path / "loss.json"
    assert bench.main(["--device", "cpu", "--sizes", "24,5,8", "--min-run-time", "0.01", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"CPU kernels {sol_ext.cpu_capability()}" in printed
    (row,) = json.loads(out.read_text())
    assert row["capability"] == sol_ext.cpu_capability() and row["threads"] >= 1 and row["agreement"] < 1e-9
    for backend in ("fused", "reference"):
        assert all(row[backend][phase] > 0 for phase in bench.PHASES)
    assert "| per core |" in printed
    for phase in ("order_loss forward", "order_loss backward", f"both, default algorithm ({row['auto']})"):
        assert f"| cpu | 24, 5, 8 | {phase} |" in printed
