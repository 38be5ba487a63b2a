"""Smoke test of benchmarks/fuzz_kernels.py, the differential fuzz of the fused kernels: a few hundred
configurations on the CPU kernels (the GPU check runs 10,000 on CUDA), and proof that it catches a
kernel that is off."""
from __future__ import annotations

import json
import types

import pytest
import torch

from common import CUDA_REASON, cuda_ready, load_benchmark

fuzz = load_benchmark("fuzz_kernels")
CHECKS = {
    "order_loss forward vs oracle", "order_loss backward vs oracle", "stochastic_dissimilarity vs oracle",
    "StochasticOrderLoss loss vs oracle", "StochasticOrderLoss dL/dh vs oracle", "StochasticOrderLoss dL/dmu vs oracle",
}


def test_cpu_kernels_agree_with_the_oracle():
    result = fuzz.run("cpu", configs=200, seed=7)
    assert set(result["checks"]) == CHECKS
    assert all(entry["compared"] == 200 for entry in result["checks"].values())
    assert result["mismatches"] == 0, result["checks"]
    coverage = result["coverage"]
    assert coverage["B == 0"] > 0 and coverage["explicit pairs"] > 0 and coverage["ties"] > 0
    assert set(coverage["dtypes"]) == {"float32", "float64"}  # the CPU kernels' dtypes only


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_the_fuzz_catches_a_kernel_with_a_shifted_margin(monkeypatch, which):
    """A margin off by 1e-3 changes few hinge decisions and values by a little: each must show."""
    real = torch.ops.sol_ext

    def shifted(op):
        return lambda *args: op(*args[:-2], args[-2] + 1e-3, args[-1])

    wrong = types.SimpleNamespace(
        order_loss=shifted(real.order_loss) if which == "forward" else real.order_loss,
        _order_loss_backward=shifted(real._order_loss_backward) if which == "backward" else real._order_loss_backward,
        stochastic_dissimilarity=real.stochastic_dissimilarity,
    )
    monkeypatch.setattr(fuzz, "ops", wrong)
    result = fuzz.run("cpu", configs=40, seed=3)
    assert result["checks"][f"order_loss {which} vs oracle"]["mismatches"] > 0


def test_command_line_writes_the_counts(tmp_path, capsys):
    out = tmp_path / "fuzz.json"
    assert fuzz.main(["--device", "cpu", "--configs", "20", "--json", str(out)]) == 0
    assert "mismatches: 0" in capsys.readouterr().out
    assert out.exists()
    with pytest.raises(SystemExit):
        fuzz.main(["--device", "cpu", "--configs", "0"])


def test_ranges_run_apart_and_merged_equal_one_run(tmp_path):
    """--first splits the configurations over runs (the GPU check runs them side by side); --merge adds
    them up to what one run over the whole range reports."""
    whole = fuzz.run("cpu", configs=12, seed=5)
    parts = [fuzz.run("cpu", configs=5, seed=5), fuzz.run("cpu", configs=7, seed=5, first=5)]
    merged = fuzz.merge(parts)
    assert merged["configs"] == 12 and merged["ranges"] == [(0, 5), (5, 12)]
    assert merged["coverage"] == whole["coverage"]
    for name, entry in whole["checks"].items():
        assert merged["checks"][name]["compared"] == entry["compared"]
        assert merged["checks"][name]["worst_ratio"] == entry["worst_ratio"]
    files = []
    for i, part in enumerate(parts):
        files.append(tmp_path / f"part{i}.json")
        files[-1].write_text(json.dumps(part))
    assert fuzz.main(["--merge", *map(str, files), "--json", str(tmp_path / "all.json")]) == 0


def test_only_runs_the_listed_configurations_and_explains_them(capsys):
    """--only 3,7 --explain: those two configurations, each comparison's worst element printed."""
    result = fuzz.run("cpu", configs=0, seed=0, only=[3, 7], explain=True)
    assert result["configs"] == 2
    assert all(entry["compared"] == 2 for entry in result["checks"].values())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("config ")]
    assert {line.split()[1] for line in lines} == {"3", "7"}
    assert all("error / bound" in line for line in lines)


def test_an_overflow_to_infinity_is_the_right_result():
    """A float16 result whose exact value lies beyond float16's range is right as an infinity of its sign."""
    tally = fuzz.Tally()
    cfg = dict(index=0, B=1, n=1, d=1, dtype=torch.float16, sigma=1.0, tau=0, margin=0.0, T=1, disc_weight=0.0,
               convention="paper", reduction="sum", explicit=False, num_pairs=1, ties=False, check_values=True,
               data_seed=0)
    exact = torch.tensor([1e5, -2e5, 3.0], dtype=torch.float64)
    magnitude = exact.abs()
    tally.compare("c", cfg, torch.tensor([float("inf"), float("-inf"), 3.0], dtype=torch.float16), exact, magnitude,
                  1, torch.float16)
    assert tally.checks["c"]["mismatches"] == 0
    tally.compare("c", cfg, torch.tensor([float("-inf"), float("-inf"), 3.0], dtype=torch.float16), exact, magnitude,
                  1, torch.float16)
    assert tally.checks["c"]["mismatches"] == 1


@pytest.mark.skipif(not cuda_ready(), reason=CUDA_REASON)
def test_cuda_kernels_agree_with_the_cpu_kernels_and_the_oracle():
    result = fuzz.run("cuda", configs=300, seed=11)
    assert result["mismatches"] == 0, result["checks"]
    assert set(result["checks"]) == CHECKS | {"order_loss forward vs CPU kernel", "order_loss backward vs CPU kernel"}
