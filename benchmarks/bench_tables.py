"""Reading tables and writing predictions: ``load_dataset`` of a CSV and a Parquet file against
``pandas.read_csv``, the memory a load adds, and ``sol-ext predict`` rows per second.

    python benchmarks/bench_tables.py                  # 1,000,000 x 12 table, 200,000 rows predicted
    python benchmarks/bench_tables.py --smoke          # 20,000 x 12 and 5,000: seconds
    python benchmarks/bench_tables.py --stream-only    # the 2,000,000-row prediction alone -> stream.json

A table of ``--rows`` rows (11 float features written with 5 decimals, an integer label 0 … 9) is
generated into a temporary folder as CSV and Parquet. Timed, each the median of ``--repeats`` runs in
this process:

- ``load_dataset`` (file to an ``OrdinalDataset`` of float32 features and ranks in memory), CSV and
  Parquet, and ``pandas.read_csv`` of the same CSV (when pandas is installed): their ratio, target <= 3;
- the resident memory a CSV load adds (peak RSS, ``VmHWM``, after the load minus the RSS just
  before it, in a fresh subprocess that has loaded a 100-row file first, so that one-time imports do
  not count; Linux), as a multiple of the float32 feature matrix, target <= 4;
- ``sol-ext predict`` of a ``--predict-rows`` CSV to a CSV, with a run trained for one epoch on 2,000
  rows, rows per second end to end (``python -m sol_ext.driver predict``: the interpreter's start, torch's
  import and the exit included), target >= 100,000; also the same command in this process;
- ``sol-ext predict`` of a long CSV (``--stream-rows``, default 2,000,000), which reads the file once and
  predicts and writes it a slice at a time: rows per second and the peak resident memory it adds (in
  a fresh process that has predicted a 100-row file first), as a multiple of the file's float32
  feature matrix, target <= 3 (plus a buffer that does not grow with the file);
- a wide table (``--wide-rows`` x ``--wide-columns``, default 200 x 5,000: embeddings or expression
  profiles saved as columns): ``load_dataset`` against ``pandas.read_csv``, one epoch of ``sol-ext
  train`` against the same on 50 columns (the cost a column adds beyond the matrix), and ``sol-ext
  predict`` of the table in this process, target < 2 s.

The results (and the targets) go to ``benchmarks/results/tables/tables.json`` (or ``--json``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

RESULTS = Path(__file__).resolve().parent / "results" / "tables" / "tables.json"
STREAM_RESULTS = RESULTS.with_name("stream.json")  # --stream-only
FEATURES = 11
TARGETS = {"csv_vs_pandas": 3.0, "memory_vs_matrix": 4.0, "predict_rows_per_s": 100_000, "wide_predict_s": 2.0,
           "stream_memory_vs_matrix": 3.0}

# Peak resident memory after the load (VmHWM) minus resident memory just before it (VmRSS): what the load
# adds at its peak, whatever the imports' own transient peak was. Not ru_maxrss: a child keeps the peak
# of the process it was forked from, here this one, which has loaded the table itself.
_RSS = """
import sys
def status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024
"""
_MEMORY_PROBE = _RSS + """
from sol_ext.driver.data import load_dataset
load_dataset(sys.argv[2], label_column="label")  # one-time imports (pyarrow loads its pandas shim) first
before = status_mb("VmRSS")
ds = load_dataset(sys.argv[1], label_column="label")
print(status_mb("VmHWM") - before, tuple(ds.features.shape))
"""
_PANDAS_PROBE = _RSS + """
import pandas
pandas.read_csv(sys.argv[2])  # its one-time imports, as for the load
before = status_mb("VmRSS")
df = pandas.read_csv(sys.argv[1])
print(status_mb("VmHWM") - before)
"""

# `sol-ext predict` of a long file: the peak resident memory it adds over the process as it stood after
# predicting a small file (its imports and the run loaded), and its seconds
_STREAM_PROBE = _RSS + """
import time
from sol_ext.driver.cli import main
run, big, small, out = sys.argv[1:5]
main(["predict", run, "--data", small, "--output", out, "--overwrite"])
before = status_mb("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) from here on
start = time.perf_counter()
main(["predict", run, "--data", big, "--output", out, "--overwrite"])
print(status_mb("VmHWM") - before, time.perf_counter() - start)
"""


def write_table(folder: Path, rows: int, seed: int = 0) -> dict[str, Path]:
    """The benchmark table as ``t.csv`` and ``t.parquet`` in ``folder``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).round(5)
    label = np.clip(np.round(2 * x[:, 0] + x[:, 1] + 5), 0, 9).astype(np.int64)
    table = pa.table({**{f"f{k}": x[:, k] for k in range(FEATURES)}, "label": label})
    paths = {"csv": folder / "t.csv", "parquet": folder / "t.parquet"}
    pacsv.write_csv(table, paths["csv"], pacsv.WriteOptions(quoting_style="none"))
    pq.write_table(table, paths["parquet"])
    return paths


