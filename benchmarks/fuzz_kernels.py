"""Differential fuzzing of the fused kernels against the CPU kernels and a float64 oracle.

    python benchmarks/fuzz_kernels.py --device cuda --configs 10000 --json fuzz.json
    python benchmarks/fuzz_kernels.py --device cpu --configs 500          # the CPU kernels alone
    python benchmarks/fuzz_kernels.py --first 5000 --configs 5000 --json b.json   # configurations 5000-9999
    python benchmarks/fuzz_kernels.py --merge a.json b.json --json all.json        # one table of several runs
    python benchmarks/fuzz_kernels.py --only 1079,9878 --explain                    # trace two configurations

Configuration i is the same in every run of one seed, so a range split over processes (``--first``) and
merged (``--merge``) is the same fuzz as one run over the whole range.

Each configuration draws B (0, 1 and 2 included), n, d, sigma, tau, margin, T, disc_weight, the
convention, the dtype (float32, float64, float16, bfloat16), all pairs or explicit ones (repeats and
self-pairs included), and D on a coarse grid in some of them, so that hinge arguments land exactly on
their kinks (ties). Two checks run per configuration, each on the loss and every gradient:

- ``order_loss`` on a given ``D``: the fused op on ``--device``, the CPU kernel (when the device is
  not the CPU) and the oracle. The kernels share the hinge decisions by construction, so each element
  is compared against a rounding bound.
- ``StochasticOrderLoss`` end to end (fused, pairwise): loss, ``dL/dh`` and ``dL/dmu`` against the oracle
  evaluated on the ``D`` the device computed (its hinge decisions; values and sums in float64).

The oracle follows docs/math.md §3-§7 directly and independently of the kernels: the probability
table of :func:`sol_ext.reference.ordering_probability_table` (float64), the hinge arguments rounded
to ``D``'s dtype once as PyTorch rounds the reference's expressions (the rounding every backend
shares, csrc/sol_math.h ``HingeArgs``), and every sum in float64. Each element's error is divided by a bound: (number of summed terms + 8) units of the
accumulation type's epsilon and two of the input dtype's (intermediates kept in it) times the sum of
the terms' magnitudes, plus one rounding of the result to its dtype. A ratio above 1 is a mismatch. The script prints the count, the mismatches and the worst
ratio per check, and exits with status 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Optional

import torch

import sol_ext
from sol_ext import reference

ops = torch.ops.sol_ext
DTYPES = [torch.float32] * 5 + [torch.float64] * 2 + [torch.float16, torch.bfloat16] * 2 + [torch.float64]
CPU_DTYPES = (torch.float32, torch.float64)  # the CPU kernels' dtypes; float16/bfloat16 are CUDA only
CONVENTIONS = ("paper", "official")


# -------------------------------------------------------------------------------------------------
# Configurations
# -------------------------------------------------------------------------------------------------


def log_uniform_int(gen: torch.Generator, low: int, high: int) -> int:
    u = torch.rand((), generator=gen, dtype=torch.float64).item()
    return int(math.exp(math.log(low) + u * (math.log(high + 1) - math.log(low))))


def draw_config(index: int, seed: int, device: str = "cuda") -> dict:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)

    def pick(choices):
        return choices[int(torch.randint(len(choices), (), generator=gen))]

    def uniform(low, high):
        return low + (high - low) * torch.rand((), generator=gen, dtype=torch.float64).item()

    big = uniform(0, 1) < 0.03  # the kernels' tiling edges: two rows per warp, y segments, rank groups
    B = pick([0, 1, 2, 3]) if uniform(0, 1) < 0.1 else log_uniform_int(gen, 2, 1100 if big else 96)
    n = log_uniform_int(gen, 1, 600 if big else 80)
    n = max(1, min(n, 50_000_000 // max(B * B // 2, 1)))  # the oracle's [M, n] float64 tensors stay < 400 MB
    dtype = pick(DTYPES)
    if device == "cpu" and dtype not in CPU_DTYPES:
        dtype = torch.float32
    return dict(
        index=index,
        B=B,
        n=n,
        d=log_uniform_int(gen, 1, 48),
        dtype=dtype,
        sigma=math.exp(uniform(math.log(0.05), math.log(20.0))),
        tau=pick([0, 1, 2, 3, 5, n - 1, n + 2]),
        margin=0.0 if uniform(0, 1) < 0.1 else pick([0.25, 0.5, 1.0, round(uniform(0, 2), 3)]),
        T=pick([1, 1, 2, 3, n + 3]),
        disc_weight=pick([0.0, 0.5, 1.0, 2.0]),
        convention=pick(CONVENTIONS),
        reduction=pick(["mean", "sum"]),
        explicit=uniform(0, 1) < 0.3,
        num_pairs=log_uniform_int(gen, 1, 4 * B + 4),
        ties=uniform(0, 1) < 0.25,
        check_values=uniform(0, 1) < 0.5,
        data_seed=int(torch.randint(2**31 - 1, (), generator=gen)),
    )


def make_data(cfg: dict, device: str):
    """h [B, d], mu [n, d], labels [B], pairs (None or [M, 2]), D [B, n] (for the order-loss check)."""
    gen = torch.Generator().manual_seed(cfg["data_seed"])
    B, n, d, dtype = cfg["B"], cfg["n"], cfg["d"], cfg["dtype"]
    h = torch.randn(B, d, generator=gen, dtype=torch.float64)
    mu = torch.randn(n, d, generator=gen, dtype=torch.float64) * 0.7 + 0.3
    labels = torch.randint(n, (B,), generator=gen)
    pairs = None
    if cfg["explicit"] and B > 0:
        pairs = torch.randint(B, (cfg["num_pairs"], 2), generator=gen)
    if dtype in (torch.float16, torch.bfloat16):  # D of order 1: per-pair sums stay inside float16's range
        h, mu = h / (2 * d**0.5), mu / (2 * d**0.5)
    if cfg["ties"]:
        # multiples of 1/4 up to 8: exact in every dtype, and delta +- margin hits 0 exactly when the
        # margin is a multiple of 1/4 too
        D = torch.randint(0, 33, (B, n), generator=gen).double() / 4
    else:
        D = reference.stochastic_dissimilarity(h, mu, cfg["sigma"])
    return (h.to(device, dtype), mu.to(device, dtype), labels.to(device),
            None if pairs is None else pairs.to(device), D.to(device, dtype))


# -------------------------------------------------------------------------------------------------
# The float64 oracle (docs/math.md §3-§7)
# -------------------------------------------------------------------------------------------------


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def oracle_order(D, labels, pairs, sigma, tau, margin, convention):
    """Per-pair losses [M] (float64), their magnitudes, and a function grad_losses [M] -> (grad_D, its
    magnitudes): the sums of the magnitudes of the terms, which scale the rounding bounds.

    ``D`` comes in the dtype the kernels saw: the hinge decisions depend on it. A delta that rounds to
    exactly +-margin in float16 is a kink there (derivative 0) but not in float64."""
    B, n = D.shape
    if pairs is None:
        pairs = reference.all_pairs(B, device=D.device)
    x, y = pairs[:, 0], pairs[:, 1]
    table = reference.ordering_probability_table(n, sigma, tau, convention, device=D.device)
    probs = table[labels[x], labels[y]]  # [M, 3]: lt, eq, gt
    lt, eq, gt = probs[:, 0:1], probs[:, 1:2], probs[:, 2:3]
    # the hinge arguments: delta in D's dtype, each argument computed in the accumulation type and
    # rounded once to D's dtype, as PyTorch rounds the reference's expressions (sol_math.h, HingeArgs)
    delta = D[x] - D[y]
    acc = acc_dtype(D.dtype)
    d = delta.to(acc)
    gamma = torch.tensor(margin, dtype=acc, device=D.device)
    above = (d + gamma).to(D.dtype).double()
    below = (gamma - d).to(D.dtype).double()
    apart = (d.abs() - gamma).to(D.dtype).double()
    q = torch.arange(n, device=D.device)[None, :]
    r_x, r_y = labels[x][:, None], labels[y][:, None]
    shift = 1 if convention == "official" else 0
    w_above = lt * (q <= r_x - shift) + gt * (q >= r_x)
    w_below = lt * (q >= r_y) + gt * (q <= r_y - shift)
    hinges = (above.clamp_min(0), below.clamp_min(0), apart.clamp_min(0))
    losses = (w_above * hinges[0] + w_below * hinges[1] + eq * hinges[2]).sum(1)
    # d loss / d delta (0 at the kinks)
    sign = torch.where(delta > 0, 1.0, -1.0).double()
    active = (above > 0, below > 0, apart > 0)
    slope = w_above * active[0] - w_below * active[1] + eq * active[2] * sign
    # The kernels' probabilities are accurate to a unit of their dtype's epsilon, not relative to tiny
    # entries (1e-26 at sigma 0.2): each hinge also counts once at weight 1 in the magnitudes.
    magnitude = losses + sum(hinges).sum(1)
    slope_magnitude = slope.abs() + sum(a.double() for a in active)

    def backward(grad_losses):
        g = grad_losses.double()[:, None]
        contribution, contribution_magnitude = g * slope, g.abs() * slope_magnitude
        grad_D = torch.zeros(B, n, dtype=torch.float64, device=D.device)
        grad_magnitude = torch.zeros_like(grad_D)
        grad_D.index_add_(0, x, contribution).index_add_(0, y, -contribution)
        grad_magnitude.index_add_(0, x, contribution_magnitude).index_add_(0, y, contribution_magnitude)
        return grad_D, grad_magnitude

    return losses, magnitude, backward


def disc_coefficients(labels, n, T):
    """[B, n] float64: l_disc[x] = sum_k coef[x, k] D[x, k] (docs/math.md §4), written per offset t."""
    B = labels.shape[0]
    coef = torch.zeros(B, n, dtype=torch.float64, device=labels.device)
    rows = torch.arange(B, device=labels.device)
    for t in range(1, min(T, n - 1) + 1):
        lo, hi = labels - t, labels + t
        lo_in, hi_in = lo >= 0, hi <= n - 1
        coef[rows, labels] += torch.where(lo_in | hi_in, 2.0, 4.0).double()
        coef[rows, lo.clamp(min=0)] -= torch.where(lo_in, torch.where(hi_in, 1.0, 2.0), 2.0 * ~hi_in).double()
        coef[rows, hi.clamp(max=n - 1)] -= torch.where(hi_in, torch.where(lo_in, 1.0, 2.0), 2.0 * ~lo_in).double()
    if T > n - 1:
        extra = float(T - max(n - 1, 0))
        coef[rows, labels] += 4.0 * extra
        coef[:, 0] -= 2.0 * extra
        coef[:, n - 1] -= 2.0 * extra
    return coef


def reduction_scale(count: int, reduction: str) -> float:
    return 1.0 / max(count, 1) if reduction == "mean" else 1.0


# -------------------------------------------------------------------------------------------------
# Comparison
# -------------------------------------------------------------------------------------------------


class Tally:
    """Worst error-to-bound ratio and mismatch count per check; with ``explain``, each comparison's worst
    element printed (value, exact value, magnitude of its terms, bound)."""

    def __init__(self, explain: bool = False):
        self.checks = {}
        self.explain = explain

    def compare(self, check: str, cfg: dict, actual, exact, magnitude, terms: int, out_dtype) -> None:
        entry = self.checks.setdefault(check, dict(compared=0, mismatches=0, worst_ratio=0.0, worst=None))
        entry["compared"] += 1
        if exact.numel() == 0:
            if actual.numel() != 0:
                self._mismatch(check, entry, cfg, math.inf, "non-empty result where none was expected")
            return
        actual = actual.detach().double().to(exact.device)
        acc = acc_dtype(cfg["dtype"])
        # sums in the accumulation type; two roundings of intermediates to the input dtype (per-pair
        # losses, dL/dD: float16/bfloat16 keep them in that dtype); one of the result
        bound = (((terms + 8) * torch.finfo(acc).eps + 2 * torch.finfo(cfg["dtype"]).eps) * magnitude.double()
                 + torch.finfo(out_dtype).eps * exact.abs() + torch.finfo(out_dtype).tiny)
        error = (actual - exact).abs()
        error = torch.where(torch.isnan(error), math.inf, error)
        # an exact value beyond the output dtype's range rounds to an infinity, which is then the right result
        rounded = exact.to(out_dtype).double()
        error = torch.where(torch.isinf(rounded) & (actual == rounded), 0.0, error)
        ratio = (error / bound).max().item()
        if self.explain:
            worst = int((error / bound).reshape(-1).argmax())
            print(f"config {cfg['index']} {check}: worst element {worst} of {exact.numel()}: got "
                  f"{actual.reshape(-1)[worst].item():.17g}, exact {exact.reshape(-1)[worst].item():.17g}, "
                  f"terms' magnitude {magnitude.double().expand_as(exact).reshape(-1)[worst].item():.6g}, bound "
                  f"{bound.reshape(-1)[worst].item():.3g}, error / bound {ratio:.3g}; largest |exact| "
                  f"{exact.abs().max().item():.6g}")
        if ratio > entry["worst_ratio"]:
            entry["worst_ratio"] = ratio
            entry["worst"] = dict(config=describe(cfg), abs_error=error.max().item(),
                                  scale=exact.abs().max().item())
        if ratio > 1:
            self._mismatch(check, entry, cfg, ratio, f"max error {error.max().item():.3e}")

    @staticmethod
    def _mismatch(check, entry, cfg, ratio, what):
        entry["mismatches"] += 1
        entry.setdefault("mismatched_configs", []).append(cfg["index"])  # for --only
        if entry["mismatches"] <= 5:
            print(f"MISMATCH {check}: error/bound {ratio:.3g}, {what}: {describe(cfg)}", file=sys.stderr)


def describe(cfg: dict) -> dict:
    return {k: (str(v).replace("torch.", "") if k == "dtype" else v) for k, v in cfg.items()}


# -------------------------------------------------------------------------------------------------
# The two checks
# -------------------------------------------------------------------------------------------------


def check_order_op(cfg: dict, device: str, tally: Tally) -> None:
    """order_loss and its backward on one D: device kernel, CPU kernel and oracle."""
    h, mu, labels, pairs, D = make_data(cfg, device)
    args = (cfg["sigma"], cfg["tau"], cfg["margin"], cfg["convention"])
    losses = ops.order_loss(D, labels, pairs, *args)
    gen = torch.Generator().manual_seed(cfg["data_seed"] + 1)
    grad_losses = torch.randn(losses.shape[0], generator=gen, dtype=torch.float64).to(device, D.dtype)
    grad_D = ops._order_loss_backward(grad_losses, D, labels, pairs, *args)
    exact, exact_magnitude, backward = oracle_order(D, labels, pairs, *args)
    exact_grad, magnitude = backward(grad_losses)
    n = cfg["n"]
    terms = cfg["num_pairs"] if pairs is not None else cfg["B"]
    tally.compare("order_loss forward vs oracle", cfg, losses, exact, exact_magnitude, n, D.dtype)
    tally.compare("order_loss backward vs oracle", cfg, grad_D, exact_grad, magnitude, terms, D.dtype)
    if device != "cpu" and D.dtype in CPU_DTYPES:
        cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
        cpu_losses = ops.order_loss(D.cpu(), labels.cpu(), cpu(pairs), *args)
        cpu_grad = ops._order_loss_backward(grad_losses.cpu(), D.cpu(), labels.cpu(), cpu(pairs), *args)
        tally.compare("order_loss forward vs CPU kernel", cfg, losses, cpu_losses.double().to(device), exact_magnitude, n,
                      D.dtype)
        tally.compare("order_loss backward vs CPU kernel", cfg, grad_D, cpu_grad.double().to(device), magnitude,
                      terms, D.dtype)


def check_loss_end_to_end(cfg: dict, device: str, tally: Tally) -> None:
    """StochasticOrderLoss (fused, pairwise): loss, dL/dh, dL/dmu against the oracle on the device's D."""
    h, mu, labels, pairs, _ = make_data(cfg, device)
    h.requires_grad_(True)
    mu.requires_grad_(True)
    n, reduction = cfg["n"], cfg["reduction"]
    criterion = sol_ext.StochasticOrderLoss(
        n, sigma=cfg["sigma"], tau=cfg["tau"], margin=cfg["margin"], T=cfg["T"], disc_weight=cfg["disc_weight"],
        convention=cfg["convention"], reduction=reduction, backend="fused", check_values=cfg["check_values"],
        algorithm="pairwise",
    )
    loss = criterion(h, labels, mu, pairs)
    grad_h, grad_mu = torch.autograd.grad(loss, (h, mu))

    # The oracle on the device's D (so both share the hinge decisions): the loss is a function of D,
    # checked here; D itself is checked against the float64 dissimilarity.
    D_kernel = ops.stochastic_dissimilarity(h.detach(), mu.detach(), cfg["sigma"])
    D = D_kernel.double()
    h64, mu64 = h.detach().double(), mu.detach().double()
    P = reference.noise_kernel(n, cfg["sigma"], device=D.device)
    # D is computed about the centroids' center (midrange per dimension, docs/math.md §3), so its
    # rounding scales with the centered norms: |h - c|^2 + |mu - c|^2 + 2 |(h - c).(mu - c)| at most
    center = (mu64.amin(0) + mu64.amax(0)) / 2 if n else 0.0
    h_centered, mu_centered = h64 - center, mu64 - center
    norms = (h_centered.norm(dim=1)[:, None] + mu_centered.norm(dim=1)[None, :]) ** 2
    tally.compare("stochastic_dissimilarity vs oracle", cfg, D, reference.stochastic_dissimilarity(h64, mu64,
                  cfg["sigma"]), norms @ P.T, cfg["d"] + n, h.dtype)
    order, order_magnitude, backward = oracle_order(D_kernel, labels, pairs, cfg["sigma"], cfg["tau"], cfg["margin"],
                                                    cfg["convention"])
    coef = disc_coefficients(labels, n, cfg["T"])
    order_scale, disc_scale = reduction_scale(order.shape[0], reduction), reduction_scale(cfg["B"], reduction)
    disc_weight = cfg["disc_weight"] * disc_scale
    exact_loss = order.sum() * order_scale + disc_weight * (coef * D).sum()
    loss_magnitude = order_magnitude.sum() * order_scale + disc_weight * (coef * D).abs().sum()
    tally.compare("StochasticOrderLoss loss vs oracle", cfg, loss, exact_loss.reshape(()), loss_magnitude.reshape(()),
                  n + max(order.shape[0], 1) + cfg["B"], loss.dtype)

    grad_order, grad_order_magnitude = backward(torch.full((order.shape[0],), order_scale, dtype=torch.float64,
                                                      device=D.device))
    grad_D = grad_order + disc_weight * coef
    G_magnitude = grad_order_magnitude + disc_weight * coef.abs()
    exact_h, exact_mu = dissimilarity_grads(h64, mu64, P, grad_D)
    # about the center, as the kernels compute them, and about the origin, as the oracle does
    mag_h, mag_mu = dissimilarity_grads(h_centered.abs() + h64.abs(), mu_centered.abs() + mu64.abs(), P, G_magnitude,
                                        magnitude=True)
    terms = (cfg["num_pairs"] if pairs is not None else cfg["B"]) + n + cfg["d"]
    tally.compare("StochasticOrderLoss dL/dh vs oracle", cfg, grad_h, exact_h, mag_h, terms, h.dtype)
    tally.compare("StochasticOrderLoss dL/dmu vs oracle", cfg, grad_mu, exact_mu, mag_mu, terms + cfg["B"], mu.dtype)


