"""A user's own table on the command line, start to finish: what the template of settings adds to
it, which device a run uses, how the data layer's warnings show, the label scale, text columns,
ids and missing cells."""

from __future__ import annotations

import pytest
import torch

import sol_ext
from common import tiny_csv, write_csv
from sol_ext.driver.cli import build_parser, main
from sol_ext.driver.options import train_config

FAST = ["--epochs", "1", "--sigma", "1", "--batch-size", "16", "--embedding-dim", "4",
        "--hidden", "16"]


def resolved(argv: list[str]):
    """The TrainConfig that ``sol-ext train ARGV`` runs with."""
    args = build_parser().parse_args(["train", *argv])
    return train_config(args)


# -- silently wrong before --------------------------------------------------------------------------

def test_print_config_template_adds_no_noise_to_a_file_of_ones_own(tmp_path, capsys):
    """The natural edit of the template (only data and label column) trains on the labels as
    given: the template says noise "auto", gaussian on the built-in data only."""
    assert main(["train", "--print-config"]) == 0
    template = capsys.readouterr().out
    assert 'noise = "auto"' in template and "gaussian" not in template
    data = tiny_csv(tmp_path / "mine.csv")
    edited = template.replace('data = "abalone"', f'data = "{data}"')
    assert edited != template
    path = tmp_path / "run.toml"
    path.write_text(edited + 'label_column = "label"\n', encoding="utf-8")
    assert resolved(["--config", str(path)]).noise == "none"
    template_file = tmp_path / "template.toml"
    template_file.write_text(template, encoding="utf-8")
    assert resolved(["--config", str(template_file)]).noise == "gaussian"  # the built-in data: as before
    # a noise typed stays what it is
    assert main(["train", "--noise", "laplacian", "--print-config"]) == 0
    assert 'noise = "laplacian"' in capsys.readouterr().out


def test_device_defaults_to_auto_and_the_first_line_says_which(tmp_path, capsys):
    assert resolved([]).device == "auto"
    data = tiny_csv(tmp_path / "d.csv")
    assert main(["train", "--data", str(data), "--output", str(tmp_path / "run"), *FAST]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    # on the CPU it also names the kernels that run (sol-ext --version answers without loading them)
    expected = "cuda" if torch.cuda.is_available() else f"cpu ({sol_ext.cpu_capability()} kernels)"
    assert f"sol on {expected}," in first, first


def test_label_scale_warning_is_one_command_line_warning(tmp_path, capsys):
    """A typo label that stretches the scale is named on one line with the flags that set it."""
    rows = [(i % 7 * 0.5, i % 3, 3 + i % 7) for i in range(140)] + [(1.0, 1.0, 60)]
    data = write_csv(tmp_path / "typo.csv", rows)
    assert main(["train", "--data", str(data), "--output", str(tmp_path / "run"), "--quiet",
                 *FAST]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "label 60" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("sol-ext: warning: label 60 (1 of 141 labels)")
    assert "--label-min and --label-max" in lines[0]
    assert "LabelScaleWarning" not in err and "warnings.warn" not in err


# -- the label scale ----------------------------------------------------------------------------------

def _grades(path, column="label", n=140):
    """A table of grades 3 … 9 under ``column``."""
    return write_csv(path, [(i % 7 * 0.5, i % 3, 3 + i % 7) for i in range(n)], header=("a", "b", column))


def test_label_scale_flags_set_the_grid_and_a_test_file_names_its_labels_otherwise(tmp_path, capsys):
    import json

    data, test = _grades(tmp_path / "train.csv"), _grades(tmp_path / "test.csv", "grade", n=30)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--test-data", str(test), "--test-label-column", "grade",
                 "--label-min", "1", "--label-max", "10", "--label-step", "0.5", "--output", str(out),
                 "--quiet", *FAST]) == 0
    grid = json.loads((out / "results.json").read_text())["data"]
    assert (grid["min_value"], grid["step"], grid["num_ranks"]) == (1.0, 0.5, 19)
    assert grid["n_test"] == 30
    capsys.readouterr()
    # without the flag the test file's labels are looked for under --label-column
    assert main(["train", "--data", str(data), "--test-data", str(test), "--output",
                 str(tmp_path / "other"), "--quiet", *FAST]) == 2
    assert "label" in capsys.readouterr().err


def test_label_scale_and_test_fraction_errors_name_the_flags(tmp_path, capsys):
    from common import expect_error

    data = _grades(tmp_path / "d.csv")
    expect_error(capsys, ["train", "--data", str(data), "--test-fraction", "1", "--print-config"],
                 "--test-fraction 1", "below 1")
    expect_error(capsys, ["train", "--label-step", "2", "--print-config"], "--label-step", "built-in")
    expect_error(capsys, ["train", "--data", str(data), "--label-min", "9", "--label-max", "3",
                          "--print-config"], "--label-min 9", "--label-max 3")
    expect_error(capsys, ["train", "--data", str(data), "--test-label-column", "grade", "--print-config"],
                 "--test-label-column", "--test-data")


def test_test_fraction_0_trains_on_every_row_and_reports_no_test_figures(tmp_path, capsys):
    import json

    data = _grades(tmp_path / "d.csv")
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--test-fraction", "0", "--output", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    assert "140 training / 0 test samples" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["test"] is None and results["test_per_rank_mae"] == {} and results["calibration"]["test"] is None
    assert results["plots"] == ["learning_curves.png", "reliability.png"]  # no test set to plot
    assert not (out / "cs_curve.png").exists() and not (out / "embeddings_pca.png").exists()
    assert main(["audit", str(out)]) == 0 and main(["predict", str(out), "--data", str(data)]) == 0


