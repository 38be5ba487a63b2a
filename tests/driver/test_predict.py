"""A trained run as a model: load_run, `sol-ext predict`, `sol-ext export`."""

import csv
import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import sol_ext.driver
from common import expect_error
from sol_ext.driver.cli import main
from sol_ext.driver.data import load_dataset, split_indices
from sol_ext.metrics import macro_mae, quadratic_weighted_kappa

FAST = ["--epochs", "2", "--batch-size", "32", "--embedding-dim", "4", "--hidden", "16",
        "--quiet", "--no-plots"]


def write_ratings(path, n, seed, with_labels=True):
    """A user's CSV: four features, an integer score 2 … 18 that depends on two of them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = np.clip(np.round(3 * x[:, 0] + x[:, 1] + 10 + rng.normal(size=n)), 2, 18)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "d"] + (["score"] if with_labels else []))
        for row, label in zip(x, y):
            w.writerow([f"{v:.5f}" for v in row] + ([f"{label:g}"] if with_labels else []))
    return path, x.astype(np.float32), y


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    train, _, _ = write_ratings(root / "f.csv", 300, 0)
    test, x, y = write_ratings(root / "g.csv", 120, 1)
    return root, train, test, x, y


def train_run(root, train, test, method, *extra):
    out = root / f"run-{method}"
    if not (out / "best.pt").exists():
        code = main(["train", "--data", str(train), "--test-data", str(test), "--label-column",
                     "score", "--method", method, "--sigma", "1", "--output", str(out), *FAST, *extra])
        assert code == 0
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("method", ["sol", "sol-no-noise", "l1", "ce", "corn"])
def test_load_run_predicts_the_runs_test_mae_for_every_method(user_files, method):
    if method == "corn":
        pytest.importorskip("coral_pytorch")
    root, train, test, x, y = user_files
    out, results = train_run(root, train, test, method)
    model = sol_ext.driver.load_run(out)
    assert model.method == method
    table = model.predict_table(test)
    assert np.mean(np.abs(table.prediction - y)) == results["test"]["mae"]
    # raw feature rows in the training column order give the same predictions
    assert np.array_equal(model.predict(x), table.prediction)
    p = model.predict_proba(x)
    assert p.shape == (120, results["data"]["num_ranks"])
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-9)
    assert np.all(p >= 0)
    np.testing.assert_allclose(model.expected(x), p @ model.label_values, rtol=1e-12)
    assert model.embed(x).shape == (120, 4)
    if method in ("sol", "sol-no-noise"):  # the default read-out: the expected rank against the run's cuts
        cuts = model.head.cuts.numpy()
        below = (p @ np.arange(p.shape[1]))[:, None] > cuts[None, :]
        assert np.mean(model.label_values[below.sum(1)] == table.prediction) > 0.95
    elif method != "ce":  # the prediction is the median of p, except for ce's argmax
        median = model.label_values[(np.cumsum(p, axis=1) < 0.5).sum(1).clip(max=p.shape[1] - 1)]
        assert np.mean(median == table.prediction) > 0.95


def test_predict_command_writes_the_csv_and_reproduces_the_test_mae(user_files, capsys):
    root, train, test, _, y = user_files
    out, results = train_run(root, train, test, "sol")
    capsys.readouterr()
    assert main(["predict", str(out), "--data", str(test), "--output", str(root / "pred.csv")]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader(open(root / "pred.csv")))
    values = [f"{v:g}" for v in range(2, 19)]
    assert list(rows[0]) == ["id", "prediction", "expected", "label"] + [f"p_{v}" for v in values]
    assert [r["id"] for r in rows] == [str(i) for i in range(120)]
    pred = np.array([float(r["prediction"]) for r in rows])
    assert np.mean(np.abs(pred - y)) == pytest.approx(results["test"]["mae"], abs=1e-12)
    assert f"MAE {results['test']['mae']:.4f}" in printed
    grid = y - 2
    assert f"QWK {quadratic_weighted_kappa(pred - 2, grid, 17):.4f}" in printed
    assert f"macro-MAE {macro_mae(pred, y):.4f}" in printed
    probs = np.array([[float(r[f"p_{v}"]) for v in values] for r in rows])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-8)


def test_predict_on_a_file_without_labels_and_bad_inputs(user_files, tmp_path, capsys):
    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    unlabeled, x, _ = write_ratings(tmp_path / "new.csv", 7, 1, with_labels=False)
    assert main(["predict", str(out), "--data", str(unlabeled), "--output", "-"]) == 0
    captured = capsys.readouterr()
    assert "label" not in captured.out.splitlines()[0].split(",")
    assert len(captured.out.splitlines()) == 8 and "MAE" not in captured.err
    with open(tmp_path / "few.csv", "w") as f:
        f.write("a,b,score\n1,2,3\n")
    assert main(["predict", str(out), "--data", str(tmp_path / "few.csv")]) == 2
    assert "feature column 'c'" in capsys.readouterr().err
    model = sol_ext.driver.load_run(out)
    with pytest.raises(ValueError, match=r"\[4\]"):
        model.predict(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="NaN"):
        model.predict(np.full((2, 4), np.nan))
    assert main(["predict", str(tmp_path), "--data", str(test)]) == 2
    assert "no trained run" in capsys.readouterr().err


def test_a_builtin_run_reads_new_rows_with_its_one_hot_columns(tmp_path):
    """Abalone's Sex column is one-hot encoded; a CSV of new rows in the original columns (no
    label) is read with the run's categories, and the run's test rows reproduce its test MAE."""
    out = tmp_path / "run"
    assert main(["train", "--output", str(out), "--sigma", "1", *FAST]) == 0
    results = json.loads((out / "results.json").read_text())
    model = sol_ext.driver.load_run(out)
    full = load_dataset("abalone")
    _, test_rows = split_indices(full.ranks, 0.2, 0)
    pred = model.predict("abalone")
    mae = np.mean(np.abs(pred[test_rows.numpy()] - full.labels.numpy()[test_rows.numpy()]))
    assert mae == results["test"]["mae"]
    with gzip.open(sol_ext.driver.data.DATASETS_DIR / "abalone.csv.gz", "rt") as f:
        lines = f.read().splitlines()
    header = lines[0].split(",")
    keep = [i for i, h in enumerate(header) if h != "Rings"]
    with open(tmp_path / "new.csv", "w") as f:
        for line in lines[:41]:
            cells = line.split(",")
            f.write(",".join(cells[i] for i in keep) + "\n")
    assert np.array_equal(model.predict(tmp_path / "new.csv"), pred[:40])


@pytest.mark.parametrize("method", ["sol", "l1", "corn"])
def test_exported_program_predicts_without_sol_ext(user_files, tmp_path, method):
    if method == "corn":
        pytest.importorskip("coral_pytorch")
    root, train, test, x, _ = user_files
    out, _ = train_run(root, train, test, method)
    assert main(["export", str(out), "--output", str(tmp_path / "model.pt2")]) == 0
    side = json.loads((tmp_path / "model.pt2.json").read_text())
    assert side["inputs"]["feature_names"] == ["a", "b", "c", "d"]
    assert side["label_values"] == [float(v) for v in range(2, 19)]
    np.save(tmp_path / "x.npy", x)
    script = f"""
