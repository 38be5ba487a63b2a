"""Nothing a user keeps is written over by predict/export/audit/compare/train; the exported
program is safe to call; the command's conventions (--version, Ctrl-C, py.typed)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common import REPO_ROOT, expect_error, tiny_csv
from sol_ext.driver.cli import main

ROOT = REPO_ROOT
FAST = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16",
        "--lr", "0.01", "--quiet", "--no-plots", "--sigma", "1"]


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 2-epoch run with its predictions, audit and export (the tests copy it before
    changing it)."""
    root = tmp_path_factory.mktemp("outputs")
    data = tiny_csv(root / "d.csv")
    out = root / "run"
    assert main(["train", "--data", str(data), "--output", str(out), *FAST]) == 0
    for argv in (["predict", str(out), "--data", str(data)], ["audit", str(out)],
                 ["export", str(out)]):
        assert main(argv) == 0
    return out, data


@pytest.fixture
def own_run(run, tmp_path):
    """A copy of the run that a test may change, with a copy of its data beside it."""
    out, data = run
    shutil.copytree(out, tmp_path / "run")
    shutil.copy(data, tmp_path / "d.csv")
    return tmp_path / "run", tmp_path / "d.csv"


# ---------------------------------------------------------------------------------------------
# 1. the run's own files, the input data and other existing files are kept


@pytest.mark.parametrize("name", ["best.pt", "checkpoint.pt", "results.json", "audit.csv",
                                  "model.pt2", "model.pt2.json"])
def test_predict_refuses_to_write_over_the_runs_files(run, capsys, name):
    out, data = run
    before = snapshot(out)
    expect_error(capsys, ["predict", str(out), "--data", str(data), "--output", str(out / name),
                          "--overwrite"], f"--output {out / name}", "written by sol-ext")
    assert snapshot(out) == before


def test_predict_refuses_to_write_over_its_input_even_with_overwrite(run, tmp_path, capsys):
    out, _ = run
    data = tiny_csv(tmp_path / "x.csv", n=30, seed=3)
    before = data.read_bytes()
    for extra in ([], ["--overwrite"]):
        expect_error(capsys, ["predict", str(out), "--data", str(data), "--output", str(data),
                              *extra], f"--output {data}", "--data file")
    assert data.read_bytes() == before


def test_predict_refuses_to_write_over_the_runs_training_data(run, capsys):
    out, data = run
    before = data.read_bytes()
    other = tiny_csv(data.parent / "other.csv", n=30, seed=4)
    expect_error(capsys, ["predict", str(out), "--data", str(other), "--output", str(data),
                          "--overwrite"], f"--output {data}", "training data")
    assert data.read_bytes() == before


def test_the_runs_data_are_kept_and_found_from_any_working_folder(tmp_path, monkeypatch, capsys):
    """A run saves its data paths as typed: a relative one is read from the folder training ran in."""
    monkeypatch.chdir(tmp_path)
    data = tiny_csv(tmp_path / "d.csv")
    shutil.copy(data, tmp_path / "other.csv")
    assert main(["train", "--data", "d.csv", "--output", "run", *FAST]) == 0
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    before = data.read_bytes()
    for argv, flag in ((["predict", "../run", "--data", "../other.csv", "--output"], "--output"),
                       (["audit", "../run", "--in-sample", "--csv"], "--csv"),
                       (["export", "../run", "--output"], "--output")):
        expect_error(capsys, [*argv, "../d.csv", "--overwrite"], f"{flag} ../d.csv", "is the training data of ../run")
    assert data.read_bytes() == before
    # the out-of-sample audit retrains on the run's data, read from where training ran
    assert main(["audit", "../run", "--folds", "2", "--csv", "audit.csv"]) == 0, capsys.readouterr().err
    assert (tmp_path / "sub" / "audit.csv").read_text().startswith("index,")


def test_a_runs_paths_are_read_from_where_it_was_trained(tmp_path):
    from sol_ext.driver.checkpoint import run_paths

    (tmp_path / "d.csv").write_text("a,label\n1,2\n")
    (tmp_path / "abalone").mkdir()  # a folder named like a built-in data set: the name still means the set
    config = {"data": "d.csv", "test_data": "abalone", "weights": "gone.pt"}
    assert run_paths(config, str(tmp_path)) == {"data": str(tmp_path / "d.csv"), "test_data": "abalone",
                                                "weights": "gone.pt"}  # a file no longer there: as typed
    assert run_paths(config, None) == config  # a run saved before the folder was recorded
    assert run_paths({"data": str(tmp_path / "d.csv")}, "/elsewhere")["data"] == str(tmp_path / "d.csv")


