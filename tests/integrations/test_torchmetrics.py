"""The torchmetrics metrics: equal to the sol_ext.metrics functions on the same samples, however
the samples are split into update() calls, and under DDP (two gloo processes on the CPU) equal to
one process on the concatenated samples."""
from __future__ import annotations

import ast
import math
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchmetrics")

from common import REPO_ROOT, spawn_processes  # noqa: E402
from sol_ext import metrics  # noqa: E402
from sol_ext.torchmetrics import (  # noqa: E402
    MAE,
    CumulativeScore,
    MacroMAE,
    MaximumMAE,
    QuadraticWeightedKappa,
    RankedProbabilityScore,
)

NUM_RANKS = 9
# (torchmetrics metric, the sol_ext.metrics function it must equal, whether predictions are real)
CASES = {
    "mae": (lambda: MAE(), metrics.mae, True),
    "cs": (lambda: CumulativeScore(theta=1.0), lambda p, t: metrics.cumulative_score(p, t, 1.0), True),
    "cs-decimal": (lambda: CumulativeScore(theta=0.25), lambda p, t: metrics.cumulative_score(p, t, 0.25), True),
    "macro_mae": (lambda: MacroMAE(NUM_RANKS), metrics.macro_mae, True),
    "mmae": (lambda: MaximumMAE(NUM_RANKS), metrics.maximum_mae, True),
    "qwk": (lambda: QuadraticWeightedKappa(NUM_RANKS), metrics.quadratic_weighted_kappa, False),
}


