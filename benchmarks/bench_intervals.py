"""Rank intervals under noisy labels: coverage and width of sol_ext.intervals against class sets.

    python benchmarks/bench_intervals.py                 # 5 seeds, every cell below (tens of minutes)
    python benchmarks/bench_intervals.py --smoke         # one seed, abalone Gaussian, 2 epochs: seconds

Each cell is a data set with known clean ranks and labels made noisy. Per seed, its rows are split 60 / 20
/ 20 into training, calibration and test rows; ``SOLRanker`` (the driver's defaults) trains on the noisy
training labels, and its probabilities on the calibration rows, with their noisy labels, calibrate:

- ``sol_ext.intervals`` with each score (``hpd``, ``cumulative``, ``absolute``), target ``labels``;
- the same scores with target ``clean``, told the labels' noise exactly (the likelihood matrix of the
  injected noise, rounded and clipped as the noise is), with the default fitted deconvolution and with
  ``deconvolve=False``; and told SOL's own sigma (the std of its noise model, which the ranker picks for
  accuracy) as the noise's std;
- class sets made contiguous, as split conformal classification libraries build them from the same
  probabilities: LAC (MAPIE's ``"lac"``, crepes' default hinge score: every rank with ``p >= 1 - q``) and
  APS (MAPIE's ``"aps"``: the most probable ranks until their mass reaches the threshold, not randomized),
  each closed to ``[min, max]`` of its set.

On the test rows each method reports the coverage of the noisy label, the coverage of the clean rank and
the mean width (ranks), at 80 % and 90 %. Cells: abalone, wine-red and Fashion-MNIST blur levels (its
pixels as features) with Gaussian and Laplacian noise, abalone and wine-red with rank-dependent noise (a
Gaussian whose std doubles around rank 0.39 (n - 1): ``input-dependent``), all at kappa 0.3 (``--kappa``);
and VADER (``../shared/data/vader_dev.npz`` when present: one rater's label for training and calibration,
the rounded mean of all the sentence's raters, that one among them, as the clean rank). VADER's noise is no
model's: its clean target is told a Gaussian whose std is estimated from a twice-labelled subset (300
calibration sentences, two of each one's ratings, :func:`sol_ext.intervals.noise_std_from_pairs`).
Results go to ``benchmarks/results/intervals/intervals.json`` (with each seed's model under ``models``)
and a markdown table beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from sol_ext.driver.data import load_dataset
from sol_ext.driver.sklearn import SOLRanker
from sol_ext.driver.synthetic_noise import (
    add_label_noise,
    default_peak_width,
    input_dependent_scale,
    noise_scale,
)
from sol_ext.intervals import (
    SCORES,
    calibrate_intervals,
    fitted_deconvolution,
    noise_std_from_pairs,
    rank_intervals,
)

RESULTS = Path(__file__).resolve().parent / "results" / "intervals"
VADER = Path(__file__).resolve().parents[2] / "shared" / "data" / "vader_dev.npz"
COVERAGES = (0.8, 0.9)
CELLS = (("abalone", "gaussian"), ("abalone", "laplacian"), ("wine-red", "gaussian"), ("wine-red", "laplacian"),
         ("fashion-mnist-blur", "gaussian"), ("fashion-mnist-blur", "laplacian"), ("abalone", "input-dependent"),
         ("wine-red", "input-dependent"), ("vader", "raters"))
KAPPA = 0.3  # the noise ratio of the paper's main tables (it reports 0.2, 0.3, 0.4)
TWICE_LABELLED = 300  # VADER calibration sentences whose two ratings estimate the noise's std


# --------------------------------------------------------------------------------------------------
# Baselines: class sets from the same probabilities, closed to an interval


def class_set_intervals(p_cal: np.ndarray, y_cal: np.ndarray, p: np.ndarray, coverage: float, kind: str):
    """LAC or APS split conformal class sets at ``coverage``, each closed to ``[min, max]``."""
    m = len(y_cal)
    k = min(math.ceil((m + 1) * coverage), m) - 1
    if kind == "lac":
        q = np.sort(1 - p_cal[np.arange(m), y_cal])[k]
        inside = p >= 1 - q - 1e-12
    else:  # aps: mass of the ranks at least as probable as the label
        order_cal = np.argsort(-p_cal, axis=1, kind="stable")
        mass_cal = np.take_along_axis(p_cal, order_cal, 1).cumsum(1)
        position = np.argmax(order_cal == y_cal[:, None], axis=1)
        q = np.sort(mass_cal[np.arange(m), position])[k]
        order = np.argsort(-p, axis=1, kind="stable")
        mass = np.take_along_axis(p, order, 1).cumsum(1)
        keep = np.concatenate([np.ones((len(p), 1), bool), mass[:, :-1] < q - 1e-12], axis=1)
        inside = np.zeros_like(keep)
        np.put_along_axis(inside, order, keep, 1)
    inside[np.arange(len(p)), p.argmax(1)] = True  # never empty
    ranks = np.arange(p.shape[1])
    return np.where(inside, ranks, p.shape[1]).min(1), np.where(inside, ranks, -1).max(1)


# --------------------------------------------------------------------------------------------------
# Data and noise


def noise_likelihood(kind: str, scale, n: int) -> torch.Tensor:
    """``L [n, n]``: row ``c`` the distribution of ``clip(floor(c + e + 0.5), 0, n - 1)`` for the noise
    ``e`` that :func:`sol_ext.driver.synthetic_noise.add_label_noise` draws (Gaussian std ``scale``, Laplace
    scale ``scale``); ``scale`` is a number or ``[n]``, one per clean rank."""
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), (n,))[:, None]

    def cdf(x: np.ndarray) -> np.ndarray:
        if kind == "gaussian":
            return 0.5 * (1 + np.vectorize(math.erf)(x / (scale * math.sqrt(2))))
        return np.where(x < 0, 0.5 * np.exp(x / scale), 1 - 0.5 * np.exp(-x / scale))

    c = np.arange(n)[:, None].astype(np.float64)
    edges = np.arange(n + 1)[None, :] - 0.5  # label y collects e in [y - 0.5 - c, y + 0.5 - c)
    mass = np.diff(cdf(edges - c), axis=1)
    mass[:, 0] += cdf(edges[:, :1] - c)[:, 0]
    mass[:, -1] += 1 - cdf(edges[:, -1:] - c)[:, 0]
    return torch.from_numpy(mass / mass.sum(1, keepdims=True))


def cell_data(name: str, noise: str, seed: int, kappa: float = KAPPA):
    """Features, clean ranks, noisy ranks, the number of ranks and the noise's likelihood (None for VADER)."""
    if name == "vader":
        data = np.load(VADER)
        x = data["embeddings"].astype(np.float32)
        clean = np.clip(np.round(data["consensus"]), -4, 4).astype(np.int64) + 4
        return x, clean, data["one_rater"].astype(np.int64) + 4, 9, None
    ds = load_dataset(name)
    clean = ds.ranks.numpy()
    n = ds.num_ranks
    noisy = add_label_noise(clean, n, noise, kappa=kappa, seed=seed).noisy.numpy()
    s = noise_scale(clean, kappa)
    if noise == "input-dependent":
        likelihood = noise_likelihood("gaussian", input_dependent_scale(np.arange(n), s, *default_peak_width(n)), n)
    else:
        likelihood = noise_likelihood(noise, s, n)
    return ds.features.reshape(len(clean), -1).numpy(), clean, noisy, n, likelihood


