"""One fit (sol_ext.driver.fit.Fit): its epochs, model selection, relabeling and resume, with sigma
resolved and the device and split its run's checks decided."""

import dataclasses

import pytest
import torch

from common import TINY_SETTINGS, tiny_data
from sol_ext.driver.checkpoint import CHECKPOINT_NAME, CheckpointMismatch, load_checkpoint
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.device import resolve_device
from sol_ext.driver.fit import Fit, FitContext, validation_split
from sol_ext.driver.train import BEST_NAME, check_run, train


def quiet(_line):
    pass


BASE = TrainConfig(**TINY_SETTINGS)


def test_a_fit_trains_with_sigma_resolved_and_records_the_run_as_asked():
    """A fit holds one configuration, with a number for sigma; a run asked for sigma "auto"
    (``sigma_choice`` given) is recorded as asked, and a choice that is not the sigma is refused."""
    data = tiny_data()
    context = check_run(BASE, data, None, False, log=quiet).context
    picked = {"sigma": 0.5, "val_mae": None}
    fit = Fit(dataclasses.replace(BASE, sigma=0.5), data, None, context, picked)
    assert fit.config.sigma == 0.5 and fit.config_as_given().sigma == "auto"
    assert Fit(dataclasses.replace(BASE, sigma=0.5), data, None, context).config_as_given().sigma == 0.5
    with pytest.raises(ValueError, match="sigma=1.0 is not the picked sigma 0.5"):
        Fit(dataclasses.replace(BASE, sigma=1.0), data, None, context, picked)


def test_the_run_s_checks_decide_the_device_and_split_of_every_fit():
    """check_run decides the context once: the validation split of the settings and the device;
    a fit takes it as it is (FitContext has no defaults to fall back on)."""
    data = tiny_data()
    context = check_run(BASE, data, None, False, log=quiet).context
    split = validation_split(data.train_given, BASE.val_fraction, BASE.seed)
    assert torch.equal(context.split.fit, split.fit) and torch.equal(context.split.val, split.val)
    assert context.device == resolve_device(BASE.device)
    fit = Fit(BASE, data, None, context)
    assert fit.split is context.split and fit.device == context.device
    with pytest.raises(TypeError):
        FitContext()  # every field is decided by check_run


@pytest.mark.parametrize("pairs", ["all", "balanced"])
def test_resume_equals_unbroken_run(pairs, tmp_path):
    data = tiny_data()
    # one sigma: under sigma="auto" a run finished after 1 epoch keeps the sigma it picked then,
    # which an unbroken run, picking on 2 epochs, may not pick
    cfg2 = dataclasses.replace(BASE, pairs=pairs, pairs_per_class=8, sigma=0.5)
    full = train(cfg2, data, tmp_path / "full", log=quiet)
    cfg1 = dataclasses.replace(cfg2, epochs=1)
    train(cfg1, data, tmp_path / "split", log=quiet)
    resumed = train(cfg2, data, tmp_path / "split", resume=True, log=quiet)
    a = load_checkpoint(tmp_path / "full" / CHECKPOINT_NAME)
    b = load_checkpoint(tmp_path / "split" / CHECKPOINT_NAME)
    assert torch.equal(resumed.labels, full.labels)
    torch.testing.assert_close(b["head"]["centroids"], a["head"]["centroids"])
    for k in a["model"]:
        torch.testing.assert_close(b["model"][k], a["model"][k])
    assert b["epoch"] == 2 and len(b["history"]) == 2
    assert resumed.results["test"] == full.results["test"]


def test_resume_of_a_finished_run_returns_its_results(tmp_path):
    data = tiny_data()
    first = train(BASE, data, tmp_path, log=quiet)
    again = train(BASE, data, tmp_path, resume=True, log=quiet)
    assert again.results["test"] == first.results["test"]
    assert torch.equal(again.test_pred, first.test_pred)


def test_resume_with_another_configuration_is_refused(tmp_path):
    data = tiny_data()
    train(dataclasses.replace(BASE, epochs=1), data, tmp_path, log=quiet)
    with pytest.raises(CheckpointMismatch, match="embedding_dim"):
        train(dataclasses.replace(BASE, embedding_dim=8), data, tmp_path, resume=True, log=quiet)
    with pytest.raises(CheckpointMismatch, match="other data"):
        train(BASE, tiny_data(num_ranks=9), tmp_path, resume=True, log=quiet)


def test_the_epoch_of_best_validation_mae_is_the_model(tmp_path):
    data = tiny_data(n_train=160)
    cfg = dataclasses.replace(BASE, epochs=5)
    out = train(cfg, data, tmp_path, log=quiet)
    r = out.results
    vals = [h["val_mae"] for h in r["history"]]
    assert r["selected_epoch"] == 1 + vals.index(min(vals))  # the first best, never the test set
    assert r["test"] == r["history"][r["selected_epoch"] - 1]["test"]
    best = load_checkpoint(tmp_path / BEST_NAME)
    assert best["epoch"] == r["selected_epoch"]
    assert torch.equal(best["test_pred"], out.test_pred)
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["epoch"] == 5


