"""Bad input raises ValueError/TypeError naming the argument, the value and what was expected."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import sol_ext
from common import cpu_and_cuda

B, N, DIM = 6, 5, 3


def good(device="cpu"):
    return dict(
        h=torch.randn(B, DIM, device=device),
        labels=torch.tensor([0, 1, 2, 3, 4, 0], device=device),
        mu=torch.randn(N, DIM, device=device),
    )


def call_loss(device="cpu", module_kwargs=None, **overrides):
    args = {**good(device), **overrides}
    criterion = sol_ext.StochasticOrderLoss(N, **(module_kwargs or {}))
    return criterion(args["h"], args["labels"], args["mu"], args.get("pairs"))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("overrides, error, pattern", [
    (dict(labels=torch.tensor([0, 1, 2, 3, 5, 0])), ValueError, r"labels must lie in 0 … 4.*got values in 0 … 5"),
    (dict(labels=torch.tensor([1, 2, 3, 4, 5, 1])), ValueError, r"look 1-based"),
    (dict(labels=torch.tensor([0, -1, 2, 3, 4, 0])), ValueError, r"labels must lie in 0 … 4"),
    (dict(labels=torch.tensor([0.0, 1, 2, 3, 4, 0])), TypeError, r"labels must be an integer tensor.*float32"),
    (dict(labels=torch.tensor([0, 1, 2])), ValueError, r"labels must have shape \[6\]"),
    (dict(labels=torch.zeros(6, 1, dtype=torch.long)), ValueError, r"labels must have shape \[6\]"),
    (dict(h=torch.randn(B)), ValueError, r"h must have shape \[B, d\]"),
    (dict(mu=torch.randn(N, DIM + 1)), ValueError, r"same embedding size d"),
    (dict(mu=torch.randn(N + 1, DIM)), ValueError, r"mu must have num_ranks=5 rows"),
    (dict(mu=torch.randn(N, DIM, dtype=torch.complex64)), TypeError, r"mu must be a floating-point tensor"),
    (dict(h=torch.ones(B, DIM, dtype=torch.long)), TypeError, r"h must be a floating-point tensor"),
    (dict(h=torch.full((B, DIM), math.nan)), ValueError, r"h contains 18 NaN or inf"),
    (dict(mu=torch.tensor([[math.inf] * DIM] * N)), ValueError, r"mu contains 15 NaN or inf"),
    (dict(pairs=torch.tensor([[0, 6]])), ValueError, r"pairs must hold batch indices in 0 … 5.*0 … 6"),
    (dict(pairs=torch.tensor([[-1, 2]])), ValueError, r"pairs must hold batch indices"),
    (dict(pairs=torch.tensor([0, 1])), ValueError, r"pairs must have shape \[M, 2\]"),
    (dict(pairs=torch.tensor([[0.0, 1.0]])), TypeError, r"pairs must be an integer tensor"),
    (dict(h=[[0.0] * DIM] * B), TypeError, r"h must be a torch.Tensor"),
])
def test_bad_tensors(device, overrides, error, pattern):
    overrides = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in overrides.items()}
    with pytest.raises(error, match=pattern):
        call_loss(device, **overrides)


@pytest.mark.parametrize("num_ranks, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)])
def test_bad_num_ranks(num_ranks, error):
    with pytest.raises(error, match="num_ranks must be an integer"):
        sol_ext.StochasticOrderLoss(num_ranks)
    with pytest.raises(error, match="num_ranks must be an integer"):
        sol_ext.ordering_probabilities(torch.tensor([0]), torch.tensor([0]), num_ranks)


@pytest.mark.parametrize("num_ranks", [2**24 + 1, 2**32, 2**40])
def test_num_ranks_whose_tables_could_not_exist_are_refused(num_ranks):
    """[num_ranks, num_ranks] float64 tables: past 2**24 ranks they could never be held (at 2**32 the
    kernels' table size once wrapped to 0 and they wrote past an empty buffer)."""
    pattern = rf"num_ranks must be <= {2**24} .* got {num_ranks}"
    with pytest.raises(ValueError, match=pattern):
        sol_ext.ordering_probabilities(torch.tensor([0]), torch.tensor([1]), num_ranks)
    with pytest.raises(ValueError, match=pattern):
        sol_ext.noise_kernel(num_ranks)
    with pytest.raises(ValueError, match=pattern):
        sol_ext.StochasticOrderLoss(num_ranks)
    with pytest.raises(ValueError, match=pattern):  # the kernels' own check, called directly
        torch.ops.sol_ext.ordering_probabilities(torch.tensor([0]), torch.tensor([1]), num_ranks, 1.0, 3, "paper",
                                                 torch.float64)


def test_tables_too_large_to_allocate_are_refused_by_name():
    """2**24 ranks pass the bound, but their 2 PiB tables exceed any address space."""
    with pytest.raises(ValueError, match=r"num_ranks=16777216 needs probability tables of \d+ float64 values, "
                                         r"more memory than could be allocated"):
        sol_ext.ordering_probabilities(torch.tensor([0]), torch.tensor([1]), 2**24)


def test_integer_table_dtypes_are_refused():
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype, got torch.int64"):
        sol_ext.noise_kernel(3, 1.0, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype, got torch.int32"):
        sol_ext.ordering_probabilities(torch.tensor([0]), torch.tensor([1]), 3, dtype=torch.int32)


def test_functional_forms_validate_too():
    D = torch.randn(B, N)
    labels = good()["labels"]
    with pytest.raises(ValueError, match=r"labels must lie in 0 … 4"):
        sol_ext.order_loss(D, labels + 1)
    with pytest.raises(ValueError, match=r"tau must be an integer >= 0"):
        sol_ext.order_loss(D, labels, tau=-2)
    with pytest.raises(ValueError, match=r"reduction must be one of"):
        sol_ext.disc_loss(D, labels, reduction="average")
    with pytest.raises(ValueError, match=r"T must be an integer >= 1"):
        sol_ext.disc_loss(D, labels, T=0)
    # Any tau or T up to int64's largest value works (tests/ops/test_probabilities.py, test_ops.py); past it:
    with pytest.raises(ValueError, match=r"tau must be an integer <= 2\*\*63 - 1"):
        sol_ext.order_loss(D, labels, tau=2**63)
    with pytest.raises(ValueError, match=r"tau must be an integer <= 2\*\*63 - 1"):
        sol_ext.ordering_probabilities(labels, labels, N, tau=2**63)
    with pytest.raises(ValueError, match=r"T must be an integer <= 2\*\*63 - 1"):
        sol_ext.disc_loss(D, labels, T=2**63)
    with pytest.raises(ValueError, match=r"D contains 1 NaN"):
        sol_ext.disc_loss(torch.where(torch.arange(B * N).reshape(B, N) == 3, math.nan, D), labels)
    with pytest.raises(ValueError, match=r"r_y must lie in 0 … 11"):
        sol_ext.ordering_probabilities(torch.tensor([8]), torch.tensor([12]), 12)
    with pytest.raises(ValueError, match=r"r_y must have shape \[1\]"):
        sol_ext.ordering_probabilities(torch.tensor([8]), torch.tensor([1, 2]), 12)


@pytest.mark.parametrize("other", ["meta", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_tensors_on_different_devices(other):
    with pytest.raises(ValueError, match=rf"one device.*h on cpu.*mu on {other}"):
        call_loss(mu=torch.randn(N, DIM, device=other))
    with pytest.raises(ValueError, match=rf"one device.*D on cpu.*labels on {other}"):
        sol_ext.order_loss(torch.randn(B, N), torch.zeros(B, dtype=torch.long, device=other))


def test_kernels_guard_against_bad_indices_when_called_directly():
    """The C++ checks are the last guard for callers that bypass the Python API."""
    D = torch.randn(B, N)
    with pytest.raises(RuntimeError, match=r"labels must lie in 0..4"):
        torch.ops.sol_ext.order_loss(D, torch.tensor([0, 1, 2, 3, 9, 0]), None, 1.0, 3, 0.25, "paper")
    with pytest.raises(RuntimeError, match=r"pair indices must lie in 0..5"):
        torch.ops.sol_ext.order_loss(D, torch.zeros(B, dtype=torch.long), torch.tensor([[0, 7]]), 1.0, 3, 0.25, "paper")
    with pytest.raises(RuntimeError, match=r"convention must be"):
        torch.ops.sol_ext.order_loss(D, torch.zeros(B, dtype=torch.long), None, 1.0, 3, 0.25, "other")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_finite_inputs_whose_dissimilarities_overflow_are_refused(device, backend):
    """Squared distances of 1e30 overflow float32: the module and the functional path refuse them alike."""
    h, mu = torch.full((4, 3), 1e30, device=device), torch.zeros(5, 3, device=device)
    labels = torch.arange(4, device=device)
    pattern = r"stochastic dissimilarities of h and mu overflow torch.float32: 20 of D's 20 values.*float64"
    with pytest.raises(ValueError, match=pattern):
        sol_ext.StochasticOrderLoss(5, backend=backend)(h, labels, mu)
    with pytest.raises(ValueError, match=pattern):
        sol_ext.stochastic_dissimilarity(h, mu, backend=backend)
    # The same embeddings in float64 are fine.
    loss = sol_ext.StochasticOrderLoss(5, backend=backend)(h.double(), labels, mu.double())
    assert torch.isfinite(loss)


@pytest.mark.parametrize("backend", ["auto", "fused", "reference"])
def test_meta_tensors_give_shapes_and_dtypes(backend):
    """Meta tensors (shape inference, models built on the meta device) run the ops' fake kernels."""
    h = torch.empty(B, DIM, device="meta", requires_grad=True)
    mu = torch.empty(N, DIM, device="meta")
    labels = torch.empty(B, dtype=torch.long, device="meta")
    pairs = torch.empty(7, 2, dtype=torch.long, device="meta")
    loss = sol_ext.StochasticOrderLoss(N, backend=backend)(h, labels, mu, pairs)
    assert loss.device.type == "meta" and loss.shape == () and loss.dtype == torch.float32
    loss.backward()
    assert h.grad.device.type == "meta" and h.grad.shape == (B, DIM)
    D = sol_ext.stochastic_dissimilarity(h, mu, backend=backend)
    assert D.device.type == "meta" and D.shape == (B, N)
    assert sol_ext.order_loss(D, labels, reduction="none", backend=backend).shape == (B * (B - 1) // 2,)
    assert sol_ext.order_loss(D, labels, pairs, reduction="none", backend=backend).shape == (7,)
    assert sol_ext.disc_loss(D, labels, reduction="none", backend=backend).shape == (B,)
    probs = sol_ext.ordering_probabilities(labels, labels, N, dtype=torch.float32, backend=backend)
    assert probs.device.type == "meta" and probs.shape == (B, 3) and probs.dtype == torch.float32


def test_torch_func_transforms_are_refused_with_a_clear_error():
    args = good()
    criterion = sol_ext.StochasticOrderLoss(N)
    batched_h = torch.randn(2, B, DIM)
    with pytest.raises(TypeError, match=r"h is batched by torch.func.vmap; sol_ext does not support torch.func"):
        torch.func.vmap(lambda h: criterion(h, args["labels"], args["mu"]))(batched_h)
    with pytest.raises(TypeError, match=r"D is batched by torch.func.vmap"):
        torch.func.vmap(lambda D: sol_ext.order_loss(D, args["labels"]))(torch.randn(2, B, N))
    with pytest.raises(TypeError, match=r"labels is batched by torch.func.vmap"):
        D = torch.randn(B, N)
        torch.func.vmap(lambda r: sol_ext.disc_loss(D, r))(torch.zeros(2, B, dtype=torch.long))
    with pytest.raises(TypeError, match=r"h is wrapped by a torch.func transform"):
        torch.func.grad(lambda h: criterion(h, args["labels"], args["mu"]))(args["h"])


@pytest.mark.parametrize("algorithm", ["pairwise", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
@pytest.mark.parametrize("bad", ["negative label", "label past the last rank", "negative pair index"])
def test_without_value_checks_the_reference_still_refuses_out_of_range_indices(algorithm, dtype, bad):
    """The paths in plain torch (the reference; CPU float16, which the kernels do not take) index with
    labels and pairs, where -1 would silently wrap around to the last rank or row."""
    if algorithm == "grouped" and bad == "negative pair index":
        pytest.skip("the grouped algorithm takes all pairs, no explicit pairs")
    labels, pairs = torch.tensor([4, 0, 1, 2, 3, 4]), None
    if bad == "negative label":
        labels[0] = -1
    elif bad == "label past the last rank":
        labels[0] = N
    else:
        pairs = torch.tensor([[0, -1]])
    torch.manual_seed(0)
    h, mu = torch.randn(B, DIM, dtype=dtype), torch.randn(N, DIM, dtype=dtype)
    backends = ["reference"] + (["auto"] if dtype == torch.float16 else [])  # auto: the reference for float16
    for backend in backends:
        criterion = sol_ext.StochasticOrderLoss(N, backend=backend, algorithm=algorithm, check_values=False)
        name = "pairs" if pairs is not None else "labels"
        # a ValueError from the Python checks, or the RuntimeError of a kernel (grouped float64 sums by the CPU op)
        with warnings.catch_warnings(), pytest.raises((ValueError, RuntimeError),
                                                      match=rf"{name} must (lie in|hold batch indices)"):
            warnings.simplefilter("ignore")  # float16 on the CPU: "using the plain PyTorch reference"
            criterion(h, labels, mu, pairs)


@pytest.mark.parametrize("algorithm", ["pairwise", "grouped"])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_a_loss_that_overflows_from_finite_inputs_is_refused(algorithm, backend):
    """Embeddings near 1e19 give a finite D near float32's largest value, and a pair's loss adds 2n such
    terms: an error naming the cause, not a NaN or inf loss (the module and the functional form)."""
    torch.manual_seed(0)
    mu, h = torch.randn(N, 2), torch.randn(B, 2) * 1e19
    labels = torch.tensor([0, 4, 0, 4, 2, 1])
    D = sol_ext.stochastic_dissimilarity(h, mu, 1e-3)
    assert torch.isfinite(D).all()
    with pytest.raises(ValueError, match=r"the loss overflows torch.float32 although its inputs are finite: "
                                         r"the largest \|value\| of D is 3.\d+e\+38"):
        sol_ext.order_loss(D, labels, sigma=1e-3, algorithm=algorithm, backend=backend)
    with pytest.raises(ValueError, match=r"the loss overflows .* of h and mu is 1.\d+e\+19 .* compute in float64"):
        sol_ext.StochasticOrderLoss(N, sigma=1e-3, algorithm=algorithm, backend=backend)(h, labels, mu)
    with pytest.raises(ValueError, match=r"margin=1e\+308"):
        sol_ext.order_loss(torch.rand(B, N), labels, margin=1e308, algorithm=algorithm, backend=backend)
    # In float64 the same embeddings are fine.
    loss = sol_ext.StochasticOrderLoss(N, sigma=1e-3, algorithm=algorithm, backend=backend)(h.double(), labels,
                                                                                            mu.double())
    assert torch.isfinite(loss)
    # float16 on the CPU: the pairwise reference sums in float16 and overflows at far smaller embeddings,
    # and says so (grouped sums in float64 and returns float32: no overflow)
    half_h = torch.zeros(B, 2, dtype=torch.float16)
    half_h[0, 0] = 150  # D about 150**2, finite in float16 (below 65504); 2n such terms are not
    half = sol_ext.StochasticOrderLoss(N, algorithm=algorithm, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "using the plain PyTorch reference"
        if algorithm == "grouped":
            assert torch.isfinite(half(half_h, labels, mu.half()))
        else:
            with pytest.raises(ValueError, match="the loss overflows torch.float16"):
                half(half_h, labels, mu.half())


def test_the_grouped_algorithm_gives_shapes_on_meta_tensors():
    h = torch.empty(B, DIM, device="meta", requires_grad=True)
    mu, labels = torch.empty(N, DIM, device="meta"), torch.empty(B, dtype=torch.long, device="meta")
    loss = sol_ext.StochasticOrderLoss(N, algorithm="grouped")(h, labels, mu)
    assert loss.device.type == "meta" and loss.shape == () and loss.dtype == torch.float32
    loss.backward()
    assert h.grad.device.type == "meta" and h.grad.shape == (B, DIM)
    D = torch.empty(B, N, device="meta")
    assert sol_ext.order_loss(D, labels, algorithm="grouped").shape == ()


@pytest.mark.parametrize("num_ranks", [2**24, 2**22])
def test_tables_too_large_to_allocate_say_to_use_fewer_ranks(num_ranks):
    """Refused before any entry is computed (an O(n^2) pass first would run for days), by the ordering
    table and by the noise kernel the loss builds first."""
    pattern = (rf"num_ranks={num_ranks} needs probability tables of \d+ float64 values, more memory than could be "
               r"allocated; use fewer ranks \(a coarser grid of labels\)")
    with pytest.raises(ValueError, match=pattern):
        sol_ext.ordering_probabilities(torch.tensor([0]), torch.tensor([1]), num_ranks)
    with pytest.raises(ValueError, match=pattern):
        sol_ext.StochasticOrderLoss(num_ranks)(torch.zeros(2, 3), torch.tensor([0, 1]), torch.zeros(num_ranks, 3))