def write_wide_table(path: Path, rows: int, columns: int, seed: int = 0) -> Path:
    """A CSV of ``rows`` x ``columns`` float features (5 decimals) and an integer label 0 … 10."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, columns)).round(5)
    label = np.clip(np.round(x[:, :5].sum(axis=1) + 5), 0, 10).astype(np.int64)
    table = pa.table({**{f"c{k}": x[:, k] for k in range(columns)}, "label": label})
    pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="none"))
    return path


def wide_table_times(folder: Path, rows: int, columns: int, repeats: int) -> dict:
    """Loading, one training epoch and predicting a wide table, with their baselines (seconds)."""
    from sol_ext.driver.cli import main
    from sol_ext.driver.data import load_dataset

    wide = write_wide_table(folder / "wide.csv", rows, columns)
    narrow = write_wide_table(folder / "narrow.csv", rows, 50)
    times = {"rows": rows, "columns": columns,
             "load_s": median_seconds(lambda: load_dataset(wide, label_column="label"), repeats)}
    try:
        import pandas
    except ImportError:
        pandas = None
    if pandas is not None:
        times["pandas_read_csv_s"] = median_seconds(lambda: pandas.read_csv(wide), repeats)
    train = ["train", "--epochs", "1", "--sigma", "1", "--quiet", "--no-plots", "--overwrite"]
    for name, path in (("train_epoch_s", wide), ("train_epoch_50_columns_s", narrow)):
        times[name] = median_seconds(
            lambda p=path: main([*train, "--data", str(p), "--output", str(folder / f"run-{p.stem}")]), repeats)
    # the wide table's own run: the narrow one would read 50 of its columns
    predict = ["predict", str(folder / "run-wide"), "--data", str(wide), "--output",
               str(folder / "wide-predictions.csv"), "--overwrite"]
    times["predict_s"] = median_seconds(lambda: main(predict), repeats)
    return times


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def probe(script: str, *paths: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-c", script, *map(str, paths)], check=True, capture_output=True,
                         text=True)
    return out.stdout.split(maxsplit=1)


def predict_rate(folder: Path, rows: int, repeats: int) -> dict:
    """``sol-ext predict`` of ``rows`` CSV rows to a CSV: end to end as a user runs it (``python -m
    sol_ext predict``: the interpreter, torch's import, the kernels' loading and the exit included;
    the median of ``repeats`` runs), which the target is about, and the same command in this process
    (seconds and rows per second)."""
    from sol_ext.driver.cli import main

    for sub in ("train", "new"):
        (folder / sub).mkdir()
    train = write_table(folder / "train", 2000, seed=1)["csv"]
    new = write_table(folder / "new", rows, seed=2)["csv"]
    run = folder / "run"
    assert main(["train", "--data", str(train), "--output", str(run), "--epochs", "1", "--sigma", "1",
                 "--quiet", "--no-plots"]) == 0
    out = folder / "predictions.csv"
    command = [sys.executable, "-m", "sol_ext.driver", "predict", str(run), "--data", str(new), "--output", str(out),
               "--overwrite"]
    end_to_end = median_seconds(lambda: subprocess.run(command, check=True, capture_output=True), repeats)
    start = time.perf_counter()
    assert main(command[3:]) == 0
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
            "end_to_end_seconds": end_to_end, "end_to_end_rows_per_s": rows / end_to_end,
            "csv_bytes": out.stat().st_size}


def stream_predict(folder: Path, rows: int) -> dict:
    """``sol-ext predict`` of a ``rows``-row CSV by the run of :func:`predict_rate` (in ``folder``): its
    seconds and rows per second, and the peak memory it adds against the float32 feature matrix."""
    (folder / "long").mkdir()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(rows, FEATURES)).round(5)
    label = np.clip(np.round(2 * x[:, 0] + x[:, 1] + 5), 0, 9).astype(np.int64)
    path = folder / "long" / "t.csv"
    pacsv.write_csv(pa.table({**{f"f{k}": x[:, k] for k in range(FEATURES)}, "label": label}), path,
                    pacsv.WriteOptions(quoting_style="none"))
    del x, label
    (folder / "short").mkdir()
    small = write_table(folder / "short", 100, seed=4)["csv"]
    out = subprocess.run([sys.executable, "-c", _STREAM_PROBE, *map(str, (folder / "run", path, small,
                                                                         folder / "long" / "p.csv"))],
                         check=True, capture_output=True, text=True).stdout
    added, seconds = map(float, out.splitlines()[-1].split())  # after the command's own lines
    matrix_mb = rows * FEATURES * 4 / 2**20
    return {"rows": rows, "csv_bytes": path.stat().st_size, "seconds": seconds, "rows_per_s": rows / seconds,
            "memory_added_mb": added, "matrix_mb": matrix_mb, "memory_vs_matrix": added / matrix_mb}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the loaded table")
    parser.add_argument("--predict-rows", type=int, default=200_000, help="rows predicted")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported")
    parser.add_argument("--stream-rows", type=int, default=2_000_000,
                        help="rows of the long file predicted in slices")
    parser.add_argument("--wide-rows", type=int, default=200, help="rows of the wide table")
    parser.add_argument("--wide-columns", type=int, default=5000, help="feature columns of the wide table")
    parser.add_argument("--smoke", action="store_true",
                        help="20,000 rows loaded, 5,000 predicted, a 50 x 500 wide table, one run")
    parser.add_argument("--stream-only", action="store_true",
                        help=f"only the prediction of --stream-rows rows in slices (default json: {STREAM_RESULTS})")
    parser.add_argument("--json", type=Path, default=None, help=f"where the results go (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.stream_only:
        return _stream_only(args)
    args.json = args.json or RESULTS
    if args.smoke:
        args.rows, args.predict_rows, args.repeats, args.stream_rows = 20_000, 5_000, 1, 20_000
        args.wide_rows, args.wide_columns = 50, 500
    from sol_ext.driver.data import load_dataset

    result: dict = {"rows": args.rows, "columns": FEATURES + 1, "repeats": args.repeats, "cpus": os.cpu_count(),
                    "pyarrow": pa.__version__, "targets": TARGETS}
    with tempfile.TemporaryDirectory(prefix="bench-tables-") as tmp:
        folder = Path(tmp)
        paths = write_table(folder, args.rows)
        result["csv_bytes"] = paths["csv"].stat().st_size
        (folder / "small").mkdir()
        small = write_table(folder / "small", 100)["csv"]
        for kind, path in paths.items():
            result[f"load_{kind}_s"] = median_seconds(lambda p=path: load_dataset(p, label_column="label"),
                                                      args.repeats)
        try:
            import pandas
        except ImportError:
            pandas = None
        if pandas is not None:
            result["pandas_read_csv_s"] = median_seconds(lambda: pandas.read_csv(paths["csv"]), args.repeats)
            result["csv_vs_pandas"] = result["load_csv_s"] / result["pandas_read_csv_s"]
            result["pandas_memory_mb"] = float(probe(_PANDAS_PROBE, paths["csv"], small)[0])
        added, shape = probe(_MEMORY_PROBE, paths["csv"], small)
        matrix_mb = args.rows * FEATURES * 4 / 2**20
        result.update(memory_added_mb=float(added), matrix_mb=matrix_mb,
                      memory_vs_matrix=float(added) / matrix_mb, loaded_shape=shape.strip())
        result["predict"] = predict_rate(folder, args.predict_rows, args.repeats)
        result["stream"] = stream_predict(folder, args.stream_rows)
        (folder / "wide").mkdir()
        result["wide"] = wide_table_times(folder / "wide", args.wide_rows, args.wide_columns, args.repeats)
    result["predict_rows_per_s"] = result["predict"]["end_to_end_rows_per_s"]

    print(f"{args.rows:,} x {FEATURES + 1} table ({result['csv_bytes'] / 2**20:.0f} MB CSV), "
          f"{os.cpu_count()} CPUs, median of {args.repeats}:")
    print(f"  load_dataset CSV      {result['load_csv_s']:.2f} s")
    print(f"  load_dataset Parquet  {result['load_parquet_s']:.2f} s")
    if "pandas_read_csv_s" in result:
        print(f"  pandas.read_csv       {result['pandas_read_csv_s']:.2f} s  -> CSV load / pandas = "
              f"{result['csv_vs_pandas']:.2f} (target <= {TARGETS['csv_vs_pandas']:g})")
    else:
        print("  pandas.read_csv       (pandas not installed: no ratio)")
    print(f"  memory a CSV load adds {result['memory_added_mb']:.0f} MB = {result['memory_vs_matrix']:.2f} x the "
          f"float32 features ({matrix_mb:.0f} MB; target <= {TARGETS['memory_vs_matrix']:g})")
    p = result["predict"]
    print(f"  sol-ext predict {p['rows']:,} rows to CSV, end to end (start-up and exit included): "
          f"{p['end_to_end_seconds']:.2f} s = {p['end_to_end_rows_per_s']:,.0f} rows/s (target >= "
          f"{TARGETS['predict_rows_per_s']:,}); the same in a process that has loaded torch: "
          f"{p['seconds']:.2f} s = {p['rows_per_s']:,.0f} rows/s")
    _print_stream(result["stream"])
    w = result["wide"]
    baseline = (f" (pandas.read_csv {w['pandas_read_csv_s']:.2f} s)" if "pandas_read_csv_s" in w else "")
    print(f"  wide table {w['rows']} x {w['columns']}: load_dataset {w['load_s']:.2f} s{baseline}; one training "
          f"epoch {w['train_epoch_s']:.2f} s (50 columns: {w['train_epoch_50_columns_s']:.2f} s); sol-ext predict "
          f"{w['predict_s']:.2f} s (target < {TARGETS['wide_predict_s']:g} s)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _print_stream(st: dict) -> None:
    print(f"  sol-ext predict {st['rows']:,} rows ({st['csv_bytes'] / 2**20:.0f} MB CSV) in slices, in a process "
          f"that has imported torch: {st['seconds']:.2f} s = {st['rows_per_s']:,.0f} rows/s; peak memory added "
          f"{st['memory_added_mb']:.0f} MB = {st['memory_vs_matrix']:.2f} x the float32 features "
          f"({st['matrix_mb']:.0f} MB; target <= {TARGETS['stream_memory_vs_matrix']:g} plus a bounded buffer)")


def _stream_only(args: argparse.Namespace) -> int:
    """``--stream-only``: a run trained on 2,000 rows, then the long file's prediction."""
    result: dict = {"cpus": os.cpu_count(), "pyarrow": pa.__version__,
                    "target": {"stream_memory_vs_matrix": TARGETS["stream_memory_vs_matrix"]}}
    with tempfile.TemporaryDirectory(prefix="bench-tables-") as tmp:
        folder = Path(tmp)
        predict_rate(folder, 1000, 1)  # trains the run
        result["stream"] = stream_predict(folder, args.stream_rows)
    result["load_average"] = os.getloadavg()[0]  # other work on the machine: seconds are comparable only at a like load
    _print_stream(result["stream"])
    print(f"  load average (1 min) at the end: {result['load_average']:.2f}")
    path = args.json or STREAM_RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
