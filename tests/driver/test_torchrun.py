"""``sol-ext train`` on several processes (torchrun, gloo on the CPU) and the driver's collectives.

The collective pieces (sharding, the all-reduced centroid rule, sharded embedding) run in spawned gloo
processes and are compared with one process on the same data. The command itself runs under
``torchrun --standalone`` (loopback, a free port) with 2 processes and a timeout: outputs from rank 0
only, ``world_size`` in results.json, the training loss of one process with the global batch,
``--resume`` with another number of processes refused, and one failing process ending the whole run.

Which process reaches a line first is a race, decided by the machine's load: no test asserts its winner
(a refusal every process makes may be printed by any of them before torchrun ends the others).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from common import MULTIPROCESS_TIMEOUT_S, multiprocess_env, spawn_processes
from sol_ext import distributed
from sol_ext.centroids import compute_centroids, embed
from sol_ext.driver.fit import _embed_all
from sol_ext.driver.loader import RunInputs
from sol_ext.driver.parallel import Parallel, state_digest
from sol_ext.ops import noise_kernel

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")

N, DIM, NUM_RANKS = 23, 6, 7  # 23 rows: unequal shards for 2 and 3 processes


# The driver's shards are sol_ext.distributed.shard's: tests/integrations/test_distributed.py
# (test_shards_cover_every_sample_once) covers them.


def test_environment_of_a_single_process_and_of_torchrun(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert Parallel.from_environment() == Parallel()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    par = Parallel.from_environment()
    assert (par.world_size, par.rank, par.local_rank, par.enabled, par.is_main) == (4, 3, 1, True, False)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="RANK < WORLD_SIZE"):
        Parallel.from_environment()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x' is not an integer"):
        Parallel.from_environment()


def test_state_digest_changes_with_any_label_or_centroid():
    labels = torch.tensor([0, 3, 1, 1])
    centroids = torch.randn(4, 3)
    base = state_digest(labels, centroids)
    swapped = labels[[1, 0, 2, 3]]  # same multiset, other order
    assert not torch.equal(base, state_digest(swapped, centroids))
    nudged = centroids.clone()
    nudged[2, 1] += 1e-6
    assert not torch.equal(base, state_digest(labels, nudged))
    assert torch.equal(base, state_digest(labels.clone(), centroids.clone()))


# ------------------------------------------------------------------------------------------------
# Spawned gloo processes: the driver's collectives against one process.
# ------------------------------------------------------------------------------------------------


def _data():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(N, 4, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, NUM_RANKS, (N,), generator=gen)
    labels[labels == 2] = 3  # a rank without samples: its centroid is interpolated
    return x, labels


def _encoder():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, DIM), torch.nn.Tanh()).double()


def _worker(rank, world_size, out_dir):
    par = Parallel(world_size=world_size, rank=rank, local_rank=rank)
    x, labels = _data()
    model = _encoder()
    # batches of 4 rows: several per shard
    h = _embed_all(model, RunInputs(x, torch.device("cpu")), 4, torch.device("cpu"), par)
    shard = distributed.shard(N)
    kernel = noise_kernel(NUM_RANKS, 1.0, dtype=torch.float64)
    centroids = compute_centroids(h[shard], labels[shard], kernel, all_reduce=distributed.all_reduce_sum())
    torch.save({"h": h, "centroids": centroids}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_embedding_and_all_reduced_centroids_equal_one_process(world_size, tmp_path):
    """Every process ends with the same embeddings and centroids, equal to one process's on the
    whole training set (centroids to float64 rounding: the sums are added in another order)."""
    spawn_processes(_worker, world_size, (str(tmp_path),))
    x, labels = _data()
    h_single = embed(_encoder(), x, 4, "cpu")
    kernel = noise_kernel(NUM_RANKS, 1.0, dtype=torch.float64)
    mu_single = compute_centroids(h_single, labels, kernel)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    for rank, got in enumerate(per_rank):
        torch.testing.assert_close(got["h"], h_single, rtol=1e-12, atol=1e-12, msg=f"rank {rank}")
        torch.testing.assert_close(got["centroids"], mu_single, rtol=1e-10, atol=1e-12, msg=f"rank {rank}")
        assert torch.equal(got["centroids"], per_rank[0]["centroids"]), f"rank {rank} differs from rank 0"
        assert torch.equal(got["h"], per_rank[0]["h"])


# ------------------------------------------------------------------------------------------------
# The command under torchrun.
# ------------------------------------------------------------------------------------------------

TRAIN = ["train", "--epochs", "1", "--no-plots", "--quiet", "--seed", "3"]


def _torchrun(args, cwd, processes=2, script=None):
    target = [script] if script else ["-m", "sol_ext.driver"]
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
         *target, *args],
        capture_output=True, text=True, timeout=MULTIPROCESS_TIMEOUT_S, cwd=cwd, env=multiprocess_env())


def _single(args, cwd):
    return subprocess.run([sys.executable, "-m", "sol_ext.driver", *args], capture_output=True, text=True,
                          timeout=MULTIPROCESS_TIMEOUT_S, cwd=cwd)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sol", "l1"])
def test_two_processes_train_as_one_process_with_the_global_batch(method, tmp_path):
    two = _torchrun([*TRAIN, "--method", method, "--batch-size", "32", "--output", "two"], tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    one = _single([*TRAIN, "--method", method, "--batch-size", "64", "--output", "one"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    r2 = json.loads((tmp_path / "two" / "results.json").read_text())
    r1 = json.loads((tmp_path / "one" / "results.json").read_text())
    assert (r2["world_size"], r1["world_size"]) == (2, 1)
    # the mean loss over the epoch's steps: float32, summed in another order
    loss2, loss1 = r2["history"][0]["train_loss"], r1["history"][0]["train_loss"]
    assert abs(loss2 - loss1) <= 1e-5 * abs(loss1), (loss2, loss1)
    # rank 0 alone reports: one results table
    assert two.stdout.count("results in") == 1, two.stdout
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir())


@pytest.mark.slow
def test_resume_needs_the_same_number_of_processes(tmp_path):
    first = _torchrun([*TRAIN, "--output", "run"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    alone = _single([*TRAIN, "--epochs", "2", "--output", "run", "--resume"], tmp_path)
    assert alone.returncode == 2
    assert "written by a run of 2 process(es) and this one has 1" in alone.stderr, alone.stderr
    again = _torchrun([*TRAIN, "--epochs", "2", "--output", "run", "--resume"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (results["world_size"], results["epochs_run"]) == (2, 2)


@pytest.mark.slow
def test_an_option_refused_under_torchrun_ends_every_process(tmp_path):
    """Every process refuses the option; whichever prints first, torchrun ends the others (the run
    returns, within the timeout) and nothing is written."""
    proc = _torchrun([*TRAIN, "--pairs", "balanced", "--output", "run"], tmp_path)
    assert proc.returncode != 0
    refusal = r"sol-ext: error \(rank [01] of 2\): --pairs balanced is not supported under torchrun"
    assert re.search(refusal, proc.stderr), proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_one_failing_process_ends_the_run_instead_of_hanging(tmp_path):
    """Rank 1 fails in its first epoch while rank 0 waits in a collective of the same step: torchrun
    ends rank 0 too, and the failure is one line."""
    script = tmp_path / "fail_on_rank_1.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import sol_ext.driver.fit
        from sol_ext.driver.cli import main

        if os.environ["RANK"] == "1":
            def broken_epoch(*args, **kwargs):
                raise ValueError("batch 7 holds a label outside 0..28")
            sol_ext.driver.fit.Fit.train_one_epoch = broken_epoch
        sys.exit(main(sys.argv[1:]))
    """))
    # the driver's process group waits 30 minutes in a collective: a rank 0 left waiting would outlast
    # the run's timeout
    proc = _torchrun([*TRAIN, "--output", "run"], tmp_path, script=str(script))
    assert proc.returncode != 0
    assert "sol-ext: error (rank 1 of 2): batch 7 holds a label outside 0..28" in proc.stderr, proc.stderr
    assert not Path(tmp_path / "run" / "results.json").exists()