def twice_labelled_noise_std(rows: np.ndarray, seed: int) -> float:
    """VADER: the std of one rater's noise (:func:`sol_ext.intervals.noise_std_from_pairs`), from
    ``TWICE_LABELLED`` of ``rows``, two ratings of each drawn at random among the sentence's (the
    training rater's possibly among them)."""
    ratings = np.load(VADER)["ratings"]
    rng = np.random.default_rng(seed)
    pairs = [rng.choice(ratings[row][ratings[row] != -99], size=2, replace=False)
             for row in rng.choice(rows, size=min(TWICE_LABELLED, len(rows)), replace=False)]
    first, second = np.asarray(pairs, dtype=np.float64).T
    return noise_std_from_pairs(first, second)


def probabilities_on_the_grid(ranker: SOLRanker, x: np.ndarray, n: int) -> np.ndarray:
    """``[N, n]`` probabilities of the ranks 0 … n-1 (the ranker's classes are the training labels' grid,
    which can be shorter than the cell's)."""
    p = ranker.predict_proba(x)
    out = np.zeros((len(x), n))
    out[:, ranker.classes_.astype(np.int64)] = p
    return out


# --------------------------------------------------------------------------------------------------
# One seed of one cell


def run_cell(name: str, noise: str, seed: int, epochs: int | None,
             kappa: float = KAPPA) -> tuple[list[dict], dict]:
    """The rows of one seed of one cell (a method, target and coverage each), and what the seed's model
    was: its accuracy on the clean rank of the test rows, the noise the clean target was told (VADER:
    the std estimated) and how many iterations its deconvolution took."""
    x, clean, noisy, n, likelihood = cell_data(name, noise, seed, kappa)
    order = np.random.default_rng(seed).permutation(len(x))
    train, cal, test = np.split(order, [int(0.6 * len(x)), int(0.8 * len(x))])
    ranker = SOLRanker(random_state=seed, **({"epochs": epochs} if epochs else {}))
    ranker.fit(x[train], noisy[train].astype(np.float64))
    p_cal, p_test = (probabilities_on_the_grid(ranker, x[rows], n) for rows in (cal, test))
    rows = []

    def record(method: str, target: str, coverage: float, lower, upper) -> None:
        lower, upper = np.asarray(lower), np.asarray(upper)
        rows.append({"cell": f"{name} {noise}", "seed": seed, "method": method, "target": target,
                     "coverage": coverage,
                     "noisy_coverage": float(np.mean((noisy[test] >= lower) & (noisy[test] <= upper))),
                     "clean_coverage": float(np.mean((clean[test] >= lower) & (clean[test] <= upper))),
                     "width": float(np.mean(upper - lower + 1))})

    pc, pt = torch.from_numpy(p_cal), torch.from_numpy(p_test)
    if likelihood is None:  # VADER: a Gaussian of the std a twice-labelled subset gives
        likelihood = twice_labelled_noise_std(cal, seed)
    model = {"cell": f"{name} {noise}", "seed": seed,
             "clean_accuracy": float(np.mean(p_test.argmax(axis=1) == clean[test])),
             "noise_std": likelihood if isinstance(likelihood, float) else None,
             "sol_sigma": ranker.history_["sigma_selected"],
             "deconvolution_iterations": fitted_deconvolution(pc, torch.from_numpy(noisy[cal]), likelihood)[1]}
    for score in SCORES:
        labels = calibrate_intervals(pc, torch.from_numpy(noisy[cal]), score=score)
        clean_cals = {
            target: calibrate_intervals(pc, torch.from_numpy(noisy[cal]), score=score, target="clean",
                                        label_noise=likelihood, deconvolve=deconvolve)
            for target, deconvolve in (("clean", True), ("clean, deconvolve=False", False))}
        # SOL's own sigma (the std of its noise model, picked for accuracy) told as the labels' noise
        clean_cals["clean, SOL's sigma"] = calibrate_intervals(
            pc, torch.from_numpy(noisy[cal]), score=score, target="clean",
            label_noise=ranker.history_["sigma_selected"])
        for coverage in COVERAGES:
            record(score, "labels", coverage, *(t.numpy() for t in rank_intervals(pt, labels, coverage)))
            for target, clean_cal in clean_cals.items():
                record(score, target, coverage, *(t.numpy() for t in rank_intervals(pt, clean_cal, coverage)))
    for kind in ("lac", "aps"):
        for coverage in COVERAGES:
            record(kind, "labels", coverage, *class_set_intervals(p_cal, noisy[cal], p_test, coverage, kind))
    return rows, model