def test_the_files_of_an_input_folder_are_kept(tmp_path):
    """An image folder's data are its labels.csv and images: neither is written over, even with
    --overwrite; a new file there, or a run folder kept inside it, changes no data."""
    from sol_ext.driver.errors import UsageError
    from sol_ext.driver.outputs import check_output, check_run_inputs

    folder = tmp_path / "imgs"
    (folder / "img").mkdir(parents=True)
    (folder / "labels.csv").write_text("path,label\nimg/0.png,3\n")
    (folder / "img" / "0.png").write_bytes(b"an image")
    inputs = [("the training data of run", str(folder))]
    for target in (folder / "labels.csv", folder / "img" / "0.png"):
        with pytest.raises(UsageError, match=rf"--output {target}: is a file of the training data of run "
                                             rf"\({folder}\), a folder of data"):
            check_output(str(target), "--output", inputs=inputs, overwrite=True)
    assert check_output(str(folder / "new.csv"), "--output", inputs=inputs) == folder / "new.csv"
    run = folder / "runs" / "mine"
    run.mkdir(parents=True)
    (run / "best.pt").write_bytes(b"a run's file")
    check_run_inputs(run, "--output", inputs)  # train --output inside the data folder, rerun
    assert check_output(str(run / "predictions.csv"), "--output", inputs=inputs) == run / "predictions.csv"


def test_the_default_output_is_never_the_input(own_run, capsys):
    out, data = own_run
    shutil.copy(data, out / "predictions.csv")  # data kept where predict writes by default
    before = (out / "predictions.csv").read_bytes()
    expect_error(capsys, ["predict", str(out), "--data", str(out / "predictions.csv")],
                 f"--output {out / 'predictions.csv'}", "--data file")
    assert (out / "predictions.csv").read_bytes() == before


def test_an_existing_file_is_replaced_only_with_overwrite(run, tmp_path, capsys):
    out, data = run
    mine = tmp_path / "mine.csv"
    mine.write_text("my own table\n")
    expect_error(capsys, ["predict", str(out), "--data", str(data), "--output", str(mine)],
                 f"--output {mine}", "--overwrite")
    assert mine.read_text() == "my own table\n"
    assert main(["predict", str(out), "--data", str(data), "--output", str(mine),
                 "--overwrite"]) == 0
    assert mine.read_text().startswith("id,prediction")


def test_a_rerun_replaces_the_commands_own_default_outputs(own_run, capsys):
    out, data = own_run
    for argv in (["predict", str(out), "--data", str(data)], ["audit", str(out)],
                 ["export", str(out)],
                 ["predict", str(out), "--data", str(data), "--output", str(out / "predictions.csv")]):
        assert main(argv) == 0, capsys.readouterr().err
    assert {"predictions.csv", "audit.csv", "model.pt2", "model.pt2.json"} <= set(snapshot(out))


@pytest.mark.parametrize("name,needle", [
    ("model.json", "sidecar"),             # a program named .json would be taken for a sidecar
    ("best.pt", "written by sol-ext"),
    ("checkpoint.pt", "written by sol-ext"),
    ("results", "results.json"),            # its sidecar would replace results.json
    ("audit.csv", "written by sol-ext"),
])
def test_export_refuses_to_write_over_the_runs_files(run, capsys, name, needle):
    out, _ = run
    before = snapshot(out)
    expect_error(capsys, ["export", str(out), "--output", str(out / name), "--overwrite"],
                 f"--output {out / name}", needle)
    assert snapshot(out) == before


def test_export_refuses_an_existing_file_or_sidecar_without_overwrite(run, tmp_path, capsys):
    out, _ = run
    mine = tmp_path / "mydata.csv"
    mine.write_text("a,b\n1,2\n")
    expect_error(capsys, ["export", str(out), "--output", str(mine)], f"--output {mine}",
                 "--overwrite")
    (tmp_path / "prog.pt2.json").write_text("{}")  # the sidecar of prog.pt2
    expect_error(capsys, ["export", str(out), "--output", str(tmp_path / "prog.pt2")],
                 "prog.pt2.json", "--overwrite")
    assert mine.read_text() == "a,b\n1,2\n" and not (tmp_path / "prog.pt2").exists()
    assert main(["export", str(out), "--output", str(tmp_path / "prog.pt2"), "--overwrite"]) == 0
    assert json.loads((tmp_path / "prog.pt2.json").read_text())["format"] == "sol_ext exported model"