# -- text columns and ids ------------------------------------------------------------------------------

def _wine_rows(n=160, seed=0, missing=False):
    """Rows of a wine-quality-like table: a text id, two text columns (one region "Dão"), numbers, a
    whole-number column (a cell empty every 37 rows when ``missing``) and quality 3 … 9."""
    import random

    rng = random.Random(seed)
    regions = ["Dão", "Douro", "Alentejo", "Minho"]
    rows = []
    for i in range(n):
        quality = 3 + (i * 7919 + seed) % 7
        vintage = "" if missing and i % 37 == 5 else str(1990 + i % 20)
        rows.append({"wine_id": f"W{seed}-{i:04d}", "color": ("red", "white")[i % 2],
                     "region": regions[(quality + i) % 4], "acidity": round(quality * 0.5 + rng.gauss(0, 0.3), 3),
                     "sugar": round(rng.random() * 5, 2), "vintage": vintage,
                     "alcohol": round(9 + quality * 0.3 + rng.gauss(0, 0.2), 2), "quality": quality})
    return rows


def _write_rows(path, rows, columns=None):
    import csv

    columns = columns or list(rows[0])
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def wine_run(tmp_path_factory):
    """The wine table and a run trained on it with one command, its id column named."""
    folder = tmp_path_factory.mktemp("wine")
    data = _write_rows(folder / "wine.csv", _wine_rows())
    out = folder / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id",
                 "--output", str(out), "--quiet", *FAST]) == 0
    return data, out


def test_text_columns_are_one_hot_and_ids_carried_into_predictions_and_audit(wine_run, capsys):
    import csv

    from sol_ext.driver.model import load_run

    data, out = wine_run
    model = load_run(out)
    names = model.feature_names
    assert "region=Dão" in names and "color=white" in names and "alcohol" in names
    assert not any(n.startswith("wine_id") for n in names)  # the id is no feature
    assert main(["predict", str(out), "--data", str(data)]) == 0
    rows = list(csv.DictReader(open(out / "predictions.csv", encoding="utf-8")))
    assert list(rows[0])[:3] == ["wine_id", "prediction", "expected"]
    assert [r["wine_id"] for r in rows] == [f"W0-{i:04d}" for i in range(160)]
    assert main(["audit", str(out), "--in-sample"]) == 0
    audit = list(csv.DictReader(open(out / "audit.csv", encoding="utf-8")))
    assert list(audit[0])[:2] == ["index", "wine_id"]
    assert all(r["wine_id"] == f"W0-{int(r['index']):04d}" for r in audit)


def test_feature_drop_and_categorical_columns(tmp_path, capsys):
    from common import expect_error
    from sol_ext.driver.model import load_run

    data = _write_rows(tmp_path / "wine.csv", _wine_rows())
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--drop-columns",
                 "wine_id,region", "--categorical", "vintage", "--output", str(out), "--quiet", *FAST]) == 0
    names = load_run(out).feature_names
    assert "vintage=1990" in names and not any(n.startswith(("region", "wine_id")) for n in names)
    out2 = tmp_path / "run2"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--feature-columns",
                 "acidity,alcohol", "--output", str(out2), "--quiet", *FAST]) == 0
    assert load_run(out2).feature_names == ["acidity", "alcohol"]
    expect_error(capsys, ["train", "--data", str(data), "--label-column", "quality", "--drop-columns",
                          "grape", "--output", str(tmp_path / "o"), *FAST], "--drop-columns", "'grape'")
    expect_error(capsys, ["train", "--id-column", "x", "--print-config"], "--id-column", "built-in")


def test_a_data_frame_index_or_id_column_names_the_predictions(wine_run):
    import pandas as pd

    from sol_ext.driver.model import load_run

    data, out = wine_run
    model = load_run(out)
    frame = pd.read_csv(data)
    assert model.predict_table(frame).ids[:2] == ["W0-0000", "W0-0001"]
    assert model.predict_table(frame).id_name == "wine_id"
    by_index = frame.drop(columns="wine_id").set_index(frame["wine_id"].str.lower())
    assert model.predict_table(by_index).ids[:2] == ["w0-0000", "w0-0001"]


# -- missing values ------------------------------------------------------------------------------------

def test_missing_cells_skipped_imputed_or_counted_in_training(tmp_path, capsys):
    import json

    from common import expect_error

    data = _write_rows(tmp_path / "wine.csv", _wine_rows(missing=True))  # 5 empty vintage cells
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id",
                 "--output", str(out), "--quiet", *FAST]) == 0
    err = capsys.readouterr().err
    assert "sol-ext: warning: " in err and "5 of 160 rows have a missing feature value" in err
    assert "--missing skip" in err
    fitted = json.loads((out / "results.json").read_text())["data"]
    assert fitted["n_train"] + fitted["n_val"] + fitted["n_test"] == 155
    assert main(["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id",
                 "--missing", "impute", "--output", str(tmp_path / "imputed"), "--quiet", *FAST]) == 0
    assert "filled with their column's median" in capsys.readouterr().err
    fitted = json.loads((tmp_path / "imputed" / "results.json").read_text())["data"]
    assert fitted["n_train"] + fitted["n_val"] + fitted["n_test"] == 160
    expect_error(capsys, ["train", "--data", str(data), "--label-column", "quality", "--missing", "error",
                          "--output", str(tmp_path / "o"), *FAST],
                 "feature column 'vintage' has 5 missing values (NaN), the first in data row 5",
                 "(5 cells in 5 of 160 rows)", "--missing skip")


