"""Real human label noise: train on one person's ratings, be judged against the crowd's.

    python benchmarks/bench_human_noise.py                 # 5 methods x k in {1, 3, 5} x 5 seeds (15 min on 2 cores)
    python benchmarks/bench_human_noise.py --smoke         # a small slice, one seed, one epoch (seconds)
    python benchmarks/bench_human_noise.py --methods sol,corn --raters 1 --seeds 0,1
    python benchmarks/bench_human_noise.py --dev --methods sol \\
        --variant wd=weight_decay=5e-4 --variant ema0=weight_ema=0   # variants of sol, judged on dev rows
    python benchmarks/bench_human_noise.py --tables-from a.json b.json   # the tables of several runs together

Data: the VADER sentence-sentiment ratings (``../shared/data/vader_dev.npz``, see its README):
fixed MiniLM sentence embeddings ``[N, 384]``, every rater's rating on the scale -4 … 4, and their
mean (the consensus). Per seed:

- the sentences are split at random into training sentences and test sentences (20 %); with
  ``--dev`` the test sentences are set aside unused and 20 % of the training sentences are judged
  instead, so that settings can be chosen without looking at the test rows;
- the training label of a sentence is the rounded mean of ``k`` of its ratings drawn at random
  without replacement (``k = 1``: one rater's rating; ``--raters fixed`` uses the file's one fixed
  draw, ``one_rater``; ``--raters consensus`` trains on the rounded consensus itself, the clean
  label: what any way of handling the noise could at best recover);
- the test label is the rounded consensus (Python's ``round``: halves to even).

Every method trains through the driver (:func:`sol_ext.driver.train.train`, the code of
``sol-ext train``) with its defaults: the MLP encoder on the standardized embeddings, the same
budget, the same split and the same training labels; the epoch (and SOL's sigma) is picked on the
driver's validation split of the training sentences, against their noisy labels. For every SOL run
the test rows are also read out with the other read-outs of the same model (``nearest``: eq. 6;
``expected``: the rounded expected rank; ``sqrt-prior`` and ``flat``: the posterior median with the
square root of the training labels' frequencies, or a uniform prior, as the prior instead of the
frequencies; ``cuts``: the expected rank against the run's cuts, fitted to its training split's
labels, which is the driver's default read-out, ``--readout cuts``), for the diagnosis. Before
the driver had it, ``cuts`` in the result files of the second round was fitted after training to
every training sentence.

Writes ``human_noise[_dev][_TAG].json`` (every run) and ``.md`` (mean ± std over seeds of test MAE,
macro-MAE, QWK and Pearson, and the read-outs of the SOL rows) to ``--output``. corn needs
coral-pytorch (``pip install coral-pytorch``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from sol_ext.driver.compare import mean_std_table
from sol_ext.driver.config import METHODS, TrainConfig
from sol_ext.driver.data import OrdinalDataset, apply_scaling
from sol_ext.driver.model import load_run
from sol_ext.driver.prepare import PreparedData, preprocessing_record
from sol_ext.driver.train import train
from sol_ext.labels import LabelGrid
from sol_ext.metrics import summarize
from sol_ext.readout import RankPosterior, median_ranks, rank_posterior

ROOT = Path(__file__).resolve().parent.parent
DATA_FILE = ROOT.parent / "shared" / "data" / "vader_dev.npz"
MISSING = -99                       # a rater who did not rate the sentence
SCALE = (-4, 4)                     # the rating scale: 9 ranks, one per integer
TEST_FRACTION = 0.2                 # of all sentences: the test rows
DEV_FRACTION = 0.2                  # of the training sentences, judged instead of the test rows (--dev)
RATERS = ("1", "3", "5")            # training labels: the rounded mean of k random ratings
FIXED = "fixed"                     # the file's one fixed draw of one rater (`one_rater`)
CONSENSUS = "consensus"             # the rounded consensus: the clean label, no noise to handle
# the driver's read-outs, the rounded expected rank, the posterior median with the same fitted
# temperature but a weaker prior: the square root of the training labels' frequencies ("sqrt-prior")
# or none ("flat"), and the expected rank against the run's cuts ("cuts", the driver's default;
# docs/math.md §12.4a)
READOUTS = ("posterior", "nearest", "expected", "sqrt-prior", "flat", "cuts")
METRICS = (("mae", "test MAE", "{:.3f} ± {:.3f}", min), ("macro_mae", "test macro-MAE", "{:.3f} ± {:.3f}", min),
           ("qwk", "test QWK", "{:.3f} ± {:.3f}", max), ("pearson", "test Pearson", "{:.3f} ± {:.3f}", max))
# --smoke: this many training and judged sentences, one seed, one epoch, k = 1
SMOKE_ROWS = (600, 200)


def load_ratings(path: Path) -> dict[str, np.ndarray]:
    """The arrays of the VADER file: ``embeddings`` [N, d] float32, ``ratings`` [N, R] int64
    (``MISSING`` where a rater did not rate), ``consensus`` [N] float64, ``one_rater`` [N] int64."""
    with np.load(path, allow_pickle=False) as npz:
        data = {"embeddings": npz["embeddings"].astype(np.float32), "ratings": npz["ratings"].astype(np.int64),
                "consensus": npz["consensus"].astype(np.float64), "one_rater": npz["one_rater"].astype(np.int64)}
    counts = (data["ratings"] != MISSING).sum(axis=1)
    if counts.min() < 1:
        raise ValueError(f"{path}: sentence {int(np.argmin(counts))} has no rating; every sentence needs one")
    return data


def split_sentences(n: int, seed: int, dev: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers ``(train, judged)`` of ``n`` sentences for ``seed``: the judged rows are the
    test sentences (``TEST_FRACTION``), or with ``dev`` a ``DEV_FRACTION`` of the training
    sentences (the test sentences then unused). The test sentences do not depend on ``dev``."""
    order = np.random.default_rng([seed, 0]).permutation(n)
    n_test = int(round(TEST_FRACTION * n))
    test, pool = order[:n_test], order[n_test:]
    if not dev:
        return np.sort(pool), np.sort(test)
    n_dev = int(round(DEV_FRACTION * pool.size))
    return np.sort(pool[n_dev:]), np.sort(pool[:n_dev])


