"""benchmarks/bench_gradient_scale.py: SOL's loss gradient next to CORN's (docs/math.md §12.10)."""
from __future__ import annotations

import pytest

from common import load_benchmark


def test_sols_gradient_outgrows_corns_with_the_number_of_ranks(capsys):
    pytest.importorskip("coral_pytorch")
    bench = load_benchmark("bench_gradient_scale")
    ratios = [sol / corn for sol, corn in (bench.gradient_norms(n, 64, 16, draws=3) for n in (6, 62))]
    assert 1 < ratios[0] < ratios[1]
    assert bench.main(["--ranks", "4,8", "--draws", "1"]) == 0
    assert "| 8 |" in capsys.readouterr().out
