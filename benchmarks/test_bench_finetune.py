"""Tests of benchmarks/bench_finetune.py: its fixed split, judged ranks and baseline read-outs on small
arrays, and a run of every head, fine-tuned and frozen, with a tiny random BERT and a tokenizer of a few
words on a small table of sentences (seconds, offline)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from common import load_benchmark

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("pyarrow")

WORDS = ("awful", "bad", "poor", "dull", "fine", "okay", "good", "great", "superb", "the", "film", "was", "very",
         "not", "plot")


def _bench():
    return load_benchmark("bench_finetune")


def test_the_split_is_fixed_disjoint_and_60_20_20():
    bench = _bench()
    split = bench.split_rows(1000)
    assert [len(split[p]) for p in ("train", "val", "test")] == [600, 200, 200]
    every = np.concatenate(list(split.values()))
    assert len(np.unique(every)) == 1000
    again = bench.split_rows(1000)
    assert all(np.array_equal(split[p], again[p]) for p in split)   # no seed: one split for every seed


def test_the_judged_rank_is_the_rounded_consensus_halves_to_even():
    bench = _bench()
    assert bench.clean_ranks(np.array([-4.0, -0.5, 0.5, 1.5, 2.4, 3.6])).tolist() == [0, 4, 4, 6, 6, 8]


def test_the_baseline_read_outs():
    bench = _bench()
    big = 20.0
    corn = np.full((2, 8), -big)
    corn[0, :3] = big                       # P(rank > k) high for k = 0, 1, 2: rank 3
    ranks, score = bench.read_out("corn", corn)
    assert ranks.tolist() == [3, 0] and score == pytest.approx([3 - 4, 0 - 4], abs=1e-6)
    ranks, score = bench.read_out("l1", np.array([[2.6], [-3.0], [11.0]]))
    assert ranks.tolist() == [3, 0, 8] and score == pytest.approx([2.6 - 4, -7.0, 7.0])
    ce = np.zeros((1, 9))
    ce[0, 6] = big
    ranks, score = bench.read_out("ce", ce)
    assert ranks.tolist() == [6] and score == pytest.approx([2.0], abs=1e-6)


@pytest.fixture
def tiny_setup(tmp_path):
    """A folder with a 2-layer random BERT and its tokenizer, and a parquet of 60 made-up sentences with
    ratings -4 … 4 (the consensus a noisy function of the words, one rater a noisy draw around it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = tmp_path / "encoder"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = BertTokenizer(str(folder / "vocab.txt"))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) for _ in range(60)]
    consensus = np.clip(np.array([t.count("good") + t.count("great") - t.count("bad") for t in texts], float)
                        + rng.normal(0, 0.5, 60), -4, 4)
    one_rater = np.clip(np.round(consensus + rng.normal(0, 1, 60)), -4, 4).astype(np.int64)
    pq.write_table(pa.table({"row": np.arange(60), "text": texts, "consensus": consensus, "one_rater": one_rater}),
                   tmp_path / "sentences.parquet")
    return folder, tmp_path / "sentences.parquet"


def test_a_small_run_trains_every_head_fine_tuned_and_frozen(tiny_setup, tmp_path):
    pytest.importorskip("coral_pytorch")
    bench = _bench()
    folder, data = tiny_setup
    out = tmp_path / "out"
    assert bench.main(["--data", str(data), "--encoder", str(folder), "--seeds", "1", "--epochs", "2",
                       "--frozen-epochs", "3", "--max-length", "8", "--train-layers", "1", "--batch-size", "8",
                       "--output", str(out), "--tag", "smoke"], log=lambda line: None) == 0
    result = json.loads((out / "finetune_smoke.json").read_text())
    settings, runs = result["settings"], result["runs"]
    assert settings["split"] == {"train": 36, "val": 12, "test": 12} and settings["truncated"] > 0
    assert [(r["mode"], r["head"]) for r in runs] == [(m, h) for m in ("finetuned", "frozen")
                                                      for h in ("sol", "corn", "l1", "ce")]
    for r in runs:
        assert 0 <= r["mae"] <= 8 and r["macro_mae"] >= 0 and -1 <= r["qwk"] <= 1, r
        assert -1 <= r["pearson"] <= 1 and -1 <= r["spearman"] <= 1
        assert r["best_epoch"] in range(1, 4) and r["val_mae"] == min(r["val_maes"])
        assert r["seconds_per_epoch"] > 0 and r["peak_memory_mb"] > 0
    finetuned = {r["head"]: r for r in runs if r["mode"] == "finetuned"}
    assert all(len(r["val_maes"]) == 2 for r in finetuned.values())      # one validation per epoch
    # the top layer only trains: every head has the same encoder parameters; the linear heads add theirs
    layer = 4 * 16 * 16 + 4 * 16 + 2 * 16 * 32 + 32 + 16 + 2 * 2 * 16   # one BERT layer of hidden 16
    assert finetuned["sol"]["trainable_parameters"] == layer
    assert finetuned["ce"]["trainable_parameters"] == layer + 16 * 9 + 9
    assert (out / "finetune_smoke.md").read_text().count("| finetuned |") == 4


def test_bad_options_are_refused_before_any_run(tiny_setup, tmp_path, capsys):
    bench = _bench()
    folder, data = tiny_setup
    for args, needle in ((["--heads", "sol,svm"], "--heads: unknown svm"),
                         (["--modes", "both"], "--modes: unknown both"),
                         (["--train-layers", "top"], "--train-layers must be a number of top layers or 'all'"),
                         (["--data", str(tmp_path / "none.parquet")], "no such file"),
                         (["--rows", "3"], "--rows must be at least 10"),
                         (["--seeds", "0"], "--seeds must be a number of seeds (at least 1) or a list")):
        with pytest.raises(SystemExit) as stopped:
            bench.main(["--encoder", str(folder), "--data", str(data), *args, "--output", str(tmp_path / "o")])
        assert stopped.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_probe_first_starts_a_fine_tuned_linear_head_from_the_frozen_encoders_head(tiny_setup, tmp_path, monkeypatch):
    bench = _bench()
    folder, data = tiny_setup
    probed = []
    original = bench.train_linear_head

    def spy(head, *args, **kwargs):
        layer, seen, epoch = original(head, *args, **kwargs)
        probed.append((head, {k: v.clone() for k, v in layer.state_dict().items()}))
        return layer, seen, epoch

    started = []

    class Spied(bench.BaselineModel):   # the head as the first training step finds it
        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **unused):
            if not started:
                started.append({n: v.clone() for n, v in self.head.state_dict().items()})
            return super().forward(input_ids, attention_mask, token_type_ids, labels)

    monkeypatch.setattr(bench, "train_linear_head", spy)
    monkeypatch.setattr(bench, "BaselineModel", Spied)
    assert bench.main(["--data", str(data), "--encoder", str(folder), "--seeds", "1", "--epochs", "1",
                       "--frozen-epochs", "2", "--max-length", "8", "--train-layers", "1", "--batch-size", "8",
                       "--heads", "ce", "--modes", "finetuned", "--probe-first", "--seeds", "2,", "--output", str(tmp_path / "o")],
                      log=lambda line: None) == 0
    assert [head for head, _ in probed] == ["ce"]
    for name, value in probed[0][1].items():
        assert torch.equal(started[0][name], value), name   # the first training step's head is the probe's
    assert "linear heads probed first" in (tmp_path / "o" / "finetune.md").read_text()
    assert [r["seed"] for r in json.loads((tmp_path / "o" / "finetune.json").read_text())["runs"]] == [2]