def mean_of_raters(ratings: np.ndarray, k: int, seed: int) -> np.ndarray:
    """``[N]`` int64: per sentence (row of ``ratings`` [N, R], ``MISSING`` where absent) the mean of
    ``k`` of its ratings drawn at random without replacement (numpy seed ``seed``), rounded (no
    ties for odd ``k``; halves to even otherwise)."""
    present = ratings != MISSING
    counts = present.sum(axis=1)
    if k < 1 or counts.min() < k:
        raise ValueError(f"k={k} raters per sentence: expected 1 <= k <= {int(counts.min())}, the fewest "
                         f"ratings a sentence has")
    keys = np.random.default_rng([seed, k]).random(ratings.shape)
    keys[~present] = np.inf                                 # absent ratings sort last: never drawn
    drawn = np.take_along_axis(ratings, np.argsort(keys, axis=1)[:, :k], axis=1)
    return np.round(drawn.mean(axis=1)).astype(np.int64)


def training_labels(data: dict[str, np.ndarray], rows: np.ndarray, raters: str, seed: int) -> np.ndarray:
    """The training labels of ``rows`` for one ``raters`` setting (``"k"``, ``FIXED`` or ``CONSENSUS``)."""
    if raters == FIXED:
        return data["one_rater"][rows]
    if raters == CONSENSUS:
        return consensus_labels(data, rows)
    return mean_of_raters(data["ratings"][rows], int(raters), seed)


