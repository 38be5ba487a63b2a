"""The CPU kernels at every capability this machine runs (csrc/cpu/cpu_capability.h, docs/performance.md): the
choice and its overrides, the object code of each build, and the oracle, gradcheck and determinism tests of
the CPU ops run once per capability, forced through sol_ext._extension._set_cpu_capability (those of
test_ops, test_autograd, test_grouped and integrations/test_distributed, called with the capability set)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sol_ext
import test_autograd
import test_grouped
import test_ops
from common import REL_TOL, REPO_ROOT, assert_rel_close
from sol_ext import _extension, reference

sys.path.insert(0, str(REPO_ROOT / "tests" / "integrations"))  # the block op's tests, run here per capability
import test_distributed  # noqa: E402

SUPPORT = {name: (built, runs) for name, built, runs in _extension._cpu_capability_support()}


def _capability_params():
    """Every capability; those this build or CPU lacks skip, saying which."""
    params = []
    for name, (built, runs) in SUPPORT.items():
        why = None if built and runs else (
            f"this build of sol_ext has no {name} kernels (its compiler could not build them, or "
            "SOL_EXT_CPU_CAPABILITIES left them out)" if not built else f"this CPU lacks the {name} instructions")
        params.append(pytest.param(name, id=name.lower(), marks=pytest.mark.skipif(why is not None, reason=why or "")))
    return params


CAPABILITIES = _capability_params()


@pytest.fixture(params=CAPABILITIES)
def capability(request):
    """Runs the test with the CPU kernels of one capability, and restores the one chosen at import."""
    chosen = sol_ext.cpu_capability()
    _extension._set_cpu_capability(request.param)
    try:
        yield request.param
    finally:
        _extension._set_cpu_capability(chosen)


def _run_python(code: str, **environment) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items()
           if key not in ("SOL_EXT_CPU_CAPABILITY", "ATEN_CPU_CAPABILITY")}
    env.update(environment)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------------------------------------
# The choice
# ------------------------------------------------------------------------------------------------


def test_the_default_choice_is_the_best_capability_this_build_and_cpu_run():
    best = [name for name, (built, runs) in SUPPORT.items() if built and runs][-1]
    result = _run_python("import sol_ext; print(sol_ext.cpu_capability())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == best
    assert "cpu_capability" in sol_ext.__all__ and SUPPORT["DEFAULT"] == (True, True)


@pytest.mark.parametrize("variable", ["SOL_EXT_CPU_CAPABILITY", "ATEN_CPU_CAPABILITY"])
def test_an_environment_variable_forces_a_capability_at_import(variable, capability):
    result = _run_python("import sol_ext; print(sol_ext.cpu_capability())", **{variable: capability.lower()})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == capability


def test_aten_names_for_finer_avx512_levels_run_the_avx512_kernels_or_the_best_below():
    best = [name for name, (built, runs) in SUPPORT.items() if built and runs][-1]
    result = _run_python("import sol_ext; print(sol_ext.cpu_capability())", ATEN_CPU_CAPABILITY="avx512_vnni")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == best  # AVX512 where it runs, else capped as ATen caps it


def test_ours_wins_over_aten_setting():
    result = _run_python("import sol_ext; print(sol_ext.cpu_capability())",
                         SOL_EXT_CPU_CAPABILITY="default", ATEN_CPU_CAPABILITY="avx2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "DEFAULT"


def test_a_setting_that_names_no_capability_fails_the_import_naming_the_variable_and_the_choices():
    result = _run_python("import sol_ext", SOL_EXT_CPU_CAPABILITY="avx9000")
    assert result.returncode != 0
    assert "ValueError: SOL_EXT_CPU_CAPABILITY='avx9000' names no CPU capability" in result.stderr
    assert "use default, avx2 or avx512" in result.stderr


@pytest.mark.parametrize("name", [name for name, (built, runs) in SUPPORT.items() if not (built and runs)]
                         or [pytest.param("none", marks=pytest.mark.skip(reason="this machine runs every capability"))])
def test_a_capability_the_machine_lacks_is_refused_with_what_it_runs(name):
    with pytest.raises(ValueError, match=rf"asks for {name} kernels, but .*; use one up to"):
        _extension._set_cpu_capability(name)


def test_the_setter_refuses_a_name_that_is_none():
    with pytest.raises(ValueError, match="cpu capability='sse9' names no CPU capability of sol_ext"):
        _extension._set_cpu_capability("sse9")
    assert sol_ext.cpu_capability() in SUPPORT


def test_the_forced_capability_is_reported(capability):
    assert sol_ext.cpu_capability() == capability


# ------------------------------------------------------------------------------------------------
# The object code: each build uses its width, and no code outside the AVX2/AVX512 builds uses more than
# the baseline (the binary runs on any x86-64 machine).
# ------------------------------------------------------------------------------------------------

EXTENSION = Path(_extension._C.__file__)
X86 = os.uname().machine in ("x86_64", "AMD64")


def _disassembly(symbol_pattern: str) -> dict:
    """{mangled name: instructions} of the extension's defined functions whose mangled name matches."""
    names = subprocess.run(["nm", "--defined-only", str(EXTENSION)], capture_output=True, text=True,
                           check=True).stdout
    functions = sorted({line.split()[-1] for line in names.splitlines()
                        if re.search(symbol_pattern, line.split()[-1]) and line.split()[1] in "tTwW"})
    out = {}
    for name in functions:
        listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={name}", str(EXTENSION)],
                                 capture_output=True, text=True, check=True).stdout
        out[name] = listing.split(f"<{name}>:", 1)[-1]
    return out


