"""Serving a table model: onnxruntime on the exported ONNX model against the ``torch.export`` program.

    python benchmarks/bench_onnx.py                 # 200,000 rows, all of this process's cores
    python benchmarks/bench_onnx.py --threads 1     # one core each
    python benchmarks/bench_onnx.py --smoke         # 5,000 rows: seconds

A run is trained for one epoch on 2,000 rows of benchmarks/bench_tables.py's table (11 float features,
labels 0 … 9) and exported both ways (``sol-ext export`` and ``sol-ext export --format onnx``). Then
``--rows`` new rows (float32) are predicted in one call by each, in this process, on the same number of
threads: ``torch.set_num_threads(T)`` for the program, ``intra_op_num_threads=T`` (and one inter-op
thread) for onnxruntime's CPU session; each the median of ``--repeats`` calls after one warm-up call.
Reported: rows per second of each, their ratio (target: onnxruntime >= the program) and the agreement
of the outputs (the share of equal ranks, the largest probability difference).

The results go to ``benchmarks/results/onnx/onnx.json`` (or ``--json``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when loaded by path
from bench_tables import FEATURES, median_seconds, write_table  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "onnx" / "onnx.json"
TARGETS = {"onnx_vs_pt2": 1.0}


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def export_both(folder: Path) -> Path:
    """A run trained for one epoch on 2,000 rows, exported as RUN/model.pt2 and RUN/model.onnx."""
    from sol_ext.driver.cli import main

    (folder / "train").mkdir()
    train = write_table(folder / "train", 2000, seed=1)["csv"]
    run = folder / "run"
    assert main(["train", "--data", str(train), "--output", str(run), "--epochs", "1", "--sigma", "1",
                 "--quiet", "--no-plots"]) == 0
    assert main(["export", str(run)]) == 0
    assert main(["export", str(run), "--format", "onnx"]) == 0
    return run


def throughput(run: Path, rows: int, threads: int, repeats: int) -> dict:
    """Rows per second of the .pt2 program and of onnxruntime on ``rows`` new rows, ``threads`` each."""
    import onnxruntime
    import torch

    x = np.random.default_rng(2).normal(size=(rows, FEATURES)).round(5).astype(np.float32)
    torch.set_num_threads(threads)
    program = torch.export.load(str(run / "model.pt2")).module()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(run / "model.onnx"), options, providers=["CPUExecutionProvider"])
    x_torch = torch.from_numpy(x)

    def run_program():
        with torch.no_grad():
            return [t.numpy() for t in program(x_torch)]

    def run_onnx():
        return session.run(None, {"x": x})

    expected, got = run_program(), run_onnx()  # also the warm-up calls
    pt2_s = median_seconds(run_program, repeats)
    onnx_s = median_seconds(run_onnx, repeats)
    return {"rows": rows, "threads": threads, "repeats": repeats,
            "pt2_s": pt2_s, "onnx_s": onnx_s,
            "pt2_rows_per_s": rows / pt2_s, "onnx_rows_per_s": rows / onnx_s, "onnx_vs_pt2": pt2_s / onnx_s,
            "ranks_equal": float(np.mean(expected[0] == got[0])),
            "max_probability_difference": float(np.abs(expected[2] - got[2]).max())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows predicted (default 200,000)")
    parser.add_argument("--threads", type=int, default=available_cores(),
                        help="threads of each runtime (default: this process's cores)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each, the median (default 5)")
    parser.add_argument("--smoke", action="store_true", help="5,000 rows, 2 repeats: seconds")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where the results go (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.repeats = 5_000, 2
    import onnxruntime
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        result = throughput(export_both(Path(tmp)), args.rows, args.threads, args.repeats)
    result.update(targets=TARGETS, cores=available_cores(), machine=platform.processor() or platform.machine(),
                  torch=torch.__version__, onnxruntime=onnxruntime.__version__)
    print(f"{result['rows']:,} table rows ({FEATURES} features), {result['threads']} thread(s) each, "
          f"median of {result['repeats']}:")
    print(f"  torch.export program (.pt2)  {result['pt2_s']:.3f} s  {result['pt2_rows_per_s']:,.0f} rows/s")
    print(f"  onnxruntime (.onnx)          {result['onnx_s']:.3f} s  {result['onnx_rows_per_s']:,.0f} rows/s")
    print(f"  onnxruntime / program = {result['onnx_vs_pt2']:.2f} (target >= {TARGETS['onnx_vs_pt2']:g}); "
          f"ranks equal on {100 * result['ranks_equal']:.1f}% of rows, probabilities within "
          f"{result['max_probability_difference']:.1e}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