def _samples(n: int, seed: int, real: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` true ranks of 0 … NUM_RANKS-1 (rank 8 absent, rank 0 rare) and predictions near them:
    real-valued, or integer ranks clipped to the scale."""
    gen = torch.Generator().manual_seed(seed)
    true = torch.randint(1, NUM_RANKS - 1, (n,), generator=gen)
    true[:3] = 0
    noise = 1.5 * torch.randn(n, generator=gen, dtype=torch.float64)
    if real:
        return true + noise, true
    return (true + noise).round().clamp(0, NUM_RANKS - 1).long(), true


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("splits", [[200], [1, 99, 0, 100], [37, 63, 50, 50]])
def test_updates_give_the_value_of_the_function_on_all_samples(name, splits):
    """compute() after update() on consecutive chunks (an empty one included) equals the sol_ext.metrics
    function on the concatenated samples, to float64 rounding."""
    make, function, real = CASES[name]
    pred, true = _samples(sum(splits), seed=len(splits), real=real)
    metric = make()
    start = 0
    for size in splits:
        metric.update(pred[start : start + size], true[start : start + size])
        start += size
    value = metric.compute()
    assert value.dtype == torch.float64 and value.ndim == 0
    assert float(value) == pytest.approx(function(pred, true), rel=1e-12, abs=1e-12)
    whole = make()
    whole.update(pred, true)
    assert float(whole.compute()) == pytest.approx(float(value), rel=1e-12, abs=1e-12)


def test_float32_and_column_inputs_are_accepted():
    """[N, 1] float32 predictions and integer true values give the value of the float64 vectors."""
    pred, true = _samples(50, seed=0, real=True)
    metric = MAE()
    metric.update(pred.float()[:, None], true)
    assert float(metric.compute()) == pytest.approx(metrics.mae(pred.float(), true), rel=1e-12)


def test_reset_forgets_the_samples():
    pred, true = _samples(40, seed=1, real=False)
    metric = QuadraticWeightedKappa(NUM_RANKS)
    metric.update(torch.zeros_like(pred), true)
    metric.reset()
    metric.update(pred, true)
    assert float(metric.compute()) == pytest.approx(metrics.quadratic_weighted_kappa(pred, true), rel=1e-12)


def test_macro_mae_per_rank_is_per_rank_mae():
    pred, true = _samples(120, seed=2, real=True)
    metric = MacroMAE(NUM_RANKS)
    metric.update(pred, true)
    per_rank = metric.per_rank()
    expected = metrics.per_rank_mae(pred, true)
    assert math.isnan(per_rank[8])  # no sample of rank 8
    assert {r: float(per_rank[r]) for r in range(NUM_RANKS) if r in expected} == pytest.approx(expected)


@pytest.mark.parametrize("splits", [[60], [1, 29, 0, 30]])
def test_rps_over_updates_is_the_function_on_all_samples(splits):
    gen = torch.Generator().manual_seed(len(splits))
    probs = torch.softmax(torch.randn(60, NUM_RANKS, generator=gen, dtype=torch.float64), dim=1)
    true = torch.randint(0, NUM_RANKS, (60,), generator=gen)
    metric = RankedProbabilityScore(NUM_RANKS)
    start = 0
    for size in splits:
        metric.update(probs[start : start + size], true[start : start + size])
        start += size
    value = metric.compute()
    assert value.dtype == torch.float64
    assert float(value) == pytest.approx(metrics.ranked_probability_score(probs, true), rel=1e-12)
    assert float(RankedProbabilityScore(NUM_RANKS)(probs[:5].float(), true[:5])) == pytest.approx(
        metrics.ranked_probability_score(probs[:5], true[:5]), rel=1e-6)


@pytest.mark.parametrize(("probs", "true", "message"), [
    (torch.full((2, 3), 1 / 3), torch.tensor([0, 1]), r"probs must be rank probabilities \[N, num_ranks\] = \[N, 4\]"),
    (torch.full((2, 4), 0.25), torch.tensor([0]), "same number of samples, got 2 and 1"),
    (torch.full((1, 4), 0.25), torch.tensor([4]), "true must hold integer ranks 0 … num_ranks-1 = 0 … 3"),
    (torch.full((1, 4), 1.0), torch.tensor([0]), "rows sum to 1; row 0 is"),
])
def test_rps_refuses_bad_samples(probs, true, message):
    with pytest.raises(ValueError, match=message):
        RankedProbabilityScore(4).update(probs, true)


@pytest.mark.parametrize("make", [lambda: QuadraticWeightedKappa(3), lambda: MAE(), lambda: MacroMAE(3), lambda: RankedProbabilityScore(3)])
def test_a_metric_on_the_meta_device_refuses_update_by_name(make):
    metric = make().to("meta")
    with pytest.raises(RuntimeError, match=r"update needs a device that holds data \(cpu, cuda\), got the meta device"):
        metric.update(torch.tensor([[1.0, 0.0, 0.0]]) if isinstance(metric, RankedProbabilityScore) else torch.tensor([0]),
                      torch.tensor([0]))


def test_qwk_of_constant_inputs_is_that_of_sol_ext_metrics():
    """Both inputs the same constant: NaN, as sol_ext.metrics (and scikit-learn); different constants: 0."""
    same = QuadraticWeightedKappa(4)
    same.update(torch.full((5,), 2), torch.full((5,), 2))
    assert math.isnan(float(same.compute())) and math.isnan(metrics.quadratic_weighted_kappa([2] * 5, [2] * 5))
    other = QuadraticWeightedKappa(4)
    other.update(torch.full((5,), 1), torch.full((5,), 3))
    assert float(other.compute()) == metrics.quadratic_weighted_kappa([1] * 5, [3] * 5) == 0.0


def test_qwk_equals_scikit_learn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    pred, true = _samples(80, seed=3, real=False)
    metric = QuadraticWeightedKappa(NUM_RANKS)
    metric.update(pred, true)
    expected = sklearn_metrics.cohen_kappa_score(true, pred, weights="quadratic", labels=list(range(NUM_RANKS)))
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: MacroMAE(0), "num_ranks must be an integer >= 1"),
    (lambda: QuadraticWeightedKappa(3.0), "num_ranks must be an integer >= 1"),
    (lambda: QuadraticWeightedKappa(True), "num_ranks must be an integer >= 1"),
    (lambda: CumulativeScore(-1), "theta must be a finite number >= 0"),
    (lambda: CumulativeScore(float("nan")), "theta must be a finite number >= 0"),
])
def test_bad_settings_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(("make", "pred", "true", "message"), [
    (MAE, [1.0, 2.0], [1.0], "same length, got 2 and 1"),
    (MAE, [[1.0, 2.0]], [[1.0, 2.0]], r"pred must be a 1-D vector \[N\], got shape \(1, 2\)"),
    (MAE, [1.0, float("inf")], [1.0, 2.0], r"pred contains a non-finite value \(inf\) at index 1"),
    (lambda: MacroMAE(3), [0.0, 1.0], [0, 3], "true must hold integer ranks 0 … num_ranks-1 = 0 … 2, got 3.0"),
    (lambda: MacroMAE(3), [0.0, 1.0], [0, 1.5], "true must hold integer ranks"),
    (lambda: QuadraticWeightedKappa(3), [0.5, 1.0], [0, 1], "pred must hold integer ranks"),
    (lambda: QuadraticWeightedKappa(3), [0, 1], [-1, 1], "true must hold integer ranks"),
])
def test_bad_samples_are_refused(make, pred, true, message):
    with pytest.raises(ValueError, match=message):
        make().update(torch.tensor(pred), torch.tensor(true))


def test_numpy_settings_are_accepted():
    np = pytest.importorskip("numpy")
    assert CumulativeScore(theta=np.int64(1)).theta == 1.0 and CumulativeScore(np.float32(0.5)).theta == 0.5
    assert MacroMAE(np.int64(5)).num_ranks == 5 and QuadraticWeightedKappa(np.int32(4)).num_ranks == 4


@pytest.mark.parametrize(("make", "pred", "true"), [
    (lambda: QuadraticWeightedKappa(3, validate_args=False), [3, 0, 1], [0, 0, 1]),   # pred 3 once counted as (true 1, pred 0)
    (lambda: MacroMAE(3, validate_args=False), [0.0, 1.0], [0, 1.5]),  # 1.5 once truncated to rank 1
])
def test_ranks_out_of_range_are_refused_on_the_cpu_also_without_validate_args(make, pred, true):
    with pytest.raises(ValueError, match="must hold integer ranks"):
        make().update(torch.tensor(pred), torch.tensor(true))


def test_cumulative_scores_at_two_thetas_in_one_collection_keep_their_own_values():
    """A MetricCollection groups metrics whose states are equal after the first update; two thresholds
    that count alike on that batch (here: none within either) must still compute apart."""
    from torchmetrics import MetricCollection

    scores = MetricCollection({"cs1": CumulativeScore(theta=1), "cs3": CumulativeScore(theta=3)})
    true = torch.tensor([0, 1, 2, 3])
    scores.update(torch.full((4,), 9), true)
    scores.update(true + 2, true)  # every error is 2: within 3, not within 1
    assert {k: float(v) for k, v in scores.compute().items()} == {"cs1": 0.0, "cs3": 50.0}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_of_an_empty_batch_is_refused_and_keeps_the_state(name):
    make, function, _ = CASES[name]
    metric = make()
    pred, true = torch.tensor([0.0, 2.0, 1.0]), torch.tensor([1, 2, 1])
    metric(pred, true)
    with pytest.raises(ValueError, match="forward.*got a batch without samples"):
        metric(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    expected = function(pred.numpy(), true.numpy())
    assert float(metric.compute()) == pytest.approx(expected, nan_ok=True)


def test_compute_without_samples_is_refused():
    metric = MacroMAE(3)
    metric.update(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="no samples"):
        metric.compute()


def test_the_readme_snippet_runs(capsys):
    readme = (REPO_ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    mark = "<!-- docs snippet: tests/integrations/test_torchmetrics.py runs it -->"
    code = re.search(re.escape(mark) + r"\n```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "docs/metrics.md", "exec"), {})
    assert set(ast.literal_eval(capsys.readouterr().out)) == {"mae", "cs", "macro_mae", "qwk"}