import sys
sys.modules["sol_ext"] = None  # importing sol_ext now fails: the program must not need it
import numpy as np, torch
program = torch.export.load({str(tmp_path / 'model.pt2')!r}).module()
x = torch.from_numpy(np.load({str(tmp_path / 'x.npy')!r}))
prediction, expected, probabilities = program(x)
one = program(x[:1])[0]
np.savez({str(tmp_path / 'out.npz')!r}, prediction=prediction.numpy(), expected=expected.numpy(),
         probabilities=probabilities.numpy(), one=one.numpy())
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    got = np.load(tmp_path / "out.npz")
    table = sol_ext.driver.load_run(out).predict_table(x)
    assert np.array_equal(got["prediction"], table.prediction)
    assert got["one"][0] == table.prediction[0]
    np.testing.assert_allclose(got["probabilities"], table.probabilities, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["expected"], table.expected, rtol=1e-6)


@pytest.mark.parametrize("method", ["sol", "l1"])
def test_onnx_model_runs_without_torch_as_the_exported_program(user_files, tmp_path, method):
    """export_onnx writes a model that onnxruntime runs where importing torch (or sol_ext) fails: ranks
    equal to the torch.export program's, probabilities within 1e-5, any batch size."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from sol_ext.driver.export import export_onnx, export_run

    root, train, test, x, _ = user_files
    out, _ = train_run(root, train, test, method)
    model = sol_ext.driver.load_run(out)
    export_run(model, tmp_path / "model.pt2")
    assert main(["export", str(out), "--format", "onnx"]) == 0  # RUN/model.onnx, as export_onnx writes it
    assert export_onnx(model, tmp_path / "model.onnx") == tmp_path / "model.onnx.json"
    assert (out / "model.onnx").read_bytes() == (tmp_path / "model.onnx").read_bytes()
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    script = f"""
import sys
sys.modules["torch"] = None  # importing torch (and so sol_ext) now fails: the model must not need it
sys.modules["sol_ext"] = None
import numpy as np, onnxruntime
session = onnxruntime.InferenceSession({str(tmp_path / 'model.onnx')!r}, providers=["CPUExecutionProvider"])
x = np.load({str(tmp_path / 'x.npy')!r})
prediction, expected, probabilities = session.run(None, {{"x": x}})
one = session.run(None, {{"x": x[:1]}})[0]
np.savez({str(tmp_path / 'onnx.npz')!r}, prediction=prediction, expected=expected, probabilities=probabilities,
         one=one)
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    got = np.load(tmp_path / "onnx.npz")
    program = torch.export.load(tmp_path / "model.pt2").module()
    prediction, expected, probabilities = program(torch.from_numpy(x.astype(np.float32)))
    assert np.array_equal(got["prediction"], prediction.numpy()) and got["one"][0] == prediction[0].item()
    np.testing.assert_allclose(got["probabilities"], probabilities.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(got["expected"], expected.numpy(), rtol=1e-5)


@pytest.mark.parametrize("method", ["sol", "l1"])
def test_a_run_gives_calibrated_rank_intervals_in_label_units(user_files, tmp_path, method):
    """load_run(...).calibrate_intervals on a labeled file, then predict_interval: label values on the
    run's grid around each row; on the calibration rows themselves at least the requested share is
    covered (the threshold is the ceil((M + 1) coverage)-th smallest score)."""
    root, train, test, x, y = user_files
    out, _ = train_run(root, train, test, method)
    model = sol_ext.driver.load_run(out)
    with pytest.raises(ValueError, match="labels="):
        model.calibrate_intervals(x)
    calibration = model.calibrate_intervals(test, score="cumulative")
    assert calibration.count == len(y) and model.intervals is calibration
    lower, upper = model.predict_interval(test, coverage=0.9)
    assert np.all(lower <= upper) and set(np.unique(np.r_[lower, upper])) <= set(model.label_values)
    assert np.mean((y >= lower) & (y <= upper)) >= 0.9
    again = model.calibrate_intervals(x, labels=y, score="cumulative")  # the rows unrounded, as an array
    torch.testing.assert_close(again.scores, calibration.scores, rtol=0, atol=1e-3)
    narrow, wide = model.predict_interval(x, 0.5), model.predict_interval(x, 0.95)
    assert np.all((wide[0] <= narrow[0]) & (narrow[1] <= wide[1]))


def test_predict_writes_interval_columns_and_says_how_often_they_held(user_files, tmp_path, capsys):
    """sol-ext predict --interval 0.9 --calibration FILE: lower and upper columns, equal to
    load_run(...).predict_interval after the same calibration, and a line with the mean width and
    the share of the data's labels inside; the options refused where they do not apply."""
    root, train, test, x, y = user_files
    out, _ = train_run(root, train, test, "sol")
    assert main(["predict", str(out), "--data", str(test), "--interval", "0.9", "--calibration", str(train),
                 "--output", str(tmp_path / "p.csv")]) == 0
    printed = capsys.readouterr().out
    assert "intervals at 90%: mean width" in printed and "holding the data's label in" in printed
    with open(tmp_path / "p.csv") as f:
        rows = list(csv.DictReader(f))
    model = sol_ext.driver.load_run(out)
    model.calibrate_intervals(train)
    lower, upper = model.predict_interval(test, 0.9)
    assert [float(r["lower"]) for r in rows] == lower.tolist() and [float(r["upper"]) for r in rows] == upper.tolist()
    for argv, flag in ((["--calibration", str(train)], "--calibration"),
                       (["--interval", "1.5", "--calibration", str(train)], "--interval"),
                       (["--interval", "0.9", "--calibration", str(train), "--interval-target", "clean"],
                        "--label-noise"),
                       (["--interval", "0.9", "--calibration", str(train), "--no-deconvolve"], "--no-deconvolve"),
                       (["--no-deconvolve"], "--no-deconvolve"),
                       (["--interval-target", "clean"], "--interval-target"),
                       (["--interval-score", "hpd"], "--interval-score"),
                       (["--interval", "0.9", "--calibration", str(train), "--interval-target", "clean",
                         "--label-noise", "-1"], "--label-noise")):
        assert main(["predict", str(out), "--data", str(test), "--output", "-", *argv]) == 2, argv
        assert flag in capsys.readouterr().err, argv


@pytest.mark.parametrize("deconvolve", [True, False])
def test_predict_aims_intervals_at_the_clean_label_as_the_library_does(user_files, tmp_path, deconvolve):
    """sol-ext predict --interval-target clean --label-noise STD [--no-deconvolve]: the intervals of
    load_run(...).calibrate_intervals(target="clean", label_noise=STD, deconvolve=...) on the same file.
    (The test checks that the two readings differ on this run, so that the flag is seen to reach the
    library.)"""
    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    flags = [] if deconvolve else ["--no-deconvolve"]
    assert main(["predict", str(out), "--data", str(test), "--interval", "0.9", "--calibration", str(train),
                 "--interval-target", "clean", "--label-noise", "2", *flags,
                 "--output", str(tmp_path / "p.csv")]) == 0
    with open(tmp_path / "p.csv") as f:
        rows = list(csv.DictReader(f))
    model = sol_ext.driver.load_run(out)
    readings = {}
    for reading in (True, False):
        model.calibrate_intervals(train, target="clean", label_noise=2.0, deconvolve=reading)
        readings[reading] = model.predict_interval(test, 0.9)
    assert not all(np.array_equal(a, b) for a, b in zip(readings[True], readings[False]))  # the flag shows
    lower, upper = readings[deconvolve]
    assert [float(r["lower"]) for r in rows] == lower.tolist() and [float(r["upper"]) for r in rows] == upper.tolist()


def test_exported_program_and_onnx_model_hold_the_intervals_calibration(user_files, tmp_path):
    """sol-ext export --interval 0.9 --calibration FILE: the .pt2 program and the ONNX model return lower
    and upper as load_run's predict_interval after the same calibration, without the data. (The rows
    predicted are not the calibration rows: one of those has a score at the threshold itself, where the
    program's probabilities, equal to within 1e-7, may fall on either side.)"""
    pytest.importorskip("onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime")
    root, train, test, x, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    model = sol_ext.driver.load_run(out)
    model.calibrate_intervals(train)
    lower, upper = model.predict_interval(x, 0.9)
    for form in ("pt2", "onnx"):
        program = tmp_path / form / f"model.{form}"
        program.parent.mkdir()
        assert main(["export", str(out), "--output", str(program), "--interval", "0.9",
                     "--calibration", str(train)]) == 0
        assert json.loads((program.parent / f"model.{form}.json").read_text())["intervals"]["coverage"] == 0.9
        if form == "pt2":
            got = [t.numpy() for t in torch.export.load(program).module()(torch.from_numpy(x))]
        else:
            got = onnxruntime.InferenceSession(str(program), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        assert len(got) == 5, form
        assert np.array_equal(got[3], lower) and np.array_equal(got[4], upper), form


def test_a_run_stores_its_validation_split_to_calibrate_intervals_on(user_files, tmp_path, capsys):
    """sol-ext train keeps the validation split's probabilities and given labels in best.pt: load_run's
    model then has intervals, and predict --interval / export --interval need no --calibration; they are
    the intervals of a calibration on those rows of the training file. An explicit --calibration
    replaces it; a run without a validation split (or saved before) asks for --calibration."""
    from sol_ext.driver.model import CALIBRATION_KEY
    from sol_ext.driver.predict import rows_of

    root, train, test, x, _ = user_files
    out, results = train_run(root, train, test, "sol")
    state = torch.load(out / "best.pt", weights_only=True)
    stored = state[CALIBRATION_KEY]
    val_rows = state["val_rows"].numpy()
    assert stored["probabilities"].shape == (len(val_rows), results["data"]["num_ranks"])
    model = sol_ext.driver.load_run(out)
    table = model.predict_table(train)
    np.testing.assert_allclose(stored["probabilities"].numpy(), table.probabilities[val_rows], rtol=0, atol=1e-6)
    assert torch.equal(stored["ranks"], model.grid.encode(table.values[val_rows]))
    assert model.intervals is not None and model.intervals.count == len(val_rows)
    lower, upper = model.predict_interval(test, 0.9)
    again = sol_ext.driver.load_run(out)
    again.calibrate_intervals_of(rows_of(table, np.isin(np.arange(len(table.ids)), val_rows)), table.values[val_rows])
    assert again.intervals.count == len(val_rows)
    np.testing.assert_array_equal(again.predict_interval(test, 0.9)[0], lower)
    assert main(["predict", str(out), "--data", str(test), "--interval", "0.9",
                 "--output", str(tmp_path / "p.csv")]) == 0
    with open(tmp_path / "p.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["lower"]) for r in rows] == lower.tolist() and [float(r["upper"]) for r in rows] == upper.tolist()
    program = tmp_path / "model.pt2"
    assert main(["export", str(out), "--output", str(program), "--interval", "0.9"]) == 0
    got = torch.export.load(program).module()(torch.from_numpy(x))
    assert np.array_equal(got[3].numpy(), lower) and np.array_equal(got[4].numpy(), upper)
    # --calibration FILE overrides the stored rows
    model.calibrate_intervals(train)
    assert main(["predict", str(out), "--data", str(test), "--interval", "0.9", "--calibration", str(train),
                 "--output", str(tmp_path / "q.csv")]) == 0
    with open(tmp_path / "q.csv") as f:
        assert [float(r["lower"]) for r in csv.DictReader(f)] == model.predict_interval(test, 0.9)[0].tolist()
    capsys.readouterr()
    # without a validation split, and in a run saved before runs stored one: --calibration is asked for
    paper = tmp_path / "no-split"
    assert main(["train", "--data", str(train), "--label-column", "score", "--sigma", "1", "--val-fraction", "0",
                 "--output", str(paper), *FAST]) == 0
    assert CALIBRATION_KEY not in torch.load(paper / "best.pt", weights_only=True)
    old = tmp_path / "old"
    old.mkdir()
    torch.save({k: v for k, v in state.items() if k != CALIBRATION_KEY}, old / "best.pt")
    for run in (paper, old):
        with pytest.raises(RuntimeError, match="calibrate_intervals"):
            sol_ext.driver.load_run(run).predict_interval(x)
        for command in (["predict", str(run), "--data", str(test), "--output", "-"], ["export", str(run)]):
            assert main([*command, "--interval", "0.9"]) == 2
            err = capsys.readouterr().err
            assert "--calibration FILE" in err and "holds no calibration" in err, err


def test_results_hold_the_calibration_error_and_a_reliability_plot(user_files, tmp_path, capsys, monkeypatch):
    """results.json's calibration: the ECE of the validation split (labels as given) and of the test set,
    as sol_ext.metrics computes them on load_run's probabilities of those rows, with the reliability
    curve; reliability.png beside the other plots, and without matplotlib one note and no plots."""
    from sol_ext.metrics import expected_calibration_error

    root, train, test, _, y = user_files
    out = tmp_path / "run"
    argv = ["train", "--data", str(train), "--test-data", str(test), "--label-column", "score", "--sigma", "1",
            "--output", str(out), *[a for a in FAST if a != "--no-plots"]]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    calibration = results["calibration"]
    model = sol_ext.driver.load_run(out)
    val_rows = torch.load(out / "best.pt", weights_only=True)["val_rows"].numpy()
    table, test_table = model.predict_table(train), model.predict_table(test)
    val_ece = expected_calibration_error(table.probabilities[val_rows], model.grid.encode(table.values[val_rows]))
    test_ece = expected_calibration_error(test_table.probabilities, model.grid.encode(y))
    assert calibration["validation"]["ece"] == pytest.approx(val_ece, abs=1e-6)
    assert calibration["test"]["ece"] == pytest.approx(test_ece, abs=1e-6)
    assert calibration["validation"]["rows"] == len(val_rows) == sum(calibration["validation"]["reliability"]["count"])
    assert calibration["test"]["rows"] == len(y) and calibration["intervals"] == "validation"
    assert "reliability.png" in results["plots"] and (out / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main([*argv, "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert err.count("sol-ext: note:") == 1 and "matplotlib" in err, err
    results = json.loads((out / "results.json").read_text())
    assert "plots" not in results and not list(out.glob("*.png"))
    assert results["calibration"]["test"]["ece"] == calibration["test"]["ece"]


def test_storing_the_validation_calibration_leaves_the_random_state(user_files):
    """The calibration runs after training and must not change what a later draw gives."""
    from sol_ext.driver.calibration import calibrate_run
    from sol_ext.driver.config import TrainConfig
    from sol_ext.driver.prepare import prepare_data
    from sol_ext.driver.train import check_run

    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    config = TrainConfig(data=str(train), test_data=str(test), label_column="score", sigma=1.0)
    data = prepare_data(config)
    before = torch.get_rng_state()
    context = check_run(config, data, None, False).context
    assert calibrate_run(out, config, data, {}, context=context) is not None
    assert torch.equal(torch.get_rng_state(), before)


def test_own_files_get_no_added_noise_unless_asked(user_files, tmp_path):
    from sol_ext.driver.config import TrainConfig

    root, train, _, _, _ = user_files
    assert TrainConfig(data=str(train)).noise == "none"
    assert TrainConfig(data="abalone").noise == "gaussian"
    assert TrainConfig(data=str(train), noise="gaussian").noise == "gaussian"
    out = tmp_path / "run"
    assert main(["train", "--data", str(train), "--label-column", "score", "--sigma", "1",
                 "--output", str(out), *FAST]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["noise"] == "none"
    assert results["label_noise_given"] is None  # the file's labels are not known to be clean


def test_a_test_file_with_the_columns_in_another_order_is_read_by_name(user_files, tmp_path):
    root, train, test, _, y = user_files
    lines = test.read_text().splitlines()
    order = [4, 2, 0, 3, 1]  # score, c, a, d, b
    shuffled = tmp_path / "g-shuffled.csv"
    shuffled.write_text("\n".join(",".join(line.split(",")[i] for i in order) for line in lines) + "\n")
    out, results = train_run(root, train, test, "sol")
    again = tmp_path / "run"
    assert main(["train", "--data", str(train), "--test-data", str(shuffled), "--label-column", "score",
                 "--method", "sol", "--sigma", "1", "--output", str(again), *FAST]) == 0
    assert json.loads((again / "results.json").read_text())["test"] == results["test"]
    assert np.array_equal(sol_ext.driver.load_run(out).predict(shuffled), sol_ext.driver.load_run(out).predict(test))


def test_checkpoints_of_an_earlier_format_are_refused_and_overwrite_replaces_them(user_files, tmp_path, capsys):
    import torch

    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "l1")
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("best.pt", "checkpoint.pt"):
        (copy / name).write_bytes((out / name).read_bytes())
    state = torch.load(copy / "best.pt", weights_only=True)
    torch.save({**state, "format_version": 1}, copy / "best.pt")
    assert main(["predict", str(copy), "--data", str(test)]) == 2
    assert "is not a sol_ext checkpoint of format 2; train the run again" in capsys.readouterr().err
    # --overwrite trains afresh over it; the new model is the one predict reads
    assert main(["train", "--data", str(train), "--test-data", str(test), "--label-column", "score",
                 "--method", "l1", "--output", str(copy), "--overwrite", *FAST]) == 0
    assert torch.load(copy / "best.pt", weights_only=True)["format_version"] == 2
    assert main(["predict", str(copy), "--data", str(test)]) == 0


def test_npz_labels_of_another_length_are_refused(tmp_path):
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    y = np.arange(40) % 5
    np.savez(tmp_path / "d.npz", embeddings=x, labels=y)
    out = tmp_path / "run"
    assert main(["train", "--data", str(tmp_path / "d.npz"), "--sigma", "1", "--output", str(out), *FAST]) == 0
    np.savez(tmp_path / "bad.npz", embeddings=x, labels=y[:10])
    with pytest.raises(ValueError, match="one label per row"):
        sol_ext.driver.load_run(out).predict(tmp_path / "bad.npz")
    assert sol_ext.driver.load_run(out).predict(tmp_path / "d.npz").shape == (40,)
    x[[7, 9], 1] = np.nan  # rows with a NaN feature: the file and the first row named
    np.savez(tmp_path / "nan.npz", embeddings=x, labels=y)
    with pytest.raises(ValueError, match=r"nan.npz: 2 row\(s\) have NaN or infinite features, the first row 7"):
        sol_ext.driver.load_run(out).predict(tmp_path / "nan.npz")
    with pytest.raises(ValueError, match=r"^data: 2 row\(s\) have NaN or infinite features, the first row 7"):
        sol_ext.driver.load_run(out).predict(x)


def test_the_cuts_read_out_is_fitted_saved_predicted_and_exported(user_files, tmp_path):
    import torch

    from sol_ext.readout import cut_ranks

    root, train, test, x, y = user_files
    out = tmp_path / "run-cuts"
    assert main(["train", "--data", str(train), "--test-data", str(test), "--label-column", "score",
                 "--sigma", "1", "--readout", "cuts", "--val-fraction", "0.2", "--output", str(out),
                 *FAST]) == 0
    results = json.loads((out / "results.json").read_text())
    model = sol_ext.driver.load_run(out)
    assert model.head.readout == "cuts" and results["config"]["readout"] == "cuts"
    table = model.predict_table(test)
    assert np.mean(np.abs(table.prediction - y)) == results["test"]["mae"]  # the run's own figure
    h = model.embed(x)
    assert np.array_equal(table.ranks, cut_ranks(model.head.expected_rank(h), model.head.cuts).numpy())
    cuts = model.head.cuts
    assert bool((cuts[1:] >= cuts[:-1]).all())  # fitted (tests/library/test_head.py: on the training split)
    assert not torch.equal(cuts, torch.arange(model.num_ranks - 1, dtype=torch.float64) + 0.5)
    assert main(["export", str(out), "--output", str(tmp_path / "model.pt2")]) == 0
    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    prediction, expected, _ = program(torch.from_numpy(x))
    assert np.array_equal(prediction.numpy(), table.prediction)
    # the program evaluates D in float64, load_run in float32
    np.testing.assert_allclose(expected.numpy(), table.expected, rtol=1e-5)


def test_predict_refuses_a_delimiter_for_a_file_that_is_not_csv(finished, tmp_path, capsys):
    """As train refuses it: a Parquet file has no cell separator to set."""
    import pyarrow.csv
    import pyarrow.parquet

    out, data = finished
    table = tmp_path / "d.parquet"
    pyarrow.parquet.write_table(pyarrow.csv.read_csv(data), table)
    expect_error(capsys, ["predict", str(out), "--data", str(table), "--delimiter", ";", "--output", "-"],
                 f"--delimiter ; applies to CSV files only; {table} is not one")
    assert main(["predict", str(out), "--data", str(data), "--delimiter", ",",
                 "--output", str(tmp_path / "p.csv")]) == 0


def test_predict_command_resolves_the_device_once(user_files, tmp_path, monkeypatch, capsys):
    """`sol-ext predict --device` is checked where the run is loaded, and nowhere else."""
    import sol_ext.driver.device as device_module
    import sol_ext.driver.model as model_module

    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    calls = []
    resolve = device_module.resolve_device
    for module in (device_module, model_module):  # where it is defined, and where it is imported
        monkeypatch.setattr(module, "resolve_device", lambda name, *a: calls.append(name) or resolve(name, *a))
    assert main(["predict", str(out), "--data", str(test), "--device", "cpu",
                 "--output", str(tmp_path / "pred.csv")]) == 0
    assert calls == ["cpu"]
    capsys.readouterr()
    assert main(["predict", str(out), "--data", str(test), "--device", "mps:0",
                 "--output", str(tmp_path / "pred2.csv")]) == 2
    assert "'mps:0' is not a device" in capsys.readouterr().err


def test_export_holds_the_clean_targets_calibration(user_files, tmp_path, capsys):
    """sol-ext export --interval 0.9 --interval-target clean --label-noise STD [--no-deconvolve]: the
    program returns the intervals of load_run's model calibrated the same way, and its sidecar names
    the target; the clean target's options are refused where they do not apply, as in predict."""
    root, train, test, x, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    intervals = {}
    for flags, deconvolve in (([], True), (["--no-deconvolve"], False)):
        program = tmp_path / f"clean{len(flags)}" / "model.pt2"
        program.parent.mkdir()
        assert main(["export", str(out), "--output", str(program), "--interval", "0.9", "--calibration", str(train),
                     "--interval-target", "clean", "--label-noise", "2", *flags]) == 0
        assert json.loads((program.parent / "model.pt2.json").read_text())["intervals"]["target"] == "clean"
        model = sol_ext.driver.load_run(out)
        model.calibrate_intervals(train, target="clean", label_noise=2.0, deconvolve=deconvolve)
        lower, upper = intervals[deconvolve] = model.predict_interval(x, 0.9)
        got = torch.export.load(program).module()(torch.from_numpy(x))
        assert np.array_equal(got[3].numpy(), lower) and np.array_equal(got[4].numpy(), upper), flags
    assert not all(np.array_equal(a, b) for a, b in zip(intervals[True], intervals[False]))  # the flag shows
    for argv, flag in ((["--interval", "0.9", "--interval-target", "clean"], "--label-noise"),
                       (["--label-noise", "2"], "--label-noise"), (["--no-deconvolve"], "--no-deconvolve"),
                       (["--interval", "0.9", "--no-deconvolve"], "--no-deconvolve"),
                       (["--interval-target", "clean"], "--interval-target"),
                       (["--interval-score", "hpd"], "--interval-score"),
                       (["--calibration", str(train)], "--calibration"), (["--interval", "1.5"], "--interval")):
        capsys.readouterr()
        assert main(["export", str(out), "--output", str(tmp_path / "refused.pt2"), *argv]) == 2, argv
        assert flag in capsys.readouterr().err, argv


@pytest.mark.parametrize("command", [["predict", "RUN", "--data", "new.csv"], ["export", "RUN"]])
def test_the_command_lines_interval_scores_are_the_librarys(command, capsys):
    """--interval-score takes each score of sol_ext.intervals, refuses an unknown one, and defaults to
    the library's default, so a run's intervals are the same from the command line and from load_run
    (left unset when not given, so that it is refused without --interval; its help names the default).
    (The command line names them itself: it does not import torch to parse its arguments.)"""
    from sol_ext.driver.cli import build_parser
    from sol_ext.intervals import DEFAULT_SCORE, SCORES

    parser = build_parser()
    assert parser.parse_args(command).interval_score is None
    sub = next(a for a in parser._actions if isinstance(a.choices, dict)).choices[command[0]]
    assert f"(default: {DEFAULT_SCORE})" in next(a.help for a in sub._actions if a.dest == "interval_score")
    for score in SCORES:
        assert parser.parse_args([*command, "--interval-score", score]).interval_score == score
    with pytest.raises(SystemExit):
        parser.parse_args([*command, "--interval-score", "widest"])
    assert "invalid choice: 'widest'" in capsys.readouterr().err


def test_a_best_pt_with_changed_bytes_is_refused_as_damaged(user_files, tmp_path, capsys):
    """64 bytes flipped inside best.pt's weights: the zip's checksums catch it, and predict and
    load_run refuse the file by name instead of predicting with other weights."""
    import shutil
    import zipfile

    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    run = tmp_path / "run"
    shutil.copytree(out, run)
    raw = bytearray((run / "best.pt").read_bytes())
    with zipfile.ZipFile(run / "best.pt") as archive:
        weights = max(archive.infolist(), key=lambda info: info.file_size)  # the largest tensor
        start = weights.header_offset + 30 + len(weights.filename) + len(weights.extra) + 8
    raw[start:start + 64] = bytes(b ^ 0x5A for b in raw[start:start + 64])
    (run / "best.pt").write_bytes(bytes(raw))
    expect_error(capsys, ["predict", str(run), "--data", str(test), "--output", "-"],
                 str(run / "best.pt"), "damaged", "checksum", "train the run again")
    with pytest.raises(ValueError, match="damaged"):
        sol_ext.driver.load_run(run)


def test_a_best_pt_whose_settings_no_longer_fit_its_weights_is_one_line(user_files, tmp_path, capsys):
    """best.pt re-saved with another grid in its record: one line naming the file as edited or
    damaged, no traceback."""
    import shutil

    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    run = tmp_path / "run"
    shutil.copytree(out, run)
    state = torch.load(run / "best.pt", weights_only=True)
    state["predictor"]["preprocessing"]["grid"]["num_ranks"] = 3
    torch.save(state, run / "best.pt")
    expect_error(capsys, ["predict", str(run), "--data", str(test), "--output", "-"],
                 str(run / "best.pt"), "edited or damaged", absent=("Traceback",))


def test_a_calibration_files_bad_label_is_named_by_the_file_and_its_data_row(user_files, tmp_path, capsys):
    """--calibration FILE: a label outside the grid, after a row without a prediction (a missing
    feature value), is named by --calibration, the file and its own data row; a label off the grid's
    steps and a file without the run's label column likewise."""
    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    lines = open(test).read().splitlines()
    header, rows = lines[0], lines[1:20]
    rows[1] = "," + rows[1].split(",", 1)[1]  # data row 1: no value in column a
    shifted = rows[:4] + [rows[4].rsplit(",", 1)[0] + ",99"] + rows[5:]
    bad = tmp_path / "cal.csv"
    bad.write_text("\n".join([header, *shifted]) + "\n")
    argv = ["predict", str(out), "--data", str(test), "--interval", "0.9", "--output", "-", "--calibration"]
    expect_error(capsys, [*argv, str(bad)], f"--calibration {bad}", "label value 99 (data row 4)",
                 absent=("index",))
    off = tmp_path / "off.csv"
    off.write_text("\n".join([header, *(r.rsplit(",", 1)[0] + ",5.4" for r in rows[2:])]) + "\n")
    expect_error(capsys, [*argv, str(off)], f"--calibration {off}", "5.4", "not a value of the run's grid")
    unlabelled = tmp_path / "nolabel.csv"
    unlabelled.write_text("\n".join(r.rsplit(",", 1)[0] for r in lines[:20]) + "\n")
    expect_error(capsys, [*argv, str(unlabelled)], f"--calibration {unlabelled}", "no label column 'score'",
                 absent=("labels=",))


def test_predict_and_export_rough_edges(user_files, tmp_path, capsys):
    """One calibration row at 90% and the run's own training file as --calibration are warned
    about; a file whose every row lacks a value writes its CSV and exits 0 without scores;
    export --output - is refused; the printed width says what it measures."""
    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    lines = open(test).read().splitlines()
    one = tmp_path / "one.csv"
    one.write_text("\n".join(lines[:2]) + "\n")
    argv = ["predict", str(out), "--data", str(test), "--interval", "0.9", "--output", str(tmp_path / "p.csv")]
    assert main([*argv, "--calibration", str(one)]) == 0
    captured = capsys.readouterr()
    # the library's warning, in the command's words, once though every slice's intervals read it
    assert captured.err.count("sol-ext: warning: --interval 0.9: 1 calibration row cannot calibrate 90% "
                              "(it needs at least 9)") == 1, captured.err
    assert "(upper - lower, label units)" in captured.out
    assert main([*argv, "--overwrite", "--calibration", str(train)]) == 0
    assert "rows the run trained on" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    empty.write_text("\n".join([lines[0], *("," + line.split(",", 1)[1] for line in lines[1:6])]) + "\n")
    assert main(["predict", str(out), "--data", str(empty), "--output", str(tmp_path / "e.csv")]) == 0
    captured = capsys.readouterr()
    assert "5 of 5 rows have a missing feature value" in captured.err and "MAE" not in captured.out
    assert len(open(tmp_path / "e.csv").read().splitlines()) == 6
    expect_error(capsys, ["export", str(out), "--output", "-"], "--output -", "stdout")
    assert not (tmp_path / "-").exists()


def test_a_damaged_stored_calibration_fails_only_the_intervals_naming_best_pt(user_files, tmp_path, capsys):
    import shutil

    from sol_ext.driver.model import CALIBRATION_KEY

    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    run = tmp_path / "run"
    shutil.copytree(out, run)
    state = torch.load(run / "best.pt", weights_only=True)
    state[CALIBRATION_KEY]["ranks"] = state[CALIBRATION_KEY]["ranks"] + 50
    torch.save(state, run / "best.pt")
    assert main(["predict", str(run), "--data", str(test), "--output", str(tmp_path / "p.csv")]) == 0
    expect_error(capsys, ["predict", str(run), "--data", str(test), "--interval", "0.9", "--output", "-"],
                 str(run / "best.pt"), "stored calibration rows are damaged", "--calibration FILE")
    assert main(["predict", str(run), "--data", str(test), "--interval", "0.9", "--calibration", str(train),
                 "--output", str(tmp_path / "q.csv")]) == 0


def test_ctrl_c_after_rows_reached_stdout_says_the_csv_is_incomplete(user_files, monkeypatch, capsys):
    """Ctrl-C while predict --output - writes its slices: rows are on stdout already, so the line says
    the CSV there is incomplete, not that nothing was written; before the first row it still does."""
    import sol_ext.driver.predict as predict
    from sol_ext.driver.data import inputs

    root, train, test, _, _ = user_files
    out, _ = train_run(root, train, test, "sol")
    monkeypatch.setattr(inputs, "SLICE_ROWS", 50)  # 120 rows: three slices
    write_slice, calls = predict.write_prediction_csv, []

    def interrupted_at_the_third_slice(f, *args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return write_slice(f, *args, **kwargs)

    monkeypatch.setattr(predict, "write_prediction_csv", interrupted_at_the_third_slice)
    capsys.readouterr()  # what training printed
    assert main(["predict", str(out), "--data", str(test), "--output", "-"]) == 130
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1 + 100
    assert "the CSV on stdout is incomplete: 100 rows were written in full" in captured.err

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(predict._ScoreTotals, "add", interrupted)  # before the first line
    assert main(["predict", str(out), "--data", str(test), "--output", "-"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "" and "nothing was written" in captured.err