def test_a_pt2_and_an_onnx_export_of_one_run_keep_a_sidecar_each(own_run, capsys):
    """The second export's sidecar is its own: the .pt2's record of its intervals stays, and the
    reverse."""
    pytest.importorskip("onnxscript")
    out, _ = own_run
    assert main(["export", str(out), "--interval", "0.9"]) == 0
    assert main(["export", str(out), "--format", "onnx"]) == 0
    assert json.loads((out / "model.pt2.json").read_text())["intervals"]["coverage"] == 0.9
    assert "intervals" not in json.loads((out / "model.onnx.json").read_text())
    assert main(["export", str(out), "--format", "onnx", "--interval", "0.8"]) == 0
    assert main(["export", str(out)]) == 0
    assert json.loads((out / "model.onnx.json").read_text())["intervals"]["coverage"] == 0.8
    assert "intervals" not in json.loads((out / "model.pt2.json").read_text())
    assert not (out / "model.json").exists()
    capsys.readouterr()


def test_no_command_writes_over_the_onnx_export_or_a_named_export(own_run, capsys):
    """RUN/model.onnx and an export of another name into the run folder (known by its sidecar's
    content) are sol-ext's files: predict, audit and an export of the other format refuse them even
    with --overwrite."""
    pytest.importorskip("onnxscript")
    out, data = own_run
    assert main(["export", str(out), "--format", "onnx"]) == 0
    assert main(["export", str(out), "--output", str(out / "iv.pt2")]) == 0
    before = snapshot(out)
    for target in (out / "model.onnx", out / "model.onnx.json", out / "iv.pt2", out / "iv.pt2.json"):
        other_format = "onnx" if ".pt2" in target.name else "pt2"
        for argv, flag in ((["predict", str(out), "--data", str(data), "--output", str(target)], "--output"),
                           (["audit", str(out), "--in-sample", "--csv", str(target)], "--csv"),
                           (["export", str(out), "--format", other_format, "--output", str(target)], "--output")):
            refused = "sidecar" if argv[0] == "export" and target.suffix == ".json" else "written by sol-ext"
            expect_error(capsys, [*argv, "--overwrite"], f"{flag} {target}", refused)
    assert snapshot(out) == before


@pytest.mark.parametrize("form, name", [("pt2", "iv.pt2"), ("onnx", "iv.onnx")])
def test_an_export_of_a_name_is_exported_again_with_overwrite(own_run, capsys, form, name):
    """An export into the run folder under a name of one's own: the same format again replaces it
    and its sidecar with --overwrite, and without it is refused pointing at --overwrite."""
    if form == "onnx":
        pytest.importorskip("onnxscript")
    out, _ = own_run
    target = out / name
    assert main(["export", str(out), "--format", form, "--interval", "0.9", "--output", str(target)]) == 0
    expect_error(capsys, ["export", str(out), "--format", form, "--output", str(target)],
                 f"--output {target}", "earlier", "--overwrite")
    assert json.loads((out / f"{name}.json").read_text())["intervals"]["coverage"] == 0.9
    assert main(["export", str(out), "--format", form, "--output", str(target), "--overwrite"]) == 0
    assert "intervals" not in json.loads((out / f"{name}.json").read_text())
    capsys.readouterr()


def test_audit_refuses_to_write_over_the_runs_files_and_its_data(run, capsys):
    out, data = run
    before, data_before = snapshot(out), data.read_bytes()
    for target, needle in ((out / "best.pt", "written by sol-ext"),
                           (out / "predictions.csv", "written by sol-ext"),
                           (data, "training data")):
        expect_error(capsys, ["audit", str(out), "--csv", str(target), "--overwrite"],
                     f"--csv {target}", needle)
    assert snapshot(out) == before and data.read_bytes() == data_before


def test_train_refuses_data_that_it_would_write_over(own_run, capsys):
    out, _ = own_run
    before = snapshot(out)
    expect_error(capsys, ["train", "--data", str(out / "results.json"), "--output", str(out),
                          "--overwrite", *FAST], "--output", "results.json")
    assert snapshot(out) == before


