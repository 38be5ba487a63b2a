"""``sol_ext.lightning.SOLModule``: the same training as SOLHead's plain loop, the head in checkpoints, and
the same head on every process under ``strategy="ddp"`` (2 gloo processes under torchrun)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lightning")
import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import sol_ext  # noqa: E402
from common import MULTIPROCESS_TIMEOUT_S, REPO_ROOT, multiprocess_env  # noqa: E402
from sol_ext.lightning import SOLModule, SOLPrediction  # noqa: E402

NUM_RANKS, DIM, EPOCHS = 8, 8, 2


def _data(n=240):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=gen)
    y = (2 * x[:, 0] + 4 + 0.5 * torch.randn(n, generator=gen)).round().clamp(0, NUM_RANKS - 1).long()
    return x, y


def _encoder():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, DIM))


def _loader(x, y, shuffle=True):
    # a generator of its own: the same order in Lightning and in the plain loop
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(2) if shuffle else None)


def _trainer(tmp_path, epochs=EPOCHS, **kwargs):
    options = dict(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    return L.Trainer(**{**options, **kwargs})


def test_one_process_trains_as_the_plain_solhead_loop(tmp_path):
    x, y = _data()
    module = SOLModule(_encoder(), NUM_RANKS, DIM, sigma=1.0)
    trainer = _trainer(tmp_path)
    trainer.fit(module, _loader(x, y), _loader(x[:80], y[:80], shuffle=False))

    encoder = _encoder()  # the README's loop, with the module's defaults
    head = sol_ext.SOLHead(NUM_RANKS, DIM, sigma=1.0)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3, weight_decay=0.01 * NUM_RANKS)
    with torch.no_grad():
        head.update_centroids(F.normalize(encoder(x), dim=1), y)
    loader = _loader(x, y)
    for _ in range(EPOCHS):
        for xb, yb in loader:
            loss = head.loss(F.normalize(encoder(xb), dim=1), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            head.update(F.normalize(encoder(x), dim=1), y)

    for name, param in encoder.state_dict().items():
        torch.testing.assert_close(module.encoder.state_dict()[name], param, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(module.head.centroids, head.centroids, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(module.head.temperature, head.temperature, rtol=1e-5, atol=0)
    with torch.no_grad():
        expected = head.predict(F.normalize(encoder(x[:80]), dim=1))
    assert torch.equal(module.predict(x[:80]).ranks, expected)
    # the validation metrics of the last epoch, of the head updated at that epoch's end
    logged = trainer.callback_metrics
    assert float(logged["val_mae"]) == pytest.approx(sol_ext.metrics.mae(expected, y[:80]), abs=1e-6)
    assert {"val_macro_mae", "val_qwk", "train_loss"} <= set(logged)
    assert float(logged["val_qwk"]) == pytest.approx(
        sol_ext.metrics.quadratic_weighted_kappa(expected, y[:80], NUM_RANKS), abs=1e-6)
    predicted = SOLPrediction.cat(trainer.predict(module, _loader(x[:80], y[:80], shuffle=False)))
    assert torch.equal(predicted.ranks, expected)
    # inputs alone: a TensorDataset(x) gives each batch as the 1-tuple [x]
    inputs_only = trainer.predict(module, DataLoader(TensorDataset(x[:80]), batch_size=32))
    assert torch.equal(SOLPrediction.cat(inputs_only).ranks, expected)


def test_checkpoints_save_the_head_and_resume_with_it(tmp_path):
    """A run of one epoch resumed from its checkpoint for a second ends as a run of two epochs."""
    x, y = _data()
    straight = SOLModule(_encoder(), NUM_RANKS, DIM)
    _trainer(tmp_path).fit(straight, _loader(x, y, shuffle=False))

    first = SOLModule(_encoder(), NUM_RANKS, DIM)
    trainer = _trainer(tmp_path, epochs=1)
    trainer.fit(first, _loader(x, y, shuffle=False))
    path = tmp_path / "one.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["state_dict"]
    assert torch.equal(saved["head.centroids"], first.head.centroids)
    assert bool(saved["head.has_readout"])

    torch.manual_seed(7)  # another initial encoder: the checkpoint must replace it, head included
    other = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, DIM))
    resumed = SOLModule(other, NUM_RANKS, DIM)
    _trainer(tmp_path).fit(resumed, _loader(x, y, shuffle=False), ckpt_path=path)
    torch.testing.assert_close(resumed.head.centroids, straight.head.centroids, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(resumed.encoder[0].weight, straight.encoder[0].weight, rtol=1e-5, atol=1e-6)

    loaded = SOLModule.load_from_checkpoint(path, encoder=_encoder())
    assert torch.equal(loaded.head.centroids, first.head.centroids)
    assert loaded.head.settings() == first.head.settings()


def test_a_loader_of_an_iterable_dataset_asks_for_embedding_dataloader(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            x, y = _data(64)
            return iter(zip(x, y))

    module = SOLModule(_encoder(), NUM_RANKS, DIM)
    with pytest.raises(TypeError, match="Override SOLModule.embedding_dataloader"):
        _trainer(tmp_path).fit(module, DataLoader(Stream(), batch_size=16))


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match="encoder must be a torch.nn.Module"):
        SOLModule(lambda x: x, NUM_RANKS, DIM)
    with pytest.raises(ValueError, match="embed_batch_size must be a positive integer"):
        SOLModule(_encoder(), NUM_RANKS, DIM, embed_batch_size=0)
    with pytest.raises(ValueError, match="momentum"):
        SOLModule(_encoder(), NUM_RANKS, DIM, momentum=1.5)
    with pytest.raises(ValueError, match="label_values must be finite numbers in strictly increasing order"):
        SOLModule(_encoder(), None, DIM, label_values=[1, 3, 2])
    with pytest.raises(ValueError, match=r"num_ranks \(4\) must equal the number of label_values \(3\)"):
        SOLModule(_encoder(), 4, DIM, label_values=[1, 2, 3])
    with pytest.raises(ValueError, match="needs num_ranks"):
        SOLModule(_encoder(), None, DIM)


class OwnValidation(SOLModule):
    """A validation step of a user's own, with no guard for a head before training."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("my_val_mae", (self.predict(x).ranks - y).abs().float().mean(), batch_size=len(y))


