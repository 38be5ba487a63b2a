"""Host overhead of one StochasticOrderLoss step: time and dispatched operations of a forward + backward.

    python benchmarks/bench_overhead.py                    # B = 4, n = 3, d = 8 on the CPU, one thread
    python benchmarks/bench_overhead.py --json overhead.json

At a tiny batch the arithmetic is negligible, so the time of a step is what every step pays on top of
it: Python, argument checks, autograd and the dispatch of each operation (on a GPU, each operation is
also a kernel launch). Prints, for check_values=False and True: the median microseconds of
``torch.autograd.grad(criterion(h, labels, mu), (h, mu))`` over --repeats runs of --steps steps (and
the fastest run's: on a shared machine the least disturbed one), and
the operations it dispatches (counted with a TorchDispatchMode: ATen and sol_ext ops, each one a
kernel launch or more on a GPU, or none for a metadata-only op).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sol_ext


class CountOps(TorchDispatchMode):
    """Records the name of every operation dispatched below autograd."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def make_step(B: int, n: int, d: int, check_values: bool):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(B, d, generator=gen).requires_grad_()
    mu = torch.randn(n, d, generator=gen).requires_grad_()
    labels = torch.randint(0, n, (B,), generator=gen)
    criterion = sol_ext.StochasticOrderLoss(n, backend="fused", check_values=check_values)
    return lambda: torch.autograd.grad(criterion(h, labels, mu), (h, mu))


def measure(B: int, n: int, d: int, check_values: bool, steps: int, repeats: int) -> dict:
    step = make_step(B, n, d, check_values)
    for _ in range(max(steps // 10, 10)):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps)
    with CountOps() as counted:
        step()
    return dict(check_values=check_values, us_per_step=sorted(times)[len(times) // 2] * 1e6,
                us_fastest=min(times) * 1e6, dispatched=len(counted.ops), ops=counted.ops)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4,3,8", help="B,n,d (default 4,3,8)")
    parser.add_argument("--steps", type=int, default=2000, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs; the median is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    B, n, d = (int(v) for v in args.size.split(","))
    torch.set_num_threads(args.threads)
    rows = [measure(B, n, d, check, args.steps, args.repeats) for check in (False, True)]
    print(f"StochasticOrderLoss forward + backward, B={B} n={n} d={d}, CPU, {args.threads} thread(s), "
          f"torch {torch.__version__}\n")
    print("| check_values | µs per step (median) | µs per step (fastest run) | operations dispatched per step |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['check_values']} | {r['us_per_step']:.0f} | {r['us_fastest']:.0f} | {r['dispatched']} |")
    for r in rows:
        print(f"\ncheck_values={r['check_values']}: {', '.join(r['ops'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(B=B, n=n, d=d, threads=args.threads, torch=torch.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