def test_train_overwrite_removes_the_old_run_s_outputs_and_keeps_one_s_own_files(own_run, capsys):
    """train --overwrite starts afresh: the old model's predictions, audit and exports (model.pt2,
    an export of another name, their sidecars) go with its checkpoints; a note of one's own stays."""
    out, data = own_run
    assert main(["export", str(out), "--output", str(out / "named.pt2")]) == 0
    (out / "notes.txt").write_text("mine")
    (out / "mine.json").write_text('{"format": "something else"}')
    old = {"predictions.csv", "audit.csv", "model.pt2", "model.pt2.json", "named.pt2", "named.pt2.json"}
    assert old <= set(snapshot(out))
    assert main(["train", "--data", str(data), "--output", str(out), "--overwrite", "--seed", "5", *FAST]) == 0
    left = set(snapshot(out))
    assert not old & left, old & left
    assert {"notes.txt", "mine.json", "best.pt", "results.json"} <= left
    assert (out / "notes.txt").read_text() == "mine"


def test_train_overwrite_refuses_data_among_the_old_run_s_outputs(own_run, capsys):
    """--overwrite would remove the old run's predictions.csv: as --test-data it is refused first."""
    out, data = own_run
    before = snapshot(out)
    expect_error(capsys, ["train", "--data", str(data), "--test-data", str(out / "predictions.csv"),
                          "--output", str(out), "--overwrite", *FAST], "--output", "predictions.csv")
    assert snapshot(out) == before