@pytest.mark.skipif(not X86 or shutil.which("objdump") is None or shutil.which("nm") is None,
                    reason="needs x86-64 and binutils (objdump, nm)")
@pytest.mark.parametrize("name, register", [("AVX512", "zmm"), ("AVX2", "ymm"), ("DEFAULT", "xmm")])
def test_each_build_of_the_order_loss_uses_its_vector_width(name, register):
    if not SUPPORT[name][0]:
        pytest.skip(f"this build has no {name} kernels")
    # sol_ext::cpu::<NAME>::all_pairs_forward and its loop over pairs (PairKernel::loss inlined there)
    code = _disassembly(rf"3cpu{len(name)}{name}.*all_pairs_forward")
    assert code, f"no {name} order-loss kernel in {EXTENSION.name}"
    text = "".join(code.values())
    widest = "zmm" if "%zmm" in text else "ymm" if "%ymm" in text else "xmm"
    assert widest == register, f"the {name} order loss uses {widest} registers, not {register}"


@pytest.mark.skipif(not X86 or shutil.which("objdump") is None or shutil.which("nm") is None,
                    reason="needs x86-64 and binutils (objdump, nm)")
def test_the_avx512_forward_keeps_the_sums_of_its_pairs_in_registers():
    """A pass of pairs at n = 101 is seven vectors long: storing its twelve sums to the stack and loading them
    back cost a tenth of the forward. The passes (PairKernel::losses) are inlined into the float32 loop over
    pairs of all_pairs_forward."""
    if not SUPPORT["AVX512"][0]:
        pytest.skip("this build has no AVX512 kernels")
    code = {name: text for name, text in _disassembly(r"3cpu6AVX51217all_pairs_forwardIfE").items() if "%zmm" in text}
    assert code, f"no AVX512 pass of four pairs in {EXTENSION.name}"
    for name, text in code.items():
        spills = [line for line in text.splitlines() if re.search(r"%zmm\d+.*\(%rsp\)|\(%rsp\).*%zmm", line)]
        assert not spills, f"{name} moves vectors through the stack: {spills[:2]}"


@pytest.mark.skipif(not X86 or shutil.which("objdump") is None or shutil.which("nm") is None,
                    reason="needs x86-64 and binutils (objdump, nm)")
def test_the_avx512_grouped_sweeps_compute_their_dot_products_inline():
    """The label-weight dot products are most of the grouped op's sweeps: a call per product (and its lanes'
    round trip through memory) cost a fifth of the op at (1,000,000, 5)."""
    if not SUPPORT["AVX512"][0]:
        pytest.skip("this build has no AVX512 kernels")
    code = _disassembly(r"3cpu6AVX5127RankSum.*3run")
    assert code, f"no AVX512 grouped kernel in {EXTENSION.name}"
    calls = [line for text in code.values() for line in text.splitlines() if "call" in line and "dot" in line]
    assert not calls, f"the AVX512 sweeps call a dot product: {calls[:2]}"


