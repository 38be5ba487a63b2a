"""Smoke test of benchmarks/bench_distributed.py: its --quick mode runs W = 1 and W = 2 gloo processes.

The benchmark spawns its own gloo processes on the loopback interface; this test only runs
it in a subprocess under a timeout and checks that it finished and printed its table.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from common import MULTIPROCESS_TIMEOUT_S, REPO_ROOT

SCRIPT = os.path.join(str(REPO_ROOT), "benchmarks", "bench_distributed.py")
TABLE_HEADER = "| global batch N | processes | per process B | step (median) |"


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="needs torch.distributed with the gloo backend")
def test_quick_benchmark_runs_and_prints_its_table():
    result = subprocess.run(
        [sys.executable, SCRIPT, "--quick"], capture_output=True, text=True, timeout=MULTIPROCESS_TIMEOUT_S,
        cwd=str(REPO_ROOT),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert TABLE_HEADER in result.stdout
    assert "| 32 | W = 2, DDP + distributed loss | 16 |" in result.stdout  # the two-process row