def test_a_missing_label_after_a_skipped_row_is_named_by_its_own_data_row(tmp_path, capsys):
    """--missing skip leaves data row 2 out; the missing label in data row 10 is still named data
    row 10, not by its place among the rows kept."""
    from common import expect_error

    rows = [(i % 5, i % 3, i % 4) for i in range(40)]
    rows[2] = ("", 1, 2)
    rows[10] = (1, 1, "")
    data = write_csv(tmp_path / "d.csv", rows)
    expect_error(capsys, ["train", "--data", str(data), "--missing", "skip", "--output", str(tmp_path / "o"),
                          *FAST], "label column 'label'", "data row 10", absent=("data row 9",))


def test_predict_leaves_rows_with_missing_cells_empty_or_out(tmp_path, capsys):
    import csv

    data = _write_rows(tmp_path / "wine.csv", _wine_rows())
    new = _write_rows(tmp_path / "new.csv", _wine_rows(seed=1, missing=True))
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id",
                 "--output", str(out), "--quiet", *FAST]) == 0
    capsys.readouterr()
    assert main(["predict", str(out), "--data", str(new)]) == 0
    assert "5 of 160 rows have a missing feature value" in capsys.readouterr().err
    rows = list(csv.DictReader(open(out / "predictions.csv", encoding="utf-8")))
    assert len(rows) == 160
    empty = [r["wine_id"] for r in rows if r["prediction"] == ""]
    assert empty == [f"W1-{i:04d}" for i in range(160) if i % 37 == 5]
    assert all(r["expected"] == "" and r["p_5"] == "" for r in rows if r["prediction"] == "")
    assert main(["predict", str(out), "--data", str(new), "--missing", "skip", "--output",
                 str(tmp_path / "kept.csv")]) == 0
    kept = list(csv.DictReader(open(tmp_path / "kept.csv", encoding="utf-8")))
    assert [r["wine_id"] for r in kept] == [r["wine_id"] for r in rows if r["prediction"] != ""]
    assert [r["prediction"] for r in kept] == [r["prediction"] for r in rows if r["prediction"] != ""]


def test_python_predictions_leave_rows_with_a_missing_value_without_one_as_predict_does(wine_run, tmp_path):
    """load_run(run).predict(file) and predict_interval give NaN for the rows sol-ext predict leaves
    empty (a missing feature value), not a prediction from a filled-in value; a data frame with the
    same empty cells gives the same."""
    import numpy as np
    import pandas as pd

    from sol_ext.driver.model import load_run

    _, out = wine_run
    new = _write_rows(tmp_path / "new.csv", _wine_rows(seed=1, missing=True))
    model = load_run(out)
    table = model.predict_table(new)
    rows = np.flatnonzero(table.incomplete)
    assert rows.tolist() == [i for i in range(160) if i % 37 == 5]
    predicted = model.predict(new)
    assert np.isnan(predicted[rows]).all() and np.isfinite(np.delete(predicted, rows)).all()
    lower, upper = model.predict_interval(new, 0.9)
    assert (np.isnan(lower) == table.incomplete).all() and (np.isnan(upper) == table.incomplete).all()
    assert np.isnan(model.expected(new)[rows]).all() and np.isnan(model.predict_proba(new)[rows]).all()
    frame = pd.read_csv(new)
    np.testing.assert_array_equal(model.predict(frame), predicted)
    complete = _write_rows(tmp_path / "complete.csv", _wine_rows(seed=1))
    assert model.predict(complete).dtype == np.int64  # whole labels stay integers where every row has one


def test_a_run_trained_with_impute_fills_missing_cells_as_training_did_everywhere(tmp_path, capsys):
    """--missing impute travels with the run: sol-ext predict, load_run on a file, a data frame and a
    raw array with NaN, and the exported program fill a missing cell with the training file's median
    and predict the row, all alike."""
    import csv

    import numpy as np
    import pandas as pd

    from sol_ext.driver.model import load_run

    data = _write_rows(tmp_path / "wine.csv", _wine_rows(missing=True))
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id",
                 "--missing", "impute", "--output", str(out), "--quiet", *FAST]) == 0
    new_rows = _wine_rows(seed=1, missing=True)
    new = _write_rows(tmp_path / "new.csv", new_rows)
    capsys.readouterr()
    assert main(["predict", str(out), "--data", str(new)]) == 0
    assert "missing feature value" not in capsys.readouterr().err
    written = list(csv.DictReader(open(out / "predictions.csv", encoding="utf-8")))
    assert all(r["prediction"] != "" for r in written)
    model = load_run(out)
    median = float(np.median([1990 + i % 20 for i in range(160) if i % 37 != 5]))
    assert model.preprocessing["schema"]["fill_values"]["vintage"] == median
    from_file = model.predict(new)
    assert from_file.dtype == np.int64
    assert [int(r["prediction"]) for r in written] == from_file.tolist()
    np.testing.assert_array_equal(model.predict(pd.read_csv(new)), from_file)
    filled = _write_rows(tmp_path / "filled.csv", [{**r, "vintage": r["vintage"] or median} for r in new_rows])
    np.testing.assert_array_equal(model.predict(filled), from_file)
    x = model.features(filled)[0]  # scaled; the raw array: undo the scaling, then empty the cells again
    mean, std = model.scaling
    raw = (x.double() * std + mean).numpy()
    column = model.feature_names.index("vintage")
    raw[[i for i in range(160) if i % 37 == 5], column] = np.nan
    np.testing.assert_array_equal(model.predict(raw), from_file)
    assert main(["export", str(out)]) == 0
    program = torch.export.load(str(out / "model.pt2")).module()
    np.testing.assert_array_equal(program(torch.from_numpy(raw))[0].numpy(), from_file)
    assert main(["predict", str(out), "--data", str(new), "--missing", "empty", "--output", "-"]) == 0
    assert ",," in capsys.readouterr().out  # asked for: the rows are left empty