def test_compare_refuses_a_folder_of_other_files(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    expect_error(capsys, ["compare", "--data", str(data), "--output", str(folder), "--seeds", "0",
                          "--kappas", "0.3", "--noises", "", "--methods", "l1", "--epochs", "1"],
                 f"--output {folder}", "notes.txt")
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


# ---------------------------------------------------------------------------------------------
# 2. the exported program


@pytest.fixture(scope="module")
def program(run):
    out, _ = run
    return torch.export.load(str(out / "model.pt2")).module(), json.loads((out / "model.pt2.json").read_text())


def test_a_row_with_nan_or_inf_gives_nan_not_a_rank(program):
    module, side = program
    x = torch.tensor([[0.5, -0.2], [float("nan"), float("nan")], [float("inf"), float("inf")],
                      [float("-inf"), 0.0], [1e300, 0.0]], dtype=torch.float64)
    prediction, expected, probabilities = module(x)
    assert torch.isnan(prediction[1:]).all() and torch.isnan(expected[1:]).all()
    assert torch.isnan(probabilities[1:]).all()
    assert float(prediction[0]) in side["label_values"]
    assert torch.isfinite(probabilities[0]).all() and abs(float(probabilities[0].sum()) - 1) < 1e-9


def test_float64_input_is_cast_inside(program):
    module, _ = program
    x = torch.tensor([[0.5, -0.2], [1.5, 0.7]])
    for a, b in zip(module(x), module(x.double())):
        assert torch.equal(a, b)


def test_an_image_program_gives_nan_for_a_nan_pixel_and_takes_float64(tmp_path, monkeypatch):
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    (tmp_path / "faces").mkdir()
    rows = ["path,label"]
    for i in range(24):
        pixels = np.clip(rng.normal(50 + 40 * (i % 4), 20, (12, 12, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(tmp_path / "faces" / f"{i}.png")
        rows.append(f"{i}.png,{i % 4}")
    (tmp_path / "faces" / "list.csv").write_text("\n".join(rows) + "\n")
    assert main(["train", "--data", "faces/list.csv", "--image-size", "8", "--epochs", "1",
                 "--batch-size", "8", "--sigma", "1", "--quiet", "--no-plots", "--output", "run",
                 "--workers", "0", "--val-fraction", "0"]) == 0
    assert main(["export", "run"]) == 0
    module = torch.export.load("run/model.pt2").module()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    x[1, 0, 0, 0] = float("nan")
    prediction, expected, probabilities = module(x)
    assert torch.isnan(prediction[1]) and torch.isnan(expected[1]) and torch.isnan(probabilities[1]).all()
    assert torch.isfinite(prediction[[0, 2]]).all() and torch.isfinite(probabilities[[0, 2]]).all()
    assert torch.allclose(module(x.double())[0], prediction, equal_nan=True)  # cast inside


def test_the_sidecar_names_what_the_readme_says(program):
    _, side = program
    assert side["inputs"]["feature_names"] == ["a", "b"] and side["inputs"]["shape"] == ["N", 2]
    assert side["label_values"] == [float(v) for v in range(20, 30)]


def test_export_into_a_folder_that_cannot_be_written_gives_one_line(run, capsys):
    out, _ = run
    expect_error(capsys, ["export", str(out), "--output", "/proc/sol-ext-model.pt2"],
                 "/proc/sol-ext-model.pt2")


# ---------------------------------------------------------------------------------------------
# 3. conventions


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("command,patch", [
    ("predict", "sol_ext.driver.predict.write_prediction_csv"),
    ("export", "torch.export.save"),
    ("audit", "sol_ext.driver.audit.audit_run"),
])
def test_ctrl_c_says_interrupted_and_writes_nothing(own_run, tmp_path, capsys, monkeypatch,
                                                    command, patch):
    out, data = own_run
    target = tmp_path / "new.out"
    flag = "--csv" if command == "audit" else "--output"
    argv = {"predict": ["predict", str(out), "--data", str(data)], "export": ["export", str(out)],
            "audit": ["audit", str(out)]}[command] + [flag, str(target)]
    before = snapshot(tmp_path)
    monkeypatch.setattr(patch, _interrupt)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.startswith("sol-ext: interrupted") and len(err.strip().splitlines()) == 1, err
    assert snapshot(tmp_path) == before


def test_version_flags(capsys):
    import sol_ext

    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as stop:
            main([flag])
        assert stop.value.code == 0
        assert capsys.readouterr().out.strip() == f"sol-ext {sol_ext.__version__}"
    proc = subprocess.run([sys.executable, "-m", "sol_ext.driver", "--version"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == f"sol-ext {sol_ext.__version__}"


@pytest.mark.parametrize("flag", ["--help", "-h", "--version", "-V"])
def test_help_and_version_answer_without_importing_torch(flag, monkeypatch):
    """The launcher answers sol-ext --help and --version alone without loading sol_ext (torch): the
    same text as the program's own parser gives."""
    import io
    from contextlib import redirect_stdout

    from sol_ext.driver.cli import build_parser

    monkeypatch.setenv("COLUMNS", "100")
    code = ("import sys, sol_ext_launcher\n"
            f"sys.argv = ['sol-ext', {flag!r}]\n"
            "status = sol_ext_launcher.main()\n"
            "print('torch loaded:', 'torch' in sys.modules, 'status:', status)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    answer, last = proc.stdout.rsplit("torch loaded:", 1)
    assert last.split() == ["False", "status:", "0"]
    program = io.StringIO()
    with redirect_stdout(program), pytest.raises(SystemExit):
        build_parser().parse_args([flag])
    assert answer == program.getvalue()


def test_the_command_ends_without_the_shutdown_but_runs_exit_handlers_and_flushes():
    # end_process skips the interpreter's teardown (0.3 s with torch loaded); what a user relies on stays
    code = ("import atexit, sys\n"
            "from sol_ext.driver.cli import end_process\n"
            "atexit.register(lambda: print('handler ran'))\n"
            "sys.stdout.write('unflushed output; ')\n"
            "end_process(3)\n"
            "print('never printed')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 3
    assert proc.stdout == "unflushed output; handler ran\n"
    proc = subprocess.run([sys.executable, "-m", "sol_ext.driver", "predict"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "RUN_DIR" in proc.stderr  # argparse's own exit is kept


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


def test_the_help_and_the_api_page_say_what_the_commands_take():
    """predict --help names every file kind --data reads, the top-level help names both export
    formats, and docs/api/index.md gives load_run's signature as the code has it."""
    import inspect

    from sol_ext.driver.cli import build_parser
    from sol_ext.driver.model import load_run

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a.choices, dict)).choices
    data_help = next(a.help for a in commands["predict"]._actions if a.dest == "data")
    assert all(kind in data_help for kind in ("CSV", "TSV", "Parquet", "Feather", ".npz", "image folder"))
    assert ".pt2" in parser.format_help() and "ONNX" in parser.format_help()
    page = (ROOT / "docs" / "api" / "index.md").read_text(encoding="utf-8")
    shown = ", ".join(f"{p.name}={p.default!r}".replace("'", '"') if p.default is not p.empty else p.name
                      for p in inspect.signature(load_run).parameters.values())
    assert f"sol_ext.driver.load_run({shown})" in page, shown
