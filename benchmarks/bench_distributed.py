"""Data-parallel SOL training steps: one process vs W gloo processes on the same global batch (CPU).

    python benchmarks/bench_distributed.py                   # global batch 512 and 1024, n = 101, W = 1, 2
    python benchmarks/bench_distributed.py --quick           # tiny sizes, a few steps (a smoke run)
    python benchmarks/bench_distributed.py --paper           # only the on-paper figures (W = 8 x B = 512)
    python benchmarks/bench_distributed.py --out benchmarks/results/distributed   # results.md, results.json

One step is what a DDP training loop runs: an MLP encoder (64 -> 128 -> d = 64) wrapped in
``DistributedDataParallel``, ``DistributedStochasticOrderLoss(StochasticOrderLoss(n))`` against fixed
centroids ``mu [n, d]``, forward, backward and an SGD step. For each global batch ``N`` the processes are
spawned with ``torch.multiprocessing`` (gloo on the loopback interface, one intra-op thread each, so
W = 1 and W = 2 use the same core per process): W = 1 runs all ``N`` samples in one process, W = 2 gives
each process ``N / 2``; at W = 1 the plain ``StochasticOrderLoss`` without a process group or DDP is timed
too. Every timed step starts after a barrier (not timed), and the setups take turns step by step, so that
a change in the machine's load affects them alike; a step's time is that of its slowest process, and the
table reports the median over the timed steps after a warm-up.

Where the time goes, measured in the same processes:

- *loss collectives*: wall time inside the ``torch.distributed`` calls the loss makes (forward: the
  gathers of sizes, ``D`` and labels and the all-reduce of the loss value; backward: the exchange of the
  gathered rows' gradient ``dL/dD``). The Python entry points of the collectives are wrapped with a
  ``perf_counter`` for the timed steps, and the calls each phase made are listed with the table. The
  time includes waiting for a slower peer.
- *DDP all-reduce*: from a gradient bucket being ready to its all-reduce finishing (a DDP comm hook that
  does what the default hook does).
- *compute only*: the same arithmetic per process with no process group and no DDP: the process's own
  rows against a gathered ``D`` assembled locally (the other processes' rows are fixed stand-ins), with
  ``sol_ext.ops.order_loss_block`` and ``sol_ext.disc_loss``, run by all W processes at once. *Overhead* is
  the median over the steps of a step minus the compute-only step that followed it (slowest process of
  each): what distribution costs beyond the arithmetic each process owns.

It also reports the pairs each process's loss kernel evaluates (the halves of process r's rows sit at
chunk positions r and 2W-1-r of the loss's zigzag order, each against the rows after it: an equal share
for every process) and the bytes each process exchanges per step (counted in the wrapped calls and checked against the formulas), and, with ``--paper`` or
``--out``, the same figures computed for W = 8 GPUs x B = 512.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel

import sol_ext
from sol_ext.distributed import DistributedStochasticOrderLoss, zigzag_layout

IN_FEATURES, HIDDEN, DIM = 64, 128, 64
DEFAULT_NUM_RANKS = 101
DEFAULT_BATCHES = (512, 1024)
DEFAULT_WORLD_SIZES = (1, 2)
DEFAULT_STEPS, DEFAULT_WARMUP = 30, 3
QUICK = dict(batches=(32,), steps=3, warmup=1)
PAPER_SIZE = (8, 512, 101, 512)  # W, B per process, n, d
LEARNING_RATE = 1e-3
TIMEOUT_S = 300
FLOAT_BYTES, INDEX_BYTES = 4, 8  # float32 D; int64 labels and sizes
# The fused all-pairs loss of one GPU at (4096, 217, 512): extra memory measured on an H100 (docs/distributed.md).
H100_ALL_PAIRS_EXTRA_MB = 35
TABLE_HEADER = (
    "| global batch N | processes | per process B | step (median) | speed-up | compute only, per process |"
    " loss collectives, per process (fwd + bwd) | DDP all-reduce, per process | overhead |"
)


# ------------------------------------------------------------------------------------------------
# Formulas: pairs and bytes per process
# ------------------------------------------------------------------------------------------------


def owned_pairs(global_batch: int, offset: int, batch: int) -> int:
    """Pairs of rows offset..offset+batch-1 against every later global row: sum_i (N - 1 - i)."""
    return batch * (global_batch - 1 - offset) - batch * (batch - 1) // 2


def process_pairs(world_size: int, batch: int, rank: int) -> int:
    """Pairs process ``rank`` evaluates: each half of its rows against the rows after it in the zigzag
    order of ``DistributedStochasticOrderLoss``."""
    _, split, offsets = zigzag_layout([batch] * world_size, rank)
    global_batch = world_size * batch
    return owned_pairs(global_batch, offsets[0], split) + owned_pairs(global_batch, offsets[1], batch - split)


def pairs_per_process(world_size: int, batch: int) -> list:
    pairs = [process_pairs(world_size, batch, rank) for rank in range(world_size)]
    assert sum(pairs) == world_size * batch * (world_size * batch - 1) // 2  # every pair once
    return pairs


def bytes_per_process(world_size: int, batch: int, num_ranks: int) -> dict:
    """Bytes of the loss's collectives per process and step (equal batches, so no padding).

    forward: the outputs of the three gathers (sizes W*8, D W*B*n*4, labels W*B*8) and the loss value (4);
    backward: the gradient of the gathered rows, W*B*n*4, which each process contributes to a reduction
    that leaves it the sum for its own B*n*4 (a reduce-scatter of it, or an all-reduce and its own slice).
    """
    rows = world_size * batch * num_ranks * FLOAT_BYTES
    return {
        "sizes": world_size * INDEX_BYTES,
        "D": rows,
        "labels": world_size * batch * INDEX_BYTES,
        "loss_value": FLOAT_BYTES,
        "forward": world_size * INDEX_BYTES + rows + world_size * batch * INDEX_BYTES + FLOAT_BYTES,
        "D_from_others": (world_size - 1) * batch * num_ranks * FLOAT_BYTES,
        "backward": rows,
    }


# ------------------------------------------------------------------------------------------------
# Timing collectives
# ------------------------------------------------------------------------------------------------


class CollectiveClock:
    """Seconds, bytes and calls of the torch.distributed collectives made in a phase, and of DDP's all-reduce.

    ``install()`` wraps the Python entry points of the collectives (``dist.all_gather``, ``dist.all_reduce``
    and the others in ``WRAPPED``), whichever of them ``sol_ext.distributed`` uses; calls are counted only
    inside ``phase("forward")`` or ``phase("backward")``. DDP's all-reduce runs in C++ and is timed by
    ``ddp_hook`` instead. Bytes are those of the collective's result buffer: a gather's or scatter's
    output, an all-reduce's tensor, a reduce-scatter's or all-to-all's input.
    """

    WRAPPED = ("all_gather", "all_gather_into_tensor", "all_reduce", "reduce_scatter", "reduce_scatter_tensor",
               "scatter", "all_to_all", "all_to_all_single", "broadcast")

    def __init__(self) -> None:
        self.current: Optional[str] = None
        self.calls: dict = {"forward": {}, "backward": {}}
        self.reset()

    def reset(self) -> None:
        self.seconds = {"forward": 0.0, "backward": 0.0, "ddp": 0.0}
        self.bytes = {"forward": 0, "backward": 0, "ddp": 0}
        self.calls = {"forward": {}, "backward": {}}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.current = name
        try:
            yield
        finally:
            self.current = None

    @staticmethod
    def _payload(name: str, args: tuple) -> int:
        def size(tensors) -> int:
            tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
            return sum(t.numel() * t.element_size() for t in tensors)

        if name in ("reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single"):
            return size(args[1])  # the input
        return size(args[0])  # the output (gathers, scatter) or the tensor reduced in place

    def _timed(self, name: str, original: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            result = original(*args, **kwargs)
            phase = self.current
            if phase is not None:
                self.seconds[phase] += time.perf_counter() - start
                self.bytes[phase] += self._payload(name, args)
                self.calls[phase][name] = self.calls[phase].get(name, 0) + 1
            return result

        return call

    @contextmanager
    def install(self) -> Iterator[None]:
        originals = {name: getattr(dist, name) for name in self.WRAPPED if hasattr(dist, name)}
        try:
            for name, original in originals.items():
                setattr(dist, name, self._timed(name, original))
            yield
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)

    def ddp_hook(self, state, bucket):  # no annotations: DDP checks them, and these would be strings
        """DDP's default all-reduce hook (average the bucket over the processes), timed to completion."""
        start = time.perf_counter()
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size())
        self.bytes["ddp"] += buffer.numel() * buffer.element_size()
        future = distributed_c10d.all_reduce(buffer, async_op=True).get_future()

        def finished(done: torch.futures.Future) -> torch.Tensor:
            self.seconds["ddp"] += time.perf_counter() - start
            return done.value()[0]

        return future.then(finished)


