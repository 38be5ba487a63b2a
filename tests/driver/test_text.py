"""Text runs: ``sol-ext train --text-column --text-encoder`` fine-tunes a Hugging Face encoder, and the run
predicts raw text (``sol-ext predict``, ``load_run``), audits and refuses export, offline."""
import csv
import random
import shutil
import sys

import numpy as np
import pytest
import torch

from common import expect_error
from sol_ext.driver.cli import main

transformers = pytest.importorskip("transformers")
pd = pytest.importorskip("pandas")

GOOD = ["good", "great", "fine", "loved", "fun"]
BAD = ["bad", "awful", "terrible", "boring", "hated"]
WORDS = [*GOOD, *BAD, "ok", "movie", "film", "plot"]
QUICK = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "8", "--sigma", "1",
         "--quiet", "--no-plots"]


def make_encoder(folder, seed=0):
    """A tiny random BERT and a tokenizer of a vocabulary written here, saved as save_pretrained does."""
    folder.mkdir(parents=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab))
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(WORDS) + 5, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sentence(rng, stars):
    pool = GOOD if stars >= 4 else BAD if stars <= 2 else ["ok", "fine", "boring"]
    return " ".join(rng.choice(pool) for _ in range(rng.randint(1, 6))) + " " + rng.choice(["movie", "film"])