def consensus_labels(data: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The rounded consensus of ``rows`` (halves to even, as Python's ``round``)."""
    return np.round(data["consensus"][rows]).astype(np.int64)


def prepared_data(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                  name: str = "vader") -> PreparedData:
    """The run's data, as ``sol-ext train --data train.npz --test-data test.npz`` prepares them
    (embeddings standardized with the training rows' mean and std; training labels as given, no
    added noise), on the fixed grid of the rating scale: a rounded mean of several raters may never
    reach an end of the scale that the consensus of a test sentence reaches."""
    grid = LabelGrid(min_value=SCALE[0], step=1.0, num_ranks=SCALE[1] - SCALE[0] + 1)
    schema = {"format": "npz", "features_key": "embeddings", "labels_key": "labels"}

    def part(x: np.ndarray, y: np.ndarray) -> OrdinalDataset:
        return OrdinalDataset(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                              grid.encode(torch.from_numpy(y.astype(np.float64))).long(), grid, name,
                              "embeddings", schema=schema)

    train_set, test_set = part(x_train, y_train), part(x_test, y_test)
    preprocessing = preprocessing_record(train_set)
    scaling = (preprocessing["scaling"]["mean"], preprocessing["scaling"]["std"])
    return PreparedData(name=name, kind="embeddings", grid=grid,
                        train_x=apply_scaling(train_set.features, scaling), train_given=train_set.ranks,
                        train_clean=None, test_x=apply_scaling(test_set.features, scaling),
                        test_ranks=test_set.ranks, train_rows=torch.arange(len(y_train)),
                        preprocessing=preprocessing)


def readout_metrics(run_dir: Path, x_test: np.ndarray, y_test: np.ndarray) -> dict[str, dict[str, float]]:
    """Metrics of every read-out of :data:`READOUTS` of a SOL run's selected model on the judged
    rows (raw features ``x_test``, labels ``y_test`` in label units)."""
    model = load_run(run_dir)
    h = model.embed(np.ascontiguousarray(x_test, dtype=np.float32))
    head = model.head
    d = head.dissimilarity(h)
    fitted = head.posterior

    def median_with_prior(power: float) -> torch.Tensor:
        prior = RankPosterior(log_prior=power * fitted.log_prior.double(), temperature=fitted.temperature)
        return median_ranks(rank_posterior(d, prior))

    # "cuts": the run's own cuts, fitted to its training split's labels whatever its --readout
    ranks = {"posterior": head.ranks(d, readout="posterior"), "nearest": head.ranks(d, readout="nearest"),
             "expected": head.expected_rank(h).round().long(), "sqrt-prior": median_with_prior(0.5),
             "flat": median_with_prior(0.0), "cuts": head.ranks(d, readout="cuts")}
    return {name: metric_summary(r.numpy() + SCALE[0], y_test) for name, r in ranks.items()}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value); NaN where a value is NaN (e.g. the Pearson
    correlation of a model that predicts one rank for every sentence)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def metric_summary(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """MAE, macro-MAE, QWK and Pearson of predicted against true labels."""
    s = summarize(pred, true, theta=1.0)
    return {key: s[key] for key, *_ in METRICS}


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME=KEY=VALUE[,KEY=VALUE...]``: a variant of sol named ``sol+NAME`` with these TrainConfig
    fields (values read as JSON where they parse: numbers, true/false, null; else as text)."""
    name, sep, rest = text.partition("=")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    options: dict[str, Any] = {}
    for item in rest.split(",") if sep else []:
        key, eq, value = item.partition("=")
        if not eq or key not in fields:
            raise ValueError(f"--variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...] with each KEY "
                             f"a TrainConfig field; {item!r} is not")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    if not name or not options:
        raise ValueError(f"--variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...], e.g. wd=weight_decay=5e-4")
    dataclasses.replace(TrainConfig(), method="sol", **options).validate()  # refused before any run
    return f"sol+{name}", options


def run(data: dict[str, np.ndarray], methods: Sequence[str], raters: Sequence[str], seeds: Sequence[int],
        work_dir: Path, epochs: int = TrainConfig.epochs, dev: bool = False,
        variants: Optional[dict[str, dict[str, Any]]] = None, limit: Optional[tuple[int, int]] = None,
        log: Callable[[str], None] = print,
        save: Optional[Callable[[list[dict[str, Any]]], None]] = None) -> list[dict[str, Any]]:
    """Train every method (and every variant of sol) for every raters setting and seed; return one
    record per run. ``limit``: at most this many (training, judged) sentences (a smoke run);
    ``save`` receives the records so far after every run (a long run keeps what it measured)."""
    variants = variants or {}
    rows_of = {m: ("sol", variants[m]) if m in variants else (m, {}) for m in [*methods, *variants]}
    records: list[dict[str, Any]] = []
    total = len(rows_of) * len(raters) * len(seeds)
    for seed in seeds:
        train_rows, judged_rows = split_sentences(len(data["consensus"]), seed, dev)
        if limit is not None:
            train_rows, judged_rows = train_rows[:limit[0]], judged_rows[:limit[1]]
        y_test = consensus_labels(data, judged_rows)
        x_train, x_test = data["embeddings"][train_rows], data["embeddings"][judged_rows]
        for setting in raters:
            y_train = training_labels(data, train_rows, setting, seed)
            label_mae = float(np.abs(y_train - consensus_labels(data, train_rows)).mean())
            prepared = prepared_data(x_train, y_train, x_test, y_test)
            for row, (method, options) in rows_of.items():
                cfg = dataclasses.replace(TrainConfig(method=method, seed=seed, epochs=epochs, noise="none"),
                                          **options).validate()
                run_dir = work_dir / f"k{setting}" / row / f"seed{seed}"
                start = time.perf_counter()
                outcome = train(cfg, prepared, run_dir, log=lambda _line: None)
                res = outcome.results
                pred = prepared.grid.decode(outcome.test_pred.cpu()).numpy()
                record = {"raters": setting, "method": row, "seed": seed, "split": "dev" if dev else "test",
                          "options": options, "n_train": int(len(train_rows)), "n_judged": int(len(judged_rows)),
                          "train_label_mae": label_mae, **metric_summary(pred, y_test),
                          "selected_epoch": res["selected_epoch"], "sigma": res["sigma_selected"],
                          "val_mae": res.get("val_mae")}
                if cfg.uses_centroids:
                    record["readouts"] = readout_metrics(run_dir, x_test, y_test)
                record["seconds"] = time.perf_counter() - start
                records.append(record)
                if save is not None:
                    save(records)
                log(f"[{len(records)}/{total}] k={setting} {row} seed {seed}: MAE {record['mae']:.3f}  "
                    f"macro-MAE {record['macro_mae']:.3f}  QWK {record['qwk']:.3f}  "
                    f"epoch {record['selected_epoch']}  {record['seconds']:.0f}s")
    return records


def tables(records: Sequence[dict[str, Any]]) -> str:
    """Markdown: one table per metric (a row per method, a column per raters setting, mean ± std
    over seeds, the best mean bold), then the read-outs of the SOL rows."""
    settings = [(s, 0) for s in dict.fromkeys(r["raters"] for r in records)]
    methods = list(dict.fromkeys(r["method"] for r in records))
    seeds = len({r["seed"] for r in records})
    judged = "dev rows (training sentences held out)" if records[0]["split"] == "dev" else "test rows"
    label = {s: f"k={s}" if s != FIXED else "one_rater" for s, _ in settings}
    lines = []
    for metric, title, fmt, best in METRICS:
        cell = {((r["raters"], 0), m): mean_std([x[metric] for x in records
                                                 if x["raters"] == r["raters"] and x["method"] == m])
                for r in records for m in [r["method"]]}
        what = title.replace("test ", "")
        lines += mean_std_table(f"**human noise: {what} on the {judged} against the rounded consensus, by "
                                f"training labels (mean of k raters), mean ± std over {seeds} seeds**",
                                {s: label[s[0]] for s in settings}, methods, cell, fmt, best)
    sol_rows = [m for m in methods if any(r["method"] == m and "readouts" in r for r in records)]
    for metric, title, fmt, best in METRICS[:2]:
        cell, rows = {}, []
        for m in sol_rows:
            for readout in READOUTS:
                rows.append(f"{m} / {readout}")
                for s, _ in settings:
                    values = [r["readouts"][readout][metric] for r in records
                              if r["method"] == m and r["raters"] == s and readout in r.get("readouts", {})]
                    if values:
                        cell[((s, 0), rows[-1])] = mean_std(values)
        if rows:
            lines += mean_std_table(f"**human noise: {title.replace('test ', '')} of each read-out of the same "
                                    f"SOL model (method / read-out), mean ± std over {seeds} seeds**",
                                    {s: label[s[0]] for s in settings}, rows, cell, fmt, best)
    noise = {s: mean_std([r["train_label_mae"] for r in records if r["raters"] == s]) for s, _ in settings}
    lines.append("Training labels against the rounded consensus, MAE: "
                 + ", ".join(f"{label[s]} {noise[s][0]:.3f}" for s, _ in settings) + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DATA_FILE, help="the VADER ratings file (default: %(default)s)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated (default: %(default)s)")
    p.add_argument("--raters", default=",".join(RATERS),
                   help=f"training labels: k raters' rounded mean per sentence, or '{FIXED}' for the file's "
                        f"one_rater draw, or '{CONSENSUS}' for the rounded consensus (the clean label) "
                        f"(default: %(default)s)")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    p.add_argument("--dev", action="store_true",
                   help="judge on held-out training sentences, never the test rows (for choosing settings)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                   help="a variant of sol, row 'sol+NAME', e.g. wd=weight_decay=5e-4 (repeatable)")
    p.add_argument("--smoke", action="store_true",
                   help=f"a smoke run: {SMOKE_ROWS[0]} training and {SMOKE_ROWS[1]} judged sentences, one seed, "
                        "one epoch, k=1")
    p.add_argument("--tag", default="", help="appended to the result file names")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "human_noise")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s: share the cores)")
    p.add_argument("--tables-from", type=Path, nargs="+", metavar="JSON",
                   help="train nothing: print the tables of these result files together (a run that "
                        "appears in several counts once)")
    args = p.parse_args(argv)
    if args.tables_from:
        missing = [str(f) for f in args.tables_from if not f.is_file()]
        if missing:
            p.error(f"--tables-from: no such file {', '.join(missing)}")
        runs: dict[tuple, dict[str, Any]] = {}
        for f in args.tables_from:  # a run in several files (the same method, labels and seed) counts once
            for r in json.loads(f.read_text()):
                runs.setdefault((r["split"], r["raters"], r["method"], r["seed"]), r)
        print(tables(list(runs.values())))
        return 0
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"--methods: unknown {', '.join(unknown)}; expected some of {', '.join(METHODS)}")
    raters = [r for r in args.raters.split(",") if r]
    if any(r not in (FIXED, CONSENSUS) and not (r.isdigit() and int(r) >= 1) for r in raters) or not raters:
        p.error(f"--raters {args.raters!r}: expected comma-separated counts >= 1, '{FIXED}' or '{CONSENSUS}', "
                f"e.g. 1,3,5")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as e:
        p.error(str(e))
    if not args.data.is_file():
        p.error(f"--data {args.data}: no such file; expected the VADER ratings file vader_dev.npz")
    limit = None
    if args.smoke:
        raters, seeds, args.epochs, limit = raters[:1], seeds[:1], 1, SMOKE_ROWS
    torch.set_num_threads(args.threads)
    data = load_ratings(args.data)
    args.output.mkdir(parents=True, exist_ok=True)
    stem = "human_noise" + ("_dev" if args.dev else "") + (f"_{args.tag}" if args.tag else "")

    def save(records: list[dict[str, Any]]) -> None:
        (args.output / f"{stem}.json").write_text(json.dumps(records, indent=1) + "\n")

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="human-noise-") as work:
        records = run(data, methods, raters, seeds, Path(work), args.epochs, args.dev, variants, limit, save=save)
    md = tables(records) + f"{len(records)} runs, {args.epochs} epochs, {(time.perf_counter() - start) / 60:.1f} min.\n"
    (args.output / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