def test_patience_stops_after_that_many_epochs_without_improvement(tmp_path):
    cfg = dataclasses.replace(BASE, epochs=12, patience=1, lr=0.05)
    r = train(cfg, tiny_data(n_train=160), tmp_path, log=quiet).results
    vals = [h["val_mae"] for h in r["history"]]
    best_so_far = [min(vals[:i + 1]) for i in range(len(vals))]
    # it stops at the first epoch that did not improve on the best so far, or at the last epoch
    stalls = [i for i in range(1, len(vals)) if vals[i] >= best_so_far[i - 1]]
    assert r["epochs_run"] == (stalls[0] + 1 if stalls else 12)
    with pytest.raises(ValueError, match="patience"):
        dataclasses.replace(BASE, patience=2, val_fraction=0.0).validate()


def test_relabeling_starts_from_the_given_labels_every_epoch(tmp_path):
    """The posterior rule judges the given labels anew each epoch: moves never accumulate."""
    data = tiny_data(n_train=160)
    cfg = dataclasses.replace(BASE, epochs=3, relabel_mass=0.5)
    out = train(cfg, data, tmp_path, log=quiet)
    best = load_checkpoint(tmp_path / BEST_NAME)
    audit = best["audit"]
    fitted = torch.isin(audit["rows"], best["train_rows"])
    assert torch.equal(audit["suggested"][fitted], out.labels)
    assert int((out.labels != best["given_labels"]).sum()) == out.results["history"][
        best["epoch"] - 1]["relabeled"]


def test_damped_centroids_do_not_oscillate_between_epochs(tmp_path):
    """The paper's wholesale centroid update settles into a period-2 cycle of the centroid span
    on abalone; the damped default does not. (Without the weights' average, which would damp the
    cycle as well: this is about the centroid rule.)"""
    from sol_ext.driver.prepare import prepare_data

    def alternations(momentum: float) -> int:
        cfg = TrainConfig(epochs=7, momentum=momentum, refine=False, seed=0, sigma=1.0,
                          weight_ema=0.0)
        torch.set_num_threads(1)
        hist = train(cfg, prepare_data(cfg), tmp_path / str(momentum), log=quiet).results["history"]
        span = [h["centroid_span"] for h in hist]
        step = [b - a for a, b in zip(span, span[1:])]
        big = 0.05 * sum(span) / len(span)
        return sum(1 for a, b in zip(step, step[1:]) if a * b < 0 and min(abs(a), abs(b)) > big)

    assert alternations(0.0) >= 3     # the cycle this guards against is there without damping
    assert alternations(0.5) <= 1


@pytest.mark.parametrize("method", ["sol", "l1"])
def test_mixed_precision_training_runs_and_stays_finite(method, tmp_path):
    """``amp=True`` (``sol-ext train --amp``): autocast forward passes, bfloat16 on the CPU."""
    cfg = dataclasses.replace(BASE, method=method, amp=True)
    r = train(cfg, tiny_data(), tmp_path, log=quiet).results
    assert r["config"]["amp"] is True
    assert all(h["train_loss"] == h["train_loss"] for h in r["history"])  # no NaN
    assert 0 <= r["test"]["mae"] < 8


def test_relabeling_corrects_labels_but_the_encoder_trains_on_the_given_ones(tmp_path):
    """The corrected labels are the run's output: the model is the one of a run that relabels
    nothing. Told the noise std, every label moves to its posterior median and the corrected
    labels are closer to the truth; told 0, nothing moves."""
    data = tiny_data(n_train=192)  # labels off by up to 2 ranks: std sqrt(2)
    cfg = dataclasses.replace(BASE, epochs=4, sigma=1.0, label_noise=2 ** 0.5)
    out = train(cfg, data, tmp_path / "known", log=quiet)
    best = load_checkpoint(tmp_path / "known" / BEST_NAME)
    assert torch.equal(best["labels"], best["given_labels"])  # trained on
    fitted = torch.isin(best["audit"]["rows"], best["train_rows"])
    assert torch.equal(out.labels, best["audit"]["suggested"][fitted])
    given, final = out.results["label_noise_given"], out.results["label_noise_final"]
    assert out.results["labels_changed"] > 0 and final["mae"] < 0.8 * given["mae"]
    assert out.results["history"][-1]["label_noise_std"] == 2 ** 0.5

    untouched = train(dataclasses.replace(cfg, refine=False), data, tmp_path / "none", log=quiet)
    assert torch.equal(out.test_pred, untouched.test_pred)

    exact = train(dataclasses.replace(cfg, label_noise=0.0), data, tmp_path / "exact", log=quiet)
    assert exact.results["labels_changed"] == 0
    assert torch.equal(exact.labels, load_checkpoint(tmp_path / "exact" / BEST_NAME)["given_labels"])


def test_the_default_estimates_the_label_noise_and_moves_only_labels_it_is_sure_of(tmp_path):
    data = tiny_data(n_train=192)
    cfg = dataclasses.replace(BASE, epochs=4, sigma=1.0)
    out = train(cfg, data, tmp_path, log=quiet)
    record = out.results["history"][out.results["selected_epoch"] - 1]
    assert record["label_noise_std"] >= 0  # estimated each epoch (tests/library/test_centroids.py)
    best = load_checkpoint(tmp_path / BEST_NAME)
    assert torch.equal(best["labels"], best["given_labels"])
    audit = best["audit"]
    moved = audit["suggested"] != audit["given"]
    assert bool((audit["confidence"][moved] >= cfg.relabel_mass).all())
    assert out.results["label_noise_final"]["mae"] <= out.results["label_noise_given"]["mae"]
