"""Gradients, op registration, torch.compile, determinism and empty inputs of the fused ops."""
from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch.library import opcheck

import sol_ext
from common import REPO_ROOT, cpu_and_cuda, load_benchmark, random_labels, random_pairs

ops = torch.ops.sol_ext


def _inputs(device, B=9, n=6, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(B, d, generator=gen, dtype=torch.float64).to(device)
    mu = torch.randn(n, d, generator=gen, dtype=torch.float64).to(device)
    labels = random_labels(B, n, gen, device)
    pairs = random_pairs(B, 12, gen, device)
    return h, mu, labels, pairs


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_gradcheck_dissimilarity(device):
    h, mu, _, _ = _inputs(device)
    fn = lambda h, mu: sol_ext.stochastic_dissimilarity(h, mu, 0.8, backend="fused")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h.requires_grad_(), mu.requires_grad_()))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("convention", ["paper", "official"])
@pytest.mark.parametrize("explicit_pairs", [False, True])
def test_gradcheck_order_loss(device, convention, explicit_pairs):
    h, mu, labels, pairs = _inputs(device)
    # D well away from the hinge kinks, so finite differences see one linear piece.
    D = (sol_ext.stochastic_dissimilarity(h, mu) / 3).requires_grad_()
    fn = lambda D: sol_ext.order_loss(  # noqa: E731
        D, labels, pairs if explicit_pairs else None, sigma=1.2, tau=1, margin=0.1, convention=convention,
        reduction="none", backend="fused",
    )
    assert torch.autograd.gradcheck(fn, (D,))


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_gradcheck_disc_loss(device):
    h, mu, labels, _ = _inputs(device)
    D = sol_ext.stochastic_dissimilarity(h, mu).requires_grad_()
    fn = lambda D: sol_ext.disc_loss(D, labels, T=3, reduction="none", backend="fused")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (D,))


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_gradcheck_module(device):
    h, mu, labels, _ = _inputs(device)
    criterion = sol_ext.StochasticOrderLoss(6, sigma=0.9, tau=1, margin=0.05, T=2, backend="fused")
    assert torch.autograd.gradcheck(lambda h, mu: criterion(h / 2, labels, mu), (h.requires_grad_(), mu.requires_grad_()))


def _composed_loss(h, mu, labels, pairs, criterion):
    """StochasticOrderLoss spelled out with the public fused ops, one autograd node per op."""
    c = criterion
    D = sol_ext.stochastic_dissimilarity(h, mu, c.sigma, backend="fused")
    order = sol_ext.order_loss(D, labels, pairs, c.sigma, c.tau, c.margin, c.convention, c.reduction, backend="fused")
    return order + c.disc_weight * sol_ext.disc_loss(D, labels, c.T, c.reduction, backend="fused")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case", ["all pairs", "explicit pairs", "empty batch", "h only", "no disc"])
def test_fused_module_is_one_node_equal_to_the_composed_ops(device, dtype, reduction, case):
    """The module runs as one autograd node with its own backward, and gives the loss and gradients of
    the composition of the public fused ops: bitwise on the CPU (same kernels, same reductions)."""
    h, mu, labels, pairs = _inputs(device)
    if case == "empty batch":
        h, labels = h[:0], labels[:0]
    h, mu = h.to(dtype).requires_grad_(), mu.to(dtype).requires_grad_(case != "h only")
    pairs = pairs if case == "explicit pairs" else None
    criterion = sol_ext.StochasticOrderLoss(
        6, sigma=0.9, tau=1, margin=0.3, T=2, disc_weight=0.0 if case == "no disc" else 2.5, reduction=reduction,
        backend="fused",
    )
    fused = criterion(h, labels, mu, pairs)
    assert "StochasticOrderLossFunction" in fused.grad_fn.name()  # the C++ node of stochastic_order_loss
    assert all(f is None or type(f).__name__ == "AccumulateGrad" for f, _ in fused.grad_fn.next_functions)
    expected = _composed_loss(h, mu, labels, pairs, criterion)
    inputs = [h, mu] if mu.requires_grad else [h]
    got_grads = torch.autograd.grad(fused * 1.5, inputs)
    expected_grads = torch.autograd.grad(expected * 1.5, inputs)
    exact = device == "cpu"
    for got, want in zip((fused, *got_grads), (expected, *expected_grads)):
        assert got.dtype == want.dtype
        if exact:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-6 if dtype == torch.float32 else 1e-13, atol=0)


