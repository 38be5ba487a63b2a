"""sol-ext audit out of sample: the folds, and flags, scores and suggestions that are
sol_ext.find_label_issues' on the same out-of-sample probabilities."""

import csv

import numpy as np
import pytest
import torch

import sol_ext.driver.audit as audit_module
from common import expect_error, tiny_csv
from sol_ext.driver.audit import audit_run, cross_validated_probabilities, fold_of_rows
from sol_ext.driver.checkpoint import load_run_state
from sol_ext.driver.cli import main
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.prepare import prepare_data
from sol_ext.label_issues import find_label_issues, label_issue_scores
from sol_ext.readout import median_ranks
from sol_ext.refine import label_noise_kernel

FAST = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16", "--lr", "0.01",
        "--sigma", "1", "--no-plots", "--quiet"]


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    """A tiny run with Gaussian noise added (clean labels known)."""
    tmp = tmp_path_factory.mktemp("audit")
    data = tiny_csv(tmp / "d.csv", n=160)
    out = tmp / "run"
    assert main(["train", "--data", str(data), "--output", str(out), "--noise", "gaussian", "--kappa", "0.5",
                 *FAST]) == 0
    return out


def test_folds_are_stratified_by_label_and_seeded():
    labels = torch.tensor([0] * 10 + [1] * 7 + [2] * 3)
    fold = fold_of_rows(labels, 3, seed=0)
    for rank in range(3):
        counts = torch.bincount(fold[labels == rank], minlength=3)
        assert int(counts.max() - counts.min()) <= 1, (rank, counts)  # each rank dealt evenly
    assert torch.equal(fold, fold_of_rows(labels, 3, seed=0))
    assert not torch.equal(fold, fold_of_rows(labels, 3, seed=1))


def test_each_row_is_judged_by_a_model_that_did_not_train_on_it(tmp_path, monkeypatch):
    config = TrainConfig(data=str(tiny_csv(tmp_path / "d.csv")), epochs=1, sigma=1.0, hidden=(8,),
                         embedding_dim=4)
    data = prepare_data(config)
    trained_on = []
    real_check = audit_module.check_run

    def spy(cfg, part, *args, **kwargs):
        trained_on.append(part.train_rows.clone())
        return real_check(cfg, part, *args, **kwargs)

    monkeypatch.setattr(audit_module, "check_run", spy)
    oos = cross_validated_probabilities(config, data, folds=3, log=lambda _line: None)
    assert len(trained_on) == 3
    for k, rows in enumerate(trained_on):
        held = set(data.train_rows[oos.fold == k].tolist())
        assert held and not held & set(rows.tolist())              # never trained on the rows it judges
        assert len(held) + rows.numel() == data.train_rows.numel()  # and trained on all the others
    p = oos.probabilities
    assert p.shape == (data.train_given.numel(), data.num_ranks) and p.dtype == torch.float64
    assert torch.allclose(p.sum(dim=1), torch.ones(p.shape[0], dtype=torch.float64))


@pytest.mark.parametrize("folds", [1, 0, True, 2.5])
def test_folds_must_be_two_or_more(tmp_path, folds):
    config = TrainConfig(data=str(tiny_csv(tmp_path / "d.csv")), epochs=1, sigma=1.0)
    with pytest.raises(ValueError, match="folds must be an integer >= 2"):
        cross_validated_probabilities(config, prepare_data(config), folds=folds)


def _audit_csv(report):
    """The CSV's rows in the order of the run's training rows (file order of the prepared data)."""
    return {int(r["index"]): r for r in csv.DictReader(report.to_csv().splitlines())}


