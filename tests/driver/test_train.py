"""The training loop: every method runs, relabels are kept, resume equals an unbroken run."""

import dataclasses

import pytest
import torch

from sol_ext.driver.checkpoint import CHECKPOINT_NAME, CheckpointMismatch, load_checkpoint
from sol_ext.driver.config import METHODS, PAPER_SETTINGS, SIGMA_GRID, TrainConfig, config_mismatches
from sol_ext.driver.encoders import build_encoder
from sol_ext.driver.prepare import PreparedData
from sol_ext.driver.train import BEST_NAME, SIGMA_SEARCH_NAME, train
from sol_ext.labels import LabelGrid


def tiny_data(n_train=96, n_test=32, num_ranks=8, seed=0):
    """Ranks readable from the features, plus label noise on the training part."""
    g = torch.Generator().manual_seed(seed)

    def make(n):
        r = torch.randint(0, num_ranks, (n,), generator=g)
        x = torch.randn(n, 4, generator=g) * 0.3
        x[:, 0] += r.float()
        return x, r

    xtr, clean = make(n_train)
    xte, rte = make(n_test)
    noisy = (clean + torch.randint(-2, 3, (n_train,), generator=g)).clamp(0, num_ranks - 1)
    return PreparedData(name="tiny", kind="tabular", encoder=LabelGrid(10.0, 0.5, num_ranks),
                        train_x=xtr, train_given=noisy, train_clean=clean, test_x=xte,
                        test_ranks=rte, train_rows=torch.arange(n_train))


def quiet(_line):
    pass


BASE = TrainConfig(data="tiny", epochs=2, batch_size=16, embedding_dim=4, hidden=(16,),
                   lr=1e-2, beta=0.5)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_and_reports(method, tmp_path):
    if method == "corn":
        pytest.importorskip("coral_pytorch")
    cfg = dataclasses.replace(BASE, method=method)
    out = train(cfg, tiny_data(), tmp_path, log=quiet)
    r = out.results
    assert len(r["history"]) == 2 and r["test"]["mae"] >= 0 and 0 <= r["test"]["cs"] <= 100
    # a stratified tenth of the training data is held out to pick the epoch
    n_fit = r["data"]["n_train"]
    assert abs(r["data"]["n_val"] - 9.6) <= 1 and n_fit + r["data"]["n_val"] == 96
    assert out.test_pred.shape == (32,) and out.train_pred.shape == (n_fit,)
    assert int(out.test_pred.min()) >= 0 and int(out.test_pred.max()) < 8
    # the CS threshold defaults to 2 rank steps, in label units
    assert r["cs_theta"] == 1.0
    if method != "sol":
        assert r["relabeled_total"] == 0 and out.labels.shape == (n_fit,)


def test_paper_rule_relabels_accumulate_and_are_reported(tmp_path):
    data = tiny_data()
    cfg = dataclasses.replace(BASE, epochs=3, **PAPER_SETTINGS)
    out = train(cfg, data, tmp_path, log=quiet)
    hist = out.results["history"]
    assert sum(h["relabeled"] for h in hist) == out.results["relabeled_total"] > 0
    state = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert torch.equal(state["labels"], out.labels)
    assert torch.equal(state["given_labels"], data.train_given)
    assert not torch.equal(out.labels, data.train_given)
    # label statistics against clean labels, before and after each refinement
    assert hist[0]["labels_before"]["mae"] == pytest.approx(
        float((data.train_given - data.train_clean).abs().float().mean()))
    assert hist[1]["labels_before"] == hist[0]["labels_after"]


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


def test_more_epochs_device_and_backend_may_change_on_resume():
    a = TrainConfig()
    assert config_mismatches(a, dataclasses.replace(a, epochs=50, backend="reference")) == []
    assert config_mismatches(a, dataclasses.replace(a, method="l1")) == ["method: 'sol' -> 'l1'"]