def dissimilarity_grads(h, mu, P, G, magnitude: bool = False):
    """dL/dh, dL/dmu of D[x,q] = sum_j P[q,j] ||h_x - mu_j||^2 for dL/dD = G (docs/math.md §3):
    dh_x = 2 sum_j W[x,j] (h_x - mu_j), dmu_j = 2 sum_x W[x,j] (mu_j - h_x), W = G P.
    With magnitude=True (h, mu, G given as magnitudes): a bound on the sums of the terms' magnitudes."""
    W = G @ P
    if magnitude:
        return 2 * (W.sum(1, keepdim=True) * h + W @ mu), 2 * (W.sum(0)[:, None] * mu + W.T @ h)
    return 2 * (W.sum(1, keepdim=True) * h - W @ mu), 2 * (W.sum(0)[:, None] * mu - W.T @ h)


# -------------------------------------------------------------------------------------------------


def run(device: str, configs: int, seed: int, log_every: int = 0, first: int = 0,
        only: Optional[list[int]] = None, explain: bool = False) -> dict:
    """Configurations ``first .. first + configs - 1`` (or the indices ``only``) of ``seed``."""
    tally = Tally(explain)
    start = time.perf_counter()
    counts = {"B == 0": 0, "B == 1": 0, "explicit pairs": 0, "ties": 0}
    dtypes: dict = {}
    indices = list(only) if only is not None else range(first, first + configs)
    for index in indices:
        cfg = draw_config(index, seed, device)
        counts["B == 0"] += cfg["B"] == 0
        counts["B == 1"] += cfg["B"] == 1
        counts["explicit pairs"] += cfg["explicit"] and cfg["B"] > 0
        counts["ties"] += cfg["ties"]
        name = str(cfg["dtype"]).replace("torch.", "")
        dtypes[name] = dtypes.get(name, 0) + 1
        check_order_op(cfg, device, tally)
        check_loss_end_to_end(cfg, device, tally)
        if log_every and (index + 1 - first) % log_every == 0:
            print(f"{index + 1 - first} configurations, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return dict(device=device if device == "cpu" else torch.cuda.get_device_name(), configs=len(indices), seed=seed,
                first=first, seconds=round(time.perf_counter() - start, 1), coverage=dict(counts, dtypes=dtypes),
                checks=tally.checks, mismatches=sum(c["mismatches"] for c in tally.checks.values()))


