"""sol_ext._dispatch: the choice of what runs (the algorithm argument, the auto rule between the pairwise
and the grouped order loss, the plan of the whole loss)."""
from __future__ import annotations

import pytest
import torch

import sol_ext
from common import load_benchmark
from sol_ext import _dispatch

CountOps = load_benchmark("bench_overhead").CountOps  # counts the operations a call dispatches


CHOICES = ("auto", "pairwise", "grouped")

# (call, exception type, the argument the message must name)
BAD_ALGORITHM = [
    (lambda: sol_ext.StochasticOrderLoss(4, algorithm="fast"), ValueError, "algorithm"),
    (lambda: sol_ext.order_loss(torch.randn(3, 4), torch.tensor([0, 1, 2]), algorithm="fast"), ValueError,
     "algorithm"),
]


@pytest.mark.parametrize("call, error, argument", BAD_ALGORITHM, ids=["StochasticOrderLoss", "order_loss"])
def test_a_bad_algorithm_is_refused_naming_the_argument_and_the_choices(call, error, argument):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert argument in message and all(f'"{choice}"' in message for choice in CHOICES), message


def test_auto_rule():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    choose = _dispatch.choose_algorithm
    assert choose("auto", 64, 60, cpu, fused=True) == "pairwise"
    assert choose("auto", 8192, 7, cpu, fused=True) == "grouped"
    assert choose("auto", 1_000_000, 5, cpu, fused=True) == "grouped"
    assert choose("auto", 4096, 217, cpu, fused=True) == "grouped"
    assert choose("auto", 1280, 217, cpu, fused=True) == "grouped"
    assert choose("auto", 1024, 217, cpu, fused=True) == "pairwise"
    assert choose("auto", 384, 60, cpu, fused=True) == "grouped"
    assert choose("auto", 256, 60, cpu, fused=True) == "pairwise"
    assert choose("auto", 64, 5, cpu, fused=True) == "grouped"
    assert choose("auto", 48, 5, cpu, fused=True) == "pairwise"
    assert choose("auto", 200, 60, cpu, fused=False) == "grouped"  # against the plain reference
    # CUDA (the CUDA op, measured on an H100): pairwise up to B = 4096 (level there); grouped from B = 8192
    assert choose("auto", 4096, 5, cuda, fused=True) == "pairwise"
    assert choose("auto", 4096, 217, cuda, fused=True) == "pairwise"
    assert choose("auto", 8192, 20, cuda, fused=True) == "grouped"
    assert choose("auto", 16384, 60, cuda, fused=True) == "grouped"
    assert choose("auto", 8192, 217, cuda, fused=True) == "pairwise"  # n > B / 64: not measured, n^2 B grows
    assert choose("auto", 65536, 7, cuda, fused=True) == "grouped"
    assert choose("auto", 8192, 7, cpu, fused=True, pairs=torch.zeros(1, 2)) == "pairwise"
    assert choose("auto", 8192, 7, cpu, fused=True, reduction="none") == "pairwise"
    assert choose("auto", 8192, 7, cpu, fused=True, backend="reference") == "pairwise"
    assert choose("auto", 8192, 7, torch.device("meta"), fused=True) == "pairwise"
    assert choose("pairwise", 8192, 7, cpu, fused=True) == "pairwise"
    assert choose("grouped", 3, 7, cpu, fused=True) == "grouped"


def test_auto_module_uses_grouped_for_a_large_batch():
    h, mu = torch.randn(600, 8), torch.randn(5, 8)
    labels = torch.randint(0, 5, (600,))
    for B, expected in ((600, "sol_ext.grouped_stochastic_order_loss.default"),
                        (50, "sol_ext.stochastic_order_loss.default")):
        with CountOps() as counted:
            sol_ext.StochasticOrderLoss(5)(h[:B], labels[:B], mu)
        assert [op for op in counted.ops if op.startswith("sol_ext.")] == [expected]


@pytest.mark.parametrize("check_values", [True, False])
def test_the_plan_of_the_whole_loss_on_the_cpu(check_values):
    """Which op runs and where the value checks run: the one-op steps with the fused kernels (the grouped one
    reads its inputs itself, the pairwise one's h and mu are read through D after it), the leaf ops for the
    reference, whose indices are read even without value checks (a negative one would wrap around)."""
    plan = _dispatch.plan_loss
    small, large = torch.zeros(8, 4), torch.zeros(600, 4)
    pairwise_step = plan("loss", "auto", small, 5, check_values=check_values)
    assert (pairwise_step.op, pairwise_step.algorithm, pairwise_step.backend) == ("stochastic_order_loss", "pairwise",
                                                                                  "fused")
    grouped_step = plan("loss", "auto", large, 5, check_values=check_values)
    assert (grouped_step.op, grouped_step.algorithm) == ("grouped_stochastic_order_loss", "grouped")
    reference = plan("loss", "reference", small, 5, check_values=check_values)
    assert (reference.op, reference.backend) == ("leaf_ops", "reference")
    leaf = plan("loss", "auto", large, 5, check_values=check_values, leaf_ops=True)
    assert (leaf.op, leaf.algorithm, leaf.backend) == ("leaf_ops", "grouped", "fused")
    if check_values:
        assert [p.checks for p in (pairwise_step, grouped_step, reference, leaf)] == ["after", "op", "python",
                                                                                     "python"]
    else:
        assert [p.checks for p in (pairwise_step, grouped_step, reference, leaf)] == ["none", "none", "indices",
                                                                                     "none"]