def write_reviews(path, n=160, seed=0, labels=True):
    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["review", "stars", "length"] if labels else ["review", "length"])
        for _ in range(n):
            stars = rng.randint(1, 5)
            text = sentence(rng, stars)
            out.writerow([text, stars, len(text)] if labels else [text, len(text)])
    return path


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A finished 2-epoch text run (the text and one numeric column), its encoder and data."""
    root = tmp_path_factory.mktemp("text")
    encoder = make_encoder(root / "encoder")
    data = write_reviews(root / "reviews.csv")
    run = root / "run"
    assert main(["train", "--data", str(data), "--text-column", "review", "--label-column", "stars",
                 "--text-encoder", str(encoder), "--output", str(run), *QUICK]) == 0
    return run, encoder, data


def test_text_rows_index_move_and_scale():
    from sol_ext.driver.data import TextRows, apply_scaling

    rows = TextRows(["a", "b", "c"], torch.tensor([[1.0], [2.0], [3.0]]))
    assert rows.shape == (3, 1) and len(rows) == 3
    picked = rows[torch.tensor([2, 0])]
    assert list(picked.texts) == ["c", "a"] and picked.features[:, 0].tolist() == [3.0, 1.0]
    assert list(rows[1:].texts) == ["b", "c"]
    assert list(rows[np.array([False, True, False])].texts) == ["b"]
    scaled = apply_scaling(rows, (torch.tensor([2.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)))
    assert list(scaled.texts) == ["a", "b", "c"] and scaled.features[:, 0].tolist() == [-1.0, 0.0, 1.0]
    assert TextRows(["x"]).shape == (1, 0)


def test_load_table_keeps_the_text_column_as_text(tmp_path):
    from sol_ext.driver.data import TextRows, load_table

    data = write_reviews(tmp_path / "r.csv", n=20)
    ds = load_table(data, "stars", text_column="review")
    assert ds.kind == "text" and isinstance(ds.features, TextRows)
    assert ds.feature_names == ("length",) and ds.schema["text_column"] == "review"
    with open(data, newline="") as f:
        texts = [row[0] for row in list(csv.reader(f))[1:]]
    assert list(ds.features.texts) == texts
    alone = load_table(data, "stars", text_column="review", drop_columns=["length"])
    assert alone.features.shape == (20, 0)


def test_run_folder_holds_the_fine_tuned_encoder(text_run):
    from sol_ext.driver.checkpoint import load_checkpoint

    run, encoder, _ = text_run
    folder = run / "text_encoder"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in folder.iterdir()}
    tuned = transformers.AutoModel.from_pretrained(folder, local_files_only=True)
    original = transformers.AutoModel.from_pretrained(encoder, local_files_only=True)
    best = load_checkpoint(run / "best.pt")
    saved = {k[len("encoder.text."):]: v for k, v in best["model"].items() if k.startswith("encoder.text.")}
    weights = dict(tuned.state_dict())
    assert saved and all(torch.equal(weights[k], v) for k, v in saved.items() if k in weights)
    name = "encoder.layer.1.attention.self.query.weight"
    assert not torch.equal(weights[name], original.state_dict()[name])  # fine-tuned, not as loaded
    assert set(best["predictor"]["text_encoder_files"]) == {p.name for p in folder.iterdir()}
    transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)


def test_predict_and_load_run_agree_on_raw_text(text_run, tmp_path):
    from sol_ext.driver import load_run

    run, _, _ = text_run
    new = write_reviews(tmp_path / "new.csv", n=12, seed=5, labels=False)
    out = tmp_path / "pred.csv"
    assert main(["predict", str(run), "--data", str(new), "--output", str(out)]) == 0
    written = pd.read_csv(out)
    frame = pd.read_csv(new)
    model = load_run(run)
    table = model.predict_table(frame)
    assert written["prediction"].tolist() == table.prediction.tolist()
    np.testing.assert_allclose(written["expected"].to_numpy(), table.expected, rtol=1e-6)
    np.testing.assert_array_equal(model.predict(frame), model.predict(str(new)))


def test_padding_does_not_change_a_prediction(text_run):
    from sol_ext.driver import load_run

    model = load_run(text_run[0])
    short = pd.DataFrame({"review": ["good film"], "length": [9]})
    beside_longer = pd.DataFrame({"review": ["good film", "awful boring terrible hated bad plot movie"],
                                  "length": [9, 43]})
    alone, padded = model.embed(short), model.embed(beside_longer)
    torch.testing.assert_close(alone[0], padded[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict_proba(short)[0], model.predict_proba(beside_longer)[0], atol=1e-6)


def test_interval_audit_and_export(text_run, tmp_path, capsys):
    run, _, data = text_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    out = tmp_path / "intervals.csv"
    assert main(["predict", str(copy), "--data", str(data), "--interval", "0.9", "--output", str(out)]) == 0
    intervals = pd.read_csv(out)
    assert (intervals["lower"] <= intervals["prediction"]).all() and (intervals["prediction"] <= intervals["upper"]).all()
    assert main(["audit", str(copy), "--folds", "2"]) == 0
    assert len(pd.read_csv(copy / "audit.csv")) == 128  # the training rows (the rest is the test set)
    capsys.readouterr()
    expect_error(capsys, ["export", str(copy)], "text run", "export supports table and image runs")


def test_changed_encoder_files_are_refused(text_run, tmp_path):
    from sol_ext.driver import load_run

    copy = tmp_path / "run"
    shutil.copytree(text_run[0], copy)
    config = copy / "text_encoder" / "tokenizer_config.json"
    config.write_text(config.read_text().replace("}", ', "x": 1}', 1))
    with pytest.raises(ValueError, match="tokenizer_config.json no longer matches the checksum"):
        load_run(copy)
    shutil.rmtree(copy / "text_encoder")
    with pytest.raises(FileNotFoundError, match="text_encoder is missing"):
        load_run(copy)


def test_run_files_of_the_encoder_are_never_overwritten(text_run, tmp_path, capsys):
    run, _, data = text_run
    target = run / "text_encoder" / "config.json"
    before = target.read_bytes()
    expect_error(capsys, ["predict", str(run), "--data", str(data), "--output", str(target), "--overwrite"],
                 "text encoder of the run folder")
    assert target.read_bytes() == before


def test_text_alone_trains_and_predicts(tmp_path):
    from sol_ext.driver import load_run

    encoder = make_encoder(tmp_path / "encoder", seed=1)
    data = write_reviews(tmp_path / "reviews.csv", n=64)
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--text-column", "review", "--label-column", "stars",
                 "--drop-columns", "length", "--text-encoder", str(encoder), "--train-layers", "1",
                 "--output", str(run), *QUICK, "--epochs", "1"]) == 0
    model = load_run(run)
    assert model.model.encoder.table is None
    assert model.predict(pd.DataFrame({"review": ["great fun film", "awful plot"]})).shape == (2,)


def test_missing_transformers_names_the_install(tmp_path, capsys, monkeypatch):
    data = write_reviews(tmp_path / "reviews.csv", n=80)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    expect_error(capsys, ["train", "--data", str(data), "--text-column", "review", "--label-column", "stars",
                          "--text-encoder", str(tmp_path), "--output", str(tmp_path / "run"), *QUICK],
                 "pip install 'sol_ext[text]'")


def test_bad_input_names_the_flag(tmp_path, capsys):
    encoder = make_encoder(tmp_path / "encoder")
    data = write_reviews(tmp_path / "reviews.csv", n=80)
    capsys.readouterr()  # what saving the encoder printed
    base = ["train", "--data", str(data), "--label-column", "stars", "--output", str(tmp_path / "run"), *QUICK]
    expect_error(capsys, [*base, "--text-column", "comment", "--text-encoder", str(encoder)],
                 "no text column 'comment'", "--text-column")
    expect_error(capsys, [*base, "--text-column", "review"], "--text-encoder")
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    expect_error(capsys, [*base, "--text-column", "review", "--text-encoder", str(not_a_model)],
                 "--text-encoder", "not a Hugging Face model folder", "config.json")
    expect_error(capsys, [*base, "--text-column", "review", "--text-encoder", str(tmp_path / "nowhere")],
                 "--text-encoder", "no such folder")
    expect_error(capsys, [*base, "--text-column", "review", "--text-encoder", str(encoder),
                          "--train-layers", "5"], "--train-layers", "2 transformer layers")
    expect_error(capsys, [*base, "--warmup", "0.2"], "--warmup", "text runs")
    rows = data.read_text().splitlines()
    rows[3] = "," + rows[3].split(",", 1)[1]  # data row 2 without its text
    holed = tmp_path / "holed.csv"
    holed.write_text("\n".join(rows) + "\n")
    expect_error(capsys, ["train", "--data", str(holed), "--label-column", "stars", "--text-column", "review",
                          "--text-encoder", str(encoder), "--output", str(tmp_path / "run2"), *QUICK],
                 "text column 'review' has 1 empty cell", "data row 2", "--text-column")


def test_learning_rates_warm_up_then_decay():
    """The schedule of a text run: from 0 up over the warm-up share of the steps, then down to 0."""
    from types import SimpleNamespace

    from sol_ext.driver.fit import Fit

    fit = Fit.__new__(Fit)
    param = torch.nn.Parameter(torch.zeros(1))
    fit.optimizer = torch.optim.AdamW([{"params": [param], "lr": 1e-4}])
    fit.base_lrs = [1e-4]
    fit.config = SimpleNamespace(warmup_share=0.1)
    seen = []
    for step in range(100):
        fit._schedule(step, 100)
        seen.append(fit.optimizer.param_groups[0]["lr"])
    assert seen[0] == 0.0 and seen[5] == pytest.approx(0.5e-4) and seen[10] == pytest.approx(1e-4)
    assert max(seen) == pytest.approx(1e-4) and seen[99] == pytest.approx(1e-4 / 90)
    assert all(b <= a for a, b in zip(seen[10:], seen[11:]))
