"""Label issues on out-of-sample probabilities: sol_ext's scores and flags against cleanlab's.

    python benchmarks/bench_label_issues.py            # abalone, wine-red, many-ranks x every noise x 3 seeds
    python benchmarks/bench_label_issues.py --quick    # two small cells, seconds (the suite's smoke test)
    python benchmarks/bench_label_issues.py --data abalone --noises gaussian1 --seeds 0 --folds 3,5
    python benchmarks/bench_label_issues.py --data vader             # real human noise (../shared/data/vader_dev.npz)
    python benchmarks/bench_label_issues.py --data fashion-mnist-blur --probabilities sol

Per cell (data set, noise, seed) the data are prepared as ``sol-ext train`` does (clean labels known,
the noise added to the training labels), and every training row's ``p(q | x)`` comes from
:func:`sol_ext.driver.audit.cross_validated_probabilities`: a model trained ``K`` times through the
driver, each time without one fold (``--epochs`` epochs: a short budget), once as SOL (sigma 1) and
once as CORN (``--probabilities``). On each model's probabilities, with "wrong" meaning ``given label
!= clean label`` (even by one rank) and "far" meaning off by two ranks or more:

- AUROC and average precision of each score for "wrong" and for "far": ours ``1 -
  sol_ext.get_label_quality_scores``; cleanlab's ``1 - cleanlab.rank.get_label_quality_scores`` (its
  default, self-confidence); and ``1 - cleanlab.regression.rank.get_label_quality_scores`` of the
  expected rank (cleanlab's regression score, which sees no distribution);
- flagged share, precision, recall and F1 of the default flags: ``sol_ext.find_label_issues`` (the rule
  of ``sol-ext audit``) and ``cleanlab.filter.find_label_issues``, both with their defaults;
- ours with the noise std estimated from the probabilities by maximum likelihood (``estimated``:
  :func:`sol_ext.refine.fit_label_noise`; the rule of ``--label-noise`` at that std, the default's
  flags where it reads 0), and told the std of the added noise (``told``: the rule of ``sol-ext audit
  --label-noise STD``, ``noise_kernel=label_noise_kernel(n, std)`` on the probabilities sharpened
  through it);
- ``at 1 % clean``: the flags of our score beyond one fixed threshold, the one that flags 1 % of the
  rows of the same data set's clean cell (same seed, folds and model kind; the clean cell runs first):
  what a rule held to 1 % of clean labels flags on noisy ones. It is one threshold, not the best F1
  over thresholds; ``false_flags`` is the share of the noisy cell's correct labels it flags.

The noises: Gaussian at kappa 0.3 and 1 and Laplacian at 0.3 (std ``kappa`` times the clean ranks' std;
for Laplacian noise that is its scale, so its std is sqrt(2) times that), and ``rank-dependent0.3``, the driver's
``input-dependent`` noise at kappa 0.3 (the paper's rank-dependent setting: an error of std
``s (1 + exp(-(r - peak)^2 / (2 width^2)))``, twice ``s`` at 39 % of the rank range and about 1.05 to
1.3 ``s`` at the ends). ``many-ranks`` is the data of
``bench_many_ranks.py``: 62 ranks, labeled by the true ages (``clean``) or by an annotator whose error
grows with the age from 2 to 8 ranks (``annotator``). ``vader``: the VADER sentence-sentiment ratings
(fixed MiniLM embeddings, scale -4 … 4; see ``../shared/data/README.md``), 80 % of the sentences per
seed: ``one_rater`` trains on one person's rating and counts it wrong where it differs from the
rounded mean of all raters (real human noise; halves to even, as in ``bench_human_noise.py``);
``consensus`` trains on that rounded mean (the clean case).

Also the wall time of the ``K`` SOL fold trainings over that of one SOL run of the same budget on all
rows, both at ``--threads`` (default: torch's). Writes ``label_issues[_TAG].json`` (every cell) and ``.md`` (means ± std over seeds) to
``--output``. Needs cleanlab (``pip install cleanlab``) and, for CORN, coral-pytorch.
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
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_many_ranks, its sibling

from sol_ext.driver.audit import cross_validated_probabilities  # noqa: E402
from sol_ext.driver.config import TrainConfig  # noqa: E402
from sol_ext.driver.prepare import prepare_data  # noqa: E402
from sol_ext.driver.synthetic_noise import (  # noqa: E402
    default_peak_width,
    input_dependent_scale,
    noise_scale,
)
from sol_ext.driver.train import train  # noqa: E402
from sol_ext.label_issues import (  # noqa: E402
    find_label_issues,
    get_label_quality_scores,
    sharpen_through_noise,
)
from sol_ext.refine import fit_label_noise, label_noise_kernel  # noqa: E402

DATASETS = ("abalone", "wine-red", "many-ranks")
NOISES = {"clean": ("none", 0.0), "gaussian0.3": ("gaussian", 0.3), "gaussian1": ("gaussian", 1.0),
          "laplacian0.3": ("laplacian", 0.3), "rank-dependent0.3": ("input-dependent", 0.3)}
# data sets that come with their own labels: the clean cell first, then the noisy one
OWN_NOISES = {"vader": ("consensus", "one_rater"), "many-ranks": ("clean", "annotator")}
CLEAN_CELLS = ("clean", "consensus")
SOURCES = ("sol", "corn")
VADER_FILE = ROOT.parent / "shared" / "data" / "vader_dev.npz"
VADER_SCALE = (-4, 4)
# the share of a clean cell's rows that the "at 1 % clean" threshold flags
CLEAN_FLAG_SHARE = 0.01


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


def noise_std(noise: str, clean: np.ndarray, num_ranks: int) -> float | None:
    """The std in ranks of the noise a cell adds to ``clean`` [N] (its root mean square over the rows
    where it depends on the rank; None where it is not known: VADER's)."""
    if noise == "annotator":  # bench_many_ranks' annotator (its ranks are the ages from 16, a year each)
        from bench_many_ranks import AGE_RANGE, annotator_std
        return float(np.sqrt(np.mean(annotator_std(clean + AGE_RANGE[0]) ** 2)))
    if noise not in NOISES:
        return None
    kind, kappa = NOISES[noise]
    s = noise_scale(clean, kappa)
    if kind == "input-dependent":
        return float(np.sqrt(np.mean(input_dependent_scale(clean, s, *default_peak_width(num_ranks)) ** 2)))
    return s * (2.0 ** 0.5 if kind == "laplacian" else 1.0)


def fitted_noise_std(given: np.ndarray, probs: np.ndarray) -> float:
    """The label-noise std in ranks that maximum likelihood reads from the probabilities ``probs`` [N, n]
    (:func:`sol_ext.refine.fit_label_noise`, temperature and std together), with ``-log p`` as the
    dissimilarity and the labels' frequencies divided out (the fit multiplies them back in)."""
    labels = torch.from_numpy(given).long()
    counts = torch.bincount(labels, minlength=probs.shape[1]).double() + 0.5  # the fit's smoothing
    d = -(torch.from_numpy(probs).clamp_min(1e-300).log() - torch.log(counts / counts.sum()))
    return float(fit_label_noise(d, labels, probs.shape[1]).std)


def flags_through_noise(given: np.ndarray, probs: np.ndarray, std: float) -> np.ndarray:
    """The flags of ``sol-ext audit --label-noise std``: the probabilities sharpened through the noise
    kernel of ``std`` ranks, then the posterior rule with that kernel (the default's where ``std`` is 0)."""
    if std <= 0.0:
        return find_label_issues(given, probs)
    kernel = label_noise_kernel(probs.shape[1], std)
    return find_label_issues(given, sharpen_through_noise(given, probs, kernel), noise_kernel=kernel)


def score_quality(given: np.ndarray, clean: np.ndarray, suspicion: np.ndarray) -> dict[str, float]:
    """AUROC and AP of ``suspicion`` for "wrong" (any error) and for "far" (off by 2 ranks or more)."""
    auroc, ap = ranking_quality(given != clean, suspicion)
    auroc_far, ap_far = ranking_quality(np.abs(given - clean) >= 2, suspicion)
    return {"auroc": auroc, "ap": ap, "auroc_far": auroc_far, "ap_far": ap_far}


def judge(given: np.ndarray, clean: np.ndarray, probs: np.ndarray, std: float | None = None,
          clean_threshold: float | None = None) -> dict:
    """Both tools' scores and default flags on the same probabilities ``probs`` [N, n]; ours also with
    the noise std estimated from them, told the std ``std`` of the added noise (when known), and
    thresholded where it flags 1 % of the clean cell (``clean_threshold`` on ``-quality``)."""
    from cleanlab.filter import find_label_issues as cleanlab_find
    from cleanlab.rank import get_label_quality_scores as cleanlab_quality
    from cleanlab.regression.rank import get_label_quality_scores as cleanlab_regression_quality
    wrong = given != clean
    expected_rank = probs @ np.arange(probs.shape[1], dtype=np.float64)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cleanlab warns about ranks with few rows
        suspicion = -get_label_quality_scores(given, probs)  # not 1 - q, which rounds tiny q away
        out["sol_ext"] = {**score_quality(given, clean, suspicion),
                          **flag_quality(wrong, find_label_issues(given, probs)),
                          "suspicion_at_clean_share": float(np.quantile(suspicion, 1.0 - CLEAN_FLAG_SHARE))}
        out["cleanlab"] = {**score_quality(given, clean, 1.0 - cleanlab_quality(given, probs)),
                           **flag_quality(wrong, np.asarray(cleanlab_find(given, probs), dtype=bool))}
        out["cleanlab_regression"] = score_quality(
            given, clean, 1.0 - cleanlab_regression_quality(given.astype(np.float64), expected_rank))
    estimated = fitted_noise_std(given, probs)
    out["sol_ext"]["estimated"] = {"std": estimated,
                                   **flag_quality(wrong, flags_through_noise(given, probs, estimated))}
    if std is not None:
        out["sol_ext"]["told"] = {"std": std, **flag_quality(wrong, flags_through_noise(given, probs, std))}
    if clean_threshold is not None:
        flags = suspicion > clean_threshold
        out["sol_ext"]["at_clean_share"] = {**flag_quality(wrong, flags),
                                            "false_flags": float(flags[~wrong].mean()) if (~wrong).any() else 0.0}
    return out


def array_data(name: str, kind: str, x_train: np.ndarray, given: np.ndarray, clean: np.ndarray,
               x_test: np.ndarray, test: np.ndarray, scale: tuple[int, int]):
    """A run's data from arrays: integer labels on ``scale`` (lowest, highest), inputs scaled by the
    training rows' mean and std as the driver scales a file's."""
    from sol_ext.driver.data import OrdinalDataset, apply_scaling
    from sol_ext.driver.prepare import PreparedData, preprocessing_record
    from sol_ext.labels import LabelGrid
    grid = LabelGrid(min_value=scale[0], step=1.0, num_ranks=scale[1] - scale[0] + 1)

    def ranks(labels: np.ndarray) -> torch.Tensor:
        return grid.encode(torch.from_numpy(labels.astype(np.float64))).long()
    train_set = OrdinalDataset(torch.from_numpy(x_train.astype(np.float32)), ranks(given), grid, name, kind)
    preprocessing = preprocessing_record(train_set)
    scaling = (preprocessing["scaling"]["mean"], preprocessing["scaling"]["std"])
    return PreparedData(name=name, kind=kind, grid=grid,
                        train_x=apply_scaling(train_set.features, scaling), train_given=train_set.ranks,
                        train_clean=ranks(clean),
                        test_x=apply_scaling(torch.from_numpy(x_test.astype(np.float32)), scaling),
                        test_ranks=ranks(test), train_rows=torch.arange(len(x_train)),
                        preprocessing=preprocessing)


def vader_data(noise: str, seed: int):
    """VADER's sentences as a run's data: 80 % of them (by ``seed``) as training rows labeled by one
    rater (``one_rater``) or the rounded consensus, the rest as the test rows; the rounded consensus
    as the clean labels."""
    with np.load(VADER_FILE, allow_pickle=False) as npz:
        x = npz["embeddings"].astype(np.float32)
        consensus = np.round(npz["consensus"]).astype(np.int64)
        one = npz["one_rater"].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    train_rows, test_rows = order[: int(0.8 * len(x))], order[int(0.8 * len(x)):]
    given = one if noise == "one_rater" else consensus
    data = array_data("vader", "embeddings", x[train_rows], given[train_rows], consensus[train_rows],
                      x[test_rows], consensus[test_rows], VADER_SCALE)
    return dataclasses.replace(data, train_rows=torch.from_numpy(train_rows))


def many_ranks_data(noise: str):
    """bench_many_ranks.py's data (fixed by its own seed): true ages (``clean``) or the annotator's
    as the training labels, the true ages as the clean ones and the test set's."""
    from bench_many_ranks import AGE_RANGE, make_data
    d = make_data()
    given = d["annotator"] if noise == "annotator" else d["true ages"]
    return array_data("many-ranks", "tabular", d["x_train"], given, d["true ages"], d["x_test"], d["test"],
                      AGE_RANGE)


def cell_data(data_name: str, noise: str, seed: int, epochs: int):
    """(configuration of a SOL run, its data) of one cell."""
    if data_name in OWN_NOISES:
        config = TrainConfig(data=str(VADER_FILE) if data_name == "vader" else data_name, noise="none",
                             seed=seed, sigma=1.0, epochs=epochs)
        return config, vader_data(noise, seed) if data_name == "vader" else many_ranks_data(noise)
    kind, kappa = NOISES[noise]
    config = TrainConfig(data=data_name, noise=kind, kappa=kappa, seed=seed, sigma=1.0, epochs=epochs)
    return config, prepare_data(config)


def run_cell(data_name: str, noise: str, seed: int, folds: int, epochs: int, sources=SOURCES,
             clean_thresholds: dict | None = None, timing: bool = True) -> dict:
    """One cell: every source's out-of-sample probabilities, judged by both tools. ``clean_thresholds``
    (source: threshold) from the same data set's clean cell."""
    config, data = cell_data(data_name, noise, seed, epochs)
    given, clean = data.train_given.numpy(), data.train_clean.numpy()
    record = {"data": data_name, "noise": noise, "seed": seed, "folds": folds, "epochs": epochs,
              "rows": int(given.size), "ranks": int(data.num_ranks), "wrong": float((given != clean).mean()),
              "far": float((np.abs(given - clean) >= 2).mean())}
    for source in sources:
        oos = cross_validated_probabilities(dataclasses.replace(config, method=source), data, folds,
                                            log=lambda _line: None)
        record[source] = {"seconds_folds": oos.seconds,
                          **judge(given, clean, oos.probabilities.numpy(), noise_std(noise, clean, data.num_ranks),
                                  (clean_thresholds or {}).get(source))}
    if timing and "sol" in sources:
        started = time.perf_counter()  # after the folds, which have paid the first run's warm-up
        with tempfile.TemporaryDirectory(prefix="bench-label-issues-") as tmp:
            train(dataclasses.replace(config), data, Path(tmp), log=lambda _line: None)
        record["sol"]["seconds_one_run"] = time.perf_counter() - started
    return record


def _mean_std(values: list[float], percent: bool = False) -> str:
    scale = 100.0 if percent else 1.0
    values = [scale * v for v in values if v == v]
    if not values:
        return "–"
    fmt = ".1f" if percent else ".3f"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


# (column title, path into a record's source entry, percent?)
COLUMNS = (
    ("AUROC ours", ("sol_ext", "auroc"), False),
    ("AUROC cleanlab", ("cleanlab", "auroc"), False),
    ("AUROC cleanlab regression", ("cleanlab_regression", "auroc"), False),
    ("AUROC far ours", ("sol_ext", "auroc_far"), False),
    ("AUROC far cleanlab", ("cleanlab", "auroc_far"), False),
    ("AP ours", ("sol_ext", "ap"), False),
    ("AP cleanlab", ("cleanlab", "ap"), False),
    ("AP cleanlab regression", ("cleanlab_regression", "ap"), False),
    ("flagged % ours", ("sol_ext", "flagged"), True),
    ("flagged % cleanlab", ("cleanlab", "flagged"), True),
    ("precision ours", ("sol_ext", "precision"), False),
    ("precision cleanlab", ("cleanlab", "precision"), False),
    ("recall % ours", ("sol_ext", "recall"), True),
    ("recall % cleanlab", ("cleanlab", "recall"), True),
    ("F1 ours", ("sol_ext", "f1"), False),
    ("F1 cleanlab", ("cleanlab", "f1"), False),
    ("at 1 % clean: recall %", ("sol_ext", "at_clean_share", "recall"), True),
    ("at 1 % clean: F1", ("sol_ext", "at_clean_share", "f1"), False),
    ("at 1 % clean: right labels flagged %", ("sol_ext", "at_clean_share", "false_flags"), True),
    ("estimated: std", ("sol_ext", "estimated", "std"), False),
    ("estimated: flagged %", ("sol_ext", "estimated", "flagged"), True),
    ("estimated: recall %", ("sol_ext", "estimated", "recall"), True),
    ("estimated: F1", ("sol_ext", "estimated", "f1"), False),
    ("told: std", ("sol_ext", "told", "std"), False),
    ("told: flagged %", ("sol_ext", "told", "flagged"), True),
    ("told: recall %", ("sol_ext", "told", "recall"), True),
    ("told: F1", ("sol_ext", "told", "f1"), False),
)


def _dig(entry: dict, path: tuple[str, ...]) -> float:
    for key in path:
        if not isinstance(entry, dict) or key not in entry:
            return float("nan")
        entry = entry[key]
    return entry


def _cell_order(key: tuple[str, str]) -> tuple:
    """Tables list the data sets as the grid runs them, the clean cell first."""
    data_order = [*DATASETS, "fashion-mnist-blur", "vader"]
    noise_order = list(NOISES) + [n for pair in OWN_NOISES.values() for n in pair]
    return (data_order.index(key[0]) if key[0] in data_order else len(data_order), key[0],
            noise_order.index(key[1]))


def tables(records: list[dict]) -> str:
    """Markdown: one row per (data, noise, folds, probabilities), means ± std over seeds."""
    titles = [title for title, _, _ in COLUMNS]
    lines = ["| data | noise | folds | probabilities | wrong % | far % | " + " | ".join(titles)
             + " | folds / one run (time) |",
             "| --- " * (len(titles) + 7) + "|"]
    keys = sorted({(r["data"], r["noise"], r["folds"]) for r in records},
                  key=lambda k: (*_cell_order(k[:2]), k[2]))
    for data_name, noise, folds in keys:
        cell = [r for r in records if (r["data"], r["noise"], r["folds"]) == (data_name, noise, folds)]
        for source in SOURCES:
            runs = [r[source] for r in cell if source in r]
            if not runs:
                continue
            values = [_mean_std([_dig(run, path) for run in runs], percent) for _, path, percent in COLUMNS]
            ratio = _mean_std([run["seconds_folds"] / run["seconds_one_run"] for run in runs
                               if "seconds_one_run" in run])
            lines.append(f"| {data_name} | {noise} | {folds} | {source} | "
                         f"{_mean_std([r['wrong'] for r in cell], True)} | "
                         f"{_mean_std([r['far'] for r in cell], True)} | " + " | ".join(values) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


# the README's table: (column title, path, percent?, with the std over seeds?)
SUMMARY_COLUMNS = (
    ("AUROC ours", ("sol_ext", "auroc"), False, True),
    ("AUROC cleanlab", ("cleanlab", "auroc"), False, True),
    ("AUROC cleanlab regression", ("cleanlab_regression", "auroc"), False, False),
    ("AUROC far: ours, cleanlab", (("sol_ext", "auroc_far"), ("cleanlab", "auroc_far")), False, False),
    ("flagged %: ours, cleanlab", (("sol_ext", "flagged"), ("cleanlab", "flagged")), True, False),
    ("F1 ours", ("sol_ext", "f1"), False, True),
    ("F1 cleanlab", ("cleanlab", "f1"), False, True),
    ("at 1 % clean: flagged %, F1", (("sol_ext", "at_clean_share", "flagged"), ("sol_ext", "at_clean_share", "f1")),
     None, False),
    ("estimated std: flagged %, F1", (("sol_ext", "estimated", "flagged"), ("sol_ext", "estimated", "f1")),
     None, False),
    ("told: recall %, F1", (("sol_ext", "told", "recall"), ("sol_ext", "told", "f1")), None, False),
)


def summary_table(records: list[dict]) -> str:
    """The README's table: one row per (data, noise, probabilities), fewer columns than :func:`tables`
    (means over seeds; ``±`` the std where the targets compare)."""
    def mean(runs, path, percent):
        values = [v for v in (_dig(run, path) for run in runs) if v == v]
        if not values:
            return "–"
        v = statistics.mean(values) * (100.0 if percent else 1.0)
        return f"{v:.1f}" if percent else f"{v:.3f}"

    titles = [title for title, *_ in SUMMARY_COLUMNS]
    lines = ["| data | noise | folds | probabilities | wrong % | " + " | ".join(titles) + " |",
             "| --- " * (len(titles) + 5) + "|"]
    keys = sorted({(r["data"], r["noise"], r["folds"]) for r in records},
                  key=lambda k: (*_cell_order(k[:2]), k[2]))
    for source in SOURCES:
        for key in keys:
            data_name, noise, folds = key
            cell = [r for r in records if (r["data"], r["noise"], r["folds"]) == key]
            runs = [r[source] for r in cell if source in r]
            if not runs:
                continue
            wrong = statistics.mean(r["wrong"] for r in cell)
            if wrong == 0 and noise not in CLEAN_CELLS:
                continue
            cells = []
            for _, path, percent, spread in SUMMARY_COLUMNS:
                if spread:
                    cells.append(_mean_std([_dig(run, path) for run in runs], percent))
                elif isinstance(path[0], tuple):  # two figures in one column (None: percent, then not)
                    kinds = (percent, percent) if percent is not None else (True, False)
                    cells.append(", ".join(mean(runs, p, k) for p, k in zip(path, kinds)))
                else:
                    cells.append(mean(runs, path, percent))
            lines.append(f"| {data_name} | {noise} | {folds} | {source} | {100 * wrong:.1f} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_tables(records: list[dict], stem: Path, heading: str) -> None:
    """``STEM.md``: the summary table, then every column."""
    stem.with_suffix(".md").write_text(f"{heading[0].upper()}{heading[1:]}.\n\n{summary_table(records)}\n"
                                       f"Every column:\n\n{tables(records)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=",".join(DATASETS),
                   help="comma-separated, of those, vader and fashion-mnist-blur (default: %(default)s)")
    p.add_argument("--noises", default=",".join(NOISES),
                   help=f"comma-separated of {', '.join(NOISES)} (data sets with their own labels: "
                        f"both of theirs)")
    p.add_argument("--probabilities", default=",".join(SOURCES),
                   help="whose out-of-sample probabilities, comma-separated (default: %(default)s)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--folds", default="3", help="comma-separated fold counts (default: %(default)s, the audit's)")
    p.add_argument("--epochs", type=int, default=8, help="training budget of every run (default %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="wine-red, clean and gaussian 1, one seed, 2 folds, 1 epoch, SOL's probabilities")
    p.add_argument("--timing", action=argparse.BooleanOptionalAction, default=True,
                   help="also time one SOL run on all rows, for the cost of the folds (default: %(default)s)")
    p.add_argument("--from-json", type=Path, nargs="+", metavar="JSON",
                   help="train nothing: write the tables of these runs' records together (with --tag)")
    p.add_argument("--tag", default="")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "label_issues")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's, as a user gets; 1 to run several grids side by side)")
    args = p.parse_args(argv)
    try:
        import cleanlab  # noqa: F401
    except ImportError:
        print("bench_label_issues needs cleanlab: pip install cleanlab", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    stem = "label_issues" + ("_quick" if args.quick else "") + (f"_{args.tag}" if args.tag else "")
    if args.from_json:
        if args.quick or not args.tag:
            p.error("--from-json writes label_issues_TAG.md: give --tag, and no --quick")
        records = [r for path in args.from_json for r in json.loads(path.read_text())]
        if not records or not all(any(s in r for s in SOURCES) for r in records):
            p.error(f"--from-json: expected this benchmark's records, each with an entry of {list(SOURCES)}")
        write_tables(records, args.output / stem, "the runs of " + ", ".join(p.name for p in args.from_json))
        print(summary_table(records))
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.quick:
        datasets, noises, sources, seeds, folds_list, epochs = ["wine-red"], ["clean", "gaussian1"], ["sol"], [0], [2], 1
    else:
        datasets = [d for d in args.data.split(",") if d]
        noises = [n for n in args.noises.split(",") if n]
        unknown = sorted(set(noises) - set(NOISES))
        if unknown:
            p.error(f"--noises: unknown {unknown}; expected some of {list(NOISES)}")
        noises = sorted(set(noises), key=list(NOISES).index)  # the clean cell first: its threshold
        sources = [s for s in args.probabilities.split(",") if s]
        if not sources or set(sources) - set(SOURCES):
            p.error(f"--probabilities: expected some of {list(SOURCES)}, got {args.probabilities!r}")
        seeds = [int(s) for s in args.seeds.split(",") if s]
        folds_list = [int(k) for k in args.folds.split(",") if k]
        epochs = args.epochs
    records = []
    for data_name in datasets:
        if data_name == "vader" and not VADER_FILE.is_file():
            print(f"skipping vader: {VADER_FILE} is absent", file=sys.stderr)
            continue
        thresholds = {}  # (seed, folds): {source: threshold} of the clean cell, which runs first
        for noise in OWN_NOISES.get(data_name, noises):
            for seed in seeds:
                for folds in folds_list:
                    r = run_cell(data_name, noise, seed, folds, epochs, sources, thresholds.get((seed, folds)),
                                 args.timing)
                    records.append(r)
                    if noise in CLEAN_CELLS:
                        thresholds[seed, folds] = {s: r[s]["sol_ext"]["suspicion_at_clean_share"] for s in sources}
                    print(f"{data_name} {noise} seed {seed} folds {folds}: " + "; ".join(
                        f"{s} AUROC {r[s]['sol_ext']['auroc']:.3f} vs {r[s]['cleanlab']['auroc']:.3f}, "
                        f"F1 {r[s]['sol_ext']['f1']:.3f} vs {r[s]['cleanlab']['f1']:.3f}, flagged "
                        f"{100 * r[s]['sol_ext']['flagged']:.1f}% vs {100 * r[s]['cleanlab']['flagged']:.1f}% "
                        f"({r[s]['seconds_folds']:.0f} s)" for s in sources), flush=True)
                    # written after every cell: a long grid stopped early keeps what it measured
                    (args.output / f"{stem}.json").write_text(json.dumps(records, indent=1))
                    write_tables(records, args.output / stem, f"training budget: {epochs} epochs, SOL at "
                                 f"sigma 1, {torch.get_num_threads()} thread(s)")
    print(summary_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
