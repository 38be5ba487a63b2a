"""``sol_ext.hf``: a tiny random BERT (no download; token ids, or text through a tokenizer built from a
word list) fine-tuned with ``SOLTrainer``: it trains, its callback runs SOL's end-of-epoch step,
predictions are the head's ranks, padding never changes them, label values map to ranks, a saved model
names its ranks for a ``text-classification`` pipeline, checkpoints hold the head, and the worked
example builds a trainer that runs."""
from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from transformers import (  # noqa: E402
    AutoModel,
    BertConfig,
    BertModel,
    BertTokenizer,
    DataCollatorWithPadding,
    TrainerCallback,
    TrainingArguments,
    pipeline,
)

import sol_ext  # noqa: E402
from common import REPO_ROOT
from sol_ext.hf import SOLTextConfig, SOLTextModel, SOLTextOutput, SOLTrainer  # noqa: E402

NUM_RANKS, LENGTH, VOCAB = 5, 12, 100
EXAMPLE = REPO_ROOT / "examples" / "hf_text_ratings.py"
WORDS = ("awful", "bad", "poor", "dull", "fine", "okay", "good", "great", "superb", "the", "film", "was", "very",
         "not", "plot", "acting")
REVIEWS = [("the film was awful", 1), ("bad acting", 1), ("very poor plot", 2), ("dull", 2), ("the film was fine", 3),
           ("okay acting not great", 3), ("good plot", 4), ("the acting was very good", 4), ("great film", 5),
           ("superb", 5), ("very very superb acting the plot was great", 5), ("not good", 2)]


class Ratings(torch.utils.data.Dataset):
    """Random token ids whose first token sets the rating (0…4): rows as a tokenizer gives them."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, VOCAB, (n, LENGTH), generator=gen)
        self.labels = ((self.ids[:, 0] - 5) * NUM_RANKS // (VOCAB - 5)).clamp(0, NUM_RANKS - 1)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        mask = torch.ones(LENGTH, dtype=torch.long)
        mask[LENGTH - 1 - i % 3:] = 0  # some padding: the mean pooling honours the mask
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": int(self.labels[i])}


def _encoder(seed=0):
    torch.manual_seed(seed)
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=LENGTH))


def _tokenizer(folder):
    """A BERT word-piece tokenizer of the few words of REVIEWS, built offline."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return BertTokenizer(str(folder / "vocab.txt"))


def _text_encoder(tokenizer, seed=0):
    torch.manual_seed(seed)
    return BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64, max_position_embeddings=32))


def _review_rows(tokenizer, label_offset=0):
    """The reviews tokenized without padding (the collator pads each batch), stars as labels."""
    return [{**tokenizer(text), "labels": stars + label_offset} for text, stars in REVIEWS * 4]


def _review_trainer(model, tokenizer, folder, label_offset=0, **arguments):
    """A SOLTrainer of the reviews, padded batch by batch by DataCollatorWithPadding."""
    options = dict(max_steps=3, per_device_train_batch_size=16, report_to=[], use_cpu=True, disable_tqdm=True,
                   save_strategy="no", seed=3, learning_rate=3e-3)
    args = TrainingArguments(str(folder), **{**options, **arguments})
    return SOLTrainer(model=model, args=args, train_dataset=_review_rows(tokenizer, label_offset),
                      data_collator=DataCollatorWithPadding(tokenizer))


def _trainer(model, tmp_path, epochs=2, centroid_updates_per_epoch=None, **arguments):
    options = dict(num_train_epochs=epochs, per_device_train_batch_size=16, per_device_eval_batch_size=32,
                   learning_rate=1e-3, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="epoch", seed=3)
    args = TrainingArguments(str(tmp_path / "out"), **{**options, **arguments})
    updates = {} if centroid_updates_per_epoch is None else {"centroid_updates_per_epoch": centroid_updates_per_epoch}
    return SOLTrainer(model=model, args=args, train_dataset=Ratings(64, 0), eval_dataset=Ratings(32, 1), **updates)


def _all_embeddings(model, data):
    batch = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    model.eval()
    with torch.no_grad():
        return model.embed(batch["input_ids"], batch["attention_mask"]), batch["labels"]


