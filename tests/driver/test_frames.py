"""One door for data: table files (CSV, Parquet, Feather) read by pyarrow and data frames (pandas,
polars, pyarrow.Table) go through one adapter that takes the run's columns by name, in the training
order, with the run's categories; arrays must hold exactly the training features."""

import csv
import io
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import sol_ext.driver
from sol_ext.driver.cli import main
from sol_ext.driver.data import DATASETS_DIR, load_dataset, load_table, read_inputs
from sol_ext.driver.data.frames import TableOrigin, table_features
from sol_ext.driver.predict import prediction_csv

FAST = ["--epochs", "2", "--batch-size", "32", "--embedding-dim", "4", "--hidden", "16",
        "--quiet", "--no-plots", "--sigma", "1"]


def write_table(path, n, seed, labels=True):
    """Four features, a category and an integer score that depends on them; as a dict of columns."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).round(4)
    kind = np.array(["p", "q", "r"])[rng.integers(0, 3, n)]
    y = np.clip(np.round(3 * x[:, 0] + x[:, 1] + 10 + (kind == "q")), 2, 18).astype(int)
    columns = {"a": x[:, 0], "b": x[:, 1], "kind": kind, "c": x[:, 2], "d": x[:, 3]}
    if labels:
        columns["score"] = y
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(columns))
        for i in range(n):
            w.writerow([columns[k][i] for k in columns])
    return columns


@pytest.fixture(scope="module")
def abalone_run(tmp_path_factory):
    """A run on the built-in abalone table, whose Sex column is one-hot encoded, and its rows as columns."""
    out = tmp_path_factory.mktemp("abalone") / "run"
    assert main(["train", "--output", str(out), *FAST]) == 0
    table = pacsv.read_csv(DATASETS_DIR / "abalone.csv.gz")
    return out, {name: table.column(name).to_numpy() for name in table.column_names}


# --------------------------------------------------------------------------------------------------
# table files


@pytest.fixture(scope="module")
def numeric(tmp_path_factory):
    """A run on numeric columns a, b, c, d (score the label) and its CSV of new rows."""
    root = tmp_path_factory.mktemp("numeric")
    columns = write_table(root / "full.csv", 240, 0)
    del columns["kind"]
    with open(root / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(columns))
        for i in range(240):
            w.writerow([columns[k][i] for k in columns])
    out = root / "run"
    assert main(["train", "--data", str(root / "train.csv"), "--label-column", "score", "--output", str(out),
                 *FAST]) == 0
    return root, out, columns


def test_parquet_and_feather_load_as_the_csv_does(numeric, tmp_path):
    root, _, columns = numeric
    ref = load_table(root / "train.csv", "score")
    table = pa.table(columns)
    pq.write_table(table, tmp_path / "t.parquet")
    feather.write_feather(table, tmp_path / "t.feather")
    feather.write_feather(table, tmp_path / "t.arrow")
    for name in ("t.parquet", "t.feather", "t.arrow"):
        ds = load_dataset(tmp_path / name, label_column="score")
        assert ds.feature_names == ref.feature_names and ds.grid == ref.grid
        assert np.array_equal(ds.features.numpy(), ref.features.numpy()) and np.array_equal(ds.ranks, ref.ranks)
        assert ds.features.dtype == ref.features.dtype


def test_parquet_as_training_and_prediction_data(numeric, tmp_path):
    root, out, columns = numeric
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    model = sol_ext.driver.load_run(out)
    assert np.array_equal(model.predict(tmp_path / "t.parquet"), model.predict(root / "train.csv"))
    assert main(["train", "--data", str(tmp_path / "t.parquet"), "--label-column", "score", "--output",
                 str(tmp_path / "run"), *FAST]) == 0
    assert np.array_equal(sol_ext.driver.load_run(tmp_path / "run").predict(root / "train.csv"),
                          sol_ext.driver.load_run(tmp_path / "run").predict(tmp_path / "t.parquet"))


def test_damaged_parquet_and_delimiter_for_parquet_are_one_line(tmp_path):
    pq.write_table(pa.table({"a": [1.0, 2.0], "label": [1, 2]}), tmp_path / "t.parquet")
    data = (tmp_path / "t.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.parquet is not a readable Parquet file"):
        load_dataset(tmp_path / "cut.parquet")
    with pytest.raises(ValueError, match="delimiter=';' applies to CSV files only"):
        load_dataset(tmp_path / "t.parquet", delimiter=";")


def test_float32_overflow_in_a_file_is_named(tmp_path):
    (tmp_path / "t.csv").write_text("a,label\n1,1\n1e300,2\n3,3\n")
    with pytest.raises(ValueError, match=r"'a' has a value 1e\+300 in data row 1 that overflows float32"):
        load_table(tmp_path / "t.csv")
    (tmp_path / "i.csv").write_text("a,label\n1,1\n-inf,2\n3,3\n")
    with pytest.raises(ValueError, match="NaN or infinite value in data row 1"):
        load_table(tmp_path / "i.csv")


def test_predict_file_with_an_empty_label_column_has_no_labels(numeric, tmp_path, capsys):
    root, out, columns = numeric
    lines = (root / "train.csv").read_text().splitlines()[:6]
    (tmp_path / "new.csv").write_text("\n".join([lines[0]] + [ln.rsplit(",", 1)[0] + "," for ln in lines[1:]]))
    model = sol_ext.driver.load_run(out)
    table = model.predict_table(tmp_path / "new.csv")
    assert table.values is None and len(table.ids) == 5
    assert main(["predict", str(out), "--data", str(tmp_path / "new.csv"), "--output", "-"]) == 0
    captured = capsys.readouterr()
    assert "label" not in captured.out.splitlines()[0].split(",") and "MAE" not in captured.err


# --------------------------------------------------------------------------------------------------
# data frames


def frames(columns):
    """The same columns as a pyarrow.Table and RecordBatch, a pandas and a polars DataFrame (each when
    installed)."""
    out = [pa.table(columns), pa.record_batch(columns)]
    try:
        import pandas as pd
        out.append(pd.DataFrame(columns))
    except ImportError:
        pass
    try:
        import polars as pl
        out.append(pl.DataFrame(columns))
    except ImportError:
        pass
    return out


def test_frames_are_read_by_column_name(numeric):
    root, out, columns = numeric
    model = sol_ext.driver.load_run(out)
    ref = model.predict(root / "train.csv")
    shuffled = {k: columns[k] for k in ("d", "score", "b", "a", "c")}  # another order, the label among them
    extra = {**shuffled, "notes": np.array(["x"] * len(columns["a"]))}
    for frame in frames(shuffled) + frames(extra):
        assert np.array_equal(model.predict(frame), ref), type(frame)
        assert np.allclose(model.predict_proba(frame), model.predict_proba(root / "train.csv"))
    # an array in the training order is taken as it is; in another order it is not the same data
    x = np.column_stack([columns[k] for k in ("a", "b", "c", "d")])
    assert np.array_equal(model.predict(x), ref)


def test_a_frame_without_a_training_column_is_refused_by_name(numeric):
    _, out, columns = numeric
    model = sol_ext.driver.load_run(out)
    partial = {k: columns[k] for k in ("a", "b", "d")}
    for frame in frames(partial):
        with pytest.raises(ValueError, match="data has no feature column 'c'"):
            model.predict(frame)
    bad = {**partial, "c": np.where(np.arange(len(columns["a"])) == 3, np.nan, columns["c"])}
    strict = sol_ext.driver.load_run(out, missing="error")
    for frame in frames(bad):  # a missing value: no prediction for its row (NaN), or refused when asked
        predicted = model.predict(frame)
        assert np.isnan(predicted[3]) and np.isfinite(np.delete(predicted, 3)).all()
        with pytest.raises(ValueError, match="'c' has a missing value \\(NaN\\) in row 3"):
            strict.predict(frame)


def test_frames_get_the_runs_categories(abalone_run):
    out, columns = abalone_run
    pd = pytest.importorskip("pandas")
    model = sol_ext.driver.load_run(out)
    assert model.feature_names[:3] == ["Sex=F", "Sex=I", "Sex=M"]
    ref = model.predict("abalone")
    frame = pd.DataFrame({k: columns[k] for k in reversed(list(columns))})
    assert np.array_equal(model.predict(frame), ref)
    assert np.array_equal(model.predict(frame.astype({"Sex": "category"})), ref)
    for other in frames({k: columns[k] for k in reversed(list(columns))})[::2]:  # pyarrow, polars
        assert np.array_equal(model.predict(other), ref)
    unknown = frame.assign(Sex=np.where(np.arange(len(frame)) == 0, "Z", frame["Sex"]))
    with pytest.raises(ValueError, match=r"categorical column 'Sex' has values \['Z'\] outside its categories"):
        model.predict(unknown)


def test_a_builtin_name_goes_through_the_runs_columns(numeric, capsys):
    _, out, _ = numeric
    with pytest.raises(ValueError, match=r"wine-red \(winequality-red\.csv\.gz\) has no feature column 'a'"):
        sol_ext.driver.load_run(out).predict("wine-red")
    assert main(["predict", str(out), "--data", "wine-red", "--output", "-"]) == 2
    err = capsys.readouterr().err
    assert "no feature column 'a'" in err and "MAE" not in err


# --------------------------------------------------------------------------------------------------
# arrays: what is refused, and the dtype of predictions


@pytest.mark.parametrize("data,match", [
    (None, "got NoneType"),
    ({"a": [1.0]}, "got dict"),
    (3.5, "got float"),
    (np.array([[1, "x", 2, 3]], dtype=object), "got an array of object"),
    (np.array([["1", "2", "3", "4"]]), "got an array of <U1"),
    ([[1, 2, 3, 4], [1, 2]], "could not be read as one array"),
])
def test_predict_refuses_what_is_not_data(numeric, data, match):
    model = sol_ext.driver.load_run(numeric[1])
    with pytest.raises(ValueError, match=match) as info:
        model.predict(data)
    assert str(info.value).startswith("data") and len(str(info.value).splitlines()) == 1


def test_predict_takes_uint64_and_names_float32_overflow(numeric):
    model = sol_ext.driver.load_run(numeric[1])
    assert model.predict(np.ones((2, 4), dtype=np.uint64)).shape == (2,)
    with pytest.raises(ValueError, match=r"1e\+300 at index \[0, 2\] overflows float32"):
        model.predict(np.array([[0, 0, 1e300, 0]]))
    with pytest.raises(ValueError, match="NaN or infinite"):
        model.predict(np.array([[0, 0, np.inf, 0]]))


def test_predictions_on_a_whole_number_grid_are_int64(numeric, tmp_path):
    root, out, _ = numeric
    model = sol_ext.driver.load_run(out)
    table = model.predict_table(root / "train.csv")
    assert table.prediction.dtype == np.int64 and model.predict(root / "train.csv").dtype == np.int64
    assert table.expected.dtype == np.float64
    assert prediction_csv(table).decode().splitlines()[1].split(",")[1] == str(table.prediction[0])


# --------------------------------------------------------------------------------------------------
# the prediction CSV


@pytest.mark.parametrize("ids", [["0", "1", "2", "3"], ["0", "a,b", 'say "hi"', "é/3.png"]])
def test_prediction_csv_reads_back_to_the_model_s_numbers(ids):
    from sol_ext.driver.model import Prediction

    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(3), size=4).astype(np.float32).astype(np.float64)
    p[0, 0] = np.float32(1.234e-12)
    pred = Prediction(ids=ids, ranks=np.array([0, 1, 2, 1]),
                      prediction=np.array([0.5, 1.0, 1.5, 1.0]), expected=p @ [0.5, 1.0, 1.5],
                      probabilities=p, label_values=np.array([0.5, 1.0, 1.5]),
                      values=np.array([0.5, 1 / 3, 1.5, 1e-5]))
    rows = list(csv.reader(io.StringIO(prediction_csv(pred).decode("utf-8"))))
    assert rows[0] == ["id", "prediction", "expected", "label", "p_0.5", "p_1", "p_1.5"]
    assert [r[0] for r in rows[1:]] == ids  # quoted where a cell needs it, as the csv module reads it
    numbers = np.array([[float(c) for c in r[1:]] for r in rows[1:]])
    assert np.array_equal(numbers[:, 0], pred.prediction)
    assert np.array_equal(numbers[:, 2], pred.values)  # the data's labels: float64, exactly
    # expected to 10 significant digits; the probabilities as float32, exactly, in few digits
    assert np.abs(numbers[:, 1] - pred.expected).max() <= 5e-10 * np.abs(pred.expected).max()
    assert max(len(r[2]) for r in rows[1:]) <= 12
    assert np.array_equal(numbers[:, 3:].astype(np.float32), p.astype(np.float32))
    assert max(len(c) for r in rows[1:] for c in r[4:]) <= 15


def test_prediction_csv_writes_a_decimal_grid_and_large_labels_as_people_write_them():
    from sol_ext.driver.model import Prediction

    grid = 2.1 + np.arange(4) * 0.1  # 2.1, 2.2, 2.3000000000000003, 2.4000000000000004
    p = np.full((3, 4), 0.25)
    pred = Prediction(ids=["0", "1", "2"], ranks=np.array([0, 2, 3]), prediction=grid[[0, 2, 3]],
                      expected=np.array([2.123456789123, 2.35, 2.4]), probabilities=p, label_values=grid)
    rows = list(csv.reader(io.StringIO(prediction_csv(pred).decode("utf-8"))))
    assert [r[1] for r in rows[1:]] == ["2.1", "2.3", "2.4"]
    assert [r[2] for r in rows[1:]] == ["2.123456789", "2.35", "2.4"]
    years = 1998.0 + np.arange(4)
    pred = Prediction(ids=["0", "1", "2"], ranks=np.array([2, 1, 3]), prediction=years[[2, 1, 3]],
                      expected=np.array([2000.123456789123, 1999.5, 2001.0]), probabilities=p, label_values=years)
    rows = list(csv.reader(io.StringIO(prediction_csv(pred).decode("utf-8"))))
    assert [r[2] for r in rows[1:]] == ["2000.123457", "1999.5", "2001"]  # a year keeps its decimals


# --------------------------------------------------------------------------------------------------
# the adapter itself


def test_adapter_takes_columns_by_name_and_names_bad_cells():
    table = pa.table({"b": ["2", " 3.5 ", "inf"], "a": [1, 2, 3], "k": ["x", "y", "x"]})
    x, names, used = table_features(table.slice(0, 2), ["a", "b", "k"], {"k": []}, TableOrigin("t"))
    assert names == ["a", "b", "k=x", "k=y"] and used == {"k": ["x", "y"]}
    assert x.dtype == np.float32 and x.tolist() == [[1, 2, 1, 0], [2, 3.5, 0, 1]]
    with pytest.raises(ValueError, match="t: feature column 'b' has a NaN or infinite value in data row 2"):
        table_features(table, ["b"], {}, TableOrigin("t"))
    with pytest.raises(ValueError, match="feature column 'k' has a non-numeric value 'x' in row 0"):
        table_features(table, ["k"], {}, TableOrigin("data", file=False))


def test_a_cell_of_a_categorys_value_written_otherwise_is_that_category():
    """A cell that is no category but the number of exactly one (2.0 for 2, 0.50 for 0.5, the float
    2.0 of a Parquet column) is that category; a number two categories share (1 and 1.0 both
    trained) and one that equals a category only as a float (a 20-digit code) stay unknown."""
    from sol_ext.driver.data.frames import UnknownCategoryError

    origin = TableOrigin("t")
    table = pa.table({"k": ["2.0", "0.50", "1", "2"], "f": [2.0, 0.5, 1.0, 2.0]})
    for column in ("k", "f"):
        x, names, _ = table_features(table, [column], {column: ["0.5", "1", "2"]}, origin)
        assert x.argmax(axis=1).tolist() == [2, 0, 1, 2] and names[0] == f"{column}=0.5"
    for categories, cell in ((["1", "1.0", "2"], "1.00"), (["12345678901234567890"], "12345678901234567891")):
        with pytest.raises(UnknownCategoryError, match=f"values \\['{cell}'\\] outside its categories"):
            table_features(pa.table({"k": [cell]}), ["k"], {"k": categories}, origin)


def test_read_inputs_of_a_feather_file(numeric, tmp_path):
    root, _, columns = numeric
    feather.write_feather(pa.table({k: columns[k] for k in ("d", "c", "b", "a")}), tmp_path / "n.feather")
    schema = {"format": "csv", "columns": ["a", "b", "c", "d"], "categorical": {}, "label_column": "score"}
    got = read_inputs(tmp_path / "n.feather", schema)
    ref = read_inputs(root / "train.csv", schema)
    assert got.values is None and np.array_equal(got.features.numpy(), ref.features.numpy())


# --------------------------------------------------------------------------------------------------
# SOLRanker


def test_solranker_fits_and_predicts_frames_by_column_name():
    pytest.importorskip("sklearn")
    pd = pytest.importorskip("pandas")
    from sol_ext.driver.sklearn import SOLRanker

    rng = np.random.default_rng(0)
    n = 120
    columns = {"a": rng.normal(size=n), "g": np.array(["lo", "hi"])[rng.integers(0, 2, n)], "b": rng.normal(size=n)}
    y = np.clip(np.round(2 * columns["a"] + (columns["g"] == "hi") + 3), 0, 6).astype(np.int64)
    ranker = SOLRanker(epochs=2, hidden=(8,), sigma=1.0, val_fraction=0).fit(pd.DataFrame(columns), y)
    assert list(ranker.feature_names_in_) == ["a", "g", "b"] and ranker.n_features_in_ == 3
    assert ranker.model_.feature_names == ["a", "g=hi", "g=lo", "b"]
    ref = ranker.predict(pd.DataFrame(columns))
    assert ref.dtype == np.int64
    other_order = {k: columns[k] for k in ("b", "g", "a")}
    for frame in frames(other_order) + frames({**other_order, "extra": np.zeros(n)}):
        assert np.array_equal(ranker.predict(frame), ref), type(frame)
        assert np.allclose(ranker.predict_proba(frame), ranker.predict_proba(pd.DataFrame(columns)))
        assert ranker.score(frame, y) == ranker.score(pd.DataFrame(columns), y)
    with pytest.raises(ValueError, match="data has no feature column 'g'"):
        ranker.predict(pd.DataFrame({"a": columns["a"], "b": columns["b"]}))
    with pytest.raises(ValueError, match=r"categorical columns \['g'\]; pass a data frame"):
        ranker.predict(np.zeros((2, 3)))


@pytest.mark.filterwarnings("ignore:X has feature names")  # scikit-learn's note on pandas, as for any estimator
def test_solranker_fitted_on_arrays_takes_polars_and_arrow_by_position():
    pytest.importorskip("sklearn")
    from sol_ext.driver.sklearn import SOLRanker

    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 2))
    y = np.clip(np.round(2 * x[:, 0] + 3), 0, 6).astype(np.int64)
    ranker = SOLRanker(epochs=2, hidden=(8,), sigma=1.0, val_fraction=0).fit(x, y)
    ref = ranker.predict(x)
    for frame in frames({"u": x[:, 0], "v": x[:, 1]}):
        assert np.array_equal(ranker.predict(frame), ref), type(frame)


def test_tsv_files_and_rows_of_empty_cells(tmp_path):
    (tmp_path / "t.tsv").write_text("a\tb\tlabel\n1\t2\t1\n\t\t\n3\t4\t2\n")  # a row of empty cells is no row
    ds = load_dataset(tmp_path / "t.tsv")
    assert ds.feature_names == ("a", "b") and ds.features.tolist() == [[1, 2], [3, 4]]


def test_arrow_columns_reach_numpy_exactly_without_importing_pandas():
    from sol_ext.driver.data.frames import _to_numpy, string_array

    texts = ["", "a,b", "é", 'q"', "x" * 300]
    assert string_array(texts).to_pylist() == texts and string_array([]).to_pylist() == []
    chunked = pa.chunked_array([pa.array([1.5, 2.5, 3.5], pa.float32()).slice(1),
                                pa.array([], pa.float32()), pa.array([4.5], pa.float32())])
    assert _to_numpy(chunked).tolist() == [2.5, 3.5, 4.5] and _to_numpy(chunked).dtype == np.float32
    assert _to_numpy(pa.array([7, 8], pa.int16()).slice(1)).tolist() == [8]
    assert _to_numpy(pa.array([1.0, None])).tolist()[0] == 1.0  # nulls: pyarrow's own conversion
    pytest.importorskip("pandas")  # installed, so that its absence from sys.modules means something
    code = ("import sys\n"
            "from sol_ext.driver.data.tables import TableRead, read_table_features\n"
            f"x, *_ = read_table_features({str(DATASETS_DIR / 'winequality-red.csv.gz')!r}, "
            "TableRead(['fixed acidity', 'alcohol'], {}, 'quality', label_optional=True))\n"
            "assert x.shape == (1599, 2), x.shape\n"
            "print('pandas' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"  # importing pandas is a fifth of a 200,000-row predict


def test_an_id_column_one_hot_encoded_is_named_and_its_errors_stay_short():
    """A unique text id among the features: a warning when it is one-hot encoded, and a prediction
    on new ids refused in a message that lists a few of them, not every category."""
    pytest.importorskip("sklearn")
    from sol_ext.driver.data.frames import ManyCategoriesWarning
    from sol_ext.driver.sklearn import SOLRanker

    rng = np.random.default_rng(0)
    n = 300
    x = rng.normal(size=n)
    table = pa.table({"wine_id": [f"w{i:04d}" for i in range(n)], "x": x,
                      "quality": np.clip(np.round(2 * x + 5), 3, 8).astype(int)})
    ranker = SOLRanker(epochs=1, sigma=1.0, hidden=(8,), embedding_dim=4)
    with pytest.warns(ManyCategoriesWarning, match="'wine_id' has 300 distinct values in 300 rows"):
        ranker.fit(table.drop_columns(["quality"]), table["quality"].to_numpy())
    new = pa.table({"wine_id": [f"n{i:04d}" for i in range(n)], "x": x})
    with pytest.raises(ValueError, match="'wine_id' has values .* \\(300 in all\\) outside") as caught:
        ranker.predict(new)
    assert len(str(caught.value)) < 500