def test_bad_configuration_values_name_the_field():
    with pytest.raises(ValueError, match="kappa"):
        TrainConfig(kappa=-0.1).validate()
    with pytest.raises(ValueError, match="unknown method"):
        TrainConfig(method="svm").validate()
    with pytest.raises(ValueError, match="beta"):
        TrainConfig(beta=1.5).validate()
    for bad in (-0.5, float("nan"), float("inf"), "high", True):
        with pytest.raises(ValueError, match="label noise must be 'auto' or a finite std"):
            TrainConfig(label_noise=bad).validate()
    with pytest.raises(ValueError, match="label noise std .* does not apply to relabel rule 'outlier'"):
        TrainConfig(label_noise=1.0, relabel="outlier").validate()
    TrainConfig(relabel="outlier").validate()  # the default 'auto' is the posterior rule's only


def test_encoders_give_embeddings_of_the_asked_size():
    assert build_encoder("mlp", (5,), 7)(torch.randn(3, 5)).shape == (3, 7)
    assert build_encoder("cnn", (1, 16, 16), 6)(torch.randn(2, 1, 16, 16)).shape == (2, 6)
    with pytest.raises(ValueError, match="images"):
        build_encoder("cnn", (5,), 4)


def test_vgg16bn_encoder_loads_local_weights(tmp_path):
    vgg = pytest.importorskip("torchvision.models.vgg")
    features = vgg.make_layers(vgg.cfgs["D"], batch_norm=True)  # vgg16_bn's features
    for p in features.parameters():
        torch.nn.init.constant_(p, 0.01)
    path = tmp_path / "vgg.pth"
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, path)
    enc = build_encoder("vgg16bn", (1, 32, 32), 8, weights=str(path))
    assert enc(torch.randn(2, 1, 32, 32)).shape == (2, 8)
    assert all(bool((p == 0.01).all()) for p in enc.features.parameters())
    torch.save({"features.0.weight": torch.zeros(3)}, path)
    with pytest.raises(ValueError, match="does not fit"):
        build_encoder("vgg16bn", (3, 32, 32), 8, weights=str(path))
    with pytest.raises(FileNotFoundError, match="not found"):
        build_encoder("vgg16bn", (3, 32, 32), 8, weights=str(tmp_path / "missing.pth"))


def test_defaults_differ_from_the_paper_only_where_paper_settings_say():
    """`--paper` (PAPER_SETTINGS) restores Algorithm 1: eq. 6, the outlier rule every epoch,
    undamped centroids, no validation split (last epoch), and the paper's loss settings."""
    ours, paper = TrainConfig(), dataclasses.replace(TrainConfig(), **PAPER_SETTINGS)
    assert (ours.readout, paper.readout) == ("cuts", "nearest")
    assert (ours.relabel, paper.relabel) == ("posterior", "outlier")
    assert paper.momentum == 0 and paper.val_fraction == 0 and paper.patience is None
    assert (paper.sigma, paper.tau, paper.margin, paper.T, paper.beta) == (1.0, 3, 0.25, 1, 0.9)
    assert not paper.selects_model and ours.selects_model
    with pytest.raises(ValueError, match="readout"):
        dataclasses.replace(BASE, readout="mean").validate()
    with pytest.raises(ValueError, match="relabel"):
        dataclasses.replace(BASE, relabel="always").validate()


def test_paper_settings_pick_the_last_epoch(tmp_path):
    cfg = dataclasses.replace(BASE, epochs=3, **PAPER_SETTINGS)
    out = train(cfg, tiny_data(), tmp_path, log=quiet)
    r = out.results
    assert r["selected_epoch"] == 3 and r["data"]["n_val"] == 0 and r["val_mae"] is None
    assert r["test"] == r["history"][-1]["test"]


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


def test_corn_baseline_comes_from_coral_pytorch(tmp_path):
    coral = pytest.importorskip("coral_pytorch")
    out = train(dataclasses.replace(BASE, method="corn"), tiny_data(), tmp_path, log=quiet)
    assert out.results["config"]["method"] == "corn" and coral.__name__ == "coral_pytorch"
    # CORN's head: n - 1 = 7 conditional binary tasks on the 4-d embedding
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["model"]["head.weight"].shape == (7, 4)


def test_sigma_is_picked_by_default_and_falls_back_to_the_papers_without_a_split(tmp_path):
    assert TrainConfig().sigma == "auto"
    lines = []
    cfg = dataclasses.replace(BASE, epochs=1, val_fraction=0.0)
    r = train(cfg, tiny_data(), tmp_path, log=lines.append).results
    assert r["sigma_selected"] == 1.0 and r["sigma_search"]["val_mae"] is None
    assert any("sigma auto needs a validation split" in line for line in lines), lines
    # sol-no-noise has no sigma to pick: no search
    r = train(dataclasses.replace(BASE, epochs=1, method="sol-no-noise"), tiny_data(), tmp_path / "nn",
              log=quiet).results
    assert r["sigma_search"] is None