def test_a_tiny_model_trains_and_the_callback_updates_the_head(tmp_path):
    model = SOLTextModel(_encoder(), NUM_RANKS, momentum=0.0)  # no damping: the last update is the rule
    before = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    trainer = _trainer(model, tmp_path)
    result = trainer.train()
    assert result.global_step == 8 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(v, before[k]) for k, v in model.encoder.state_dict().items())
    assert bool(model.head.has_centroids) and bool(model.head.has_readout)
    # the head is the end-of-epoch update of the trained encoder on the whole training set
    h, labels = _all_embeddings(model, trainer.train_dataset)
    expected = sol_ext.SOLHead(NUM_RANKS, 32, momentum=0.0)
    expected.update(h, labels)
    torch.testing.assert_close(model.head.centroids, expected.centroids, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.head.temperature, expected.temperature, rtol=1e-5, atol=0)


def test_the_first_centroids_come_before_the_first_step(tmp_path):
    model = SOLTextModel(_encoder(), NUM_RANKS)
    h, labels = _all_embeddings(model, Ratings(64, 0))
    expected = sol_ext.SOLHead(NUM_RANKS, 32)
    expected.update_centroids(h, labels)
    trainer = _trainer(model, tmp_path, epochs=1, max_steps=1)
    seen = []
    original = model.head.loss

    def spy(h, labels, pairs=None):  # the head's centroids when the first loss is computed
        seen.append(model.head.centroids.clone())
        return original(h, labels, pairs)

    model.head.loss = spy
    trainer.train()
    torch.testing.assert_close(seen[0], expected.centroids, rtol=1e-5, atol=1e-6)