def test_a_validation_step_of_ones_own_runs_in_the_sanity_check(tmp_path):
    """The sanity check (2 batches before the first epoch) finds a head with a read-out, and training
    goes as it does without the check: the first head starts from the same centroids."""
    x, y = _data()
    module = OwnValidation(_encoder(), NUM_RANKS, DIM)
    seen = []
    module.on_validation_end = lambda: seen.append((module.trainer.sanity_checking, module.head.centroids.clone()))
    trainer = _trainer(tmp_path, num_sanity_val_steps=2)
    trainer.fit(module, _loader(x, y), _loader(x[:80], y[:80], shuffle=False))
    assert [checking for checking, _ in seen] == [True, False, False]
    first = sol_ext.SOLHead(NUM_RANKS, DIM)
    with torch.no_grad():
        first.update_centroids(F.normalize(_encoder()(x), dim=1), y)
    torch.testing.assert_close(seen[0][1], first.centroids, rtol=1e-5, atol=1e-6)
    assert "my_val_mae" in trainer.callback_metrics

    unchecked = SOLModule(_encoder(), NUM_RANKS, DIM)
    _trainer(tmp_path, num_sanity_val_steps=0).fit(unchecked, _loader(x, y), _loader(x[:80], y[:80], shuffle=False))
    for name, param in unchecked.encoder.state_dict().items():
        torch.testing.assert_close(module.encoder.state_dict()[name], param, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(module.head.centroids, unchecked.head.centroids, rtol=1e-6, atol=1e-7)


def test_every_epoch_logs_losses_and_metrics_of_train_val_and_test(tmp_path):
    """metrics.csv holds one row per epoch with train_loss (8 steps an epoch, fewer than the logging
    interval), train/val MAE, macro-MAE and QWK, and val_loss; trainer.test gives the test_* values
    of the head's predictions."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    x, y = _data()
    module = SOLModule(_encoder(), NUM_RANKS, DIM)
    trainer = _trainer(tmp_path, logger=CSVLogger(tmp_path, name="log", version=0))
    trainer.fit(module, _loader(x, y), _loader(x[:80], y[:80], shuffle=False))
    rows = list(csv.DictReader(open(tmp_path / "log" / "version_0" / "metrics.csv")))
    per_epoch = {}
    for row in rows:
        per_epoch.setdefault(int(row["epoch"]), {}).update({k: v for k, v in row.items() if v != ""})
    assert sorted(per_epoch) == list(range(EPOCHS))
    for stage in ("train", "val"):
        for name in ("loss", "mae", "macro_mae", "qwk"):
            assert all(f"{stage}_{name}" in logged for logged in per_epoch.values()), (stage, name)
    with torch.no_grad():
        h = F.normalize(module.encoder(x), dim=1)
    train_ranks = module.head.predict(h)
    assert float(per_epoch[EPOCHS - 1]["train_mae"]) == pytest.approx(sol_ext.metrics.mae(train_ranks, y), abs=1e-6)
    # the mean over the batches of 32, 32 and 16, each weighed by its size
    val_loss = sum(len(part) * float(module.head.loss(h_part, part))
                   for h_part, part in zip(h[:80].split(32), y[:80].split(32))) / 80
    assert float(per_epoch[EPOCHS - 1]["val_loss"]) == pytest.approx(val_loss, rel=1e-5)

    (tested,) = trainer.test(module, _loader(x[80:], y[80:], shuffle=False), verbose=False)
    ranks = module.head.predict(h[80:])
    assert tested["test_mae"] == pytest.approx(sol_ext.metrics.mae(ranks, y[80:]), abs=1e-6)
    assert tested["test_macro_mae"] == pytest.approx(sol_ext.metrics.macro_mae(ranks, y[80:]), abs=1e-6)
    assert tested["test_qwk"] == pytest.approx(sol_ext.metrics.quadratic_weighted_kappa(ranks, y[80:], NUM_RANKS), abs=1e-6)
    assert "test_loss" in tested


def test_testing_or_predicting_an_untrained_module_is_refused(tmp_path):
    x, y = _data(40)
    module = SOLModule(_encoder(), NUM_RANKS, DIM)
    with pytest.raises(RuntimeError, match="test needs a trained head"):
        _trainer(tmp_path).test(module, _loader(x, y, shuffle=False), verbose=False)
    with pytest.raises(RuntimeError, match="predict needs a trained head"):
        module.predict(x)


def test_predictions_give_probabilities_expected_values_and_labels_on_the_grid(tmp_path):
    """With label_values the batches hold label values (ages 20, 22, …): training is that of their
    ranks, and predictions come back in ranks, labels, probabilities and expected label."""
    x, y = _data()
    grid = [20.0 + 2 * r for r in range(NUM_RANKS)]
    by_value = SOLModule(_encoder(), None, DIM, label_values=grid)
    _trainer(tmp_path).fit(by_value, _loader(x, 20.0 + 2 * y), _loader(x[:80], 20.0 + 2 * y[:80], shuffle=False))
    by_rank = SOLModule(_encoder(), NUM_RANKS, DIM)
    _trainer(tmp_path).fit(by_rank, _loader(x, y), _loader(x[:80], y[:80], shuffle=False))
    torch.testing.assert_close(by_value.head.centroids, by_rank.head.centroids, rtol=1e-6, atol=1e-7)

    out = by_value.predict(x[:10])
    assert isinstance(out, SOLPrediction)
    assert torch.equal(out.ranks, by_rank.predict(x[:10]).ranks)
    assert torch.equal(out.labels, 20.0 + 2 * out.ranks.double())
    assert out.probabilities.shape == (10, NUM_RANKS)
    torch.testing.assert_close(out.probabilities.sum(dim=1), torch.ones(10, dtype=torch.float64))
    torch.testing.assert_close(out.expected, 20.0 + 2 * by_value.head.expected_rank(out.embeddings))
    assert out.embeddings.shape == (10, DIM)
    plain = by_rank.predict(x[:10])
    assert torch.equal(plain.labels, plain.ranks)   # no grid: labels are the ranks
    with pytest.raises(ValueError, match=r"labels must be values of label_values \(20, 22, 24, …, 34\), got 21.0"):
        by_value.to_ranks(torch.tensor([20.0, 21.0]))


def test_float_validation_labels_are_refused_as_in_training(tmp_path):
    x, y = _data(120)
    module = SOLModule(_encoder(), 7, DIM)
    halves = y[:40].clamp(max=5).float() + 0.5
    with pytest.raises(TypeError, match=r"val labels must be integer ranks 0 … 6 .*got dtype torch.float32 \(\d.5 at"):
        _trainer(tmp_path).fit(module, _loader(x[40:], y[40:].clamp(max=6)), _loader(x[:40], halves, shuffle=False))
    with pytest.raises(TypeError, match="labels must be integer ranks"):
        _trainer(tmp_path, num_sanity_val_steps=0).fit(SOLModule(_encoder(), 7, DIM), _loader(x, y.float() + 0.5))


DDP_SCRIPT = """
import os, sys
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import sol_ext
from sol_ext.lightning import SOLModule

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
x = torch.randn(203, 6, generator=gen)   # 203 samples: unequal shards
y = (2 * x[:, 0] + 4 + 0.5 * torch.randn(203, generator=gen)).round().clamp(0, 7).long()
torch.manual_seed(1)
encoder = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
module = SOLModule(encoder, 8, 8, momentum=0.0)   # no damping: the last update is the rule alone
trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
            DataLoader(TensorDataset(x[:50], y[:50]), batch_size=16))