def summary(rows: list[dict]) -> list[dict]:
    """Mean and std over seeds per (cell, method, target, coverage)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["cell"], r["method"], r["target"], r["coverage"]), []).append(r)
    out = []
    for (cell, method, target, coverage), rs in groups.items():
        entry = {"cell": cell, "method": method, "target": target, "coverage": coverage, "seeds": len(rs)}
        for key in ("noisy_coverage", "clean_coverage", "width"):
            values = [r[key] for r in rs]
            entry[key] = statistics.fmean(values)
            entry[key + "_std"] = statistics.pstdev(values) if len(values) > 1 else 0.0
        out.append(entry)
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| cell | method | target | requested | noisy-label coverage | clean-rank coverage | width (ranks) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in table:
        lines.append(f"| {e['cell']} | {e['method']} | {e['target']} | {e['coverage']:.0%} | "
                     f"{e['noisy_coverage']:.3f} ± {e['noisy_coverage_std']:.3f} | "
                     f"{e['clean_coverage']:.3f} ± {e['clean_coverage_std']:.3f} | "
                     f"{e['width']:.2f} ± {e['width_std']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cells", nargs="*", default=None, help="e.g. 'abalone gaussian' 'vader raters'")
    parser.add_argument("--epochs", type=int, default=None, help="SOLRanker's epochs (default: its own)")
    parser.add_argument("--kappa", type=float, default=KAPPA,
                        help="noise ratio: the injected noise's scale over the clean ranks' std (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="one seed of abalone Gaussian, 2 epochs")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cells = [tuple(c.split()) for c in args.cells] if args.cells else list(CELLS)
    if args.smoke:
        cells, args.seeds, args.epochs = [("abalone", "gaussian")], 1, 2
    cells = [c for c in cells if c[0] != "vader" or VADER.exists()]
    rows, models, start = [], [], time.perf_counter()
    for name, noise in cells:
        for seed in range(args.seeds):
            seed_rows, model = run_cell(name, noise, seed, args.epochs, args.kappa)
            rows += seed_rows
            models.append(model)
            print(f"{name} {noise} seed {seed}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    table = summary(rows)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "intervals.json").write_text(json.dumps({"cells": [" ".join(c) for c in cells],
                                                            "seeds": args.seeds, "kappa": args.kappa,
                                                            "summary": table, "models": models, "rows": rows},
                                                           indent=1) + "\n")
    text = markdown(table)
    (args.output / "intervals.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