def test_predicts_advice_names_what_the_predict_command_can_do(wine_run, tmp_path, capsys):
    """An unseen category points at predict's own --handle-unknown (which then predicts), a word in
    a numeric column says to fix the cell and names train's options as training's, and a file
    without the run's id column is told about the id column."""
    import csv

    from common import expect_error

    _, out = wine_run
    rows = _wine_rows(n=30, seed=3)
    rows[4]["region"] = "Algarve"
    novel = _write_rows(tmp_path / "novel.csv", rows)
    expect_error(capsys, ["predict", str(out), "--data", str(novel), "--output", "-"], "'Algarve'",
                 "--handle-unknown 'ignore'", absent=("handle_unknown",))
    assert main(["predict", str(out), "--data", str(novel), "--handle-unknown", "ignore", "--output",
                 str(tmp_path / "p.csv")]) == 0
    assert len(list(csv.DictReader(open(tmp_path / "p.csv", encoding="utf-8")))) == 30
    rows = _wine_rows(n=30, seed=3)
    rows[7]["acidity"] = "high"
    word = _write_rows(tmp_path / "word.csv", rows)
    line = expect_error(capsys, ["predict", str(out), "--data", str(word), "--output", "-"], "'high'",
                        "data row 7", "fix the cell", "train again with it in --categorical")
    assert line.index("fix the cell") < line.index("--categorical")
    no_id = _write_rows(tmp_path / "noid.csv", _wine_rows(n=30, seed=3),
                        columns=[c for c in _wine_rows(n=1)[0] if c != "wine_id"])
    expect_error(capsys, ["predict", str(out), "--data", str(no_id), "--output", "-"], "no id column 'wine_id'",
                 "names each row by it", absent=("feature column", "--feature-columns"))


@pytest.mark.parametrize("flags,values", [(["--label-step", "2"], "1, 3, 5, 7, 9"),
                                          (["--label-min", "-0.5", "--label-step", "1"], "0, 1, 2, 3, 4, …")])
def test_labels_off_a_given_grid_are_refused_not_rounded(tmp_path, capsys, flags, values):
    """--label-step 2 on grades 0 … 9, or --label-min -0.5 on whole grades: the labels off the grid
    are named with what to do, where they used to be rounded onto a neighbouring rank."""
    from common import expect_error

    data = write_csv(tmp_path / "d.csv", [(i % 7, i % 3, i % 10) for i in range(100)])
    line = expect_error(capsys, ["train", "--data", str(data), *flags, "--output", str(tmp_path / "o"), *FAST],
                        "label column 'label'", f"label values {values}", "not on the label grid",
                        "--label-step", "--label-min")
    assert "data row 1" in line or "data row 0" in line
    assert not (tmp_path / "o").exists()


def test_test_labels_off_the_training_grid_are_refused(tmp_path, capsys):
    """--test-data whose labels fall between the training grid's values (odd grades on even ones)."""
    from common import expect_error

    data = write_csv(tmp_path / "d.csv", [(i % 7, i % 3, 2 * (i % 5)) for i in range(100)])
    test = write_csv(tmp_path / "t.csv", [(i % 7, i % 3, i % 9) for i in range(40)])
    expect_error(capsys, ["train", "--data", str(data), "--test-data", str(test), "--output", str(tmp_path / "o"),
                          *FAST], str(test), "label values 1, 3, 5, 7", "not on the label grid")


def test_the_free_text_warning_names_the_option_that_leaves_the_column_out(tmp_path, capsys):
    rows = [(f"note {i} about it", i % 5, i % 4) for i in range(120)]
    data = write_csv(tmp_path / "d.csv", rows, header=("comment", "b", "label"))
    assert main(["train", "--data", str(data), "--output", str(tmp_path / "o"), "--quiet", *FAST]) == 0
    err = capsys.readouterr().err
    assert "text column 'comment'" in err and "leave it out of the features (--drop-columns)" in err


@pytest.mark.parametrize("missing", ["skip", "impute"])
def test_a_column_without_any_value_is_named(tmp_path, capsys, missing):
    from common import expect_error

    data = write_csv(tmp_path / "d.csv", [(i % 5, "", i % 4) for i in range(60)], header=("a", "c", "label"))
    expect_error(capsys, ["train", "--data", str(data), "--missing", missing, "--output", str(tmp_path / "o"),
                          *FAST], "feature column 'c' has no value in any row", "--drop-columns")


def test_an_id_column_that_is_the_label_and_a_repeated_feature_column_are_refused(tmp_path, capsys):
    from common import expect_error

    data = tiny_csv(tmp_path / "d.csv")
    expect_error(capsys, ["train", "--data", str(data), "--id-column", "label", "--output", str(tmp_path / "o"),
                          *FAST], "id column 'label' cannot also be the label column")
    expect_error(capsys, ["train", "--data", str(data), "--feature-columns", "a,a,b", "--output",
                          str(tmp_path / "o"), *FAST], "--feature-columns names ['a'] more than once")