# one process's update on the whole training set with the trained encoder
single = sol_ext.SOLHead(8, 8, momentum=0.0)
with torch.no_grad():
    single.update(F.normalize(module.encoder(x), dim=1), y)
torch.save({"head": module.head.state_dict(), "single": single.state_dict(),
            "encoder": module.encoder.state_dict(),
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}},
           os.path.join(sys.argv[1], f"rank{trainer.global_rank}.pt"))
torch.distributed.destroy_process_group()
os._exit(0)  # torch's gloo can abort in the interpreter's shutdown after DDP (tests/common.py)
"""


def test_ddp_processes_hold_the_same_head_as_one_process_on_all_the_data(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=MULTIPROCESS_TIMEOUT_S, env=multiprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for key in ("centroids", "temperature", "log_prior"):
        assert torch.equal(ranks[0]["head"][key], ranks[1]["head"][key]), key
        torch.testing.assert_close(ranks[0]["head"][key], ranks[0]["single"][key], rtol=1e-5, atol=1e-6)
    for name, param in ranks[0]["encoder"].items():
        assert torch.equal(param, ranks[1]["encoder"][name]), name
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    assert {"val_mae", "val_macro_mae", "val_qwk"} <= set(ranks[0]["metrics"])


def test_the_readme_snippet_runs(tmp_path, monkeypatch):
    import re

    readme = (REPO_ROOT / "docs" / "lightning.md").read_text()
    mark = "<!-- docs snippet: tests/integrations/test_lightning.py runs it -->"
    (code,) = re.findall(re.escape(mark) + r"\n```python\n(.*?)```", readme, re.S)
    monkeypatch.chdir(tmp_path)  # the trainer's logs and checkpoints
    scope: dict = {}
    exec(compile(code, "docs/lightning.md", "exec"), scope)
    assert scope["ranks"].shape == (5,) and scope["out"].probabilities.shape == (5, 10)
    assert float(scope["trainer"].callback_metrics["test_mae"]) < 1.0   # trainer.test on the validation set
