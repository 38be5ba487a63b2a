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
from common import MULTIPROCESS_TIMEOUT_S, multiprocess_env  # noqa: E402
from sol_ext.lightning import SOLModule  # noqa: E402

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
    assert torch.equal(module.predict_ranks(x[:80]), expected)
    # the validation metrics of the last epoch, of the head updated at that epoch's end
    logged = trainer.callback_metrics
    assert float(logged["val_mae"]) == pytest.approx(sol_ext.metrics.mae(expected, y[:80]), abs=1e-6)
    assert {"val_macro_mae", "val_qwk", "train_loss"} <= set(logged)
    assert float(logged["val_qwk"]) == pytest.approx(
        sol_ext.metrics.quadratic_weighted_kappa(expected, y[:80], NUM_RANKS), abs=1e-6)
    predicted = trainer.predict(module, _loader(x[:80], y[:80], shuffle=False))
    assert torch.equal(torch.cat(predicted), expected)
    # inputs alone: a TensorDataset(x) gives each batch as the 1-tuple [x]
    inputs_only = trainer.predict(module, DataLoader(TensorDataset(x[:80]), batch_size=32))
    assert torch.equal(torch.cat(inputs_only), expected)


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
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "lightning.md").read_text()
    mark = "<!-- docs snippet: tests/test_lightning.py runs it -->"
    (code,) = re.findall(re.escape(mark) + r"\n```python\n(.*?)```", readme, re.S)
    monkeypatch.chdir(tmp_path)  # the trainer's logs and checkpoints
    scope: dict = {}
    exec(compile(code, "docs/lightning.md", "exec"), scope)
    assert scope["ranks"].shape == (5,)
    assert float(scope["trainer"].callback_metrics["val_mae"]) < 1.0
