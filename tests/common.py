"""Helpers shared by the tests: devices, tolerances, random SOL inputs, spawned gloo processes."""
from __future__ import annotations

import csv
import datetime
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

# The repository: tests find the sources, docs and examples from here, whichever folder they live in.
REPO_ROOT = Path(__file__).resolve().parents[1]

CUDA_REASON = "needs a CUDA GPU and a build of sol_ext with CUDA kernels"


def cuda_ready() -> bool:
    import sol_ext

    return torch.cuda.is_available() and sol_ext.cuda_kernels_available()


def cpu_and_cuda():
    """Device parameters; the CUDA case skips itself where there is no GPU (or no CUDA build)."""
    return ("cpu", pytest.param("cuda", marks=pytest.mark.skipif(not cuda_ready(), reason=CUDA_REASON)))


# Relative error bounds of the fused kernels against the reference, per dtype.
REL_TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "") -> None:
    """max |actual - expected| <= tol * max |expected| (exact equality required when expected is all 0)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.numel() == 0:
        return
    actual, expected = actual.double().cpu(), expected.double().cpu()
    error = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert error <= tol * scale, f"{what}: max abs error {error:.3e} > {tol:.0e} x max |expected| {scale:.3e}"


def noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values, stored transposed (a non-contiguous view)."""
    return t.T.contiguous().T if t.dim() == 2 else t.repeat_interleave(2)[::2]


def random_labels(batch_size: int, num_ranks: int, generator: torch.Generator, device="cpu") -> torch.Tensor:
    """Random ranks that include 0 and n-1 whenever the batch has room."""
    labels = torch.randint(0, num_ranks, (batch_size,), generator=generator)
    if batch_size >= 2:
        labels[0], labels[-1] = 0, num_ranks - 1
    return labels.to(device)


def random_pairs(batch_size: int, count: int, generator: torch.Generator, device="cpu") -> torch.Tensor:
    """Explicit pairs with some x == y and some repeated rows."""
    pairs = torch.randint(0, batch_size, (count, 2), generator=generator)
    if count >= 4:
        pairs[0, 1] = pairs[0, 0]  # x == y
        pairs[-1] = pairs[1]  # a repeat
        pairs[-2] = pairs[1].flip(0)  # the same pair, other orientation
    return pairs.to(device)


# Every test that starts several processes (spawned gloo groups, torchrun, Lightning DDP) waits this
# long for them: a hang is still caught, and a machine whose cores are busy with another job (CI right
# after other work) has room to import torch in each process and finish.
MULTIPROCESS_TIMEOUT_S = 600


def multiprocess_env() -> dict:
    """The environment for a subprocess that starts a process group: loopback only, one thread each
    (two processes on two cores, beside whatever else runs)."""
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _in_process_group(rank: int, worker, world_size: int, store_path: str, timeout_s: float, *args) -> None:
    """``worker(rank, world_size, *args)`` inside a gloo process group that meets in the file
    ``store_path`` (one thread per process); then the process ends without the interpreter's shutdown:
    torch's gloo can abort there after DistributedDataParallel ("terminate called without an active
    exception", about one run in twelve with plain torch), which would fail a test whose work is done."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s))
    try:
        worker(rank, world_size, *args)
    finally:
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_processes(worker, world_size: int, args: tuple, timeout_s: float = MULTIPROCESS_TIMEOUT_S) -> None:
    """Run ``worker(rank, world_size, *args)`` in ``world_size`` spawned processes, each in one gloo
    process group; fail the test if they do not finish in ``timeout_s``.

    The group meets in a file of a fresh folder rather than on a TCP port picked in advance: a port
    found free here can be taken by another program before the processes bind it."""
    rendezvous = tempfile.mkdtemp(prefix="sol_ext_group_")
    context = torch.multiprocessing.start_processes(
        _in_process_group, args=(worker, world_size, os.path.join(rendezvous, "store"), timeout_s, *args),
        nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"{world_size} spawned processes did not finish within {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
        shutil.rmtree(rendezvous, ignore_errors=True)


def write_csv(path, rows, header=("a", "b", "label")):
    """A CSV file of ``rows`` under ``header``; returns ``path``."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def tiny_csv(path, n=120, num_ranks=10, seed=0, step=None):
    """A small data file for the command line: two features and a label 20 + rank (times ``step``
    when given, else whole numbers)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, num_ranks, (n,), generator=g)
    rows = [(float(v) + 0.3 * float(e), float(e), 20 + int(v) if step is None else round(20 + step * int(v), 6))
            for v, e in zip(r, torch.randn(n, generator=g))]
    return write_csv(path, rows)


def load_benchmark(name: str):
    """The module of ``benchmarks/<name>.py`` (the benchmarks are scripts, not a package)."""
    path = os.path.join(REPO_ROOT, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A quick, quiet training on tiny data: the runs of the driver tests.
QUICK_TRAIN = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16",
               "--lr", "0.01", "--quiet", "--no-plots"]


def train_argv(data, out, *extra) -> list:
    """``sol-ext train`` of ``data`` into ``out``, quick and quiet, then ``extra``."""
    return ["train", "--data", str(data), "--output", str(out), *QUICK_TRAIN, *extra]


def snapshot(folder) -> dict:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*"))
            if p.is_file()}


def expect_error(capsys, argv, *needles, absent=()):
    """``sol-ext argv`` fails with status 2 and one line ``sol-ext: error: ...`` on stderr, no
    traceback, holding every one of ``needles`` and none of ``absent``; returns the line."""
    from sol_ext.driver.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("sol-ext: error:"), err
    for needle in needles:
        assert needle in err, err
    for needle in absent:
        assert needle not in err, err
    return err


# The driver's tests on a small prepared data set: ranks readable from the features.
TINY_SETTINGS = dict(data="tiny", epochs=2, batch_size=16, embedding_dim=4, hidden=(16,), lr=1e-2, beta=0.5)


def tiny_data(n_train=96, n_test=32, num_ranks=8, seed=0):
    """A driver's PreparedData: ranks readable from the features, plus label noise on the training part."""
    from sol_ext.driver.prepare import PreparedData
    from sol_ext.labels import LabelGrid

    g = torch.Generator().manual_seed(seed)

    def make(n):
        r = torch.randint(0, num_ranks, (n,), generator=g)
        x = torch.randn(n, 4, generator=g) * 0.3
        x[:, 0] += r.float()
        return x, r

    xtr, clean = make(n_train)
    xte, rte = make(n_test)
    noisy = (clean + torch.randint(-2, 3, (n_train,), generator=g)).clamp(0, num_ranks - 1)
    return PreparedData(name="tiny", kind="tabular", grid=LabelGrid(10.0, 0.5, num_ranks),
                        train_x=xtr, train_given=noisy, train_clean=clean, test_x=xte,
                        test_ranks=rte, train_rows=torch.arange(n_train))