@pytest.mark.parametrize("flag", ["--feature-columns", "--drop-columns", "--categorical"])
@pytest.mark.parametrize("columns, entry", [("a,,b", "entry 2 of 3"), ("a,b,", "entry 3 of 3"), (",a", "entry 1 of 2")])
def test_an_empty_entry_of_a_column_list_is_refused_naming_the_option(tmp_path, capsys, flag, columns, entry):
    """--feature-columns a,,b (and the other column lists): a typo or a lost name, refused naming the
    option, the list and the empty entry, before anything is written (it used to be skipped)."""
    from common import expect_error

    data = tiny_csv(tmp_path / "d.csv")
    expect_error(capsys, ["train", "--data", str(data), flag, columns, "--output", str(tmp_path / "o"), *FAST],
                 f"{flag} {columns!r} has an empty entry ({entry})", "name one column between each pair of commas")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, flag", [
    (["train", "--hidden", "16,,16"], "--hidden"),
    (["compare", "--seeds", "0,,1"], "--seeds"),
    (["compare", "--kappas", "0.2,"], "--kappas"),
    (["compare", "--methods", "sol,,l1"], "--methods"),
    (["compare", "--noises", "laplacian,,uniform"], "--noises"),
])
def test_an_empty_entry_of_a_list_option_is_refused_naming_it(capsys, argv, flag):
    """The number and name lists of train and compare refuse an empty entry as the column lists do;
    an empty list ('--noises ""': none) stays one."""
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args([*argv, "--data", "tiny"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: " in err and "has an empty entry (entry " in err, err
    assert build_parser().parse_args(["compare", "--noises", "", "--data", "tiny"]).noises == []


def test_a_column_of_two_rows_a_value_is_named_and_one_of_four_is_not(tmp_path, capsys):
    """150 distinct values in 300 rows (each twice) one-hot encoded: warned, naming the column and
    --drop-columns; 75 values (four rows each) train without the warning."""
    for values, warned in ((150, True), (75, False)):
        rows = [(f"v{i % values}", i % 5, i % 4) for i in range(300)]
        data = write_csv(tmp_path / f"d{values}.csv", rows, header=("city", "b", "label"))
        assert main(["train", "--data", str(data), "--output", str(tmp_path / f"o{values}"), "--quiet", *FAST]) == 0
        err = capsys.readouterr().err
        assert (f"text column 'city' has {values} distinct values in 300 rows" in err) == warned, err
        assert ("leave it out of the features (--drop-columns)" in err) == warned, err


def test_numbers_with_thousands_separators_or_percent_signs_are_named_when_one_hot(tmp_path, capsys):
    rows = [(f"{1000 + 37 * i:,}", f"{i % 60}%", i % 4) for i in range(80)]
    data = write_csv(tmp_path / "d.csv", rows, header=("income", "share", "label"))
    assert main(["train", "--data", str(data), "--output", str(tmp_path / "o"), "--quiet", *FAST]) == 0
    err = capsys.readouterr().err
    assert "text column 'income' holds numbers written with thousands separators" in err
    assert "text column 'share' holds numbers written as percentages" in err and "--drop-columns" in err


# -- done when: a wine-quality-like table, start to finish -----------------------------------------------

@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_predict_in_slices_writes_what_one_slice_writes(kind, wine_run, tmp_path, capsys, monkeypatch):
    """sol-ext predict reads a table file once and predicts and writes it a slice at a time: in slices of
    7 rows it writes the bytes, the summary lines and the warnings it writes in one slice, with an id
    that needs quotes in one slice only, rows with a missing cell, --interval and --missing skip, to a
    file and to stdout; a bad cell in a later slice is named by its row in the file, and leaves the
    output file as it was."""
    from sol_ext.driver.data import inputs
    from sol_ext.driver.model import load_run

    _, out = wine_run
    rows = _wine_rows(n=60, seed=2, missing=True)
    rows[45]["wine_id"] = 'W2-"0045", late'  # quotes needed, in the seventh slice of 7 rows only
    new = _write_rows(tmp_path / "new.csv", rows)
    if kind == "parquet":
        new = _parquet(new, tmp_path / "new.parquet")
    assert [len(p.ids) for p in load_run(out).predict_slices(new, 7)] == [7] * 8 + [4]
    target = tmp_path / "p.csv"
    capsys.readouterr()
    for extra in ([], ["--interval", "0.8"], ["--missing", "skip"], ["--output", "-"]):
        written = []
        for rows_per_slice in (7, 10**6):
            monkeypatch.setattr(inputs, "SLICE_ROWS", rows_per_slice)
            argv = ["predict", str(out), "--data", str(new), "--output", str(target), "--overwrite", *extra]
            assert main(argv) == 0
            written.append((target.read_bytes() if "-" not in extra else b"", capsys.readouterr()))
        assert written[0] == written[1], extra
        assert b'"W2-""0045"", late"' in written[0][0] or '"W2-""0045"", late"' in written[0][1].out
    if kind == "csv":
        rows[50]["acidity"] = "abc"
        _write_rows(new, rows)
        before = target.read_bytes()
        errors = []
        for rows_per_slice in (7, 10**6):
            monkeypatch.setattr(inputs, "SLICE_ROWS", rows_per_slice)
            assert main(["predict", str(out), "--data", str(new), "--output", str(target), "--overwrite"]) == 2
            errors.append(capsys.readouterr().err)
            assert target.read_bytes() == before  # the file is replaced whole or not at all
        assert errors[0] == errors[1] and "'acidity'" in errors[0] and "data row 50" in errors[0], errors


def test_cli_predictions_on_a_table_equal_solrankers_row_for_row(tmp_path, capsys):
    """`sol-ext train --test-fraction 0` trains on every row of a table, as SOLRanker.fit does on it as a
    data frame: with the same settings the two are the same model, and `sol-ext predict`'s CSV holds
    SOLRanker's predictions and probabilities, row for row under the same ids (the data row numbers
    from 0, the frame's index)."""
    import csv
    import json

    import numpy as np
    import pandas as pd

    from sol_ext.driver.sklearn import SOLRanker

    rng = np.random.default_rng(5)
    n = 150
    frame = pd.DataFrame({"acidity": rng.integers(0, 256, n) / 64, "sugar": rng.integers(0, 256, n) / 32,
                          "color": rng.choice(["red", "white", "rosé"], n)})  # exact in float32
    frame["quality"] = np.clip(np.round(frame["acidity"] + frame["sugar"] / 2 + (frame["color"] == "red")), 1, 7)
    frame["quality"] = frame["quality"].astype(int)
    data = tmp_path / "wines.csv"
    frame.to_csv(data, index=False)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--test-fraction", "0",
                 "--output", str(out), "--quiet", "--no-plots", *FAST]) == 0
    assert main(["predict", str(out), "--data", str(data)]) == 0
    capsys.readouterr()
    rows = list(csv.DictReader(open(out / "predictions.csv", encoding="utf-8")))
    ranker = SOLRanker(epochs=1, sigma=1.0, batch_size=16, embedding_dim=4, hidden=(16,))
    ranker.fit(frame.drop(columns=["quality"]), frame["quality"])
    table = ranker.model_.predict_table(frame.drop(columns=["quality"]))
    results = json.loads((out / "results.json").read_text())
    assert results["test"] is None and results["data"]["n_test"] == 0  # --test-fraction 0: no test set
    assert results["data"]["n_train"] + results["data"]["n_val"] == n
    assert [r["id"] for r in rows] == table.ids == [str(i) for i in range(n)]
    np.testing.assert_array_equal([int(r["prediction"]) for r in rows], ranker.predict(frame.drop(columns=["quality"])))
    probabilities = np.array([[float(r[f"p_{v:g}"]) for v in table.label_values] for r in rows])
    np.testing.assert_array_equal(probabilities.astype(np.float32), table.probabilities.astype(np.float32))


def _parquet(csv_path, path):
    """The CSV's table as Parquet, the vintage a nullable integer column."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pacsv.read_csv(csv_path, convert_options=pacsv.ConvertOptions(
        column_types={"vintage": pa.int64(), "wine_id": pa.string()}))
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_a_wine_table_trains_and_predicts_with_one_command_each(kind, tmp_path, capsys):
    """A text id, text columns (one region "Dão"), a nullable integer column with a few missing cells,
    labels 3 … 9, and a predict file with its columns in another order: one `sol-ext train` and one
    `sol-ext predict`; the predictions match load_run(...).predict(DataFrame), SOLRanker and the
    exported program, and carry wine_id."""
    import csv

    import numpy as np
    import pandas as pd

    from sol_ext.driver.data import read_inputs
    from sol_ext.driver.model import load_run
    from sol_ext.driver.sklearn import SOLRanker

    train_rows, new_rows = _wine_rows(missing=True), _wine_rows(n=60, seed=1, missing=True)
    columns = list(train_rows[0])
    train = _write_rows(tmp_path / "train.csv", train_rows)
    new = _write_rows(tmp_path / "new.csv", new_rows, columns[::-1])
    if kind == "parquet":
        train, new = _parquet(train, tmp_path / "train.parquet"), _parquet(new, tmp_path / "new.parquet")
    out = tmp_path / "run"
    assert main(["train", "--data", str(train), "--label-column", "quality", "--id-column", "wine_id",
                 "--output", str(out), *FAST]) == 0
    assert main(["predict", str(out), "--data", str(new)]) == 0
    written = list(csv.DictReader(open(out / "predictions.csv", encoding="utf-8")))
    assert [r["wine_id"] for r in written] == [r["wine_id"] for r in new_rows]
    complete = [r["vintage"] != "" for r in new_rows]
    assert [r["prediction"] != "" for r in written] == complete
    predicted = np.array([int(r["prediction"]) for r, ok in zip(written, complete) if ok])

    model = load_run(out)
    frame = pd.read_csv(tmp_path / "new.csv", dtype={"vintage": "Int64"})  # the nullable integer
    frame = frame[frame["vintage"].notna()]
    by_frame = model.predict_table(frame)
    assert by_frame.ids == [r["wine_id"] for r, ok in zip(new_rows, complete) if ok]
    np.testing.assert_array_equal(by_frame.prediction, predicted)

    # the exported program, on the raw features of the file as the run reads them
    import torch

    assert main(["export", str(out)]) == 0
    program = torch.export.load(str(out / "model.pt2")).module()
    raw = read_inputs(new, model.preprocessing["schema"]).features[torch.as_tensor(complete)]
    exported = program(raw.double())[0].numpy()
    np.testing.assert_array_equal(exported, predicted)

    # SOLRanker on the same rows (the frame's text columns one-hot, the id left out) agrees with itself
    # and carries the frame's index as ids
    fit = pd.read_csv(tmp_path / "train.csv", dtype={"vintage": "Int64"}).dropna()
    ranker = SOLRanker(epochs=1, sigma=1.0, batch_size=16, embedding_dim=4, hidden=(16,))
    ranker.fit(fit.drop(columns=["quality", "wine_id"]), fit["quality"])
    features = frame.drop(columns=["wine_id", "quality"]).set_index(frame["wine_id"])
    assert set(ranker.predict(features)) <= set(range(3, 10))
    assert ranker.model_.predict_table(features).ids == by_frame.ids


# -- the rest: SIGTERM, an empty frame ------------------------------------------------------------------

def test_sigterm_during_train_says_what_the_folder_holds(tmp_path, capsys, monkeypatch):
    """As a Ctrl-C does: one line naming the checkpoint, exit status 143 (128 + SIGTERM)."""
    import os
    import signal

    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    argv = ["train", "--data", str(data), "--output", str(out), "--quiet", *FAST]
    assert main(argv) == 0  # one epoch, checkpointed
    capsys.readouterr()
    calls = []
    zero_grad = torch.optim.Optimizer.zero_grad

    def terminated_at_the_second_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return zero_grad(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", terminated_at_the_second_step)
    before = signal.getsignal(signal.SIGTERM)
    code = main([*argv, "--resume", "--epochs", "3"])
    err = capsys.readouterr().err
    assert code == 143, err
    assert err.startswith("sol-ext: interrupted;") and "checkpoint of epoch 1" in err and "--resume" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the run's only


def test_solranker_fit_on_an_empty_frame_names_the_problem():
    import pandas as pd

    from sol_ext.driver.sklearn import SOLRanker

    with pytest.raises(ValueError, match="no rows"):
        SOLRanker(epochs=1).fit(pd.DataFrame({"a": pd.Series([], dtype=float)}), pd.Series([], dtype=float))


def test_a_windows_1252_csv_reads_with_encoding(tmp_path, capsys):
    import csv

    from common import expect_error
    from sol_ext.driver.model import load_run

    rows = _wine_rows()
    utf8 = _write_rows(tmp_path / "utf8.csv", rows)
    data = tmp_path / "excel.csv"
    data.write_bytes(utf8.read_text(encoding="utf-8").encode("cp1252"))
    argv = ["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id", "--quiet", *FAST]
    expect_error(capsys, [*argv, "--output", str(tmp_path / "o")], "not UTF-8", "--encoding", "cp1252")
    out = tmp_path / "run"
    assert main([*argv, "--encoding", "cp1252", "--output", str(out)]) == 0
    assert "region=Dão" in load_run(out).feature_names
    assert main(["predict", str(out), "--data", str(data)]) == 0  # read as the training file was
    by_run = list(csv.DictReader(open(out / "predictions.csv", encoding="utf-8")))
    assert main(["predict", str(out), "--data", str(utf8), "--encoding", "utf-8", "--output",
                 str(tmp_path / "p.csv")]) == 0
    assert list(csv.DictReader(open(tmp_path / "p.csv", encoding="utf-8"))) == by_run
    expect_error(capsys, [*argv, "--encoding", "klingon", "--output", str(tmp_path / "o2")],
                 "--encoding 'klingon'", "cp1252")


def test_unseen_categories_are_refused_or_ignored_as_asked(tmp_path, capsys):
    import numpy as np
    import pandas as pd

    from sol_ext.driver import load_run
    from sol_ext.driver.sklearn import SOLRanker

    data = _write_rows(tmp_path / "wine.csv", _wine_rows())
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id",
                 "--output", str(out), "--quiet", *FAST]) == 0
    frame = pd.read_csv(data)
    novel = frame.assign(region=["Bairrada"] * len(frame))
    with pytest.raises(ValueError, match="'Bairrada'.*handle_unknown='ignore'"):
        load_run(out).predict(novel)
    ignoring = load_run(out, handle_unknown="ignore")
    none_of_them = frame.copy()
    x_novel = ignoring.features(novel)[0]
    names = ignoring.feature_names
    region = [k for k, n in enumerate(names) if n.startswith("region=")]
    assert ignoring.predict(novel).shape == (len(frame),)
    # the unseen region is no region: its one-hot features are those of the mean-centred zero
    raw_zero = (0 - ignoring.scaling[0]) / ignoring.scaling[1]
    np.testing.assert_allclose(x_novel[:, region].double(), raw_zero[region].expand(len(frame), -1), atol=1e-6)
    assert ignoring.features(none_of_them)[0].shape == x_novel.shape
    X, y = frame.drop(columns=["quality", "wine_id"]), frame["quality"]
    ranker = SOLRanker(epochs=1, sigma=1.0, batch_size=16, embedding_dim=4, hidden=(16,)).fit(X, y)
    with pytest.raises(ValueError, match="Bairrada"):
        ranker.predict(novel.drop(columns=["quality", "wine_id"]))
    ranker.set_params(handle_unknown="ignore")
    assert ranker.predict(novel.drop(columns=["quality", "wine_id"])).shape == (len(frame),)


# -- the audit: train's threads, its out-of-sample probabilities ------------------------------------------

def test_audit_uses_trains_threads_and_writes_its_probabilities(tmp_path, capsys, monkeypatch):
    import csv

    data = _write_rows(tmp_path / "wine.csv", _wine_rows())
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-column", "quality", "--id-column", "wine_id",
                 "--output", str(out), "--quiet", *FAST]) == 0
    threads = []
    set_num_threads = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (threads.append(n), set_num_threads(n)))
    before = torch.get_num_threads()
    try:
        assert main(["audit", str(out), "--folds", "2"]) == 0
        assert threads and threads[0] == 1  # the MLP encoder's, as sol-ext train picks
        assert main(["audit", str(out), "--folds", "2", "--threads", "2", "--csv",
                     str(tmp_path / "two.csv")]) == 0
        assert 2 in threads
    finally:
        set_num_threads(before)
    rows = list(csv.DictReader(open(out / "audit.csv", encoding="utf-8")))
    p_columns = [c for c in rows[0] if c.startswith("p_")]
    assert p_columns == [f"p_{v}" for v in range(3, 10)]
    assert all(abs(sum(float(r[c]) for c in p_columns) - 1) < 1e-4 for r in rows)


# -- a fine label step: a grid of more than 1,000 ranks ----------------------------------------------------

@pytest.mark.slow
def test_a_label_step_finer_than_the_labels_trains_on_its_grid_of_ranks(tmp_path, capsys):
    """--label-step 0.005 on whole numbers 20 … 29 makes 1,801 ranks: past 1,000 ranks the loss's
    probability table is built in O(n^2), so such a grid trains as any other (it used to take minutes,
    and 9,001 ranks hours, before the first step)."""
    import json

    data = tiny_csv(tmp_path / "whole.csv")
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--label-step", "0.005", "--output", str(out), "--quiet",
                 "--no-plots", *FAST]) == 0
    grid = json.loads((out / "results.json").read_text())["data"]
    assert (grid["min_value"], grid["step"], grid["num_ranks"]) == (20.0, 0.005, 1801)


@pytest.mark.parametrize("step,ranks", [("0.001", "9001"), ("0.0001", "90001")])
def test_a_label_step_of_too_many_ranks_is_refused_before_training(tmp_path, capsys, monkeypatch, step, ranks):
    """--label-step 0.001 (9,001 ranks) or 0.0001 (90,001) on labels 0 … 9: refused while the data
    are read, naming the flags and a step that fits, before anything of the size of the grid is
    allocated (the label-noise fit of 9,001 ranks took minutes and 8 GB; 90,001 ran out of memory)."""
    import sol_ext.driver.fit
    from common import expect_error
    from sol_ext.driver.data.encoding import MAX_GIVEN_RANKS

    def no_training(*args, **kwargs):
        raise AssertionError("the run trained")

    monkeypatch.setattr(sol_ext.driver.fit.Fit, "__init__", no_training)
    data = write_csv(tmp_path / "d.csv", [(i % 7, i % 3, i % 10) for i in range(100)])
    expect_error(capsys, ["train", "--data", str(data), "--label-step", step, "--output", str(tmp_path / "o"), *FAST],
                 "label column 'label'", f"{ranks} ranks", f"more than the {MAX_GIVEN_RANKS} ranks",
                 "--label-step (e.g. 0.005: 1801 ranks)", "--label-min/--label-max")
    assert not (tmp_path / "o").exists()


def test_train_s_unseen_test_category_names_what_train_can_do(tmp_path, capsys):
    """A --test-data row with a region the training file lacks: train has no --handle-unknown, so the
    error names what train can do (fix the test rows, or --drop-columns), not predict's option."""
    from common import expect_error

    data = _write_rows(tmp_path / "wine.csv", _wine_rows())
    rows = _wine_rows(n=30, seed=3)
    rows[4]["region"] = "Algarve"
    test = _write_rows(tmp_path / "test.csv", rows)
    expect_error(capsys, ["train", "--data", str(data), "--test-data", str(test), "--label-column", "quality",
                          "--id-column", "wine_id", "--output", str(tmp_path / "o"), *FAST],
                 "'Algarve'", "outside the training file's categories", "test file", "--drop-columns",
                 absent=("handle_unknown", "--handle-unknown"))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize("trained, written", [("1", "1.0"), ("1.0", "1")])
def test_a_code_written_otherwise_is_its_category_from_a_csv_and_from_parquet(kind, trained, written,
                                                                              tmp_path, capsys):
    """Codes trained as categories written one way (1, 2, 3 or 1.0, 2.0, 3.0) and predicted from a file
    that writes them the other way: a CSV's text, or a Parquet column of floats or integers (whose
    cells have no text of their own), predicts as the training file's own writing does. A code of
    no category's value (4.0) is still refused by name."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    from common import expect_error

    def code(value, style):
        return f"{value:.1f}" if style == "1.0" else str(value)

    rows = [{"code": 1 + i % 3, "x": i % 7, "label": i % 5} for i in range(90)]
    data = _write_rows(tmp_path / "codes.csv", [{**r, "code": code(r["code"], trained)} for r in rows])
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--categorical", "code", "--output", str(out), "--quiet", *FAST]) == 0
    same = _write_rows(tmp_path / "same.csv", [{**r, "code": code(r["code"], trained)} for r in rows[:9]])
    if kind == "csv":
        other = _write_rows(tmp_path / "other.csv", [{**r, "code": code(r["code"], written)} for r in rows[:9]])
    else:  # numbers without text: floats for 1.0, integers for 1
        other = tmp_path / "other.parquet"
        codes = [float(r["code"]) if written == "1.0" else r["code"] for r in rows[:9]]
        pq.write_table(pa.table({"code": codes, "x": [r["x"] for r in rows[:9]],
                                 "label": [r["label"] for r in rows[:9]]}), other)
    predictions = {}
    for name, path in (("same", same), ("other", other)):
        assert main(["predict", str(out), "--data", str(path), "--output", str(tmp_path / f"{name}.out.csv")]) == 0
        predictions[name] = list(csv.DictReader(open(tmp_path / f"{name}.out.csv", encoding="utf-8")))
    assert predictions["other"] == predictions["same"]
    unknown = _write_rows(tmp_path / "unknown.csv", [{**rows[0], "code": "4.0"}, *rows[1:3]])
    expect_error(capsys, ["predict", str(out), "--data", str(unknown), "--output", "-"],
                 "categorical column 'code' has values ['4.0'] outside its categories",
                 "--handle-unknown 'ignore'")