def _op_cases(device):
    h, mu, labels, pairs = _inputs(device)
    D = sol_ext.stochastic_dissimilarity(h, mu)
    B, n = D.shape
    grad_pairs = torch.randn(B * (B - 1) // 2, dtype=torch.float64, device=device)
    return {
        "stochastic_dissimilarity": (ops.stochastic_dissimilarity, (h, mu, 1.0)),
        "_stochastic_dissimilarity_backward": (ops._stochastic_dissimilarity_backward, (D, h, mu, 1.0, True, True)),
        "_stochastic_dissimilarity_backward_h_only": (ops._stochastic_dissimilarity_backward, (D, h, mu, 1.0, True, False)),
        "ordering_probabilities": (ops.ordering_probabilities, (labels, labels.flip(0), n, 1.0, 2, "paper", torch.float32)),
        "order_loss_all_pairs": (ops.order_loss, (D, labels, None, 1.0, 2, 0.25, "paper")),
        "order_loss_pairs": (ops.order_loss, (D, labels, pairs, 1.0, 2, 0.25, "official")),
        "_order_loss_backward_all_pairs": (ops._order_loss_backward, (grad_pairs, D, labels, None, 1.0, 2, 0.25, "paper")),
        "_order_loss_backward_pairs": (
            ops._order_loss_backward, (torch.randn(12, dtype=torch.float64, device=device), D, labels, pairs, 1.0, 2, 0.25, "official")),
        "disc_loss": (ops.disc_loss, (D, labels, 2)),
        "_disc_loss_backward": (ops._disc_loss_backward, (torch.randn(B, dtype=torch.float64, device=device), labels, n, 2)),
        "stochastic_order_loss_all_pairs": (
            ops.stochastic_order_loss, (h, mu, labels, None, 1.0, 2, 0.25, 2, 1.5, "paper", "mean")),
        "stochastic_order_loss_pairs": (
            ops.stochastic_order_loss, (h, mu, labels, pairs, 0.7, 1, 0.5, 1, 0.0, "official", "sum")),
        "_stochastic_order_loss_backward": (
            ops._stochastic_order_loss_backward,
            (torch.tensor(1.3, dtype=torch.float64, device=device), h, mu, D, labels, pairs, 1.0, 2, 0.25, 2, 1.5,
             "paper", "mean", True, True)),
        "_stochastic_order_loss_backward_mu_only": (
            ops._stochastic_order_loss_backward,
            (torch.tensor(1.3, dtype=torch.float64, device=device), h, mu, D, labels, None, 1.0, 2, 0.25, 2, 1.5,
             "paper", "sum", False, True)),
    }


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("case", list(_op_cases("cpu")))
def test_opcheck(device, case):
    """Schema, fake kernel, autograd registration and dispatch consistency of every op."""
    op, args = _op_cases(device)[case]
    opcheck(op, args)


SCHEMAS = REPO_ROOT / "csrc" / "sol_ext.cpp"
# The whole-step ops' backward ops run inside their C++ autograd nodes, which call them below autograd;
# they have no autograd kernel of their own (a Python one would run on every training step).
WHOLE_STEP_BACKWARDS = {"_stochastic_order_loss_backward", "_grouped_stochastic_order_loss_backward"}


def _every_op_requiring_grad(device):
    """One call per op of csrc/sol_ext.cpp (and the grouped sum's torch operations), every floating input
    requiring grad: opcheck's test_autograd_registration and test_aot_dispatch_* then check gradients."""
    h, mu, labels, pairs = _inputs(device)
    D = sol_ext.stochastic_dissimilarity(h, mu)
    B, n = D.shape

    gen = torch.Generator().manual_seed(1)

    def grad(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()

    h, mu, D = (t.detach().clone().requires_grad_() for t in (h, mu, D))
    D_all = torch.cat([D.detach(), D.detach()[:3] + 0.5]).requires_grad_()
    labels_all = torch.cat([labels, labels[:3]])
    loss = (1.0, 2, 0.25)
    return {
        "stochastic_dissimilarity": (h, mu, 0.8),
        "_stochastic_dissimilarity_backward": (grad(B, n), h, mu, 0.8, True, True),
        "ordering_probabilities": (labels, labels.flip(0), n, 1.0, 2, "paper", torch.float64),
        "order_loss": (D, labels, pairs, *loss, "official"),
        "_order_loss_backward": (grad(B * (B - 1) // 2), D, labels, None, *loss, "paper"),
        "order_loss_block": (D[2:5], labels[2:5], D_all, labels_all, 2, *loss, "paper"),
        "_order_loss_block_backward": (grad(B), D, labels, D_all, labels_all, 0, *loss, "paper", True, True),
        "disc_loss": (D, labels, 2),
        "_disc_loss_backward": (grad(B), labels, n, 2),
        "stochastic_order_loss": (h, mu, labels, None, *loss, 2, 1.5, "paper", "mean"),
        "_stochastic_order_loss_backward": (
            grad(), h, mu, D, labels, pairs, *loss, 2, 1.5, "paper", "sum", True, True),
        "grouped_stochastic_order_loss": (h, mu, labels, *loss, 2, 1.5, "paper", "mean", True, True),
        "_grouped_stochastic_order_loss_backward": (
            grad(), h, mu, D, labels, grad(B, n).detach(), 1.0, 2, 1.5, "mean",
            True, True),
        "grouped_order_sum": (D, labels, *loss, "paper", 1, n, True),
        "grouped_order_sum_torch": (D, labels, *loss, "official", 0, n, True),
    }


def test_every_op_of_the_schema_file_is_checked():
    defined = set(re.findall(r'm\.def\(\s*"(\w+)\(', SCHEMAS.read_text(encoding="utf-8")))
    assert len(defined) == 14
    assert defined | {"grouped_order_sum_torch"} == set(_every_op_requiring_grad("cpu"))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name", list(_every_op_requiring_grad("cpu")))
def test_opcheck_with_inputs_that_require_grad(device, name):
    """All of opcheck's default tests, with gradients: every leaf op has an autograd formula
    (torch.library.register_autograd) that AOTAutograd traces to the eager gradients, and every backward op
    a kernel that says it is not differentiable, so that none falls back to autograd's warning."""
    op = getattr(ops, name).default
    args = _every_op_requiring_grad(device)[name]
    with warnings.catch_warnings():
        if name not in WHOLE_STEP_BACKWARDS:
            warnings.filterwarnings("error", message=".*autograd kernel was not registered")
        results = opcheck(op, args)
    assert set(results) == {"test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"}
    assert all(result == "SUCCESS" for result in results.values())


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("name, differentiable", [
    ("stochastic_dissimilarity", (0, 1)), ("order_loss", (0,)), ("order_loss_block", (0, 2)), ("disc_loss", (0,)),
])
def test_the_ops_are_differentiable_on_their_own(device, name, differentiable):
    """torch.ops.sol_ext.<op>, called directly, has the gradient of the public function (gradcheck), and its
    backward kernel's results refuse a second differentiation."""
    args = list(_every_op_requiring_grad(device)[name])
    if name != "stochastic_dissimilarity":  # D away from the hinge kinks: finite differences see one piece
        args = [a.detach().div(3).requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]
    inputs = [args[i] for i in differentiable]

    def call(*tensors):
        full = list(args)
        for i, t in zip(differentiable, tensors):
            full[i] = t
        return getattr(ops, name)(*full)

    assert torch.autograd.gradcheck(call, inputs)
    grads = torch.autograd.grad(call(*inputs).sum(), inputs, create_graph=True)
    if name == "disc_loss":  # linear in D: its gradient is a constant, correctly without a graph
        assert not any(g.requires_grad for g in grads)
        return
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD.format(op=name)):
        torch.autograd.grad(sum(g.square().sum() for g in grads), inputs)


@pytest.mark.slow
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_compiled_training_step_matches_eager(device):
    """torch.compile(fullgraph=True) of model + StochasticOrderLoss; backward through the compiled graph."""
    torch._dynamo.reset()
    h, mu, labels, _ = _inputs(device, B=16, n=7, d=5)
    model = torch.nn.Linear(5, 5).double().to(device)
    criterion = sol_ext.StochasticOrderLoss(7, backend="fused")

    def loss_of(x, labels, mu):
        return criterion(model(x), labels, mu)

    compiled = torch.compile(loss_of, fullgraph=True)
    results = []
    for fn in (compiled, loss_of):
        model.zero_grad()
        loss = fn(h, labels, mu)
        loss.backward()
        results.append((loss.detach(), model.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("B, n", [(200, 40), (600, 20)])  # rows of tiles as tasks; diagonals of tiles (B > 512)
def test_all_pairs_backward_is_bitwise_reproducible_across_thread_counts(B, n):
    gen = torch.Generator().manual_seed(3)
    D = torch.randn(B, n, generator=gen, dtype=torch.float32).requires_grad_()
    labels = torch.randint(0, n, (B,), generator=gen)
    threads = torch.get_num_threads()
    grads = []
    try:
        for count in (1, max(2, threads)):
            torch.set_num_threads(count)
            loss = sol_ext.order_loss(D, labels, backend="fused")
            grads.append(torch.autograd.grad(loss, D)[0])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("batch_size, pairs", [(0, None), (1, None), (5, "empty")])
def test_empty_batch_or_pair_set_gives_zero_loss_and_zero_gradients(device, backend, batch_size, pairs):
    h = torch.randn(batch_size, 3, dtype=torch.float64, device=device, requires_grad=True)
    mu = torch.randn(4, 3, dtype=torch.float64, device=device, requires_grad=True)
    labels = torch.zeros(batch_size, dtype=torch.long, device=device)
    pairs = torch.zeros(0, 2, dtype=torch.long, device=device) if pairs == "empty" else None
    for reduction in ("mean", "sum"):
        criterion = sol_ext.StochasticOrderLoss(4, reduction=reduction, backend=backend, disc_weight=0.0)
        loss = criterion(h, labels, mu, pairs)
        grad_h, grad_mu = torch.autograd.grad(loss, (h, mu))
        assert loss.item() == 0.0
        assert torch.count_nonzero(grad_h) == 0 and torch.count_nonzero(grad_mu) == 0
        assert torch.isfinite(grad_h).all() and torch.isfinite(grad_mu).all()
    disc = sol_ext.disc_loss(torch.zeros(0, 4, dtype=torch.float64, device=device), labels[:0], backend=backend)
    assert disc.item() == 0.0


def test_auto_backend_falls_back_with_a_warning_for_half_on_cpu():
    h = torch.randn(4, 3).half()
    mu = torch.randn(5, 3).half()
    with pytest.raises(RuntimeError, match="float32 or float64"):
        sol_ext.stochastic_dissimilarity(h, mu, backend="fused")
    with pytest.warns(UserWarning, match="reference"):
        D = sol_ext.stochastic_dissimilarity(h, mu, backend="auto")
    assert D.dtype == torch.float16  # no silent cast


DOUBLE_BACKWARD = r"double backward .*sol_ext\.{op}.* not supported.*backend='reference'"


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_gradient_penalty_through_the_fused_module_raises_naming_double_backward(device):
    """A gradient penalty (create_graph=True) used to add a silent 0: the fused backward records no graph."""
    h, mu, labels, _ = _inputs(device)
    model = torch.nn.Linear(4, 4).double().to(device)
    criterion = sol_ext.StochasticOrderLoss(6, backend="fused")
    loss = criterion(model(h), labels, mu)
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    assert all(g.requires_grad for g in grads)  # not a constant that a penalty would silently ignore
    penalty = sum((g**2).sum() for g in grads)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD.format(op="StochasticOrderLoss")):
        (loss + penalty).backward()
    # The reference supports it, and create_graph alone (without differentiating the gradient) is fine.
    reference = sol_ext.StochasticOrderLoss(6, backend="reference")
    grads = torch.autograd.grad(reference(model(h), labels, mu), list(model.parameters()), create_graph=True)
    sum((g**2).sum() for g in grads).backward()
    assert model.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_double_backward_through_the_fused_order_loss_is_refused(device):
    h, mu, labels, _ = _inputs(device)
    D = sol_ext.stochastic_dissimilarity(h, mu).requires_grad_()
    (grad_D,) = torch.autograd.grad(sol_ext.order_loss(D, labels, backend="fused"), D, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD.format(op="order_loss")):
        torch.autograd.grad(grad_D.square().sum(), D)
    # Differentiating the gradient with respect to the upstream gradient (the double-vjp trick) is refused too.
    losses = sol_ext.disc_loss(D, labels, reduction="none", backend="fused")
    upstream = torch.ones_like(losses, requires_grad=True)
    (grad_D,) = torch.autograd.grad(losses, D, upstream, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD.format(op="disc_loss")):
        torch.autograd.grad(grad_D.sum(), upstream)


def test_a_training_step_dispatches_the_loss_op_and_its_backward_and_nothing_else():
    """check_values=False: forward + backward dispatch one sol_ext op per direction (and autograd's seed
    gradient and a dtype promotion), where a step once dispatched 32 operations (benchmarks/bench_overhead.py)."""
    CountOps = load_benchmark("bench_overhead").CountOps  # the counter the benchmark reports with
    h, mu, labels, pairs = _inputs("cpu")
    for explicit in (None, pairs):
        criterion = sol_ext.StochasticOrderLoss(6, backend="fused", check_values=False)
        with CountOps() as counted:
            torch.autograd.grad(criterion(h.requires_grad_(), labels, mu.requires_grad_(), explicit), (h, mu))
        ours = [op for op in counted.ops if op.startswith("sol_ext.")]
        assert ours == ["sol_ext.stochastic_order_loss.default", "sol_ext._stochastic_order_loss_backward.default"]
        assert len(counted.ops) <= 4, counted.ops
