"""pytest-benchmark suite: fused vs reference StochasticOrderLoss, forward+backward, all pairs.

    pytest benchmarks/bench_loss_suite.py --benchmark-only --benchmark-group-by=param:size

(benchmarks/bench_loss.py prints the same comparison as one table, with memory and ratios.)
"""
from __future__ import annotations

import pytest
import torch
from bench_loss import check_agreement, make_inputs, make_loss

import sol_ext

SIZES = [(64, 60, 512), (256, 101, 512), (1024, 217, 512)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and sol_ext.cuda_kernels_available()), reason="needs a CUDA GPU and CUDA kernels"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_forward_backward(benchmark, size, backend, device):
    B, n, d = size
    if backend == "reference" and device == "cpu" and B > 256:
        pytest.skip("the reference needs several GB and minutes here")
    assert check_agreement(min(B, 128), n, d, device) < 1e-9  # correctness before timing
    h, mu, labels = make_inputs(B, n, d, device)
    criterion = make_loss(n, backend)

    def step():
        grads = torch.autograd.grad(criterion(h, labels, mu), (h, mu))
        if device == "cuda":
            torch.cuda.synchronize()
        return grads

    benchmark.extra_info["pair_rank_updates"] = B * (B - 1) // 2 * n
    benchmark(step)