def test_evaluation_and_predictions_are_the_heads_ranks(tmp_path):
    model = SOLTextModel(_encoder(), NUM_RANKS)
    trainer = _trainer(model, tmp_path, epochs=1)
    trainer.train()
    test = Ratings(20, 2)
    output = trainer.predict(test)
    h, labels = _all_embeddings(model, test)
    ranks = model.head.predict(h)
    assert output.ranks.tolist() == ranks.tolist()
    np.testing.assert_allclose(output.predictions, model.head.predict_proba(h).numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(output.predictions.sum(axis=1), 1.0, rtol=0, atol=1e-9)  # cleanlab's pred_probs
    predictions, label_ids, scores = output   # it unpacks as Trainer.predict's output
    assert label_ids.tolist() == labels.tolist() and scores is output.metrics
    assert output.metrics["test_mae"] == pytest.approx(sol_ext.metrics.mae(ranks, labels))
    assert output.metrics["test_qwk"] == pytest.approx(
        sol_ext.metrics.quadratic_weighted_kappa(ranks, labels, NUM_RANKS))
    batch = torch.utils.data.default_collate([test[i] for i in range(4)])
    assert model.predict(**batch).tolist() == ranks[:4].tolist()
    assert model.predict_proba(**batch).shape == (4, NUM_RANKS)


class CentroidRecorder(TrainerCallback):
    """After each step (and SOLCallback's work at it): the step, the head's centroids, and the centroid
    rule (momentum 0) of the model as it is then, on the whole training set."""

    def __init__(self, model, train):
        self.model, self.train, self.seen = model, train, []

    def on_step_end(self, args, state, control, **kwargs):
        was_training = self.model.training
        h, labels = _all_embeddings(self.model, self.train)
        self.model.train(was_training)
        rule = sol_ext.SOLHead(NUM_RANKS, 32, momentum=0.0)
        rule.update_centroids(h, labels)
        self.seen.append((state.global_step, self.model.head.centroids.clone(), rule.centroids))


@pytest.mark.parametrize("updates", [1, 2, 4])
def test_centroids_follow_the_encoder_inside_an_epoch_as_often_as_asked(tmp_path, updates):
    """4-step epochs, momentum 0 (an update is the rule alone): with k updates an epoch, the centroids
    after steps 4/k, 2·4/k, … are the rule of the model at that step, and stay as they were between
    them; with 1, they stay the first centroids all the first epoch, as before there was a choice."""
    model = SOLTextModel(_encoder(), NUM_RANKS, momentum=0.0)
    h, labels = _all_embeddings(model, Ratings(64, 0))
    first = sol_ext.SOLHead(NUM_RANKS, 32, momentum=0.0)
    first.update_centroids(h, labels)
    trainer = _trainer(model, tmp_path, epochs=2, centroid_updates_per_epoch=updates, learning_rate=3e-3,
                       save_strategy="no")
    assert trainer.centroid_updates_per_epoch == updates
    recorder = CentroidRecorder(model, trainer.train_dataset)
    trainer.add_callback(recorder)
    trainer.train()
    assert [step for step, _, _ in recorder.seen] == list(range(1, 9))
    current = first.centroids
    for step, centroids, rule in recorder.seen:
        if step % 4 == 0:   # on_epoch_end comes after on_step_end: the epoch's own update is not yet done
            continue
        if step % (4 // updates) == 0:
            torch.testing.assert_close(centroids, rule, rtol=1e-5, atol=1e-6, msg=f"step {step}")
            assert not torch.allclose(centroids, current), step   # the encoder moved: so did they
            current = centroids
        elif step < 4:
            torch.testing.assert_close(centroids, current, rtol=0, atol=0, msg=f"step {step}")
    # the epoch's end updated the whole head as ever
    h, labels = _all_embeddings(model, trainer.train_dataset)
    expected = sol_ext.SOLHead(NUM_RANKS, 32, momentum=0.0)
    expected.update(h, labels)
    torch.testing.assert_close(model.head.centroids, expected.centroids, rtol=1e-5, atol=1e-6)


def test_centroid_updates_per_epoch_must_be_a_whole_number_from_one(tmp_path):
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="centroid_updates_per_epoch must be a whole number of updates, "
                                             "at least 1"):
            _trainer(SOLTextModel(_encoder(), NUM_RANKS), tmp_path, centroid_updates_per_epoch=bad)


class EvaluationRecorder(TrainerCallback):
    """At each evaluation: its eval_mae, and the MAE of a head updated afresh (momentum 0: the rule
    alone) from the model as it is at that step."""

    def __init__(self, model, train, test):
        self.model, self.train, self.test, self.seen = model, train, test, []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        was_training = self.model.training
        h, labels = _all_embeddings(self.model, self.train)
        fresh = sol_ext.SOLHead(NUM_RANKS, 32, momentum=0.0)
        fresh.update(h, labels)
        h_test, test_labels = _all_embeddings(self.model, self.test)
        self.model.train(was_training)
        self.seen.append((state.global_step, metrics["eval_mae"],
                          sol_ext.metrics.mae(fresh.predict(h_test), test_labels)))


def test_evaluations_inside_an_epoch_use_a_head_updated_at_their_step(tmp_path):
    """eval_strategy="steps" every 3 steps of 4-step epochs, with max_steps ending inside the second
    epoch: each evaluation scores a head updated from the model at its step (a fresh update_head and
    predict), and the scores move with the model."""
    model = SOLTextModel(_encoder(), NUM_RANKS, momentum=0.0)
    trainer = _trainer(model, tmp_path, epochs=1, max_steps=7, eval_strategy="steps", eval_steps=3,
                       learning_rate=3e-3, save_strategy="no")
    recorder = EvaluationRecorder(model, trainer.train_dataset, trainer.eval_dataset)
    trainer.add_callback(recorder)
    trainer.train()
    assert [step for step, _, _ in recorder.seen] == [3, 6, 7]   # and at the last step
    for step, logged, fresh in recorder.seen:
        assert logged == pytest.approx(fresh, abs=1e-9), step
    assert len({logged for _, logged, _ in recorder.seen}) > 1
    # after training (step 7, inside an epoch) predict scores the model of step 7
    h, labels = _all_embeddings(model, trainer.train_dataset)
    fresh = sol_ext.SOLHead(NUM_RANKS, 32, momentum=0.0)
    fresh.update(h, labels)
    h_test, _ = _all_embeddings(model, trainer.eval_dataset)
    assert trainer.predict(trainer.eval_dataset).ranks.tolist() == fresh.predict(h_test).tolist()


def test_predict_before_training_is_refused(tmp_path):
    trainer = _trainer(SOLTextModel(_encoder(), NUM_RANKS), tmp_path)
    with pytest.raises(RuntimeError, match=r"SOLTrainer.predict: the model's head is not trained.*trainer.train\(\)"):
        trainer.predict(Ratings(8, 2))
    with pytest.raises(RuntimeError, match="SOLTrainer.evaluate: the model's head is not trained"):
        trainer.evaluate()


def test_save_pretrained_and_from_pretrained_keep_the_encoder_and_the_head(tmp_path):
    """config.json holds the encoder's config and the head's settings; the weights file its state;
    SOLTextModel.from_pretrained and AutoModel.from_pretrained give the same predictions offline."""
    import json

    model = SOLTextModel(_encoder(), NUM_RANKS, sigma=0.7, readout="cuts")
    _trainer(model, tmp_path, epochs=1, save_strategy="no").update_head()   # a head with centroids and read-out
    model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["model_type"] == "sol_text" and config["encoder_config"]["model_type"] == "bert"
    assert config["head_settings"] == model.head.settings()
    batch = torch.utils.data.default_collate([Ratings(8, 2)[i] for i in range(8)])
    for loaded in (SOLTextModel.from_pretrained(tmp_path / "saved"), AutoModel.from_pretrained(tmp_path / "saved")):
        assert isinstance(loaded, SOLTextModel) and isinstance(loaded.config, SOLTextConfig)
        for name, value in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], value), name
        assert loaded.head.settings() == model.head.settings()
        assert loaded.predict(**batch).tolist() == model.predict(**batch).tolist()
    assert callable(model.push_to_hub)


