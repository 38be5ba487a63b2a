"""sol-ext train/audit/predict/export on bad or risky input: one line ``sol-ext: error: ...``
naming the flag or file, exit status 2, no traceback, and nothing that was in the output folder
lost; Ctrl-C and ``--resume`` keep the last complete results, also during the sigma search."""

import json
import os
from pathlib import Path

import pytest
import torch

from common import expect_error, tiny_csv, write_csv
from sol_ext.driver.cli import main

FAST = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16",
        "--lr", "0.01", "--quiet", "--no-plots"]
SIGMA1 = ["--sigma", "1"]




def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def train_argv(data, out, *extra):
    return ["train", "--data", str(data), "--output", str(out), *FAST, *extra]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-epoch run (sigma 1), not to be changed by the tests."""
    root = tmp_path_factory.mktemp("finished")
    data = tiny_csv(root / "d.csv")
    assert main(train_argv(data, root / "run", *SIGMA1)) == 0
    return root / "run", data


def _ctrl_c_at_optimizer_step(monkeypatch, step):
    """The ``step``-th optimizer step of the process raises KeyboardInterrupt (as Ctrl-C does);
    returns the list of steps taken (counts every step when ``step`` is None)."""
    calls = []
    zero_grad = torch.optim.Optimizer.zero_grad

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if step is not None and len(calls) >= step:
            raise KeyboardInterrupt
        return zero_grad(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", interrupted)
    return calls


def without_timings(results):
    return {**results, "seconds": None,
            "history": [{k: v for k, v in r.items() if k != "seconds"} for r in results["history"]]}


# ---------------------------------------------------------------------------------------------
# 1. the output folder: never delete or overwrite what a run did not write


def test_an_empty_output_path_is_refused(tmp_path, capsys, monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    work = tmp_path / "work"
    work.mkdir()
    (work / "results.json").write_text("mine")
    monkeypatch.chdir(work)
    expect_error(capsys, train_argv(data, "", *SIGMA1), "--output", "empty")
    assert snapshot(work) == {"results.json": b"mine"}


@pytest.mark.parametrize("where", ["folder", "dot"])
def test_a_folder_with_other_files_and_no_run_is_refused_and_kept(tmp_path, capsys, monkeypatch,
                                                                   where):
    data = tiny_csv(tmp_path / "d.csv")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.json").write_text('{"my": "results"}')
    (folder / "learning_curves.png").write_bytes(b"my plot")
    (folder / "notes.txt").write_text("notes")
    before = snapshot(folder)
    if where == "dot":
        monkeypatch.chdir(folder)
    out = "." if where == "dot" else str(folder)
    for extra in ([], ["--overwrite"]):
        expect_error(capsys, train_argv(data, out, *SIGMA1, *extra), "--output",
                     "not a sol-ext run folder")
        assert snapshot(folder) == before


def test_an_existing_empty_folder_is_a_fine_output(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "empty"
    out.mkdir()
    assert main(train_argv(data, out, *SIGMA1)) == 0
    assert (out / "results.json").is_file() and (out / "checkpoint.pt").is_file()


# ---------------------------------------------------------------------------------------------
# 2. a resumed run keeps the last complete results until new ones replace them


def test_ctrl_c_in_a_resumed_run_keeps_the_finished_runs_results(tmp_path, capsys, monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    with_plots = [a for a in train_argv(data, out, *SIGMA1) if a != "--no-plots"]
    assert main(with_plots) == 0
    kept = {name: (out / name).read_bytes() for name in
            ("results.json", "learning_curves.png", "cs_curve.png", "embeddings_pca.png")}
    capsys.readouterr()
    _ctrl_c_at_optimizer_step(monkeypatch, 8)  # 6 steps an epoch: in epoch 4
    more = [*train_argv(data, out, *SIGMA1), "--resume", "--epochs", "5"]
    assert main(more) == 130
    assert "--resume" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in kept} == kept
    monkeypatch.undo()
    assert main(more) == 0
    assert json.loads((out / "results.json").read_text())["epochs_run"] == 5


# ---------------------------------------------------------------------------------------------
# 3. the default sigma "auto" resumes like any run


def test_ctrl_c_in_the_sigma_search_resumes_to_the_uninterrupted_results(tmp_path, capsys,
                                                                          monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    steps = _ctrl_c_at_optimizer_step(monkeypatch, None)
    assert main(train_argv(data, tmp_path / "whole")) == 0  # sigma auto: three trials
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    total = len(steps)
    monkeypatch.undo()

    out = tmp_path / "broken"
    _ctrl_c_at_optimizer_step(monkeypatch, total // 2 + 2)  # the second trial's second epoch
    assert main(train_argv(data, out)) == 130
    err = capsys.readouterr().err
    assert "sigma search" in err and "--resume" in err and "nothing to resume" not in err, err
    assert (out / "sigma-search").is_dir() and not (out / "checkpoint.pt").exists()
    record = json.loads((out / "sigma-search" / "search.json").read_text())
    assert list(record["finished"]) == ["0.25"]
    monkeypatch.undo()

    # without --resume or --overwrite the unfinished search is not thrown away
    expect_error(capsys, train_argv(data, out), "--resume", "sigma search")
    assert main(train_argv(data, out, "--resume")) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert without_timings(resumed) == without_timings(whole)
    assert not (out / "sigma-search").exists()


def test_an_interrupted_sigma_search_can_be_started_afresh_with_overwrite(tmp_path, capsys,
                                                                         monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    _ctrl_c_at_optimizer_step(monkeypatch, 8)  # the second trial's first epoch
    assert main(train_argv(data, out, "--epochs", "1")) == 130
    capsys.readouterr()
    monkeypatch.undo()
    assert (out / "sigma-search").is_dir()
    assert main(train_argv(data, out, "--epochs", "1", "--overwrite")) == 0
    assert not (out / "sigma-search").exists() and (out / "results.json").is_file()


# ---------------------------------------------------------------------------------------------
# 8. --epochs on resume


def test_resume_with_fewer_epochs_than_already_run_is_refused(finished, capsys):
    out, data = finished
    before = snapshot(out)
    expect_error(capsys, [*train_argv(data, out, *SIGMA1), "--resume", "--epochs", "1"],
                 "--epochs 1", "2 epochs")
    assert snapshot(out) == before


# ---------------------------------------------------------------------------------------------
# 9. contradictory options


def test_resume_and_overwrite_together_are_refused(finished, capsys):
    out, data = finished
    before = snapshot(out)
    expect_error(capsys, [*train_argv(data, out, *SIGMA1), "--resume", "--overwrite"],
                 "--resume", "--overwrite")
    assert snapshot(out) == before


def test_test_fraction_with_a_test_file_is_refused(tmp_path, capsys):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = tiny_csv(tmp_path / "test.csv", n=40, seed=2)
    expect_error(capsys, train_argv(train, tmp_path / "o", "--test-data", str(test),
                                    "--test-fraction", "0.3"), "--test-fraction", "--test-data")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("how", ["same path", "same bytes"])
def test_a_test_file_equal_to_the_training_file_is_refused(tmp_path, capsys, how):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = train
    if how == "same bytes":
        test = tmp_path / "copy.csv"
        test.write_bytes(train.read_bytes())
    expect_error(capsys, train_argv(train, tmp_path / "o", "--test-data", str(test)),
                 "--test-data", "training")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# 10, 11, 15. absurd numbers are refused before anything loads or trains


def test_absurd_thread_count_is_refused_naming_the_cores(tmp_path, capsys):
    # checked before the data load: the missing data file is not reached
    expect_error(capsys, train_argv(tmp_path / "nope.csv", tmp_path / "o", "--threads", "100000"),
                 "--threads", f"{os.cpu_count()} CPU cores", absent=("nope.csv",))


def test_absurd_epoch_count_is_refused(tmp_path, capsys):
    from sol_ext.driver.config import TrainConfig

    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=10 ** 20).validate()
    expect_error(capsys, train_argv(tmp_path / "nope.csv", tmp_path / "o", "--epochs",
                                    "99999999999999999999"), "--epochs", "100000",
                 absent=("nope.csv",))


@pytest.mark.parametrize("seed", ["-1", str(2**63), str(2**64 - 1)])
def test_a_seed_outside_int64_is_refused_by_name(tmp_path, capsys, seed):
    expect_error(capsys, train_argv(tmp_path / "nope.csv", tmp_path / "o", "--seed", seed),
                 f"seed must be in 0 … 2**63 - 1, got {seed}", absent=("nope.csv", "Overflow"))


@pytest.mark.parametrize("flag,value", [("--weight-decay", "inf"), ("--lr", "inf"),
                                        ("--margin", "inf"), ("--disc-weight", "nan"),
                                        ("--cs-theta", "inf"), ("--lr", "nan")])
def test_non_finite_numbers_are_refused_naming_the_flag(tmp_path, capsys, flag, value):
    expect_error(capsys, train_argv(tmp_path / "nope.csv", tmp_path / "o", flag, value),
                 f"{flag} {value}", "finite", absent=("diverged", "nope.csv"))


def test_every_float_setting_must_be_finite():
    import dataclasses

    from sol_ext.driver.config import TrainConfig

    floats = [f.name for f in dataclasses.fields(TrainConfig)
              if isinstance(getattr(TrainConfig(), f.name), float)]
    assert {"lr", "margin", "disc_weight", "kappa"} <= set(floats)
    for name in floats + ["cs_theta", "weight_decay"]:  # weight_decay: "auto" or a number
        for bad in (float("inf"), float("nan")):
            with pytest.raises(ValueError):
                TrainConfig(**{name: bad}).validate()


# ---------------------------------------------------------------------------------------------
# 16, 21. the validation split


def test_a_failing_validation_split_names_val_fraction(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [(i, -i, 20 + i % 3) for i in range(5)])
    expect_error(capsys, train_argv(data, tmp_path / "o", *SIGMA1), "--val-fraction",
                 absent=("--test-fraction",))


def test_a_tiny_fitted_part_is_warned_about(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    assert main(train_argv(data, tmp_path / "o", *SIGMA1, "--val-fraction", "0.9",
                           "--epochs", "1")) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning:" in err[0] and "--val-fraction" in err[0], err
    # the usual split of the same data says nothing
    assert main(train_argv(data, tmp_path / "o2", *SIGMA1, "--epochs", "1")) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------
# 18. output paths that cannot be written


def test_output_that_is_a_file_is_refused(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    expect_error(capsys, train_argv(data, afile, *SIGMA1), "--output", "is a file, expected a folder",
                 absent=("Errno",))
    expect_error(capsys, train_argv(data, afile / "sub", *SIGMA1), "--output", "is a file",
                 absent=("Errno",))
    assert afile.read_text() == "keep me"


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_output_where_no_folder_can_be_made_is_refused(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    expect_error(capsys, train_argv(data, "/proc/sol-ext-x", *SIGMA1), "--output /proc/sol-ext-x",
                 "cannot create the folder", absent=("Errno",))


def test_audit_predict_export_outputs_that_are_folders_are_refused(finished, tmp_path, capsys):
    out, data = finished
    folder = tmp_path / "afolder"
    folder.mkdir()
    before = snapshot(out)
    for argv, flag in ((["audit", str(out), "--csv", str(folder)], "--csv"),
                       (["predict", str(out), "--data", str(data), "--output", str(folder)], "--output"),
                       (["export", str(out), "--output", str(folder)], "--output")):
        expect_error(capsys, argv, f"{flag} {folder}", "is a folder, expected a file path",
                     absent=(".tmp", "Errno"))
    afile = tmp_path / "afile"
    afile.write_text("x")
    expect_error(capsys, ["audit", str(out), "--csv", str(afile / "a.csv")], "--csv",
                 "is a file", absent=(".tmp", "Errno"))
    assert list(folder.iterdir()) == [] and snapshot(out) == before


# ---------------------------------------------------------------------------------------------
# 23. the default output folder


def test_default_output_names_paper_and_no_noise(tmp_path, capsys, monkeypatch):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = tiny_csv(tmp_path / "test.csv", n=40, seed=2)
    monkeypatch.chdir(tmp_path)
    base = ["train", "--data", str(train), "--test-data", str(test), *FAST, "--epochs", "1"]
    assert main([*base, *SIGMA1]) == 0
    assert main([*base, "--paper"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "train-sol-none-seed0", "train-sol-paper-none-seed0"]

    from sol_ext.driver.config import TrainConfig
    from sol_ext.driver.options import default_output as _default_output

    assert _default_output(TrainConfig(), paper=True) == Path("runs/abalone-sol-paper-gaussian0.3-seed0")
    assert _default_output(TrainConfig(), paper=False) == Path("runs/abalone-sol-gaussian0.3-seed0")


# ---------------------------------------------------------------------------------------------
# 20. one unit per results table


def test_results_table_shows_label_mae_in_label_units(tmp_path):
    from sol_ext.driver.report import format_table

    results = {"config": {"method": "sol", "noise": "gaussian", "kappa": 0.3},
               "data": {"name": "grid", "step": 0.01, "min_value": 0.0},
               "test": {"mae": 0.636, "cs": 40.0, "qwk": 0.5, "macro_mae": 0.7}, "cs_theta": 0.02,
               "labels_changed": 3, "label_noise_given": {"mae": 37.98},
               "label_noise_final": {"mae": 30.0}}
    table = format_table([results])
    assert "0.380->0.300" in table and "37.98" not in table
    assert "label units" in table.splitlines()[0]


@pytest.mark.parametrize("flags,needle", [
    (["--tau", "1000000"], "tau=1000000 makes every pair"),
    (["--sigma", "1e300"], "sigma=1e+300 ranks is wider than the data's"),
])
def test_settings_that_leave_no_order_to_learn_are_refused(tmp_path, capsys, flags, needle):
    data = tiny_csv(tmp_path / "d.csv")
    code = main(["train", "--data", str(data), "--epochs", "1", "--output", str(tmp_path / "o"),
                 "--batch-size", "16", "--quiet", "--no-plots", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("sol-ext: error:") and needle.replace("=", " ") in err.replace("=", " ")


def test_a_weights_file_of_other_pickled_objects_is_refused_without_unsafe_advice(tmp_path):
    pytest.importorskip("torchvision")
    import collections
    import pickle

    from sol_ext.driver.encoders import build_encoder

    path = tmp_path / "w.pth"
    with open(path, "wb") as f:
        pickle.dump(collections.OrderedDict(a=1), f)
    with pytest.raises(ValueError, match="pickled objects other than tensors") as info:
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(path))
    assert "weights_only" not in str(info.value)
    path.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a torch file") as info:
        build_encoder("resnet18", (3, 32, 32), 8, weights=str(path))
    assert "weights_only" not in str(info.value)


def test_a_negative_disc_weight_is_refused_before_the_data_is_read(tmp_path, capsys):
    """It used to pass the configuration's checks and fail only when the loss was built, after the
    data had been loaded (and, with --sigma auto, inside the search)."""
    from sol_ext.driver.config import TrainConfig

    with pytest.raises(ValueError, match="disc weight must be >= 0"):
        TrainConfig(disc_weight=-1.0).validate()
    expect_error(capsys, train_argv(tmp_path / "nope.csv", tmp_path / "o", "--disc-weight", "-1"),
                 "disc weight must be >= 0", absent=("nope.csv",))


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