def test_import_sol_ext_does_not_import_torchmetrics():
    """The core imports without torchmetrics; sol_ext.torchmetrics without it says what to install."""
    code = ("import sys; import sol_ext, sol_ext.metrics; assert 'torchmetrics' not in sys.modules\n"
            "sys.modules['torchmetrics'] = None  # as if not installed\n"
            "try:\n    import sol_ext.torchmetrics\n"
            "except ImportError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "sol_ext.torchmetrics needs torchmetrics: pip install 'sol_ext[torchmetrics]'" in out


# Samples per process in the DDP test: unequal, and one process's first batch empty.
DDP_SHARDS = ([0, 30, 17], [25, 41])


def _ddp_worker(rank, world_size, out_dir):
    values = {}
    for name, (make, _, real) in CASES.items():
        pred, true = _samples(sum(map(sum, DDP_SHARDS)), seed=7, real=real)
        metric = make()
        start = sum(map(sum, DDP_SHARDS[:rank]))
        for size in DDP_SHARDS[rank]:
            metric.update(pred[start : start + size], true[start : start + size])
            start += size
        values[name] = float(metric.compute())  # synced over the processes
    torch.save(values, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_ddp_value_equals_one_process_on_the_concatenated_samples(tmp_path):
    """Two gloo processes with unequal shards: every process's compute() equals the one-process value
    (and the sol_ext.metrics function) on all the samples."""
    spawn_processes(_ddp_worker, len(DDP_SHARDS), (str(tmp_path),))
    for name, (make, function, real) in CASES.items():
        pred, true = _samples(sum(map(sum, DDP_SHARDS)), seed=7, real=real)
        single = make()
        single.update(pred, true)
        expected = float(single.compute())
        assert expected == pytest.approx(function(pred, true), rel=1e-12)
        for rank in range(len(DDP_SHARDS)):
            got = torch.load(tmp_path / f"rank{rank}.pt")[name]
            assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), f"{name}, rank {rank}"