# ------------------------------------------------------------------------------------------------
# One process's steps
# ------------------------------------------------------------------------------------------------


def make_encoder() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights in every process and every setup
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, DIM)
    )


def make_global_batch(global_batch: int, num_ranks: int, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(global_batch, IN_FEATURES, generator=gen)
    labels = torch.randint(0, num_ranks, (global_batch,), generator=gen)
    mu = torch.randn(num_ranks, DIM, generator=gen) / DIM**0.5
    return x, labels, mu


def time_interleaved(setups: dict, steps: int, warmup: int, clock: CollectiveClock) -> dict:
    """Per-step seconds of each setup (and, for all, the clock's collective seconds and bytes).

    The setups take turns step by step, so that a change of the machine's load between them affects
    them alike. Every step starts after a barrier of all processes (not timed).
    """
    records = {name: {"step": [], "loss_forward": [], "loss_backward": [], "ddp": [], "first_loss": None}
               for name in setups}
    for index in range(warmup + steps):
        for name, step in setups.items():
            record = records[name]
            dist.barrier()
            clock.reset()
            start = time.perf_counter()
            loss = step()
            elapsed = time.perf_counter() - start
            if record["first_loss"] is None:
                record["first_loss"] = loss.item()
            if index < warmup:
                continue
            record["step"].append(elapsed)
            record["loss_forward"].append(clock.seconds["forward"])
            record["loss_backward"].append(clock.seconds["backward"])
            record["ddp"].append(clock.seconds["ddp"])
            record["bytes"] = dict(clock.bytes)  # the last step's; every step exchanges the same
            record["calls"] = clock.calls
    return records


def measure_process(rank: int, world_size: int, global_batch: int, num_ranks: int, steps: int,
                    warmup: int) -> dict:
    """The distributed steps, the compute-only steps and, in one process, the plain loss's steps."""
    x_all, labels_all, mu = make_global_batch(global_batch, num_ranks)
    batch = global_batch // world_size
    offset = rank * batch
    x, labels = x_all[offset : offset + batch], labels_all[offset : offset + batch]
    settings = sol_ext.StochasticOrderLoss(num_ranks)

    def training_step(encoder: torch.nn.Module, loss_of: Callable) -> Callable[[], torch.Tensor]:
        optimizer = torch.optim.SGD(encoder.parameters(), lr=LEARNING_RATE, momentum=0.9)

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            h = encoder(x)
            with clock.phase("forward"):
                loss = loss_of(h)
            with clock.phase("backward"):
                loss.backward()
            optimizer.step()
            return loss.detach()

        return step

    # The distributed step: DDP encoder, DistributedStochasticOrderLoss.
    clock = CollectiveClock()
    model = DistributedDataParallel(make_encoder())
    model.register_comm_hook(None, clock.ddp_hook)
    criterion = DistributedStochasticOrderLoss(sol_ext.StochasticOrderLoss(num_ranks))
    setups = {"distributed": training_step(model, lambda h: criterion(h, labels, mu))}

    # Compute only: the same per-process arithmetic without collectives. The other processes' rows of
    # the gathered D are constants computed once, as the gather would deliver them at the first step.
    encoder = make_encoder()
    with torch.no_grad():
        D_others = sol_ext.stochastic_dissimilarity(encoder(x_all), mu, settings.sigma)
    D_before, D_after = D_others[:offset], D_others[offset + batch :]
    total_pairs = max(global_batch * (global_batch - 1) // 2, 1)
    segments, split, offsets = zigzag_layout([batch] * world_size, rank)
    labels_zigzag = torch.cat([labels_all[a:b] for a, b in segments])

    def own_share(h: torch.Tensor) -> torch.Tensor:
        D = sol_ext.stochastic_dissimilarity(h, mu, settings.sigma)
        D_cat = torch.cat([D_before, D, D_after])
        D_all = torch.cat([D_cat[a:b] for a, b in segments])  # the loss's zigzag order
        args = (settings.sigma, settings.tau, settings.margin, settings.convention)
        order = (sol_ext.ops.order_loss_block(D[:split], labels[:split], D_all, labels_zigzag, offsets[0], *args).sum()
                 + sol_ext.ops.order_loss_block(D[split:], labels[split:], D_all, labels_zigzag, offsets[1], *args).sum()
                 ) / total_pairs
        disc = sol_ext.disc_loss(D, labels, settings.T, "sum") / global_batch
        return order + settings.disc_weight * disc

    setups["compute_only"] = training_step(encoder, own_share)
    # One process, no process group: the plain loss on the whole batch (the all-pairs kernel).
    if world_size == 1:
        setups["plain"] = training_step(make_encoder(), lambda h: settings(h, labels, mu))

    with clock.install():
        records = time_interleaved(setups, steps, warmup, clock)
    return {"global_batch": global_batch, "world_size": world_size, "rank": rank, "batch": batch,
            "offset": offset, "pairs": process_pairs(world_size, batch, rank),
            "distributed": records["distributed"], "compute_only": records["compute_only"],
            "plain": records.get("plain")}


def _worker(rank: int, world_size: int, config: dict, out_dir: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # one core per process, at W = 1 as at W = 2
    # The group meets in a file of the run's folder: a TCP port picked in advance could be taken by
    # another program before the processes bind it.
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'store')}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        results = [
            measure_process(rank, world_size, global_batch, config["num_ranks"], config["steps"],
                            config["warmup"])
            for global_batch in config["batches"]
        ]
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()
    # torch's gloo processes abort now and then in the interpreter's shutdown ("terminate called
    # without an active exception"), after all is written: end without it, as tests/common.py does
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(world_size: int, config: dict) -> list:
    """Runs the measurements in world_size spawned processes; their results, per rank."""
    with tempfile.TemporaryDirectory() as out_dir:
        context = torch.multiprocessing.start_processes(
            _worker, args=(world_size, config, out_dir), nprocs=world_size, join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not context.join(timeout=max(1.0, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{world_size} processes did not finish within {TIMEOUT_S} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        per_rank = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                per_rank.append(json.load(f))
    return per_rank


# ------------------------------------------------------------------------------------------------
# Summaries and tables
# ------------------------------------------------------------------------------------------------


def summarize(per_rank: list, num_ranks: int) -> list:
    """One row per global batch: medians per process, the step time of the slowest process."""
    rows = []
    world_size = len(per_rank)
    for index in range(len(per_rank[0])):
        ranks = [results[index] for results in per_rank]
        global_batch, batch = ranks[0]["global_batch"], ranks[0]["batch"]
        slowest = [max(times) for times in zip(*(r["distributed"]["step"] for r in ranks))]
        expected = bytes_per_process(world_size, batch, num_ranks)
        for r in ranks:  # the counted bytes are the formulas'
            counted = r["distributed"]["bytes"]
            assert (counted["forward"], counted["backward"]) == (expected["forward"], expected["backward"]), (
                f"bytes counted {counted} differ from the formulas {expected}"
            )
        compute_only = [statistics.median(r["compute_only"]["step"]) for r in ranks]
        slowest_compute = [max(times) for times in zip(*(r["compute_only"]["step"] for r in ranks))]
        step = statistics.median(slowest)
        rows.append({
            "global_batch": global_batch,
            "world_size": world_size,
            "batch": batch,
            "step": step,
            "compute_only": compute_only,
            "loss_collectives": [
                statistics.median(f + b for f, b in zip(r["distributed"]["loss_forward"],
                                                        r["distributed"]["loss_backward"]))
                for r in ranks
            ],
            "loss_collectives_forward": [statistics.median(r["distributed"]["loss_forward"]) for r in ranks],
            "loss_collectives_backward": [statistics.median(r["distributed"]["loss_backward"]) for r in ranks],
            "ddp_allreduce": [statistics.median(r["distributed"]["ddp"]) for r in ranks],
            # step i against compute-only step i, which ran right after it
            "overhead": statistics.median(s - c for s, c in zip(slowest, slowest_compute)),
            "plain": statistics.median(ranks[0]["plain"]["step"]) if ranks[0]["plain"] else None,
            "first_loss": [r["distributed"]["first_loss"] for r in ranks],
            "plain_first_loss": ranks[0]["plain"]["first_loss"] if ranks[0]["plain"] else None,
            "pairs": [r["pairs"] for r in ranks],
            "bytes": expected,
            "ddp_bytes": ranks[0]["distributed"]["bytes"]["ddp"],
            "calls": ranks[0]["distributed"]["calls"],
        })
    return rows


def check_losses_agree(rows: list) -> None:
    """The first step's loss is the same global loss at every W (same weights, same global batch)."""
    by_batch: dict = {}
    for row in rows:
        values = by_batch.setdefault(row["global_batch"], [])
        values += row["first_loss"] + ([row["plain_first_loss"]] if row["plain_first_loss"] is not None else [])
    for global_batch, values in by_batch.items():
        spread = (max(values) - min(values)) / max(abs(v) for v in values)
        assert spread < 1e-4, f"the losses of N = {global_batch} differ between setups: {values}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if abs(seconds) >= 0.01 else f"{seconds * 1e3:.2f} ms"


def _per_process(values: list, fmt: Callable = _ms) -> str:
    return " / ".join(fmt(v) for v in values)


def _mb(count: float) -> str:
    return f"{count / 1e6:.3g} MB" if count >= 1e5 else f"{count / 1e3:.3g} kB"


def time_table(rows: list) -> str:
    lines = [TABLE_HEADER, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    plain = {r["global_batch"]: r["plain"] for r in rows if r["plain"] is not None}
    for global_batch in sorted({r["global_batch"] for r in rows}):
        if global_batch in plain:
            lines.append(f"| {global_batch} | 1, plain `StochasticOrderLoss`, no DDP | {global_batch} | "
                         f"{_ms(plain[global_batch])} | 1.00× | — | — | — | — |")
        for r in (r for r in rows if r["global_batch"] == global_batch):
            base = plain.get(global_batch)
            speed_up = f"{base / r['step']:.2f}×" if base else "—"
            collectives = " / ".join(
                f"{_ms(total)} ({_ms(f)} + {_ms(b)})" for total, f, b in
                zip(r["loss_collectives"], r["loss_collectives_forward"], r["loss_collectives_backward"])
            )
            lines.append(
                f"| {global_batch} | W = {r['world_size']}, DDP + distributed loss | {r['batch']} | {_ms(r['step'])} | "
                f"{speed_up} | {_per_process(r['compute_only'])} | {collectives} | "
                f"{_per_process(r['ddp_allreduce'])} | {_ms(r['overhead'])} |"
            )
    return "\n".join(lines)


def calls_line(rows: list) -> str:
    """The collectives one loss call made, per phase (the same at every size)."""
    calls = max(rows, key=lambda r: r["world_size"])["calls"]
    return "Collectives of the loss per step: " + "; ".join(
        f"{phase}: " + ", ".join(f"`dist.{name}` ×{count}" for name, count in calls[phase].items())
        for phase in ("forward", "backward")
    ) + "."


def work_table(rows: list) -> str:
    lines = [
        "| global batch N | W | pairs per process (share of N(N-1)/2) | loss forward: gathered per process"
        " (D + labels + sizes + value) | of D, from the other processes | loss backward: dL/dD exchanged per"
        " process | DDP all-reduce per process |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        total = r["global_batch"] * (r["global_batch"] - 1) // 2
        pairs = " / ".join(f"{p:,} ({p / total:.0%})" for p in r["pairs"])
        b = r["bytes"]
        lines.append(
            f"| {r['global_batch']} | {r['world_size']} | {pairs} | {b['forward']:,} B ({_mb(b['forward'])}) | "
            f"{b['D_from_others']:,} B | {b['backward']:,} B ({_mb(b['backward'])}) | {r['ddp_bytes']:,} B |"
        )
    return "\n".join(lines)


MEASURED_NOTES = """\
Per-process entries read "process 0 / process 1". *Step*: the slowest process's time per step (each step
starts after an untimed barrier), median over the timed steps. *Speed-up*: the one-process plain loss's
step divided by this step. *Compute only*: each process's own arithmetic (encoder, `D`, its block of
pairs with `order_loss_block`, its discriminative terms, SGD) with no process group, all processes at
once. *Loss collectives*: wall time inside the loss's `torch.distributed` calls per step (median of the
per-step sums), and in parentheses the medians of its forward (gathers of sizes, `D`, labels; all-reduce
of the value) and backward part (the exchange of the gathered rows' gradient `dL/dD`); it includes
waiting for a slower process at the collective. *DDP all-reduce*: from the gradient bucket being ready
to its all-reduce finishing. *Overhead*: step minus the slowest process's compute only, median over the
pairs of steps (the two ran one after the other). Byte counts are those of the wrapped calls and equal
the formulas of the on-paper section."""


# ------------------------------------------------------------------------------------------------
# On paper: W GPUs x B per GPU
# ------------------------------------------------------------------------------------------------


def paper_figures(world_size: int, batch: int, num_ranks: int, dim: int) -> dict:
    global_batch = world_size * batch
    pairs = pairs_per_process(world_size, batch)
    all_pairs = global_batch * (global_batch - 1) // 2
    traffic = bytes_per_process(world_size, batch, num_ranks)
    gathered_D = traffic["D"]
    return {
        "W": world_size, "B": batch, "n": num_ranks, "d": dim, "N": global_batch,
        "bytes": traffic,
        "gathered_h_instead": world_size * batch * dim * FLOAT_BYTES,
        "reduce_scatter_output": batch * num_ranks * FLOAT_BYTES,
        "ring_send": (world_size - 1) * batch * num_ranks * FLOAT_BYTES,
        "pairs": pairs,
        "all_pairs": all_pairs,
        "balanced_pairs": all_pairs / world_size,
        "memory": {
            "gathered_D": gathered_D,
            "gathered_D_grad": gathered_D,
            "gathered_labels": global_batch * INDEX_BYTES,
            "row_losses": batch * FLOAT_BYTES,
            "held": 2 * gathered_D + global_batch * INDEX_BYTES + batch * FLOAT_BYTES,
        },
        "single": {
            "pair_losses": all_pairs * FLOAT_BYTES,
            "D": global_batch * num_ranks * FLOAT_BYTES,
        },
    }


def paper_markdown(f: dict) -> str:
    W, B, n, d, N = f["W"], f["B"], f["n"], f["d"], f["N"]
    b, m, s = f["bytes"], f["memory"], f["single"]
    most, least = max(f["pairs"]), min(f["pairs"])
    per_rank = ", ".join(f"{p:,}" for p in f["pairs"])
    return f"""\
## On paper: W = {W} GPUs x B = {B} per GPU (N = {N}, n = {n}, d = {d}, float32)

Computed from formulas (`python benchmarks/bench_distributed.py --paper`); equal batches, so no padding;
labels and sizes int64; MB = 10^6 bytes.

**Traffic per process and step** (the loss's collectives; DDP's gradient all-reduce of 4 bytes per
encoder parameter comes on top and does not depend on the loss):

| collective | formula | bytes |
| --- | --- | --- |
| all-gather of the sizes | W·8 | {b['sizes']:,} |
| all-gather of `D` | W·B·n·4 | {b['D']:,} ({_mb(b['D'])}; {_mb(b['D_from_others'])} from the other {W - 1}) |
| all-gather of the labels | W·B·8 | {b['labels']:,} |
| all-reduce of the loss value | 4 | {b['loss_value']} |
| **forward, all gathered** | W·(8 + B·n·4 + B·8) + 4 | **{b['forward']:,} ({_mb(b['forward'])})** |
| **backward: reduce-scatter of `dL/dD_all`** | input W·B·n·4, output B·n·4 | **{b['backward']:,} in ({_mb(b['backward'])}), {f['reduce_scatter_output']:,} out** |

In backward each process contributes the gradient of all W·B gathered rows and keeps the sum for its
own B: a reduce-scatter, which a ring runs by sending (W − 1)·B·n·4 = {_mb(f['ring_send'])} per process;
done as an all-reduce of the W·B·n·4 bytes followed by taking the own slice, a ring sends twice that,
2·(W − 1)·B·n·4 = {_mb(2 * f['ring_send'])}.

Gathering `D [B, n]` rather than the embeddings `h [B, d]` moves n/d = {n / d:.2f} of the bytes
(all-gathering `h` would be W·B·d·4 = {_mb(f['gathered_h_instead'])}).

**Pairs per process.** The loss puts the global rows in a zigzag order: the first halves (B/2 rows) of
the processes in rank order, then the second halves in reverse rank order, so process r's halves sit at
chunk positions r and 2W − 1 − r. Each half is paired with every row after it: a half at position c
evaluates (B/2)·(N − 1) − c·(B/2)² − (B/2)·(B/2 − 1)/2 pairs, and the two halves of a process add up to
P_r = B·(N − 1)/2 = N·(N − 1)/(2W) for every r (B even).

- per process (r = 0 … {W - 1}): {per_rank}
- max {most:,}, min {least:,}; sum = N·(N − 1)/2 = {f['all_pairs']:,}, the single GPU's all-pairs count of
  the global batch
- an even split is N·(N − 1)/(2W) = {f['balanced_pairs']:,.0f}; the busiest process evaluates
  {most / f['balanced_pairs']:.3f}× that and {most / f['all_pairs']:.1%} of the single GPU's pairs, so the loss
  part of a step can be up to {f['all_pairs'] / most:.2f}× faster than on one GPU with the global batch. (Pairing
  each process's rows with the later rows in plain rank order would give process 0 (2WB − B − 1)/(WB − 1)
  ≈ 2 − 1/W times an even share: 1.875× at W = 8.)

**Extra memory of the loss per process** (beyond the encoder's activations):

| | formula | bytes |
| --- | --- | --- |
| gathered `D_all` | W·B·n·4 | {m['gathered_D']:,} ({_mb(m['gathered_D'])}) |
| its gradient `dL/dD_all` (backward) | W·B·n·4 | {m['gathered_D_grad']:,} ({_mb(m['gathered_D_grad'])}) |
| gathered labels | W·B·8 | {m['gathered_labels']:,} |
| per-row losses | B·4 | {m['row_losses']:,} |
| **held** | 2·W·B·n·4 + W·B·8 + B·4 | **{m['held']:,} ({_mb(m['held'])})** |

The gather and the reduce-scatter add transient buffers of up to W·B·n·4 each while they run. All of it is
O(W·B·n): no pair list and no per-pair tensor. One GPU with the global batch of {N} instead needs the
fused all-pairs loss's {s['pair_losses'] / 1e6:.1f} MB `[M]` per-pair loss vector (M·4 with
M = N·(N − 1)/2; it grows as N² and does not depend on n) on top of its own `D` of N·n·4 =
{_mb(s['D'])}: about {H100_ALL_PAIRS_EXTRA_MB} MB extra was measured at (4096, 217) on an H100
(`benchmarks/results/gpu/`), nearly all of it that vector. Per process the loss needs
{s['pair_losses'] / m['held']:.0f}× less here, growing linearly with the global batch W·B where the
single GPU's grows quadratically.
"""


# ------------------------------------------------------------------------------------------------


def _parse_size(text: str) -> tuple:
    values = tuple(int(v) for v in text.split(","))
    if len(values) != 4 or min(values) < 1:
        raise argparse.ArgumentTypeError("expected W,B,n,d (positive integers)")
    return values


def findings(rows: list) -> list:
    """What the measured rows say, per global batch run on more than one process."""
    plain = {r["global_batch"]: r["plain"] for r in rows if r["plain"] is not None}
    lines = []
    for r in rows:
        if r["world_size"] < 2:
            continue
        total = r["global_batch"] * (r["global_batch"] - 1) // 2
        # by measured compute time: the pair counts are equal (or nearly) in the zigzag order
        busiest = max(range(r["world_size"]), key=lambda rank: r["compute_only"][rank])
        idlest = min(range(r["world_size"]), key=lambda rank: r["compute_only"][rank])
        base = plain.get(r["global_batch"])
        versus = f", {base / r['step']:.2f}× the speed of one process ({_ms(base)})" if base else ""
        lines.append(
            f"- N = {r['global_batch']}, W = {r['world_size']}: {_ms(r['step'])} per step{versus}. Process "
            f"{busiest} owns {r['pairs'][busiest] / total:.0%} of the pairs and computes for "
            f"{_ms(r['compute_only'][busiest])}; process {idlest} owns {r['pairs'][idlest] / total:.0%} and "
            f"computes for {_ms(r['compute_only'][idlest])}. Time inside the loss's collectives, waiting for "
            f"the slower process included: {_ms(r['loss_collectives'][idlest])} on process {idlest}, "
            f"{_ms(r['loss_collectives'][busiest])} on process {busiest}. Beyond the busiest process's "
            f"arithmetic the step costs {_ms(r['overhead'])} ({r['overhead'] / r['step']:.0%} of it)."
        )
    return lines


def results_markdown(rows: list, config: dict, elapsed: float, paper: str) -> str:
    load = config["load_average_1min"]
    batches = " and ".join(str(b) for b in config["batches"])
    worlds = " and ".join(str(w) for w in config["world_sizes"])
    reading = "\n".join(findings(rows))
    return f"""\
# Data-parallel training steps: W = {worlds} processes on the same global batch (gloo, CPU)

- Machine: {os.cpu_count()}-core CPU, gloo, torch {torch.__version__}; one intra-op thread per process; 1-minute
  load average {load['before']:.2f} before the run and {load['after']:.2f} after (its own processes included).
- Command: `{config['command']}`; one run, {elapsed:.0f} s.
- Setup: global batches {batches}, W = {worlds}, n = {config['num_ranks']}, encoder {IN_FEATURES} → {HIDDEN} → d = {DIM}
  (DDP), fixed centroids, SGD; {config['warmup']} warm-up and {config['steps']} timed steps per setup.
  `results.json` holds every step's times per process.

## Measured

{time_table(rows)}

{MEASURED_NOTES}

{calls_line(rows)}

{work_table(rows)}

{reading}

{paper}"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=list(DEFAULT_BATCHES),
                        help="global batch sizes N (divisible by every world size)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=list(DEFAULT_WORLD_SIZES))
    parser.add_argument("--num-ranks", type=int, default=DEFAULT_NUM_RANKS, help="n")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="timed steps per setup")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps before them")
    parser.add_argument("--quick", action="store_true", help="a tiny batch and a few steps (a smoke run)")
    parser.add_argument("--paper", action="store_true", help="print only the on-paper figures and exit")
    parser.add_argument("--paper-size", type=_parse_size, default=PAPER_SIZE, metavar="W,B,n,d",
                        help="the on-paper setup (default: %(default)s)")
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--out", help="write results.md and results.json into this folder")
    args = parser.parse_args(argv)

    paper = paper_markdown(paper_figures(*args.paper_size))
    if args.paper:
        print(paper)
        return 0
    if not (dist.is_available() and dist.is_gloo_available()):
        parser.error("needs torch.distributed with the gloo backend")
    if args.quick:
        args.batches, args.steps, args.warmup = list(QUICK["batches"]), QUICK["steps"], QUICK["warmup"]
    for global_batch in args.batches:
        for world_size in args.world_sizes:
            if global_batch % world_size:
                parser.error(f"global batch {global_batch} is not divisible by W = {world_size}")
    config = dict(batches=args.batches, world_sizes=args.world_sizes, num_ranks=args.num_ranks,
                  steps=args.steps, warmup=args.warmup,
                  command=" ".join(["python benchmarks/bench_distributed.py", *(argv or sys.argv[1:])]))

    load_before = os.getloadavg()  # other work on the machine shows in the times: recorded with them
    start = time.perf_counter()
    raw, rows = {}, []
    for world_size in args.world_sizes:
        per_rank = spawn(world_size, config)
        raw[str(world_size)] = per_rank
        rows += summarize(per_rank, args.num_ranks)
        print(f"  done W = {world_size}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    load = {"before": load_before[0], "after": os.getloadavg()[0]}
    config["load_average_1min"] = load
    check_losses_agree(rows)
    rows.sort(key=lambda r: (r["global_batch"], r["world_size"]))

    print(f"\nDistributedStochasticOrderLoss training steps, n = {args.num_ranks}, float32; gloo, torch "
          f"{torch.__version__}, {os.cpu_count()} CPU cores, 1 thread per process; 1-minute load average "
          f"{load['before']:.2f} before, {load['after']:.2f} after\n")
    print(time_table(rows))
    print()
    print(calls_line(rows))
    print()
    print(work_table(rows))
    print()
    print("\n".join(findings(rows)))
    results = {"machine": f"{os.cpu_count()}-core CPU, gloo, torch {torch.__version__}", "config": config,
               "seconds": elapsed, "summary": rows, "per_process": raw,
               "paper": paper_figures(*args.paper_size)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(results_markdown(rows, config, elapsed, paper))
    return 0


if __name__ == "__main__":
    sys.exit(main())