def test_sigma_auto_keeps_the_winning_trial_instead_of_training_it_again(tmp_path):
    cfg = dataclasses.replace(BASE, epochs=2)  # sigma "auto", the default
    auto = train(cfg, tiny_data(), tmp_path / "auto", log=quiet).results
    picked = auto["sigma_selected"]
    fixed = train(dataclasses.replace(cfg, sigma=picked), tiny_data(), tmp_path / "fixed", log=quiet).results
    def without_timings(history):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in history]

    assert without_timings(auto["history"]) == without_timings(fixed["history"])
    assert auto["test"] == fixed["test"]
    assert auto["config"]["sigma"] == "auto" and not (tmp_path / "auto" / SIGMA_SEARCH_NAME).exists()
    for name in (CHECKPOINT_NAME, BEST_NAME):  # the checkpoints are those of the "auto" run
        assert load_checkpoint(tmp_path / "auto" / name, cfg)["sigma_choice"]["sigma"] == picked


def test_sigma_auto_picks_the_candidate_of_best_validation_mae(tmp_path):
    cfg = dataclasses.replace(BASE, epochs=1, sigma="auto")
    r = train(cfg, tiny_data(), tmp_path, log=quiet).results
    scores = {float(k): v for k, v in r["sigma_search"]["val_mae"].items()}
    assert set(scores) == set(SIGMA_GRID)
    assert r["sigma_selected"] == min(scores, key=scores.get)
    assert r["config"]["sigma"] == "auto"


@pytest.mark.parametrize("method", ["sol", "l1"])
def test_mixed_precision_training_runs_and_stays_finite(method, tmp_path):
    """``amp=True`` (``sol-ext train --amp``): autocast forward passes, bfloat16 on the CPU."""
    cfg = dataclasses.replace(BASE, method=method, amp=True)
    r = train(cfg, tiny_data(), tmp_path, log=quiet).results
    assert r["config"]["amp"] is True
    assert all(h["train_loss"] == h["train_loss"] for h in r["history"])  # no NaN
    assert 0 <= r["test"]["mae"] < 8


def test_a_resumed_sigma_auto_run_keeps_its_pick(tmp_path, monkeypatch):
    import sol_ext.driver.train

    cfg = dataclasses.replace(BASE, epochs=1, sigma="auto")
    first = train(cfg, tiny_data(), tmp_path, log=quiet).results
    monkeypatch.setattr(sol_ext.driver.train.SigmaSearch, "trials",
                        lambda *a, **k: pytest.fail("searched again"))
    again = train(dataclasses.replace(cfg, epochs=2), tiny_data(), tmp_path, resume=True,
                  log=quiet).results
    assert again["sigma_selected"] == first["sigma_selected"] and again["epochs_run"] == 2


def test_a_failed_sigma_search_leaves_no_trials_behind(tmp_path, monkeypatch):
    import sol_ext.driver.fit

    def fail_in_the_search(fit, epoch):
        assert (fit.out_dir.parent.name, fit.out_dir.name) == (SIGMA_SEARCH_NAME, "sigma0.25")
        assert fit.out_dir.is_dir()  # a trial had started
        raise KeyboardInterrupt

    monkeypatch.setattr(sol_ext.driver.fit.Fit, "train_one_epoch", fail_in_the_search)
    with pytest.raises(KeyboardInterrupt):
        train(dataclasses.replace(BASE, epochs=1), tiny_data(), tmp_path, log=quiet)
    assert not (tmp_path / SIGMA_SEARCH_NAME).exists()


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