def test_audit_flags_are_find_label_issues_on_the_same_probabilities(noisy_run):
    report = audit_run(noisy_run, folds=2, log=lambda _line: None)
    data = prepare_data(TrainConfig.from_dict(load_run_state(noisy_run)["config"]))
    given, p = data.train_given, report.probabilities
    by_index = _audit_csv(report)
    rows = [by_index[int(i)] for i in data.train_rows]
    flags = np.array([r["outlier"] == "1" for r in rows])
    assert np.array_equal(flags, find_label_issues(given, p))          # one rule, two doors
    assert 0 < flags.sum() < len(rows)
    scores = np.array([float(r["score"]) for r in rows])
    assert np.allclose(scores, label_issue_scores(given, p), atol=1e-6)
    # the suggested label is the median of the same out-of-sample posterior, for flagged rows only
    median = median_ranks(p).numpy()
    suggested = np.array([int(r["suggested_label"]) - 20 for r in rows])  # tiny_csv: label 20 + rank
    assert np.array_equal(suggested, np.where(flags, median, given.numpy()))
    assert "out of sample, 2 folds" in report.summary()
    assert report.wrong_total is not None and report.num_outliers == int(flags.sum())


def _check_known_noise(run, report, std):
    prepared = prepare_data(TrainConfig.from_dict(load_run_state(run)["config"]))
    given, p = prepared.train_given, report.probabilities
    kernel = label_noise_kernel(prepared.num_ranks, std)
    rows = [_audit_csv(report)[int(i)] for i in prepared.train_rows]
    flags = np.array([r["outlier"] == "1" for r in rows])
    assert np.array_equal(flags, find_label_issues(given, p, noise_kernel=kernel))
    assert not np.array_equal(flags, find_label_issues(given, p))  # the kernel made a difference
    post = p * kernel[:, given].T
    median = median_ranks(post / post.sum(dim=1, keepdim=True)).numpy()
    suggested = np.array([int(r["suggested_label"]) - 20 for r in rows])
    assert np.array_equal(suggested, np.where(flags, median, given.numpy()))
    assert f"label noise std {std:g}" in report.summary()


def test_known_noise_of_the_run_suggests_the_median_of_the_posterior_through_it(tmp_path):
    data = tiny_csv(tmp_path / "d.csv", n=160)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--output", str(out), "--noise", "gaussian", "--kappa", "0.5",
                 "--label-noise", "1.5", *FAST]) == 0
    _check_known_noise(out, audit_run(out, folds=2, log=lambda _line: None), 1.5)


def test_known_noise_given_to_the_audit(noisy_run):
    _check_known_noise(noisy_run, audit_run(noisy_run, folds=2, log=lambda _line: None, label_noise=0.8), 0.8)
    for bad in (-1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="label_noise must be a finite std in ranks >= 0"):
            audit_run(noisy_run, folds=2, label_noise=bad)


def test_in_sample_audit_is_labelled_and_trains_nothing(noisy_run, monkeypatch):
    monkeypatch.setattr(audit_module, "fit_run", None)  # an in-sample audit must not train
    report = audit_run(noisy_run, folds=None)
    assert "in sample" in report.summary() and report.probabilities is None


def test_cli_folds_and_in_sample(noisy_run, capsys):
    assert main(["audit", str(noisy_run)]) == 0
    out = capsys.readouterr().out
    assert "out of sample, 3 folds" in out  # the default
    assert "one-sided mass >= 0.9975" in out and "--label-noise STD" in out  # what it cannot see, and the way out
    assert main(["audit", str(noisy_run), "--folds", "2", "--csv", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("index,given_label")   # the fold lines go to stderr
    assert "fold 2/2" in captured.err and "out of sample, 2 folds" in captured.err
    assert main(["audit", str(noisy_run), "--in-sample", "--csv", "-"]) == 0
    assert "in sample" in capsys.readouterr().err
    expect_error(capsys, ["audit", str(noisy_run), "--folds", "1"], "--folds must be >= 2")
    expect_error(capsys, ["audit", str(noisy_run), "--folds", "3", "--in-sample"],
                 "--folds and --in-sample exclude each other")
    expect_error(capsys, ["audit", str(noisy_run), "--label-noise", "-1"], "expected a std in ranks >= 0")
    expect_error(capsys, ["audit", str(noisy_run), "--label-noise", "1", "--in-sample"],
                 "not with --in-sample")