def test_forward_gives_logits_that_a_compute_metrics_of_ones_own_can_use(tmp_path):
    """The rank log-probabilities as logits: the usual argmax compute_metrics runs, and the loss
    comes with labels."""
    model = SOLTextModel(_encoder(), NUM_RANKS)
    batch = torch.utils.data.default_collate([Ratings(4, 2)[i] for i in range(4)])
    untrained = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert isinstance(untrained, SOLTextOutput) and untrained.logits is None   # no read-out yet
    seen = []

    def accuracy(prediction):
        seen.append(prediction.predictions.shape)
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    trainer = _trainer(model, tmp_path, epochs=1, save_strategy="no")
    trainer.compute_metrics = accuracy
    trainer.update_head()   # SOL's end-of-epoch step without training: the head gets its read-out
    assert "eval_accuracy" in trainer.evaluate() and seen == [(32, NUM_RANKS)]
    model.eval()
    out = model(**batch)
    torch.testing.assert_close(out.logits.exp(), model.predict_proba(**batch))
    assert out.loss is not None and out.embeddings.shape == (4, 32)
    assert model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).loss is None


def test_checkpoints_hold_the_head_and_resuming_keeps_it(tmp_path):
    from safetensors.torch import load_file

    model = SOLTextModel(_encoder(), NUM_RANKS)
    _trainer(model, tmp_path, epochs=1).train()
    checkpoint = tmp_path / "out" / "checkpoint-4"
    saved = load_file(str(checkpoint / "model.safetensors"))
    head = sol_ext.SOLHead.from_state_dict({k[5:]: v for k, v in saved.items() if k.startswith("head.")})
    assert torch.equal(head.centroids, model.head.centroids)

    resumed = SOLTextModel(_encoder(seed=5), NUM_RANKS)  # another start: the checkpoint replaces it all
    seen = []
    resumed.head.update_centroids = lambda *args, **kwargs: seen.append("recomputed")
    _trainer(resumed, tmp_path, epochs=1).train(resume_from_checkpoint=str(checkpoint))
    assert seen == []  # the resumed head kept the checkpoint's centroids
    assert torch.equal(resumed.head.centroids, model.head.centroids)