@pytest.mark.parametrize("sigma", [0.5, "auto"])
def test_a_run_in_memory_writes_nothing_and_equals_the_run_in_a_folder(sigma, tmp_path, monkeypatch):
    """train(..., out_dir=None): the same selected epoch, bit for bit, as a run with a folder, its
    state in the outcome (best.pt's), and no file written anywhere (a sigma search included)."""
    data = tiny_data()
    cfg = dataclasses.replace(BASE, sigma=sigma)
    on_disk = train(cfg, data, tmp_path / "run", log=quiet)
    saved = load_checkpoint(tmp_path / "run" / BEST_NAME)
    assert on_disk.best_state is None
    writes = []
    monkeypatch.setattr(torch, "save", lambda *a, **k: writes.append(a[1]))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "no-such-temp-dir"))
    in_memory = train(cfg, data, None, log=quiet)
    assert writes == []
    state = in_memory.best_state
    assert state["epoch"] == saved["epoch"] and state["sigma_choice"] == saved["sigma_choice"]
    assert state["config"] == saved["config"] and state["predictor"] == saved["predictor"]
    for part in ("model", "head"):
        assert state[part].keys() == saved[part].keys()
        for k in saved[part]:
            assert torch.equal(state[part][k], saved[part][k]), (part, k)
    assert in_memory.results["test"] == on_disk.results["test"]
    def untimed(history):
        return [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in history]

    assert untimed(in_memory.results["history"]) == untimed(on_disk.results["history"])


def test_a_run_in_memory_cannot_resume():
    with pytest.raises(ValueError, match="in memory"):
        train(dataclasses.replace(BASE, sigma=0.5), tiny_data(), None, resume=True, log=quiet)


def test_a_checkpoint_is_one_state_record_and_old_ones_are_migrated_in_one_place(tmp_path):
    from sol_ext.driver.checkpoint import FORMAT_VERSION, EpochState, migrated, save_checkpoint

    train(dataclasses.replace(BASE, sigma=0.5), tiny_data(), tmp_path, log=quiet)
    best = load_checkpoint(tmp_path / BEST_NAME)
    record = EpochState.from_dict(best)
    assert record.epoch == best["epoch"] and torch.equal(record.labels, best["labels"])
    assert list(record.to_dict()) == [k for k in best if k in record.to_dict()]  # the saved order
    # a checkpoint saved before the corrected labels were kept apart: they are the labels
    old = {k: v for k, v in best.items() if k not in ("corrected_labels", "format_version")}
    save_checkpoint(tmp_path / "old.pt", old)
    assert torch.equal(load_checkpoint(tmp_path / "old.pt")["corrected_labels"], best["labels"])
    with pytest.raises(CheckpointMismatch, match="format 1"):
        migrated({"format_version": 1}, tmp_path / "x.pt")
    with pytest.raises(CheckpointMismatch, match=f"format {FORMAT_VERSION}"):
        migrated([], tmp_path / "x.pt")


def test_the_deprecated_training_loss_warns_and_gives_each_methods_loss():
    from sol_ext.driver import methods

    torch.manual_seed(0)
    h, y = torch.randn(8, 4), torch.randint(0, 5, (8,))
    for method in ("l1", "ce"):
        cfg = dataclasses.replace(BASE, method=method, embedding_dim=4)
        model = methods.build_model(cfg, (3,), "tabular", 5)
        with pytest.warns(DeprecationWarning, match="training_loss is deprecated"):
            old = methods.training_loss(cfg, model, h, y, 5, None, None)
        assert torch.equal(old, methods.head_loss(method, model, h, y, 5))
    head = methods.make_sol_head(dataclasses.replace(BASE, sigma=1.0, embedding_dim=4), 5)
    with pytest.warns(DeprecationWarning):
        old = methods.training_loss(BASE, None, h, y, 5, head.centroids, head.criterion)
    assert torch.equal(old, head.criterion(h, y, head.centroids))


@pytest.mark.parametrize("old, new, names", [
    ("sol_ext.driver.run", "sol_ext.driver.fit", ("Fit", "FitContext", "RunOutcome", "WeightAverage",
                                                  "validation_split", "run_results", "train_run")),
    ("sol_ext.driver.tuning", "sol_ext.driver.train", ("SigmaSearch", "SingleRun", "Trial", "trial_dir",
                                                       "trial_config"))])
def test_the_former_modules_of_the_fit_still_give_their_names_with_a_warning(old, new, names):
    import importlib

    former, module = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        with pytest.warns(DeprecationWarning, match=f"import {name} from {new}"):
            assert getattr(former, name) is getattr(module, name)
    assert not hasattr(former, "no_such_name")  # any other name is an AttributeError
