"""Fused vs reference: time and peak extra memory of StochasticOrderLoss (all pairs, float32).

    python benchmarks/bench_loss.py                  # CPU, and CUDA when present
    python benchmarks/bench_loss.py --device cuda --sizes 64,60,512 1024,101,512 4096,217,512

For each (B, n, d) it first checks that the fused and reference losses and gradients agree, then times
forward, backward and forward+backward with torch.utils.benchmark (which warms up and synchronizes),
and measures the peak memory a forward+backward adds on top of its inputs: on CUDA from the caching
allocator's peak, on the CPU from the peak resident size of a fresh process. On CUDA with
--no-check-values it also times the forward+backward replayed from a CUDA graph captured by hand, and
through torch.compile(mode="reduce-overhead") (PyTorch's CUDA graphs). It prints one markdown
table: median times, the reference/fused ratio, and pair-rank updates per second (B(B-1)/2 * n per pass),
also per core (per thread of the run) on the CPU. Beside the pairwise step it times, per op, the order
loss alone on D (forward, backward: the op the step spends its time in) and the step with the default
algorithm (algorithm="auto", which may sort instead, docs/performance.md); the header names the CPU
kernels that ran (sol_ext.cpu_capability(), SOL_EXT_CPU_CAPABILITY forces one).

    python benchmarks/bench_loss.py --device cpu --cpu-time --sizes 256,101,512 1024,217,512

--cpu-time prints, instead, the rates of the CPU order-loss op alone (torch.ops.sol_ext.order_loss and its
backward on a float32 D, all pairs) per CPU capability, from the calling thread's CPU time
(time.thread_time, one thread, the best of --rounds rounds): on a machine shared with other jobs, wall time
is mostly the scheduler's, CPU time much less so.

    python benchmarks/bench_loss.py --algorithms     # grouped vs pairwise vs reference (docs/math.md §13)
    python benchmarks/bench_loss.py --algorithms --busy --sizes 8192,7,64 1000000,5,64

--algorithms times, in one run, the forward+backward of StochasticOrderLoss (float32, d = 64 by default)
with algorithm="grouped" (sorting, O(n^2 B + n B log B)), algorithm="pairwise" with the fused kernels
(O(B^2 n)) and the plain-PyTorch reference, at sizes up to B = 1,000,000. Where pairwise or the reference
would not fit in memory or would take more than --budget seconds (extrapolated from a small calibration
run of the same run), the table says "skipped". It also says which algorithm "auto" picks
(sol_ext._dispatch.grouped_is_faster) and whether that was the faster one. Everything runs at torch's
default thread count (or --threads); on the CPU grouped is also timed on one thread, in rounds that
alternate with the default's, and the table gives the ratio (default / one thread; above 1 the extra
threads cost time). On CUDA grouped is also timed with the other implementation of its op
(SOL_EXT_CUDA_GROUPED=fused, csrc/cuda/grouped_order_loss_kernel.cu); --profile adds a torch.profiler table
of grouped's step per size (on CUDA, of each implementation). --busy runs one spinning process
beside the measurement, as a DataLoader worker or another job would; the header gives the load average.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import time

import torch
import torch.utils.benchmark as tbench

import sol_ext

DEFAULT_SIZES = {
    "cpu": [(64, 60, 512), (256, 101, 512), (1024, 217, 512)],
    "cuda": [(64, 60, 512), (256, 101, 512), (1024, 101, 512), (1024, 217, 512), (4096, 217, 512)],
}
BACKENDS = ("fused", "reference")
# The reference materializes several [B(B-1)/2, n] tensors: about this many bytes per pair-rank
# (float32, forward+backward; 64.5 GB at B=4096, n=217). It is skipped where that would not fit.
REFERENCE_BYTES_PER_PAIR_RANK = 40


def reference_fits(pair_ranks: int, device: str) -> bool:
    if device == "cuda":
        free = torch.cuda.mem_get_info()[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return pair_ranks * REFERENCE_BYTES_PER_PAIR_RANK < 0.8 * free


def make_inputs(B: int, n: int, d: int, device: str, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(B, d, generator=gen, dtype=dtype).to(device) / d**0.5
    mu = torch.randn(n, d, generator=gen, dtype=dtype).to(device) / d**0.5
    labels = torch.randint(0, n, (B,), generator=gen).to(device)
    return h.requires_grad_(True), mu.requires_grad_(True), labels


# --no-check-values: time the loss as a training loop that switched the value checks off runs it (on a
# GPU those checks cost a host-device synchronization per call; see StochasticOrderLoss).
CHECK_VALUES = True


def make_loss(n: int, backend: str, algorithm: str = "pairwise") -> sol_ext.StochasticOrderLoss:
    return sol_ext.StochasticOrderLoss(n, backend=backend, check_values=CHECK_VALUES, algorithm=algorithm)


def check_agreement(B: int, n: int, d: int, device: str) -> float:
    """Largest relative difference of loss, dh and dmu between the backends (float64)."""
    h, mu, labels = make_inputs(B, n, d, device, torch.float64)
    results = []
    for backend in BACKENDS:
        loss = make_loss(n, backend)(h, labels, mu)
        results.append((loss, *torch.autograd.grad(loss, (h, mu))))
    worst = 0.0
    for fused, ref in zip(*results):
        worst = max(worst, ((fused - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item())
    return worst


def time_phases(B: int, n: int, d: int, device: str, backend: str, min_run_time: float) -> dict:
    """Median seconds of forward, backward (on a retained graph) and forward+backward."""
    h, mu, labels = make_inputs(B, n, d, device)
    criterion = make_loss(n, backend)
    env = dict(criterion=criterion, h=h, mu=mu, labels=labels, torch=torch)
    loss = criterion(h, labels, mu)
    env["loss"] = loss
    statements = {
        "forward": "criterion(h, labels, mu)",
        "backward": "torch.autograd.grad(loss, (h, mu), retain_graph=True)",
        "both": "torch.autograd.grad(criterion(h, labels, mu), (h, mu))",
    }
    return {
        phase: tbench.Timer(stmt, globals=env, num_threads=torch.get_num_threads())
        .blocked_autorange(min_run_time=min_run_time)
        .median
        for phase, stmt in statements.items()
    }


def time_cuda_graph(B: int, n: int, d: int, min_run_time: float):
    """Median seconds of a fused forward+backward captured once in a CUDA graph and replayed: what a
    training loop that captures its step (``torch.cuda.graphs``, or ``torch.compile(mode="reduce-overhead")``)
    pays, with no Python and no per-kernel launch cost. Needs ``check_values=False`` (capture allows no
    host-device synchronization); ``None``, with the reason on stderr, where capture fails."""
    h, mu, labels = make_inputs(B, n, d, "cuda")
    criterion = sol_ext.StochasticOrderLoss(n, backend="fused", check_values=False)
    try:
        side = torch.cuda.Stream()  # warm up (tables, cuBLAS handles) on a side stream, as capture requires
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                h.grad = mu.grad = None
                criterion(h, labels, mu).backward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        h.grad = mu.grad = None
        with torch.cuda.graph(graph):
            criterion(h, labels, mu).backward()
    except RuntimeError as error:  # a benchmark column, not a test: report and go on
        print(f"  CUDA graph capture failed at {(B, n, d)}: {error}", file=sys.stderr, flush=True)
        return None
    return tbench.Timer("graph.replay()", globals=dict(graph=graph)).blocked_autorange(min_run_time=min_run_time).median


def time_compiled(B: int, n: int, d: int, min_run_time: float):
    """Median seconds of a fused forward+backward through ``torch.compile(mode="reduce-overhead")``: what
    a user who compiles the loss gets, the forward and the compiled backward replayed from CUDA graphs
    by PyTorch. Needs ``check_values=False``; ``None``, with the reason on stderr, where it fails."""
    h, mu, labels = make_inputs(B, n, d, "cuda")
    criterion = sol_ext.StochasticOrderLoss(n, backend="fused", check_values=False)
    torch._dynamo.reset()
    compiled = torch.compile(criterion, mode="reduce-overhead", fullgraph=True)

    def step():
        h.grad = mu.grad = None
        compiled(h, labels, mu).backward()

    try:
        for _ in range(4):  # compile, warm up, record the graphs
            step()
        torch.cuda.synchronize()
    except Exception as error:  # a benchmark column, not a test: report and go on
        print(f"  torch.compile(mode='reduce-overhead') failed at {(B, n, d)}: {error}", file=sys.stderr, flush=True)
        return None
    return tbench.Timer("step()", globals=dict(step=step)).blocked_autorange(min_run_time=min_run_time).median


def time_order_loss_op(B: int, n: int, device: str, backend: str, min_run_time: float) -> dict:
    """Median seconds of the order loss alone over all pairs of a float32 D [B, n] (reduction="sum"):
    forward, and backward on a retained graph."""
    gen = torch.Generator().manual_seed(1)
    D = torch.randn(B, n, generator=gen).to(device).requires_grad_(True)
    labels = torch.randint(0, n, (B,), generator=gen).to(device)
    loss = sol_ext.order_loss(D, labels, reduction="sum", backend=backend, algorithm="pairwise")
    env = dict(sol_ext=sol_ext, torch=torch, D=D, labels=labels, loss=loss, backend=backend)
    statements = {
        "order_loss forward": "sol_ext.order_loss(D, labels, reduction='sum', backend=backend, algorithm='pairwise')",
        "order_loss backward": "torch.autograd.grad(loss, D, retain_graph=True)",
    }
    return {
        phase: tbench.Timer(stmt, globals=env, num_threads=torch.get_num_threads())
        .blocked_autorange(min_run_time=min_run_time)
        .median
        for phase, stmt in statements.items()
    }


def time_default_algorithm(B: int, n: int, d: int, device: str, backend: str, min_run_time: float) -> float:
    """Median seconds of a forward+backward of StochasticOrderLoss with its default algorithm ("auto")."""
    h, mu, labels = make_inputs(B, n, d, device)
    criterion = make_loss(n, backend, "auto")
    env = dict(criterion=criterion, h=h, mu=mu, labels=labels, torch=torch)
    return (tbench.Timer("torch.autograd.grad(criterion(h, labels, mu), (h, mu))", globals=env,
                         num_threads=torch.get_num_threads()).blocked_autorange(min_run_time=min_run_time).median)


def cpu_time_rates(sizes: list, rounds: int) -> list:
    """Pair-rank terms per second of CPU time of the CPU order-loss op alone, forward and backward, per
    capability this machine runs: the best of ``rounds`` rounds of calls on one thread."""
    from sol_ext._extension import _set_cpu_capability

    torch.set_num_threads(1)
    chosen, rows = sol_ext.cpu_capability(), []
    for B, n, _ in sizes:
        gen = torch.Generator().manual_seed(1)
        D = torch.randn(B, n, generator=gen)
        labels = torch.randint(0, n, (B,), generator=gen)
        pair_ranks = B * (B - 1) // 2 * n
        grad = torch.ones(()).expand(B * (B - 1) // 2)
        calls = {
            "forward": functools.partial(torch.ops.sol_ext.order_loss, D, labels, None, 1.0, 3, 0.25, "paper"),
            "backward": functools.partial(torch.ops.sol_ext._order_loss_backward, grad, D, labels, None, 1.0, 3, 0.25,
                                          "paper"),
        }
        repeats = max(1, int(2e8 // pair_ranks))  # about 0.05 s per round at 4 G terms/s
        for capability in ("DEFAULT", "AVX2", "AVX512"):
            try:
                _set_cpu_capability(capability)
            except ValueError:  # not built, or not this CPU's
                continue
            row = dict(B=B, n=n, capability=capability)
            for phase, call in calls.items():
                call()
                best = float("inf")
                for _ in range(rounds):
                    start = time.thread_time()
                    for _ in range(repeats):
                        call()
                    best = min(best, (time.thread_time() - start) / repeats)
                row[phase] = pair_ranks / best
            rows.append(row)
    _set_cpu_capability(chosen)
    return rows


def print_cpu_time_table(rows: list) -> None:
    print("| B, n | CPU kernels | order_loss forward (CPU time) | order_loss backward (CPU time) |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['B']}, {r['n']} | {r['capability']} | {r['forward'] / 1e9:.2f} G terms/s | "
              f"{r['backward'] / 1e9:.2f} G terms/s |")


def peak_extra_memory(B: int, n: int, d: int, device: str, backend: str, algorithm: str = "auto") -> int:
    """Bytes a forward+backward allocates at its peak, beyond its inputs."""
    if device == "cuda":
        h, mu, labels = make_inputs(B, n, d, device)
        criterion = make_loss(n, backend, algorithm)
        torch.autograd.grad(criterion(h, labels, mu), (h, mu))  # warm caches (tables, cuBLAS workspace)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.autograd.grad(criterion(h, labels, mu), (h, mu))
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    # CPU: a fresh process, so that its peak resident size (VmHWM; getrusage's ru_maxrss would carry
    # over the parent's) is this computation's alone. A small warm-up first maps the library code
    # both paths use, which would otherwise count as extra.
    script = (
        "import sys, json, resource, torch; sys.path.insert(0, sys.argv[1]); import bench_loss as b;"
        "B, n, d = map(int, sys.argv[2:5]); crit = b.make_loss(n, sys.argv[5], sys.argv[6]);"
        "h, mu, labels = b.make_inputs(8, n, d, 'cpu'); torch.autograd.grad(crit(h, labels, mu), (h, mu));"
        "h, mu, labels = b.make_inputs(B, n, d, 'cpu'); import gc; gc.collect();"
        "base = int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize();"
        "torch.autograd.grad(crit(h, labels, mu), (h, mu));"
        "peak = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) * 1024;"
        "print(json.dumps(max(0, peak - base)))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", script, here, str(B), str(n), str(d), backend, algorithm],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fmt_time(seconds):
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_bytes(count):
    return "—" if count is None else f"{count / 2**20:.1f} MB"


def profile_kernels(B: int, n: int, d: int, device: str, rows: int = 12, criterion=None) -> str:
    """The forward+backward of ``criterion`` (default: the fused pairwise loss) under torch.profiler: which
    kernels and operations hold the time."""
    from torch.profiler import ProfilerActivity, profile

    h, mu, labels = make_inputs(B, n, d, device)
    criterion = criterion or make_loss(n, "fused")
    for _ in range(3):
        torch.autograd.grad(criterion(h, labels, mu), (h, mu))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(5):
            torch.autograd.grad(criterion(h, labels, mu), (h, mu))
        if device == "cuda":
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    if device == "cuda":  # the kernels by GPU time, then the operations by host time (what an eager step waits on)
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows) + "\n" + table
    return table


def run(device: str, sizes, min_run_time: float) -> list:
    rows = []
    for B, n, d in sizes:
        pair_ranks = B * (B - 1) // 2 * n
        run_reference = reference_fits(pair_ranks, device)
        agreement = check_agreement(min(B, 256), n, d, device)
        assert agreement < 1e-9, f"fused and reference disagree at {(B, n, d)}: {agreement:.2e}"
        result = {"device": device, "B": B, "n": n, "d": d, "agreement": agreement, "check_values": CHECK_VALUES,
                  "threads": torch.get_num_threads(),
                  "capability": sol_ext.cpu_capability() if device == "cpu" else None,
                  "auto": "grouped" if sol_ext._dispatch.grouped_is_faster(B, n, torch.device(device)) else "pairwise"}
        for backend in BACKENDS:
            if backend == "reference" and not run_reference:
                result[backend] = None
                continue
            times = time_phases(B, n, d, device, backend, min_run_time)
            times.update(time_order_loss_op(B, n, device, backend, min_run_time))
            times["both, default algorithm"] = time_default_algorithm(B, n, d, device, backend, min_run_time)
            if device == "cuda" and backend == "fused" and not CHECK_VALUES:
                times["graph"] = time_cuda_graph(B, n, d, min_run_time)
                times["compiled"] = time_compiled(B, n, d, min_run_time)
            result[backend] = dict(times, memory=peak_extra_memory(B, n, d, device, backend))
        rows.append(result)
        print(f"  done {device} {(B, n, d)}", file=sys.stderr, flush=True)
    return rows


PHASES = ("forward", "backward", "both", "order_loss forward", "order_loss backward", "both, default algorithm")


def print_table(rows: list) -> None:
    print(
        "| device | B, n, d | phase | fused | reference | speed-up | fused pair-rank updates/s |"
        " per core | fused extra memory | reference extra memory |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fused, ref = r["fused"], r["reference"]
        pair_ranks = r["B"] * (r["B"] - 1) // 2 * r["n"]
        cores = r.get("threads", 1) if r["device"] == "cpu" else None
        for phase in PHASES + ("graph", "compiled"):
            if phase in ("graph", "compiled"):  # CUDA graphs (--no-check-values): captured by hand, torch.compile
                if fused.get(phase) is not None:
                    how = "CUDA graph" if phase == "graph" else "torch.compile reduce-overhead"
                    print(f"| {r['device']} | {r['B']}, {r['n']}, {r['d']} | both, {how} | "
                          f"{_fmt_time(fused[phase])} | | | {pair_ranks / fused[phase]:.3g} | | | |")
                continue
            ratio = f"{ref[phase] / fused[phase]:.1f}×" if ref else "—"
            memory = (_fmt_bytes(fused["memory"]), _fmt_bytes(ref["memory"] if ref else None)) if phase == "both" else ("", "")
            name = f"{phase} ({r['auto']})" if phase == "both, default algorithm" else phase
            rate = pair_ranks / fused[phase]
            print(
                f"| {r['device']} | {r['B']}, {r['n']}, {r['d']} | {name} | {_fmt_time(fused[phase])} | "
                f"{_fmt_time(ref[phase] if ref else None)} | {ratio} | {rate:.3g} | "
                f"{f'{rate / cores:.3g}' if cores else ''} | {memory[0]} | {memory[1]} |"
            )


ALGORITHM_SIZES = {
    "cpu": [(64, 60, 64), (1024, 101, 64), (4096, 217, 64), (8192, 7, 64), (65536, 7, 64), (1000000, 5, 64)],
    "cuda": [(64, 60, 64), (1024, 101, 64), (4096, 217, 64), (8192, 7, 64), (65536, 7, 64), (1000000, 5, 64)],
}
ALGORITHM_RUNS = {  # name -> StochasticOrderLoss arguments
    "grouped": dict(backend="auto", algorithm="grouped"),
    "pairwise": dict(backend="fused", algorithm="pairwise"),
    "reference": dict(backend="reference", algorithm="pairwise"),
}
# On CUDA grouped is also timed with the op's other implementation (csrc/cuda/grouped_order_loss_kernel.cu,
# SOL_EXT_CUDA_GROUPED), as "grouped_fused".
CUDA_GROUPED_SETTING = "SOL_EXT_CUDA_GROUPED"


@contextlib.contextmanager
def _environment(name: str, value: str):
    """``os.environ[name] = value`` inside the block (the CUDA op reads it at each call)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_forward_backward(B: int, n: int, d: int, device: str, how: str, min_run_time: float, repeats: int = 5,
                          cpu_time: bool = False):
    """Median seconds of one forward+backward (gradients of h and mu) of StochasticOrderLoss, after one
    warm-up call: repeated while the total stays under ``min_run_time`` (at least once, at most ``repeats``).
    ``cpu_time``: also the median CPU seconds of the calling thread (``time.thread_time``), which a busy
    machine inflates far less than the wall time; on one thread that is the whole step's."""
    h, mu, labels = make_inputs(B, n, d, device)
    criterion = sol_ext.StochasticOrderLoss(n, check_values=CHECK_VALUES, **ALGORITHM_RUNS[how])
    torch.autograd.grad(criterion(h, labels, mu), (h, mu))
    _sync(device)
    times, cpu_times = [], []
    while len(times) < repeats and (not times or sum(times) < min_run_time):
        start, cpu_start = time.perf_counter(), time.thread_time()
        torch.autograd.grad(criterion(h, labels, mu), (h, mu))
        _sync(device)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - cpu_start)
    wall = sorted(times)[len(times) // 2]
    return (wall, sorted(cpu_times)[len(cpu_times) // 2]) if cpu_time else wall


def _pairwise_rate(n: int, d: int, device: str, how: str, min_run_time: float) -> float:
    """Pair-ranks per second of a pairwise forward+backward, from a small run (B = 256; 2048 on a GPU,
    where a call of B = 256 is all fixed cost and would make larger ones look hours long)."""
    B = 2048 if device == "cuda" else 256
    return B * (B - 1) // 2 * n / time_forward_backward(B, n, d, device, how, min_run_time)


def check_algorithms_agree(B: int, n: int, d: int, device: str) -> float:
    """Largest relative difference of loss, dh and dmu between grouped and pairwise (float64)."""
    h, mu, labels = make_inputs(B, n, d, device, torch.float64)
    results = []
    for how in ("grouped", "pairwise"):
        loss = sol_ext.StochasticOrderLoss(n, **ALGORITHM_RUNS[how])(h, labels, mu)
        results.append((loss, *torch.autograd.grad(loss, (h, mu))))
    return max(
        ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item() for a, b in zip(*results)
    )


def _time_on_both_thread_counts(B: int, n: int, d: int, how: str, min_run_time: float, rounds: int = 5):
    """(default threads, one thread, one thread's CPU time): medians over ``rounds`` alternating rounds of
    each, so that a change in how loaded the machine is reaches both figures of the ratio alike."""
    threads = torch.get_num_threads()
    default, one, one_cpu = [], [], []
    try:
        for _ in range(rounds):
            torch.set_num_threads(threads)
            default.append(time_forward_backward(B, n, d, "cpu", how, min_run_time / rounds))
            torch.set_num_threads(1)
            wall, cpu = time_forward_backward(B, n, d, "cpu", how, min_run_time / rounds, cpu_time=True)
            one.append(wall)
            one_cpu.append(cpu)
    finally:
        torch.set_num_threads(threads)
    return sorted(default)[rounds // 2], sorted(one)[rounds // 2], sorted(one_cpu)[rounds // 2]


def run_algorithms(device: str, sizes, min_run_time: float, budget: float, memory: bool = True,
                   profile: bool = False) -> list:
    rows = []
    for B, n, d in sizes:
        agreement = check_algorithms_agree(min(B, 300), n, d, device)
        assert agreement < 1e-10, f"grouped and pairwise disagree at {(B, n, d)}: {agreement:.2e}"
        pair_ranks = B * (B - 1) // 2 * n
        result = {"device": device, "B": B, "n": n, "d": d, "agreement": agreement, "threads": torch.get_num_threads(),
                  "auto": "grouped" if sol_ext._dispatch.grouped_is_faster(B, n, torch.device(device)) else "pairwise"}
        for how in ALGORITHM_RUNS:
            if how == "grouped" and device == "cpu":  # below, beside its time on one thread
                continue
            if how != "grouped":
                if how == "reference" and not reference_fits(pair_ranks, device):
                    result[how], result[how + "_why"] = None, "would not fit"
                    continue
                # Extrapolated from a small run (_pairwise_rate); the reference's [pairs, n] tensors leave the caches at large B
                # and it slows down about twice more than the count of pair-ranks says.
                estimate = pair_ranks / _pairwise_rate(n, d, device, how, 0.2) * (2 if how == "reference" else 1)
                if estimate > budget:
                    result[how], result[how + "_why"] = None, f"about {estimate:.0f} s"
                    continue
            result[how] = time_forward_backward(B, n, d, device, how, min_run_time)
        if device == "cpu":
            result["grouped"], result["grouped_1_thread"], result["grouped_1_thread_cpu"] = _time_on_both_thread_counts(
                B, n, d, "grouped", min_run_time)
        else:
            with _environment(CUDA_GROUPED_SETTING, "fused"):
                result["grouped_fused"] = time_forward_backward(B, n, d, device, "grouped", min_run_time)
        if memory:
            result["grouped_memory"] = peak_extra_memory(B, n, d, device, "auto", "grouped")
        if profile:
            settings = ["separate", "fused"] if device == "cuda" else ["default"]
            result["profile"] = {}
            for setting in settings:
                criterion = sol_ext.StochasticOrderLoss(n, check_values=CHECK_VALUES, **ALGORITHM_RUNS["grouped"])
                with _environment(CUDA_GROUPED_SETTING, setting) if device == "cuda" else contextlib.nullcontext():
                    result["profile"][setting] = profile_kernels(B, n, d, device, criterion=criterion)
        rows.append(result)
        print(f"  done {device} {(B, n, d)}", file=sys.stderr, flush=True)
    return rows


def print_algorithm_table(rows: list) -> None:
    # The fused CUDA implementation's two columns only where it was timed (CUDA rows).
    with_fused = any(r.get("grouped_fused") is not None for r in rows)
    header = ["device", "B, n, d", "grouped", "grouped, 1 thread", "grouped, 1 thread CPU time", "grouped / 1 thread"]
    header += ["grouped, fused CUDA kernels"] if with_fused else []
    header += ["pairwise (fused)", "reference", "pairwise / grouped"]
    header += ["pairwise / grouped (fused CUDA kernels)"] if with_fused else []
    header += ["reference / grouped", "auto picks", "auto's pick is the faster", "grouped extra memory"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r in rows:
        cells = []
        for how in ALGORITHM_RUNS:
            cells.append(_fmt_time(r[how]) if r[how] is not None else f"skipped ({r[how + '_why']})")
        fused = r.get("grouped_fused")
        ratios = [f"{r[how] / r['grouped']:.1f}×" if r[how] is not None else "—" for how in ("pairwise", "reference")]
        if with_fused:
            ratios[1:1] = [f"{r['pairwise'] / fused:.1f}×" if fused and r["pairwise"] is not None else "—"]
        if r["pairwise"] is None:
            faster = "grouped"
        else:
            faster = "grouped" if r["grouped"] <= r["pairwise"] else "pairwise"
        ok = "yes" if r["auto"] == faster else f"no ({faster} is)"
        one = r.get("grouped_1_thread")
        cells[1:1] = [_fmt_time(one), _fmt_time(r.get("grouped_1_thread_cpu")), f"{r['grouped'] / one:.2f}" if one else "—"]
        cells[3:3] = [_fmt_time(fused)] if with_fused else []
        print(f"| {r['device']} | {r['B']}, {r['n']}, {r['d']} | {' | '.join(cells)} | {' | '.join(ratios)} | "
              f"{r['auto']} | {ok} | {_fmt_bytes(r.get('grouped_memory'))} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--sizes", nargs="+", help="B,n,d triples (default: per device)")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--no-check-values", action="store_true",
                        help="StochasticOrderLoss(check_values=False): no host-device synchronization per call")
    parser.add_argument("--profile", action="store_true",
                        help="also print a torch.profiler table of the fused forward+backward per size (5 steps); "
                             "with --algorithms of grouped's (on CUDA with each implementation of its op)")
    parser.add_argument("--algorithms", action="store_true",
                        help="time algorithm='grouped' vs 'pairwise' (fused) vs the reference instead (d = 64)")
    parser.add_argument("--budget", type=float, default=30.0,
                        help="--algorithms: skip pairwise/reference where one call would take longer (seconds)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="rates of the CPU order-loss op alone per CPU capability, from CPU time (one thread)")
    parser.add_argument("--rounds", type=int, default=15, help="--cpu-time: rounds per measurement (the best counts)")
    parser.add_argument("--busy", action="store_true",
                        help="run one spinning process beside the measurement (a busy machine)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        return _measure(args, parser)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def _measure(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:

    global CHECK_VALUES
    CHECK_VALUES = not args.no_check_values
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not (torch.cuda.is_available() and sol_ext.cuda_kernels_available()):
        if args.device == "cuda":
            parser.error("no CUDA GPU, or this build of sol_ext has no CUDA kernels")
        devices.remove("cuda")
    if args.cpu_time:
        sizes = [tuple(map(int, s.split(","))) for s in args.sizes] if args.sizes else DEFAULT_SIZES["cpu"]
        rows = cpu_time_rates(sizes, args.rounds)
        print(f"\nThe CPU order-loss op alone, all pairs, float32, one thread; torch {torch.__version__}, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; the best of {args.rounds} rounds")
        print_cpu_time_table(rows)
        return 0
    if args.algorithms:
        measure = functools.partial(run_algorithms, budget=args.budget, profile=args.profile)
        default_sizes = ALGORITHM_SIZES
    else:
        measure, default_sizes = run, DEFAULT_SIZES
    rows = []
    for device in devices:
        sizes = [tuple(map(int, s.split(","))) for s in args.sizes] if args.sizes else default_sizes[device]
        rows += measure(device, sizes, args.min_run_time)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    what = " forward+backward" if args.algorithms else ""
    print(f"\nStochasticOrderLoss(check_values={CHECK_VALUES}){what}, all pairs, float32; torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads"
          + (f", {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}" if args.algorithms else "")
          + (", beside one spinning process (--busy)" if args.busy else "")
          + (f", CPU kernels {sol_ext.cpu_capability()}" if "cpu" in devices else "")
          + (f", {torch.cuda.get_device_name()}" if "cuda" in devices else ""))
    if args.algorithms:
        print_algorithm_table(rows)
        for r in rows:
            for setting, table in r.get("profile", {}).items():
                print(f"\n### profile: grouped ({setting}) {r['device']} B={r['B']} n={r['n']} d={r['d']}, "
                      "5 x (forward + backward)")
                print(table)
        return 0
    print_table(rows)
    if args.profile:
        for r in rows:
            print(f"\n### profile: {r['device']} B={r['B']} n={r['n']} d={r['d']}, 5 x (forward + backward)")
            print(profile_kernels(r["B"], r["n"], r["d"], r["device"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