def merge(results: list[dict]) -> dict:
    """One result from runs over disjoint ranges of configurations (of one seed): counts added, the worst
    ratio of each check kept, seconds the longest run's (the runs ran side by side)."""
    checks: dict = {}
    coverage: dict = {"dtypes": {}}
    for result in results:
        for name, entry in result["checks"].items():
            total = checks.setdefault(name, dict(compared=0, mismatches=0, worst_ratio=0.0, worst=None))
            total["compared"] += entry["compared"]
            total["mismatches"] += entry["mismatches"]
            if entry.get("mismatched_configs"):
                total.setdefault("mismatched_configs", []).extend(entry["mismatched_configs"])
            if entry["worst_ratio"] >= total["worst_ratio"]:
                total["worst_ratio"], total["worst"] = entry["worst_ratio"], entry["worst"]
        for key, value in result["coverage"].items():
            if key == "dtypes":
                for dtype, count in value.items():
                    coverage["dtypes"][dtype] = coverage["dtypes"].get(dtype, 0) + count
            else:
                coverage[key] = coverage.get(key, 0) + value
    ranges = sorted((r["first"], r["first"] + r["configs"]) for r in results)
    return dict(device=results[0]["device"], configs=sum(r["configs"] for r in results), seed=results[0]["seed"],
                first=ranges[0][0], ranges=ranges, seconds=max(r["seconds"] for r in results), coverage=coverage,
                checks=checks, mismatches=sum(c["mismatches"] for c in checks.values()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--configs", type=int, default=10_000, help="random configurations (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first configuration (default 0)")
    parser.add_argument("--json", help="write the counts, worst ratios and mismatches here")
    parser.add_argument("--only", help="comma-separated configuration indices to run instead of a range")
    parser.add_argument("--explain", action="store_true", help="print each comparison's worst element")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="print (and with --json write) one result "
                        "merged from the --json files of runs over disjoint ranges, instead of fuzzing")
    args = parser.parse_args(argv)
    if args.configs < 1:
        parser.error(f"--configs must be a positive integer, got {args.configs}")
    if args.first < 0:
        parser.error(f"--first must be a non-negative integer, got {args.first}")
    if args.merge:
        results = []
        for path in args.merge:
            with open(path) as f:
                results.append(json.load(f))
        result = merge(results)
    else:
        if args.device == "cuda" and not (torch.cuda.is_available() and sol_ext.cuda_kernels_available()):
            parser.error("--device cuda needs a CUDA GPU and a build of sol_ext with CUDA kernels")
        only = None
        if args.only:
            try:
                only = [int(i) for i in args.only.split(",")]
            except ValueError:
                parser.error(f"--only must be comma-separated non-negative integers, got {args.only!r}")
            if min(only) < 0:
                parser.error(f"--only must be comma-separated non-negative integers, got {args.only!r}")
        result = run(args.device, args.configs, args.seed, log_every=0 if only else max(args.configs // 10, 1),
                     first=args.first, only=only, explain=args.explain)
    print(f"\nfuzz: {result['configs']} configurations on {result['device']} in {result['seconds']} s "
          f"(seed {result['seed']}, from {result['first']}); coverage {result['coverage']}")
    print("\n| check | compared | mismatches | worst error / bound |")
    print("| --- | --- | --- | --- |")
    for name, entry in result["checks"].items():
        print(f"| {name} | {entry['compared']} | {entry['mismatches']} | {entry['worst_ratio']:.3g} |")
    print(f"\nmismatches: {result['mismatches']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
