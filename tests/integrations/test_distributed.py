"""Data-parallel SOL: the block op (local rows x gathered rows) and the loss over the global batch.

The spawned-process tests run W = 2 and 3 processes with the gloo backend on the CPU, on the loopback
interface with a free port, under a timeout, and compare one DDP step with one process on the
concatenated batch.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from torch.library import opcheck

import sol_ext
from common import (
    MULTIPROCESS_TIMEOUT_S,
    REL_TOL,
    REPO_ROOT,
    assert_rel_close,
    cpu_and_cuda,
    multiprocess_env,
    random_labels,
    spawn_processes,
)
from sol_ext import reference
from sol_ext.distributed import DistributedStochasticOrderLoss
from sol_ext.ops import order_loss_block

ops = torch.ops.sol_ext

# (B, N, offset, n, convention, margin): the local rows are rows offset..offset+B-1 of the N global rows.
BLOCK_CASES = [
    (4, 11, 0, 7, "paper", 0.25),
    (5, 11, 4, 7, "official", 0.0),
    (2, 11, 9, 7, "paper", 1.0),
    (0, 6, 3, 5, "paper", 0.25),
    (7, 7, 0, 1, "official", 0.25),
    (9, 40, 17, 33, "paper", 0.3),
    (3, 3, 0, 150, "official", 0.1),
]


def _block_inputs(B, N, offset, n, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    D_all = torch.randn(N, n, generator=gen, dtype=torch.float64).to(device, dtype)
    labels_all = random_labels(N, n, gen, device)
    return D_all[offset : offset + B].clone(), labels_all[offset : offset + B].clone(), D_all, labels_all


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", BLOCK_CASES)
def test_block_kernel_matches_reference(case, dtype, device):
    """Fused order_loss_block: per-row sums and both gradients (local and gathered rows) equal the reference's."""
    B, N, offset, n, convention, margin = case
    tol = REL_TOL[dtype]
    D, labels, D_all, labels_all = _block_inputs(B, N, offset, n, dtype, device)
    D.requires_grad_(True)
    D_all.requires_grad_(True)
    args = (offset, 0.8, 2, margin, convention)
    fused = order_loss_block(D, labels, D_all, labels_all, *args, backend="fused")
    ref = reference.order_loss_block(D, labels, D_all, labels_all, *args)
    assert_rel_close(fused, ref, tol, "per-row losses")
    if B == 0:
        return
    upstream = torch.randn(B, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device, dtype)
    g_fused = torch.autograd.grad(fused, (D, D_all), upstream)
    g_ref = torch.autograd.grad(ref, (D, D_all), upstream)
    assert_rel_close(g_fused[0], g_ref[0], tol, "dD (local rows)")
    assert_rel_close(g_fused[1], g_ref[1], tol, "dD_all (gathered rows)")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_blocks_of_a_partition_count_every_pair_once(dtype):
    """Summed over the processes of any split of the batch, the blocks give the all-pairs loss of the batch."""
    N, n = 13, 9
    _, _, D_all, labels_all = _block_inputs(0, N, 0, n, dtype, "cpu", seed=3)
    expected = sol_ext.order_loss(D_all, labels_all, None, 0.8, 2, 0.25, reduction="sum", backend="fused")
    for sizes in ([13], [7, 6], [5, 0, 8], [1, 4, 4, 4]):
        offsets = [sum(sizes[:r]) for r in range(len(sizes))]
        total = sum(
            order_loss_block(
                D_all[o : o + s], labels_all[o : o + s], D_all, labels_all, o, 0.8, 2, 0.25, backend="fused"
            ).sum(dtype=torch.float64)
            for o, s in zip(offsets, sizes)
        )
        assert_rel_close(total.to(dtype), expected, REL_TOL[dtype], f"sizes {sizes}")


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_gradcheck_block(device):
    D, labels, D_all, labels_all = _block_inputs(4, 9, 3, 6, torch.float64, device)

    def fn(D, D_all):
        return order_loss_block(D, labels, D_all, labels_all, 3, 0.9, 1, 0.05, "official", backend="fused")

    assert torch.autograd.gradcheck(fn, (D.requires_grad_(), D_all.requires_grad_()))


