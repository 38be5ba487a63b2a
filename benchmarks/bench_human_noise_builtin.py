"""What the settings tried on real human label noise do on the driver's built-in data sets.

    python benchmarks/bench_human_noise_builtin.py       # abalone, wine-red; kappa 0.3, 1; 5 seeds (17 min on 2 cores)
    python benchmarks/bench_human_noise_builtin.py --variant disc0.3=disc_weight=0.3 --seeds 0

A setting that helps on the VADER ratings (``bench_human_noise.py``) becomes a default only if it
does not hurt the data sets ``sol-ext train`` and ``sol-ext compare`` run by default. Per data set,
Gaussian noise level kappa and seed, this trains sol with its defaults and with each ``--variant``
(the same split and noisy labels, through :func:`sol_ext.driver.train.train`), and reads every
model's test rows out twice: the posterior median and the ``cuts`` read-out (the expected rank
against the run's cuts, fitted to its training split's labels; the driver's default since; before,
this benchmark fitted them after training to every training row). Writes ``builtin.json`` (every run) and ``builtin.md`` (mean ±
std over seeds of test MAE and macro-MAE, in label units) to ``--output``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sol_ext.centroids import embed
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.model import load_run
from sol_ext.driver.prepare import prepare_data
from sol_ext.driver.train import train

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when loaded by path
from bench_human_noise import ROOT, mean_std, parse_variant  # noqa: E402

DATA = ("abalone", "wine-red")
KAPPAS = (0.3, 1.0)


def mae_and_macro(pred: np.ndarray, true: np.ndarray, step: float) -> tuple[float, float]:
    """MAE and macro-MAE (the mean over the true ranks of each rank's MAE) of ranks ``[N]``, in label
    units (``step`` label units per rank)."""
    errors = np.abs(pred - true) * step
    return float(errors.mean()), float(np.mean([errors[true == r].mean() for r in np.unique(true)]))


def readouts(run_dir: Path, test_x: torch.Tensor, test_ranks: np.ndarray, step: float) -> dict[str, dict[str, float]]:
    """Test MAE and macro-MAE of the posterior-median and ``cuts`` read-outs of a SOL run (its own
    cuts, fitted to its training split's labels); ``test_x``: the run's scaled inputs."""
    model = load_run(run_dir)
    with torch.no_grad():
        h_test = embed(model.model, test_x)
    preds = {name: model.head.predict(h_test, readout=name).numpy() for name in ("posterior", "cuts")}
    return {name: dict(zip(("mae", "macro_mae"), mae_and_macro(p, test_ranks, step))) for name, p in preds.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=",".join(DATA))
    p.add_argument("--kappas", default=",".join(f"{k:g}" for k in KAPPAS))
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                   help="a variant of sol, row 'sol+NAME' (repeatable; default: disc0.1=disc_weight=0.1)")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "human_noise")
    args = p.parse_args(argv)
    try:
        variants = dict(parse_variant(v) for v in args.variant or ["disc0.1=disc_weight=0.1"])
        kappas = [float(k) for k in args.kappas.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(1)
    rows = {"sol": {}, **variants}
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="human-noise-builtin-") as work:
        for data in args.data.split(","):
            for kappa in kappas:
                for seed in seeds:
                    base = TrainConfig(data=data, noise="gaussian", kappa=kappa, seed=seed,
                                       epochs=args.epochs).validate()
                    prepared = prepare_data(base)
                    for row, options in rows.items():
                        run_dir = Path(work) / data / f"k{kappa:g}" / row / f"seed{seed}"
                        train(dataclasses.replace(base, **options).validate(), prepared, run_dir,
                              log=lambda _line: None)
                        record = {"data": data, "kappa": kappa, "seed": seed, "method": row, "options": options,
                                  **readouts(run_dir, prepared.test_x, prepared.test_ranks.numpy(),
                                             float(prepared.grid.step))}
                        records.append(record)
                        print(f"{data} kappa {kappa:g} seed {seed} {row}: MAE {record['posterior']['mae']:.3f} "
                              f"(cuts {record['cuts']['mae']:.3f})", flush=True)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "builtin.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = ["| data | kappa | method | MAE | MAE, cuts | macro-MAE | macro-MAE, cuts |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for data in args.data.split(","):
        for kappa in kappas:
            for row in rows:
                runs = [r for r in records if r["data"] == data and r["kappa"] == kappa and r["method"] == row]
                cells = ["{:.3f} ± {:.3f}".format(*mean_std([r[readout][metric] for r in runs]))
                         for metric in ("mae", "macro_mae") for readout in ("posterior", "cuts")]
                lines.append(f"| {data} | {kappa:g} | {row} | " + " | ".join(cells) + " |")
    md = ("\n".join(lines) + f"\n\n{len(records)} runs, {len(seeds)} seeds, "
          f"{(time.perf_counter() - start) / 60:.1f} min.\n")
    (args.output / "builtin.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
