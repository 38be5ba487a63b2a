"""Many ranks and annotator noise that grows with the rank: a synthetic age-like data set.

    python benchmarks/bench_many_ranks.py            # 6 methods x 2 label sets x 3 seeds (about 5 min on 2 cores)
    python benchmarks/bench_many_ranks.py --quick    # a smoke run: 2 methods, one seed, 2 epochs
    python benchmarks/bench_many_ranks.py --methods sol,corn --sol-option weight_ema=0.99  # a variant of sol
    python benchmarks/bench_many_ranks.py --feature-dim 384  # features spread over 384 dims, like text embeddings

The built-in data sets have 6–29 ranks and noise that does not depend on the rank. Human labels
of ages often have more ranks and an error that grows with the age. This benchmark makes such a
set, deterministically (numpy seed 0):

- 12 standard-normal features; the true age is 40 + 18 tanh(x.w / 2) + 3 x_0 x_1 plus N(0, 2^2)
  (w evenly spaced in [-1, 1]), rounded and clipped to 16 … 77;
- one annotator's labels: the true age plus N(0, s^2) with s = 2 + 0.1 (age - 16) years
  (2 at 16, 8 at 76), rounded and clipped to 16 … 77;
- 4000 training samples and 1500 test samples, the test set with true ages;
- with ``--feature-dim D`` (> 12), the 12 features plus D - 12 features of noise (std 0.5), turned by
  a fixed random rotation: every one of the D inputs then carries a little of the signal, as the
  dimensions of a sentence or image embedding do.

Every method trains twice, with the true ages and with the annotator's labels as training labels,
through ordinary ``sol-ext train`` runs (``--data train.csv --test-data test.csv``; 10 % of the
training file is the validation split, with the same labels as the rest). Writes
``many_ranks.md`` (mean ± std of test MAE and CS, the test MAE by true-age band, and how closely
each method fits the annotator's errors) and ``many_ranks.json`` (every run).

How much a method memorizes the annotator's errors shows on its own training samples (the rows
it fitted, not the validation split): ``train_mae_true`` is the MAE of its predictions there
against the true ages, and ``error_corr`` the correlation of its prediction error
(prediction - true age) with the annotator's error (label - true age). A method that learns the
ages, not the labels, has ``error_corr`` near 0 and ``train_mae_true`` near its test MAE.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sol_ext.driver.compare import mean_std, mean_std_table, method_config
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.prepare import prepare_data
from sol_ext.driver.train import train, validation_split

METHODS = ("sol", "sol-paper", "sol-no-noise", "l1", "ce", "corn")
LABEL_SETS = ("true ages", "annotator")
FEATURES, TRAIN_SIZE, TEST_SIZE = 12, 4000, 1500
AGE_RANGE = (16, 77)
# true-age bands of the per-band test MAE (years; the last one open to 77)
AGE_BANDS = ((16, 30), (31, 45), (46, 60), (61, 77))


def annotator_std(ages: np.ndarray) -> np.ndarray:
    """The std in years of the annotator's error at each true age: 2 at 16, growing by 0.1 a year."""
    return 2.0 + 0.1 * (np.asarray(ages, dtype=np.float64) - AGE_RANGE[0])


def make_data(seed: int = 0, feature_dim: int = FEATURES) -> dict[str, np.ndarray]:
    """Features, true ages and one annotator's ages of the training set, and the test set; with
    ``feature_dim`` above :data:`FEATURES`, the features spread over that many dimensions
    (:func:`spread_features`), the ages unchanged."""
    rng = np.random.default_rng(seed)
    weights = np.linspace(-1.0, 1.0, FEATURES)

    def true_ages(x: np.ndarray) -> np.ndarray:
        age = 40 + 18 * np.tanh(x @ weights / 2) + 3 * x[:, 0] * x[:, 1] + rng.normal(0.0, 2.0, len(x))
        return np.clip(np.round(age), *AGE_RANGE).astype(np.int64)

    x_train = rng.normal(size=(TRAIN_SIZE, FEATURES))
    train_true = true_ages(x_train)
    error = rng.normal(0.0, 1.0, TRAIN_SIZE) * annotator_std(train_true)
    annotator = np.clip(np.round(train_true + error), *AGE_RANGE).astype(np.int64)
    x_test = rng.normal(size=(TEST_SIZE, FEATURES))
    test = true_ages(x_test)
    if feature_dim != FEATURES:
        x_train, x_test = spread_features((x_train, x_test), feature_dim)
    return {"x_train": x_train, "true ages": train_true, "annotator": annotator,
            "x_test": x_test, "test": test}