@pytest.mark.skipif(not X86 or shutil.which("objdump") is None or shutil.which("nm") is None,
                    reason="needs x86-64 and binutils (objdump, nm)")
def test_no_function_outside_the_wide_builds_uses_avx_registers():
    """The op files, the dispatcher and the DEFAULT kernels, and the library code they instantiate, stay
    within SSE2: a machine without AVX runs every function it reaches."""
    code = _disassembly(r"^_ZN7sol_ext")
    wide = {name for name, text in code.items() if re.search(r"%[yz]mm", text)}
    outside = {name for name in wide if not re.search(r"3cpu(4AVX2|6AVX512)", name)}
    assert not outside, f"functions outside the AVX2/AVX512 builds use ymm/zmm registers: {sorted(outside)[:5]}"


# ------------------------------------------------------------------------------------------------
# The CPU ops at each capability: the oracle, gradcheck, determinism (the tests of test_ops, test_autograd and
# test_grouped, run with the capability forced).
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", range(0, test_ops.NUM_CONFIGS, 4))
def test_fused_matches_reference(capability, seed, dtype):
    test_ops.test_fused_matches_reference(seed, dtype, "cpu")


@pytest.mark.parametrize("convention", ["paper", "official"])
@pytest.mark.parametrize("explicit_pairs", [False, True])
def test_gradcheck_order_loss(capability, convention, explicit_pairs):
    test_autograd.test_gradcheck_order_loss("cpu", convention, explicit_pairs)


def test_gradcheck_dissimilarity_and_module(capability):
    test_autograd.test_gradcheck_dissimilarity("cpu")
    test_autograd.test_gradcheck_module("cpu")


def test_order_loss_is_bitwise_reproducible_across_thread_counts(capability):
    for B, n in [(200, 40), (600, 20)]:
        test_autograd.test_all_pairs_backward_is_bitwise_reproducible_across_thread_counts(B, n)
    test_ops.test_reduced_losses_are_bitwise_identical_for_any_number_of_threads()


@pytest.mark.parametrize("B, n", [(5000, 7), (600, 60)])
def test_grouped_is_bitwise_reproducible_across_thread_counts(capability, B, n):
    test_grouped.test_bitwise_the_same_for_any_number_of_threads(B, n)


