"""Label issues on out-of-sample SOL probabilities: sol_ext's scores and flags against cleanlab's.

    python benchmarks/bench_label_issues.py                  # abalone, wine-red x 4 noises x 3 seeds
    python benchmarks/bench_label_issues.py --quick          # one small cell, seconds (the suite's smoke test)
    python benchmarks/bench_label_issues.py --data abalone --noises gaussian1 --seeds 0 --folds 3,5
    python benchmarks/bench_label_issues.py --data vader         # real human noise (../shared/data/vader_dev.npz)
    python benchmarks/bench_label_issues.py --data fashion-mnist-blur --noises clean,gaussian0.3 --seeds 0

Per cell (data set, noise, seed) the data are prepared as ``sol-ext train`` does (built-in data sets:
clean labels known, the noise added to the training labels), and every training row's ``p(q | x)``
comes from :func:`sol_ext.driver.audit.cross_validated_probabilities`: SOL trained ``K`` times through
the driver, each time without one fold (sigma fixed, ``--epochs`` epochs: a short budget). On those
same probabilities, with "wrong" meaning ``given label != clean label`` (even by one rank):

- AUROC and average precision of the score for "wrong": ours ``1 - sol_ext.get_label_quality_scores``,
  cleanlab's ``1 - cleanlab.rank.get_label_quality_scores`` (its default, self-confidence);
- flagged share, precision, recall and F1 of the default flags: ``sol_ext.find_label_issues`` (the rule
  of ``sol-ext audit``) and ``cleanlab.filter.find_label_issues``, both with their defaults; and those
  of ours told the noise, the rule of ``sol-ext audit --label-noise STD``: ``noise_kernel=
  label_noise_kernel(n, std)`` on the probabilities sharpened through it (``sharpen_through_noise``),
  at the std of the added noise in ranks (``kappa`` times the clean ranks' std; times sqrt(2) for
  Laplacian noise, whose std that is).

``vader``: the VADER sentence-sentiment ratings (fixed MiniLM embeddings, scale -4 … 4; see
``../shared/data/README.md``), 80 % of the sentences per seed: ``one_rater`` trains on one person's
rating and counts it wrong where it differs from the rounded mean of all raters (real human noise);
``consensus`` trains on that rounded mean (the clean case).

Also the label-noise std that maximum likelihood reads from the probabilities (``fitted_noise_std``:
what any rule on them could learn of the noise), and the wall time of the ``K`` fold trainings over
that of one run of the same budget on all rows.
Writes ``label_issues[_TAG].json`` (every cell) and ``.md`` (means ± std over seeds) to ``--output``.
Needs cleanlab (``pip install cleanlab``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sol_ext.centroids import fit_label_noise, label_noise_kernel  # noqa: E402
from sol_ext.driver.audit import cross_validated_probabilities  # noqa: E402
from sol_ext.driver.config import TrainConfig  # noqa: E402
from sol_ext.driver.prepare import prepare_data  # noqa: E402
from sol_ext.driver.train import train  # noqa: E402
from sol_ext.label_issues import (  # noqa: E402
    find_label_issues,
    get_label_quality_scores,
    sharpen_through_noise,
)
from sol_ext.noise import noise_scale  # noqa: E402

DATASETS = ("abalone", "wine-red")
NOISES = {"clean": ("none", 0.0), "gaussian0.3": ("gaussian", 0.3), "gaussian1": ("gaussian", 1.0),
          "laplacian0.3": ("laplacian", 0.3)}
VADER_FILE = ROOT.parent / "shared" / "data" / "vader_dev.npz"
VADER_NOISES = ("consensus", "one_rater")
VADER_SCALE = (-4, 4)


def ranking_quality(wrong: np.ndarray, suspicion: np.ndarray) -> tuple[float, float]:
    """AUROC and average precision of ``suspicion`` [N] (higher = more suspect) for ``wrong`` [N] bool;
    NaN where every label is right or every one is wrong."""
    from sklearn.metrics import average_precision_score, roc_auc_score
    if wrong.all() or not wrong.any():
        return float("nan"), float("nan")
    return float(roc_auc_score(wrong, suspicion)), float(average_precision_score(wrong, suspicion))


def flag_quality(wrong: np.ndarray, flagged: np.ndarray) -> dict[str, float]:
    """Flagged share, precision, recall and F1 of boolean flags [N] for ``wrong`` [N] (0 where undefined)."""
    hits = int((flagged & wrong).sum())
    precision = hits / max(int(flagged.sum()), 1)
    recall = hits / max(int(wrong.sum()), 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {"flagged": float(flagged.mean()), "precision": precision, "recall": recall, "f1": f1}


def noise_std(noise: str, clean: np.ndarray) -> float | None:
    """The std in ranks of the noise a built-in cell adds to ``clean`` [N] (None: unknown, VADER's)."""
    if noise not in NOISES:
        return None
    kind, kappa = NOISES[noise]
    return noise_scale(clean, kappa) * (2.0 ** 0.5 if kind == "laplacian" else 1.0)


def fitted_noise_std(given: np.ndarray, probs: np.ndarray) -> float:
    """The label-noise std in ranks that maximum likelihood reads from the probabilities ``probs`` [N, n]
    (:func:`sol_ext.centroids.fit_label_noise`, temperature and std together), with ``-log p`` as the
    dissimilarity and the labels' frequencies divided out (the fit multiplies them back in)."""
    labels = torch.from_numpy(given).long()
    counts = torch.bincount(labels, minlength=probs.shape[1]).double() + 0.5  # the fit's smoothing
    d = -(torch.from_numpy(probs).clamp_min(1e-300).log() - torch.log(counts / counts.sum()))
    return float(fit_label_noise(d, labels, probs.shape[1]).std)


def judge(given: np.ndarray, clean: np.ndarray, probs: np.ndarray,
          std: float | None = None) -> dict[str, dict[str, float]]:
    """Both tools' scores and default flags on the same probabilities ``probs`` [N, n]; ours also told
    the noise std ``std`` in ranks (``"told"``), when it is known."""
    from cleanlab.filter import find_label_issues as cleanlab_find
    from cleanlab.rank import get_label_quality_scores as cleanlab_quality
    wrong = given != clean
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cleanlab warns about ranks with few rows
        for name, quality, flags in (
                ("sol_ext", get_label_quality_scores(given, probs), find_label_issues(given, probs)),
                ("cleanlab", cleanlab_quality(given, probs), cleanlab_find(given, probs))):
            auroc, ap = ranking_quality(wrong, 1.0 - quality)
            out[name] = {"auroc": auroc, "ap": ap, **flag_quality(wrong, np.asarray(flags, dtype=bool))}
    if std is not None:
        kernel = label_noise_kernel(probs.shape[1], std)
        told = find_label_issues(given, sharpen_through_noise(given, probs, kernel), noise_kernel=kernel)
        out["sol_ext"]["told"] = {"std": std, **flag_quality(wrong, told)}
    return out


def vader_data(noise: str, seed: int):
    """VADER's sentences as a run's data: 80 % of them (by ``seed``) as training rows labeled by one
    rater (``one_rater``) or the rounded consensus, the rest as the test rows; the rounded consensus
    as the clean labels."""
    from sol_ext.driver.data import OrdinalDataset, RankEncoder, apply_scaling
    from sol_ext.driver.prepare import PreparedData, preprocessing_record
    with np.load(VADER_FILE, allow_pickle=False) as npz:
        x = npz["embeddings"].astype(np.float32)
        consensus = np.round(npz["consensus"]).astype(np.int64)
        one = npz["one_rater"].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    train_rows, test_rows = order[: int(0.8 * len(x))], order[int(0.8 * len(x)):]
    grid = RankEncoder(min_value=VADER_SCALE[0], step=1.0, num_ranks=VADER_SCALE[1] - VADER_SCALE[0] + 1)
    given = one if noise == "one_rater" else consensus
    train_set = OrdinalDataset(torch.from_numpy(x[train_rows]), grid.encode(torch.from_numpy(
        given[train_rows].astype(np.float64))).long(), grid, "vader", "embeddings")
    preprocessing = preprocessing_record(train_set)
    scaling = (preprocessing["scaling"]["mean"], preprocessing["scaling"]["std"])

    def ranks(labels: np.ndarray) -> torch.Tensor:
        return grid.encode(torch.from_numpy(labels.astype(np.float64))).long()
    return PreparedData(name="vader", kind="embeddings", encoder=grid,
                        train_x=apply_scaling(train_set.features, scaling), train_given=train_set.ranks,
                        train_clean=ranks(consensus[train_rows]),
                        test_x=apply_scaling(torch.from_numpy(x[test_rows]), scaling),
                        test_ranks=ranks(consensus[test_rows]), train_rows=torch.from_numpy(train_rows),
                        preprocessing=preprocessing)


def run_cell(data_name: str, noise: str, seed: int, folds: int, epochs: int) -> dict:
    if data_name == "vader":
        config = TrainConfig(data=str(VADER_FILE), noise="none", seed=seed, sigma=1.0, epochs=epochs)
        data = vader_data(noise, seed)
    else:
        kind, kappa = NOISES[noise]
        config = TrainConfig(data=data_name, noise=kind, kappa=kappa, seed=seed, sigma=1.0, epochs=epochs)
        data = prepare_data(config)
    oos = cross_validated_probabilities(config, data, folds, log=lambda _line: None)
    started = time.perf_counter()  # after the folds, which have paid the first run's warm-up
    with tempfile.TemporaryDirectory(prefix="bench-label-issues-") as tmp:
        train(dataclasses.replace(config), data, Path(tmp), log=lambda _line: None)
    one_run = time.perf_counter() - started
    given, clean = data.train_given.numpy(), data.train_clean.numpy()
    return {"data": data_name, "noise": noise, "seed": seed, "folds": folds, "epochs": epochs,
            "rows": int(given.size), "wrong": float((given != clean).mean()),
            "seconds_one_run": one_run, "seconds_folds": oos.seconds,
            "fitted_noise_std": fitted_noise_std(given, oos.probabilities.numpy()),
            **judge(given, clean, oos.probabilities.numpy(), noise_std(noise, clean))}


def _mean_std(values: list[float], percent: bool = False) -> str:
    scale = 100.0 if percent else 1.0
    values = [scale * v for v in values if v == v]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.1f}" if percent else f"{values[0]:.3f}"
    fmt = ".1f" if percent else ".3f"
    return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