def spread_features(parts: tuple[np.ndarray, ...], dim: int, seed: int = 1) -> tuple[np.ndarray, ...]:
    """Each ``[N, FEATURES]`` part with ``dim - FEATURES`` columns of noise (std 0.5) appended,
    turned by one random rotation of ``dim`` dimensions (fixed by ``seed``)."""
    if dim < FEATURES:
        raise ValueError(f"feature_dim must be at least {FEATURES} (the features), got {dim}")
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    return tuple(np.concatenate([x, rng.normal(0.0, 0.5, (len(x), dim - FEATURES))], 1) @ rotation.T
                 for x in parts)


def write_csv(path: Path, x: np.ndarray, ages: np.ndarray) -> None:
    header = ",".join([f"f{i}" for i in range(x.shape[1])] + ["age"])
    rows = np.column_stack([np.round(x, 5), ages])
    np.savetxt(path, rows, delimiter=",", header=header, comments="", fmt=["%.5f"] * x.shape[1] + ["%d"])


def band_mae(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """Test MAE of the samples of each true-age band of :data:`AGE_BANDS` ("lo-hi": MAE)."""
    out = {}
    for lo, hi in AGE_BANDS:
        inside = (true >= lo) & (true <= hi)
        out[f"{lo}-{hi}"] = float(np.abs(pred[inside] - true[inside]).mean()) if inside.any() else None
    return out


def fit_to_noise(pred: np.ndarray, true: np.ndarray, annotator: np.ndarray) -> dict[str, float]:
    """How a run's predictions on its fitted training rows relate to the true ages and to the
    annotator's errors (see the module docstring)."""
    error = pred - true
    noise = annotator - true
    corr = float(np.corrcoef(error, noise)[0, 1]) if error.std() > 0 and noise.std() > 0 else 0.0
    return {"train_mae_true": float(np.abs(error).mean()), "error_corr": corr}


def parse_options(items) -> dict:
    """``KEY=VALUE`` strings as TrainConfig fields (values read as JSON where they parse: numbers,
    true/false, null; else as text)."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--sol-option {item!r}: expected KEY=VALUE with KEY a TrainConfig field.")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def run(methods, seeds, epochs, work_dir: Path, log=print, sol_options=None,
        feature_dim: int = FEATURES) -> list[dict]:
    """Writes the CSV files and the run folders into ``work_dir``; returns one record per run.
    ``sol_options``: TrainConfig fields set on the ``sol`` rows only (a variant of the default)."""
    data = make_data(feature_dim=feature_dim)
    files = {}
    for name in LABEL_SETS:
        files[name] = work_dir / f"train-{name.replace(' ', '-')}.csv"
        write_csv(files[name], data["x_train"], data[name])
    test_file = work_dir / "test.csv"
    write_csv(test_file, data["x_test"], data["test"])
    label_error = float(np.abs(data["annotator"] - data["true ages"]).mean())
    log(f"annotator labels: MAE {label_error:.2f} years against the true ages")
    records = []
    total = len(LABEL_SETS) * len(seeds) * len(methods)
    for name in LABEL_SETS:
        for seed in seeds:
            base = TrainConfig(data=str(files[name]), test_data=str(test_file), label_column="age",
                               noise="none", seed=seed, epochs=epochs)
            prepared = prepare_data(base.validate())
            for method in methods:
                cfg = method_config(base, method)
                if method == "sol" and sol_options:
                    cfg = dataclasses.replace(cfg, **sol_options).validate()
                # the file rows the encoder fits: the complement of this method's validation split
                # (sol-paper has none and fits every row)
                fit = validation_split(prepared.train_given, cfg.val_fraction, seed).fit
                rows = (fit if prepared.train_rows is None else prepared.train_rows[fit]).numpy()
                start = time.perf_counter()
                outcome = train(cfg, prepared, work_dir / "runs" / name.replace(" ", "-") / method / f"seed{seed}",
                                log=lambda _line: None)
                res = outcome.results
                decode = prepared.grid.decode
                test_pred = decode(outcome.test_pred.cpu()).numpy()
                train_pred = decode(outcome.train_pred.cpu()).numpy()
                records.append({"labels": name, "method": method, "seed": seed, "mae": res["test"]["mae"],
                                "cs": res["test"]["cs"], "cs_theta": res["cs_theta"],
                                "selected_epoch": res["selected_epoch"],
                                "band_mae": band_mae(test_pred, data["test"]),
                                **fit_to_noise(train_pred, data["true ages"][rows], data["annotator"][rows]),
                                "seconds": time.perf_counter() - start})
                r = records[-1]
                log(f"[{len(records)}/{total}] {name} {method} seed {seed}: MAE {r['mae']:.3f}  "
                    f"CS {r['cs']:.1f}%  epoch {r['selected_epoch']}  {r['seconds']:.1f}s")
    return records


def tables(records) -> str:
    settings = [(name, i) for i, name in enumerate(LABEL_SETS) if any(r["labels"] == name for r in records)]
    methods = list(dict.fromkeys(r["method"] for r in records))
    seeds = len({r["seed"] for r in records})
    theta = records[0]["cs_theta"]
    lines = []
    for metric, title, fmt, better in (("mae", "test MAE in years (lower is better)", "{:.3f} ± {:.3f}", min),
                                       ("cs", f"test CS@{theta:g} in % (higher is better)", "{:.1f} ± {:.1f}", max)):
        values: dict = {}
        for r in records:
            values.setdefault(((r["labels"], LABEL_SETS.index(r["labels"])), r["method"]), []).append(r[metric])
        cell = {key: mean_std(v) for key, v in values.items()}
        lines += mean_std_table(f"**many ranks: {title}, by training labels, mean ± std over {seeds} seeds**",
                                {s: s[0] for s in settings}, methods, cell, fmt, better)
    for name, _ in settings:
        runs = [r for r in records if r["labels"] == name and "band_mae" in r]
        if not runs:
            continue
        bands = [f"{lo}-{hi}" for lo, hi in AGE_BANDS]
        cell = {}
        for method in methods:
            mine = [r for r in runs if r["method"] == method]
            for band in bands:
                values = [r["band_mae"][band] for r in mine if r["band_mae"][band] is not None]
                if values:
                    cell[((band, 0), method)] = mean_std(values)
            for key, column in (("train_mae_true", "train MAE vs true ages"),
                                ("error_corr", "corr(error, annotator's error)")):
                if mine:
                    cell[((column, 0), method)] = mean_std([r[key] for r in mine])
        columns = [(b, 0) for b in bands] + [("train MAE vs true ages", 0), ("corr(error, annotator's error)", 0)]
        lines += mean_std_table(
            f"**many ranks, {name} as training labels: test MAE by true-age band (years), and the fit "
            f"on the training rows, mean ± std over {seeds} seeds**",
            {s: s[0] for s in columns}, methods, cell, "{:.3f} ± {:.3f}", min)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    p.add_argument("--output", type=Path, default=Path("benchmarks/results/many_ranks"),
                   help="folder for many_ranks.md and many_ranks.json")
    p.add_argument("--work", type=Path, default=None,
                   help="folder for the CSV files and the runs (default: a temporary folder, removed after)")
    p.add_argument("--quick", action="store_true", help="sol and l1, one seed, 2 epochs (a smoke run)")
    p.add_argument("--sol-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a TrainConfig field for the sol rows only, e.g. weight_ema=0.99 (repeatable)")
    p.add_argument("--feature-dim", type=int, default=FEATURES,
                   help=f"spread the {FEATURES} features over this many dimensions (default {FEATURES}: as they are)")
    args = p.parse_args(argv)
    if args.feature_dim < FEATURES:
        p.error(f"--feature-dim must be at least {FEATURES}, got {args.feature_dim}")
    try:
        sol_options = parse_options(args.sol_option)
        if sol_options:  # refused before any run, not by the first sol run
            dataclasses.replace(TrainConfig(), **sol_options).validate()
    except (TypeError, ValueError) as e:
        p.error(str(e))
    methods, seeds, epochs = args.methods.split(","), [int(s) for s in args.seeds.split(",")], args.epochs
    if args.quick:
        methods, seeds, epochs = ["sol", "l1"], [0], 2
    args.output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        records = run(methods, seeds, epochs, work, sol_options=sol_options, feature_dim=args.feature_dim)
    md = tables(records) + f"\n{len(records)} runs, {(time.perf_counter() - start) / 60:.1f} min wall time.\n"
    if args.feature_dim != FEATURES:
        md += f"The {FEATURES} features spread over {args.feature_dim} dimensions (--feature-dim).\n"
    if sol_options:
        md += f"sol rows with {', '.join(f'{k}={v}' for k, v in sol_options.items())}.\n"
    (args.output / "many_ranks.json").write_text(json.dumps(records, indent=1) + "\n")
    (args.output / "many_ranks.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