def _block_inputs(dtype, B=37, N=90, n=23, seed=4):
    gen = torch.Generator().manual_seed(seed)
    D_all = torch.randn(N, n, generator=gen, dtype=torch.float64).to(dtype)
    labels_all = torch.randint(0, n, (N,), generator=gen)
    return D_all, labels_all, 20, B


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("convention", ["paper", "official"])
def test_order_loss_block_and_its_gradients_match_the_oracle(capability, dtype, convention):
    D_all, labels_all, offset, B = _block_inputs(dtype)
    D = D_all[offset:offset + B].clone().requires_grad_()
    D_all = D_all.clone().requires_grad_()
    args = (1.1, 2, 0.3, convention)
    rows = torch.ops.sol_ext.order_loss_block(D, labels_all[offset:offset + B], D_all, labels_all, offset, *args)
    # The oracle: the float64 reference over the pairs (D[i], D_all[j]), j > offset + i, of [D; D_all].
    local, N = torch.arange(B), D_all.shape[0]
    pairs = torch.tensor([(i, B + j) for i in range(B) for j in range(offset + i + 1, N)])
    D64, D_all64 = D.detach().double().requires_grad_(), D_all.detach().double().requires_grad_()
    losses = reference.order_loss(torch.cat([D64, D_all64]), torch.cat([labels_all[offset + local], labels_all]),
                                  pairs, *args, reduction="none")
    want = torch.zeros(B, dtype=torch.float64).index_add_(0, pairs[:, 0], losses)
    assert_rel_close(rows.double(), want, REL_TOL[dtype], "row sums")
    upstream = torch.randn(B, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad(rows, (D, D_all), upstream.to(dtype))
    expected = torch.autograd.grad(want, (D64, D_all64), upstream)
    for name, g, e in zip(("dD", "dD_all"), got, expected):
        assert_rel_close(g.double(), e, REL_TOL[dtype], name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_blocks_of_a_partition_count_every_pair_once(capability, dtype):
    """The local rows at offset 0 start where the gathered rows do: the kernel must still read D_all for y."""
    test_distributed.test_blocks_of_a_partition_count_every_pair_once(dtype)
    test_distributed.test_gradcheck_block("cpu")
    test_distributed.test_block_backward_is_bitwise_reproducible_across_thread_counts()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_sum_matches_the_pairwise_oracle(capability, dtype):
    gen = torch.Generator().manual_seed(8)
    B, n = 700, 9
    D = torch.randn(B, n, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    labels = torch.randint(0, n, (B,), generator=gen)
    got = sol_ext.order_loss(D, labels, sigma=0.9, tau=2, margin=0.2, reduction="sum", algorithm="grouped")
    D64 = D.detach().double().requires_grad_()
    want = reference.order_loss(D64, labels, None, 0.9, 2, 0.2, "paper", reduction="sum")
    assert_rel_close(got.double(), want.detach(), REL_TOL[dtype], "grouped sum")
    assert_rel_close(torch.autograd.grad(got, D)[0].double(), torch.autograd.grad(want, D64)[0], REL_TOL[dtype],
                     "grouped dD")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_capability_agrees_with_the_others_to_rounding(dtype):
    """The builds differ in their summation order only."""
    gen = torch.Generator().manual_seed(2)
    D = torch.randn(150, 45, generator=gen, dtype=dtype).requires_grad_()
    labels = torch.randint(0, 45, (150,), generator=gen)
    chosen = sol_ext.cpu_capability()
    results = {}
    try:
        for name, (built, runs) in SUPPORT.items():
            if built and runs:
                _extension._set_cpu_capability(name)
                losses = sol_ext.order_loss(D, labels, reduction="none", backend="fused")
                results[name] = (losses.detach(), torch.autograd.grad(losses.sum(), D)[0])
    finally:
        _extension._set_cpu_capability(chosen)
    base = results.pop("DEFAULT")
    for name, (losses, grad) in results.items():
        assert_rel_close(losses, base[0], 10 * REL_TOL[dtype], f"{name} losses")
        assert_rel_close(grad, base[1], 10 * REL_TOL[dtype], f"{name} dD")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_pair_loss_is_the_one_it_has_alone(capability, dtype):
    """The kernels run several pairs side by side in one loop: each pair's loss is bitwise the one it has
    evaluated by itself, whatever pairs share its pass (all pairs, explicit pairs, a block's row sums)."""
    gen = torch.Generator().manual_seed(7)
    B, n = 13, 21  # odd B, n not a multiple of any lane count: passes cross rows and leave tails
    D = torch.randn(B, n, generator=gen, dtype=dtype)
    D[:, ::4] = D[:, ::4].round(decimals=1)  # ties: delta == +-margin
    labels = torch.randint(0, n, (B,), generator=gen)
    settings = (1.0, 3, 0.25, "official")
    alone = torch.stack([torch.ops.sol_ext.order_loss(D, labels, torch.tensor([[x, y]]), *settings)[0]
                         for x in range(B) for y in range(x + 1, B)])
    assert torch.equal(torch.ops.sol_ext.order_loss(D, labels, None, *settings), alone)
    pairs = torch.randint(0, B, (37, 2), generator=gen)
    alone_pairs = torch.stack([torch.ops.sol_ext.order_loss(D, labels, pair[None], *settings)[0] for pair in pairs])
    assert torch.equal(torch.ops.sol_ext.order_loss(D, labels, pairs, *settings), alone_pairs)
    rows = torch.ops.sol_ext.order_loss_block(D, labels, D, labels, 0, *settings)
    row_sums = [float(sum(float(alone[k]) for k in range(len(alone)) if _pair_row(k, B) == x)) for x in range(B)]
    assert torch.equal(rows, torch.tensor(row_sums, dtype=dtype))


def _pair_row(k: int, B: int) -> int:
    """The first row x of the k-th pair x < y in batch order."""
    x = 0
    while k >= B - 1 - x:
        k -= B - 1 - x
        x += 1
    return x
