"""The training loop: every method runs, relabels are kept, resume equals an unbroken run."""

import dataclasses

import pytest
import torch

from sol_ext.checkpoint import CHECKPOINT_NAME, CheckpointMismatch, load_checkpoint
from sol_ext.config import METHODS, TrainConfig, config_mismatches
from sol_ext.data import RankEncoder
from sol_ext.encoders import build_encoder
from sol_ext.prepare import PreparedData
from sol_ext.train import train


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
    return PreparedData(name="tiny", kind="tabular", encoder=RankEncoder(10.0, 0.5, num_ranks),
                        train_x=xtr, train_given=noisy, train_clean=clean, test_x=xte,
                        test_ranks=rte, train_rows=torch.arange(n_train))


def quiet(_line):
    pass


BASE = TrainConfig(data="tiny", epochs=2, batch_size=16, embedding_dim=4, hidden=(16,),
                   lr=1e-2, beta=0.5)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_and_reports(method, tmp_path):
    cfg = dataclasses.replace(BASE, method=method)
    out = train(cfg, tiny_data(), tmp_path, log=quiet)
    r = out.results
    assert len(r["history"]) == 2 and r["test"]["mae"] >= 0 and 0 <= r["test"]["cs"] <= 100
    assert out.test_pred.shape == (32,) and out.train_pred.shape == (96,)
    assert int(out.test_pred.min()) >= 0 and int(out.test_pred.max()) < 8
    # the CS threshold defaults to 2 rank steps, in label units
    assert r["cs_theta"] == 1.0
    if method != "sol":
        assert r["relabeled_total"] == 0 and torch.equal(out.labels, tiny_data().train_given)


def test_sol_relabels_are_kept_and_reported(tmp_path):
    data = tiny_data()
    cfg = dataclasses.replace(BASE, epochs=3)
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
    cfg2 = dataclasses.replace(BASE, pairs=pairs, pairs_per_class=8)
    full = train(cfg2, data, tmp_path / "full", log=quiet)
    cfg1 = dataclasses.replace(cfg2, epochs=1)
    train(cfg1, data, tmp_path / "split", log=quiet)
    resumed = train(cfg2, data, tmp_path / "split", resume=True, log=quiet)
    a = load_checkpoint(tmp_path / "full" / CHECKPOINT_NAME)
    b = load_checkpoint(tmp_path / "split" / CHECKPOINT_NAME)
    assert torch.equal(resumed.labels, full.labels)
    torch.testing.assert_close(b["centroids"], a["centroids"])
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


def test_posterior_inference_is_off_by_default_and_trains(tmp_path):
    """``inference="posterior"`` (not in the paper) is an option; the default stays eq. 6."""
    assert TrainConfig().inference == "nearest"
    data = tiny_data()
    base = train(dataclasses.replace(BASE, epochs=2), data, tmp_path / "a", log=quiet)
    cfg = dataclasses.replace(BASE, epochs=2, inference="posterior")
    out = train(cfg, data, tmp_path / "b", log=quiet)
    assert out.test_pred.shape == (32,) and int(out.test_pred.min()) >= 0
    assert int(out.test_pred.max()) < 8
    assert out.results["config"]["inference"] == "posterior"
    assert base.results["config"]["inference"] == "nearest"
    with pytest.raises(ValueError, match="inference"):
        dataclasses.replace(BASE, inference="mean").validate()