def test_block_backward_is_bitwise_reproducible_across_thread_counts():
    """Each gradient row is summed by one worker in a fixed order, whatever the number of threads."""
    D, labels, D_all, labels_all = _block_inputs(40, 90, 30, 21, torch.float32, "cpu", seed=5)
    grad_rows = torch.randn(40, generator=torch.Generator().manual_seed(6))
    args = (D, labels, D_all, labels_all, 30, 1.0, 2, 0.25, "paper")
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            results.append((ops.order_loss_block(*args), *ops._order_loss_block_backward(grad_rows, *args, True, True)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def _block_op_cases(device):
    D, labels, D_all, labels_all = _block_inputs(4, 9, 3, 6, torch.float64, device)
    grad_rows = torch.randn(4, dtype=torch.float64, device=device)
    tail = (3, 1.0, 2, 0.25, "paper")
    return {
        "order_loss_block": (ops.order_loss_block, (D, labels, D_all, labels_all, *tail)),
        "order_loss_block_empty": (ops.order_loss_block, (D[:0], labels[:0], D_all, labels_all, *tail)),
        "_order_loss_block_backward": (
            ops._order_loss_block_backward, (grad_rows, D, labels, D_all, labels_all, *tail, True, True)),
        "_order_loss_block_backward_gathered_only": (
            ops._order_loss_block_backward, (grad_rows, D, labels, D_all, labels_all, *tail, False, True)),
    }


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("case", list(_block_op_cases("cpu")))
def test_opcheck_block(device, case):
    """Schema, fake kernel and dispatch consistency of the block op and its backward."""
    op, args = _block_op_cases(device)[case]
    opcheck(op, args)


def test_block_refuses_an_offset_outside_the_gathered_rows():
    D, labels, D_all, labels_all = _block_inputs(4, 9, 3, 6, torch.float64, "cpu")
    with pytest.raises(ValueError, match="offset must lie in 0..5"):
        order_loss_block(D, labels, D_all, labels_all, 6)
    with pytest.raises(RuntimeError, match="offset must lie in 0..5"):
        ops.order_loss_block(D, labels, D_all, labels_all, 6, 1.0, 2, 0.25, "paper")


def test_distributed_loss_without_a_process_group_says_how_to_start_one():
    criterion = DistributedStochasticOrderLoss(sol_ext.StochasticOrderLoss(4))
    with pytest.raises(RuntimeError, match="init_process_group"):
        criterion(torch.randn(3, 2), torch.tensor([0, 1, 3]), torch.randn(4, 2))


@pytest.fixture
def one_process_group():
    """A process group of this process alone (gloo, in-memory store), destroyed after the test."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["pairwise", "grouped"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_distributed_loss_of_one_process_is_the_wrapped_loss(one_process_group, algorithm, reduction):
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(9, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    mu = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    labels = random_labels(9, 5, gen)
    loss = sol_ext.StochasticOrderLoss(5, tau=1, disc_weight=0.6, reduction=reduction, algorithm=algorithm)
    single = loss(h, labels, mu)
    (grad_single,) = torch.autograd.grad(single, h)
    wrapped = DistributedStochasticOrderLoss(loss)(h, labels, mu)
    (grad_wrapped,) = torch.autograd.grad(wrapped, h)
    assert_rel_close(wrapped.detach(), single.detach(), 1e-12, "loss")
    assert_rel_close(grad_wrapped, grad_single, 1e-12, "dL/dh")


def test_distributed_loss_reads_values_only_when_the_wrapped_loss_does(one_process_group):
    h, mu, labels = torch.randn(6, 3), torch.randn(4, 3), torch.tensor([0, 1, 2, 3, 0, 1])
    h[2, 1] = float("nan")
    strict = DistributedStochasticOrderLoss(sol_ext.StochasticOrderLoss(4))
    with pytest.raises(ValueError, match="h contains 1 NaN or inf"):
        strict(h, labels, mu)
    # check_values=False: no host read of the values, as in the wrapped loss (a NaN goes through)
    lenient = sol_ext.StochasticOrderLoss(4, check_values=False)
    assert torch.isnan(lenient(h, labels, mu))
    assert torch.isnan(DistributedStochasticOrderLoss(lenient)(h, labels, mu))


def test_distributed_loss_refuses_what_the_wrapped_loss_refuses(one_process_group):
    """An overflow from finite but huge embeddings (check_values=True, on the global value), and a label
    outside the ranks on the CPU's reference path with check_values=False (-1 would wrap around)."""
    torch.manual_seed(0)
    mu, h, labels = torch.randn(5, 2), torch.randn(6, 2) * 1e19, torch.tensor([0, 4, 0, 4, 2, 1])
    with pytest.raises(ValueError, match=r"the loss overflows torch.float32 .* of h and mu is 1.\d+e\+19"):
        DistributedStochasticOrderLoss(sol_ext.StochasticOrderLoss(5, sigma=1e-3))(h, labels, mu)
    lenient = sol_ext.StochasticOrderLoss(5, backend="reference", check_values=False)
    with pytest.raises(ValueError, match=r"labels must lie in 0 … 4"):
        DistributedStochasticOrderLoss(lenient)(torch.randn(6, 2), torch.tensor([-1, 4, 0, 4, 2, 1]), mu)


# ------------------------------------------------------------------------------------------------
# Spawned processes: one DDP step on W processes against one process on the concatenated batch.
# ------------------------------------------------------------------------------------------------

IN_DIM, DIM, NUM_RANKS = 5, 4, 9


class _Model(torch.nn.Module):
    """An encoder and trainable centroids, so that DDP averages the gradients of both."""

    def __init__(self, dtype):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.encoder = torch.nn.Linear(IN_DIM, DIM, dtype=dtype)
        with torch.no_grad():
            self.encoder.weight.copy_(torch.randn(DIM, IN_DIM, generator=gen))
            self.encoder.bias.copy_(torch.randn(DIM, generator=gen))
        self.mu = torch.nn.Parameter(torch.randn(NUM_RANKS, DIM, generator=gen, dtype=torch.float64).to(dtype))

    def forward(self, x):
        return self.encoder(x), self.mu


# (sizes per process, dtype, reduction, convention): unequal last batches and empty process batches.
SPAWN_CASES = {
    2: [([6, 6], torch.float64, "mean", "paper"), ([7, 3], torch.float32, "mean", "official"),
        ([5, 0], torch.float64, "sum", "paper"), ([0, 4], torch.float32, "sum", "paper")],
    3: [([4, 4, 4], torch.float64, "mean", "paper"), ([5, 5, 2], torch.float32, "sum", "official"),
        ([4, 0, 3], torch.float64, "mean", "official"), ([3, 3, 0], torch.float32, "mean", "paper")],
}


def _global_batch(sizes, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), IN_DIM, generator=gen, dtype=torch.float64).to(dtype)
    return x, random_labels(sum(sizes), NUM_RANKS, gen)


def _criterion(reduction, convention):
    return sol_ext.StochasticOrderLoss(
        NUM_RANKS, sigma=0.8, tau=2, margin=0.3, T=2, disc_weight=0.7, convention=convention,
        reduction=reduction, backend="fused",
    )


def _single_process_step(case, seed):
    sizes, dtype, reduction, convention = case
    x, labels = _global_batch(sizes, dtype, seed)
    model = _Model(dtype)
    h, mu = model(x)
    loss = _criterion(reduction, convention)(h, labels, mu)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _worker(rank, world_size, cases, out_dir):
    results = []
    for seed, case in enumerate(cases):
        sizes, dtype, reduction, convention = case
        x, labels = _global_batch(sizes, dtype, seed)
        start = sum(sizes[:rank])
        x, labels = x[start : start + sizes[rank]], labels[start : start + sizes[rank]]
        model = torch.nn.parallel.DistributedDataParallel(_Model(dtype))
        criterion = DistributedStochasticOrderLoss(_criterion(reduction, convention))
        h, mu = model(x)
        loss = criterion(h, labels, mu)
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.module.named_parameters()}
        results.append((loss.detach(), grads))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_step_equals_one_process_on_the_concatenated_batch(world_size, tmp_path):
    """Loss value on every process and DDP-averaged parameter gradients (encoder and centroids) equal the
    single-process ones on the concatenated batch, with unequal and empty process batches."""
    cases = SPAWN_CASES[world_size]
    spawn_processes(_worker, world_size, (cases, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    for seed, case in enumerate(cases):
        sizes, dtype = case[0], case[1]
        expected_loss, expected_grads = _single_process_step(case, seed)
        for rank in range(world_size):
            loss, grads = per_rank[rank][seed]
            what = f"sizes {sizes}, {dtype}, {case[2]}, {case[3]}, rank {rank}"
            assert_rel_close(loss, expected_loss, REL_TOL[dtype], f"loss, {what}")
            assert grads.keys() == expected_grads.keys()
            for name, grad in grads.items():
                assert_rel_close(grad, expected_grads[name], REL_TOL[dtype], f"d/d{name}, {what}")


def test_zigzag_layout_gives_every_process_the_same_number_of_pairs():
    """Each half of a process's rows is paired with the rows after it in the zigzag order: together the
    processes cover every pair once, and with equal even batches each evaluates N(N-1)/(2W) pairs."""
    from sol_ext.distributed import zigzag_layout

    for sizes in ([512] * 8, [6, 6], [5, 5, 2], [4, 0, 3], [1, 1], [0, 3]):
        N = sum(sizes)
        owned = []
        for rank, size in enumerate(sizes):
            segments, split, (first, second) = zigzag_layout(sizes, rank)
            order = [i for a, b in segments for i in range(a, b)]
            assert sorted(order) == list(range(N))
            start = sum(sizes[:rank])
            assert order[first:first + split] == list(range(start, start + split))
            assert order[second:second + size - split] == list(range(start + split, start + size))
            positions = [*range(first, first + split), *range(second, second + size - split)]
            owned.append(sum(N - 1 - p for p in positions))
        assert sum(owned) == N * (N - 1) // 2, sizes
        if len(set(sizes)) == 1 and sizes[0] % 2 == 0:
            assert owned == [N * (N - 1) // (2 * len(sizes))] * len(sizes), (sizes, owned)


# ------------------------------------------------------------------------------------------------
# SOL's end-of-epoch step across processes: update_head, and the DDP example script under torchrun.
# ------------------------------------------------------------------------------------------------

HEAD_N, HEAD_RANKS = 23, 7  # 23 samples: unequal shares for 2 and 3 processes


def _head_data():
    gen = torch.Generator().manual_seed(4)
    h = torch.nn.functional.normalize(torch.randn(HEAD_N, DIM, generator=gen, dtype=torch.float64), dim=1)
    labels = torch.randint(0, HEAD_RANKS, (HEAD_N,), generator=gen)
    val_h = torch.nn.functional.normalize(torch.randn(9, DIM, generator=gen, dtype=torch.float64), dim=1)
    return h, labels, val_h, torch.randint(0, HEAD_RANKS, (9,), generator=gen)


def _head_updates(h, labels, val_h, val_labels, shares, val_share, update_centroids, update):
    """The head's states after the first centroids and one end-of-epoch update on ``shares[0]`` of
    the training set, then after a second update on ``shares[1]`` with the validation split."""
    from sol_ext import SOLHead

    states = []
    head = SOLHead(HEAD_RANKS, DIM, sigma=0.8)
    share, second = shares
    update_centroids(head, h[share], labels[share])
    update(head, h[share], labels[share])
    states.append({k: v.clone() for k, v in head.state_dict().items()})
    update(head, h[second] * 0.9 + 0.1, labels[second], val_h[val_share], val_labels[val_share])
    states.append({k: v.clone() for k, v in head.state_dict().items()})
    return states


def _head_worker(rank, world_size, out_dir):
    from sol_ext.distributed import shard, update_centroids, update_head

    h, labels, val_h, val_labels = _head_data()
    # unequal shares, then empty ones: the second update's training set on the first process
    # alone, the validation split on the last process alone
    second = slice(0, HEAD_N) if rank == 0 else slice(0, 0)
    val_share = slice(0, 9) if rank == world_size - 1 else slice(0, 0)
    states = _head_updates(h, labels, val_h, val_labels, (shard(HEAD_N), second), val_share,
                           update_centroids, update_head)
    torch.save(states, os.path.join(out_dir, f"head{rank}.pt"))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_update_head_across_processes_equals_one_process_on_all_the_data(tmp_path):
    """Every process ends with the head of SOLHead.update_centroids/update on the whole training set:
    the centroids to float64 rounding (the sums are added in another order), the read-out exactly."""
    world_size = 3  # 23 samples: shares of 8, 8 and 7
    spawn_processes(_head_worker, world_size, (str(tmp_path),))
    h, labels, val_h, val_labels = _head_data()
    expected = _head_updates(h, labels, val_h, val_labels, (slice(None), slice(None)), slice(None),
                             lambda head, *a: head.update_centroids(*a), lambda head, *a: head.update(*a))
    for rank in range(world_size):
        got = torch.load(tmp_path / f"head{rank}.pt")
        for step, (state, want) in enumerate(zip(got, expected)):
            assert state.keys() == want.keys()
            for key, value in want.items():
                torch.testing.assert_close(state[key], value, rtol=1e-12, atol=1e-12,
                                           msg=f"{key} after update {step}, rank {rank}")


def test_update_head_without_a_process_group_is_the_heads_update():
    from sol_ext import SOLHead
    from sol_ext.distributed import gather_all, shard, update_head

    h, labels, _, _ = _head_data()
    assert shard(HEAD_N) == slice(0, HEAD_N) and gather_all(h) is h
    mine, plain = SOLHead(HEAD_RANKS, DIM), SOLHead(HEAD_RANKS, DIM)
    update_head(mine, h, labels)
    plain.update(h, labels)
    for key, value in plain.state_dict().items():
        assert torch.equal(mine.state_dict()[key], value), key


def test_update_head_checks_every_argument_before_changing_the_head():
    from sol_ext import SOLHead
    from sol_ext.distributed import update_head

    h, labels, val_h, _ = _head_data()
    head = SOLHead(HEAD_RANKS, DIM)
    with pytest.raises(ValueError, match="pass val_h and val_labels together"):
        update_head(head, h, labels, val_h)
    with pytest.raises(ValueError, match="val_labels must hold one rank per row of val_h"):
        update_head(head, h, labels, val_h, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"h must be embeddings \[N, 4\]"):
        update_head(head, h[:, :3], labels)
    assert not bool(head.has_centroids)


def test_shards_cover_every_sample_once(one_process_group, monkeypatch):
    import sol_ext.distributed as sd

    assert sd.shard(5) == slice(0, 5)  # a group of one process: everything
    for world in (2, 3, 5):
        for count in (0, 1, 4, 23):
            parts = []
            for rank in range(world):  # what each process of a group of `world` gets
                monkeypatch.setattr(sd.dist, "get_world_size", lambda group=None, w=world: w)
                monkeypatch.setattr(sd.dist, "get_rank", lambda group=None, r=rank: r)
                parts.append(sd.shard(count))
            assert [i for p in parts for i in range(count)[p]] == list(range(count)), (world, count)
            sizes = [p.stop - p.start for p in parts]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


EXAMPLE = REPO_ROOT / "examples" / "ddp_train.py"
DDP_PAGE = REPO_ROOT / "docs" / "distributed.md"


def test_the_readme_ddp_script_is_the_example_file():
    assert "```python\n" + EXAMPLE.read_text().split('"""\n', 1)[1].lstrip() + "```" in DDP_PAGE.read_text()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_the_ddp_example_runs_under_torchrun_on_the_cpu(tmp_path):
    """examples/ddp_train.py (the DDP script of docs/distributed.md) runs as written with 2 gloo processes."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(EXAMPLE)], capture_output=True, text=True, timeout=MULTIPROCESS_TIMEOUT_S,
                          cwd=tmp_path, env=multiprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    match = re.search(r"2 processes: test MAE ([0-9.]+)", proc.stdout)
    assert match and float(match.group(1)) < 1.0, proc.stdout  # ranks 0…9: it learned
    saved = torch.load(tmp_path / "sol_ddp.pt")
    head = sol_ext.SOLHead.from_state_dict(saved["head"])
    assert bool(head.has_readout) and head.num_ranks == 10
