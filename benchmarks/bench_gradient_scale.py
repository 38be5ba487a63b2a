"""How large SOL's loss gradient is next to CORN's, by the number of ranks (why SOL's weight decay
grows with the ranks: docs/math.md §12.10).

    python benchmarks/bench_gradient_scale.py                 # ranks 6, 29, 62; batch 64, d = 16
    python benchmarks/bench_gradient_scale.py --ranks 5,10,100

Adam adds its L2 term ``weight_decay * w`` to the loss gradient and divides the sum by its running
scale, so how much a weight decay counts depends on how large the loss gradient is. For random
embeddings, labels and centroids (SOL: L2-normalized embeddings, the driver's default loss with
σ 1 and τ 1; CORN: coral-pytorch's loss on a linear head of small random weights, as at
initialization; needs ``pip install .[baselines]``) this prints the norm
of each loss's gradient with respect to the embeddings, averaged over --draws draws, and their ratio.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import sol_ext
from sol_ext.driver.methods import require_coral


def gradient_norms(num_ranks: int, batch: int, dim: int, draws: int, seed: int = 0) -> tuple[float, float]:
    """Mean gradient norms (SOL, CORN) with respect to the embeddings over ``draws`` random batches."""
    gen = torch.Generator().manual_seed(seed)
    corn_loss = require_coral().losses.corn_loss  # the baseline's own loss (pip install .[baselines])
    sol, corn = 0.0, 0.0
    criterion = sol_ext.StochasticOrderLoss(num_ranks, sigma=1.0, tau=1)
    for _ in range(draws):
        h = torch.randn(batch, dim, generator=gen).requires_grad_()
        labels = torch.randint(0, num_ranks, (batch,), generator=gen)
        centroids = F.normalize(torch.randn(num_ranks, dim, generator=gen), dim=1)
        (g,) = torch.autograd.grad(criterion(F.normalize(h, dim=1), labels, centroids), h)
        sol += float(g.norm())
        head = 0.1 * torch.randn(num_ranks - 1, dim, generator=gen)
        (g,) = torch.autograd.grad(corn_loss(h @ head.T, labels, num_ranks), h)
        corn += float(g.norm())
    return sol / draws, corn / draws


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="6,29,62", help="numbers of ranks (default 6,29,62)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dim", type=int, default=16, help="embedding size (default 16)")
    parser.add_argument("--draws", type=int, default=20, help="random batches per size (default 20)")
    args = parser.parse_args(argv)
    print(f"gradient norm w.r.t. the embeddings, batch {args.batch_size}, d = {args.dim}, "
          f"mean of {args.draws} draws\n")
    print("| ranks | SOL | CORN | SOL / CORN |")
    print("| --- | --- | --- | --- |")
    for n in (int(v) for v in args.ranks.split(",")):
        sol, corn = gradient_norms(n, args.batch_size, args.dim, args.draws)
        print(f"| {n} | {sol:.4f} | {corn:.4f} | {sol / corn:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