def test_bad_models_are_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="encoder must be a transformers model"):
        SOLTextModel(torch.nn.Linear(3, 3), NUM_RANKS)
    with pytest.raises(ValueError, match="pooling must be one of"):
        SOLTextModel(_encoder(), NUM_RANKS, pooling="max")
    args = TrainingArguments(str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(TypeError, match="SOLTrainer's model must be a sol_ext.hf.SOLTextModel"):
        SOLTrainer(model=_encoder(), args=args)


def test_the_worked_example_builds_a_trainer_that_trains(tmp_path):
    spec = importlib.util.spec_from_file_location("hf_text_ratings", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert "distilbert-base-uncased" in EXAMPLE.read_text()  # the public checkpoint a user starts from
    trainer = example.build_trainer(_encoder(), Ratings(48, 0), Ratings(16, 1), str(tmp_path), epochs=1,
                                    batch_size=16, learning_rate=1e-3, use_cpu=True, disable_tqdm=True)
    trainer.train()
    assert set(trainer.evaluate()) >= {"eval_mae", "eval_macro_mae", "eval_qwk"}


def test_padding_never_changes_an_embedding_or_a_prediction(tmp_path):
    """Inside SOLTextModel the encoder keeps its attention implementation and gets the attention mask:
    the same sentences padded to their longest, to 32 tokens, or alone give the same embeddings and
    probabilities, and the encoder's states of the real tokens are those of the encoder alone."""
    tokenizer = _tokenizer(tmp_path / "tok")
    encoder = _text_encoder(tokenizer)
    alone = copy.deepcopy(encoder).eval()
    model = SOLTextModel(encoder, NUM_RANKS)
    assert model.encoder.config._attn_implementation == alone.config._attn_implementation == "sdpa"
    _review_trainer(model, tokenizer, tmp_path / "out", label_offset=-1).update_head()  # a read-out to predict with
    texts = [text for text, _ in REVIEWS]
    longest = tokenizer(texts, padding=True, return_tensors="pt")
    fixed = tokenizer(texts, padding="max_length", max_length=32, return_tensors="pt")
    assert fixed["input_ids"].shape[1] > longest["input_ids"].shape[1] + 20
    model.eval()
    with torch.no_grad():
        embedded = {name: model.embed(**batch) for name, batch in (("longest", longest), ("fixed", fixed))}
        one_by_one = torch.cat([model.embed(**tokenizer([text], return_tensors="pt")) for text in texts])
        states = model.encoder(**fixed).last_hidden_state
        for i, text in enumerate(texts):
            single = tokenizer([text], return_tensors="pt")
            n = single["input_ids"].shape[1]
            torch.testing.assert_close(states[i, :n], alone(**single).last_hidden_state[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(embedded["fixed"], embedded["longest"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(one_by_one, embedded["longest"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.predict_proba(**fixed), model.predict_proba(**longest), rtol=1e-5, atol=1e-7)
    assert model.predict(**fixed).tolist() == model.predict(**longest).tolist()
    # loaded with either implementation, the encoder uses it, and it gives the same probabilities
    model.save_pretrained(tmp_path / "saved")
    for implementation in ("sdpa", "eager"):
        loaded = AutoModel.from_pretrained(tmp_path / "saved", attn_implementation=implementation)
        assert loaded.encoder.config._attn_implementation == implementation
        torch.testing.assert_close(loaded.predict_proba(**fixed), model.predict_proba(**longest), rtol=1e-5, atol=1e-7)


def test_label_values_map_stars_to_ranks_as_ranks_would_train(tmp_path):
    """Labels 1…5 with label_values=range(1, 6) train the same model as ranks 0…4 without; predictions
    come back as ranks and as stars, metrics in rank units; a label off the grid is refused by name."""
    tokenizer = _tokenizer(tmp_path / "tok")
    collator = DataCollatorWithPadding(tokenizer)
    results = {}
    for name, offset, options in (("stars", 0, {"label_values": range(1, 6)}), ("ranks", -1, {"num_ranks": 5})):
        model = SOLTextModel(_text_encoder(tokenizer), **options)
        trainer = _review_trainer(model, tokenizer, tmp_path / name, offset)
        trainer.train()
        results[name] = (model, trainer.predict(trainer.train_dataset))
    (stars, by_stars), (ranks, by_ranks) = results["stars"], results["ranks"]
    assert stars.config.label_values == [1.0, 2.0, 3.0, 4.0, 5.0] and stars.config.num_labels == 5
    torch.testing.assert_close(stars.head.centroids, ranks.head.centroids, rtol=0, atol=0)
    assert by_stars.ranks.tolist() == by_ranks.ranks.tolist()
    assert by_stars.labels.tolist() == [r + 1.0 for r in by_stars.ranks.tolist()]
    assert by_ranks.labels.tolist() == by_ranks.ranks.tolist()
    assert by_stars.metrics["test_mae"] == pytest.approx(by_ranks.metrics["test_mae"])
    assert by_stars.label_ids.tolist() == [stars for _, stars in REVIEWS * 4]   # as the dataset gave them
    batch = collator([{**tokenizer("good plot"), "labels": 6}])
    with pytest.raises(ValueError, match=r"labels must be values of label_values \(1, 2, 3, 4, 5\), got 6 at index 0"):
        stars(**batch)
    with pytest.raises(ValueError, match="label_values must be finite numbers in strictly increasing order"):
        SOLTextModel(_text_encoder(tokenizer), label_values=[1, 3, 2])
    with pytest.raises(ValueError, match=r"num_ranks \(4\) must equal the number of label_values \(5\)"):
        SOLTextModel(_text_encoder(tokenizer), 4, label_values=range(1, 6))
    with pytest.raises(TypeError, match="needs num_ranks.*or label_values"):
        SOLTextModel(_text_encoder(tokenizer))


def test_a_saved_model_names_its_ranks_for_a_text_classification_pipeline(tmp_path):
    """config.json holds num_labels, id2label and label2id of the ranks (their stars), and
    pipeline("text-classification") gives each text its most probable rank's label and probability,
    from the model in memory and from the saved folder (AutoModelForSequenceClassification)."""
    tokenizer = _tokenizer(tmp_path / "tok")
    model = SOLTextModel(_text_encoder(tokenizer), label_values=range(1, 6))
    _review_trainer(model, tokenizer, tmp_path / "out").train()
    model.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    names = {"0": "1", "1": "2", "2": "3", "3": "4", "4": "5"}
    assert config["id2label"] == names and config["label2id"] == {v: int(k) for k, v in names.items()}
    texts = ["the film was awful", "superb acting", "okay"]
    model.eval()  # a pipeline runs the model as it is: out of training mode, without dropout
    probabilities = model.predict_proba(**tokenizer(texts, padding=True, return_tensors="pt"))
    for source in (model, str(tmp_path / "saved")):
        classify = pipeline("text-classification", model=source, tokenizer=tokenizer)
        assert classify.model.config.num_labels == 5
        for text, p, answer in zip(texts, probabilities, classify(texts)):
            assert answer["label"] == names[str(int(p.argmax()))], text
            assert answer["score"] == pytest.approx(float(p.max()), rel=1e-5)
        every = classify(texts[:1], top_k=None)[0]
        assert sorted(a["label"] for a in every) == ["1", "2", "3", "4", "5"]
        assert {a["label"]: a["score"] for a in every} == pytest.approx(
            {names[str(q)]: float(probabilities[0, q]) for q in range(5)}, rel=1e-5)


def test_the_auto_classes_load_a_saved_model_once_sol_ext_hf_is_imported(tmp_path):
    """A fresh process that has not imported sol_ext.hf gets transformers' own error, which names the
    model type sol_text (docs/hf.md says to import sol_ext.hf); with the import, AutoModel loads it."""
    model = SOLTextModel(_encoder(), NUM_RANKS)
    model.save_pretrained(tmp_path / "saved")
    load = f"from transformers import AutoModel; print(type(AutoModel.from_pretrained({str(tmp_path / 'saved')!r})).__name__)"
    without = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=300)
    assert without.returncode != 0 and "model type `sol_text`" in without.stderr, without.stderr[-2000:]
    with_import = subprocess.run([sys.executable, "-c", "import sol_ext.hf; " + load], capture_output=True,
                                 text=True, timeout=300)
    assert with_import.returncode == 0 and with_import.stdout.strip() == "SOLTextModel", with_import.stderr[-2000:]


def test_training_rows_without_labels_are_refused_by_name(tmp_path):
    rows = [{k: v for k, v in row.items() if k != "labels"} for row in Ratings(32, 0)]
    args = TrainingArguments(str(tmp_path / "out"), max_steps=2, report_to=[], use_cpu=True, disable_tqdm=True,
                             save_strategy="no")
    trainer = SOLTrainer(model=SOLTextModel(_encoder(), NUM_RANKS), args=args, train_dataset=rows)
    with pytest.raises(ValueError, match=r"SOLTrainer.train: the training rows have no 'labels' \(they hold "
                                         r"attention_mask, input_ids\); give every row its rank"):
        trainer.train()