def tables(records: list[dict]) -> str:
    """Markdown: one row per (data, noise, folds), means ± std over seeds."""
    lines = ["| data | noise | folds | wrong % | AUROC ours | AUROC cleanlab | AP ours | AP cleanlab | "
             "flagged % ours | flagged % cleanlab | F1 ours | F1 cleanlab | recall ours | recall cleanlab | "
             "told the noise: flagged % | recall | F1 | noise std read from p (ranks) | folds / one run (time) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- |"]
    noise_order = list(NOISES) + list(VADER_NOISES)
    keys = sorted({(r["data"], r["noise"], r["folds"]) for r in records},
                  key=lambda k: (k[0], noise_order.index(k[1]), k[2]))
    for data_name, noise, folds in keys:
        cell = [r for r in records if (r["data"], r["noise"], r["folds"]) == (data_name, noise, folds)]

        def col(tool, metric, percent=False, cell=cell):
            return _mean_std([r[tool][metric] for r in cell], percent)
        ratio = _mean_std([r["seconds_folds"] / r["seconds_one_run"] for r in cell])

        def told(metric, percent=False, cell=cell):
            return _mean_std([r["sol_ext"]["told"][metric] for r in cell if "told" in r["sol_ext"]], percent)
        lines.append(f"| {data_name} | {noise} | {folds} | {_mean_std([r['wrong'] for r in cell], True)} | "
                     f"{col('sol_ext', 'auroc')} | {col('cleanlab', 'auroc')} | {col('sol_ext', 'ap')} | "
                     f"{col('cleanlab', 'ap')} | {col('sol_ext', 'flagged', True)} | "
                     f"{col('cleanlab', 'flagged', True)} | {col('sol_ext', 'f1')} | {col('cleanlab', 'f1')} | "
                     f"{col('sol_ext', 'recall', True)} | {col('cleanlab', 'recall', True)} | "
                     f"{told('flagged', True)} | {told('recall', True)} | {told('f1')} | "
                     f"{_mean_std([r['fitted_noise_std'] for r in cell])} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=",".join(DATASETS),
                   help="comma-separated, of those, vader and fashion-mnist-blur (default: %(default)s)")
    p.add_argument("--noises", default=",".join(NOISES), help=f"comma-separated of {', '.join(NOISES)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--folds", default="5", help="comma-separated fold counts (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=8, help="training budget of every run (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="wine-red, gaussian 1, one seed, 2 folds, 1 epoch")
    p.add_argument("--tag", default="")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "label_issues")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s: share the cores)")
    args = p.parse_args(argv)
    try:
        import cleanlab  # noqa: F401
    except ImportError:
        print("bench_label_issues needs cleanlab: pip install cleanlab", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if args.quick:
        datasets, noises, seeds, folds_list, epochs = ["wine-red"], ["gaussian1"], [0], [2], 1
    else:
        datasets = [d for d in args.data.split(",") if d]
        noises = [n for n in args.noises.split(",") if n]
        unknown = sorted(set(noises) - set(NOISES))
        if unknown:
            p.error(f"--noises: unknown {unknown}; expected some of {list(NOISES)}")
        seeds = [int(s) for s in args.seeds.split(",") if s]
        folds_list = [int(k) for k in args.folds.split(",") if k]
        epochs = args.epochs
    records = []
    for data_name in datasets:
        if data_name == "vader" and not VADER_FILE.is_file():
            print(f"skipping vader: {VADER_FILE} is absent", file=sys.stderr)
            continue
        for noise in (VADER_NOISES if data_name == "vader" else noises):
            for seed in seeds:
                for folds in folds_list:
                    r = run_cell(data_name, noise, seed, folds, epochs)
                    records.append(r)
                    print(f"{data_name} {noise} seed {seed} folds {folds}: AUROC {r['sol_ext']['auroc']:.3f} "
                          f"vs {r['cleanlab']['auroc']:.3f}, F1 {r['sol_ext']['f1']:.3f} vs "
                          f"{r['cleanlab']['f1']:.3f}, flagged {100 * r['sol_ext']['flagged']:.1f}% vs "
                          f"{100 * r['cleanlab']['flagged']:.1f}% ({r['seconds_folds']:.0f} s)", flush=True)
    args.output.mkdir(parents=True, exist_ok=True)
    stem = "label_issues" + ("_quick" if args.quick else "") + (f"_{args.tag}" if args.tag else "")
    (args.output / f"{stem}.json").write_text(json.dumps(records, indent=1))
    table = tables(records)
    (args.output / f"{stem}.md").write_text(f"Training budget: {epochs} epochs, sigma 1, "
                                            f"{torch.get_num_threads()} thread(s).\n\n" + table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
