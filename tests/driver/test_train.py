"""The training loop: every method runs, relabels are kept, resume equals an unbroken run."""

import dataclasses
import re

import pytest
import torch

from common import TINY_SETTINGS, tiny_csv, tiny_data
from sol_ext.driver.checkpoint import CHECKPOINT_NAME, load_checkpoint
from sol_ext.driver.cli import main
from sol_ext.driver.config import METHODS, PAPER_SETTINGS, SIGMA_GRID, TrainConfig
from sol_ext.driver.encoders import build_encoder
from sol_ext.driver.train import BEST_NAME, SIGMA_SEARCH_NAME, train


def quiet(_line):
    pass


BASE = TrainConfig(**TINY_SETTINGS)


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


def test_paper_settings_pick_the_last_epoch(tmp_path):
    cfg = dataclasses.replace(BASE, epochs=3, **PAPER_SETTINGS)
    out = train(cfg, tiny_data(), tmp_path, log=quiet)
    r = out.results
    assert r["selected_epoch"] == 3 and r["data"]["n_val"] == 0 and r["val_mae"] is None
    assert r["test"] == r["history"][-1]["test"]


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


# -- ``--sigma auto`` (the default) trains once per candidate sigma: every epoch of every trial prints
# a line naming the trial's sigma, the epoch and its validation MAE, unless --quiet

SEARCH_FAST = ["--batch-size", "16", "--embedding-dim", "4", "--hidden", "16", "--lr", "0.01", "--no-plots"]
TRIAL_LINE = re.compile(r"^sigma (\S+) \(trial (\d)/(\d)\): epoch +(\d+)/(\d+) .*val MAE \d+\.\d{3}")


def _train_search(tmp_path, *extra) -> None:
    data = tiny_csv(tmp_path / "d.csv")
    assert main(["train", "--data", str(data), "--output", str(tmp_path / "run"), *SEARCH_FAST, *extra]) == 0


@pytest.mark.parametrize("quiet", [False, True])
def test_every_epoch_of_every_trial_prints_a_line(quiet, tmp_path, capsys):
    epochs = 1 if quiet else 2
    _train_search(tmp_path, "--epochs", str(epochs), *(["--quiet"] if quiet else []))
    lines = [m.groups() for m in map(TRIAL_LINE.match, capsys.readouterr().out.splitlines()) if m]
    if quiet:
        assert lines == []
        return
    trials = len(SIGMA_GRID)
    assert lines == [(f"{sigma:g}", str(t), str(trials), str(e), str(epochs))
                     for t, sigma in enumerate(SIGMA_GRID, start=1) for e in range(1, epochs + 1)]
