"""A user's own table on the command line, start to finish: what the template of settings adds to
it, which device a run uses, how the data layer's warnings show, the label scale, text columns,
ids and missing cells."""

from __future__ import annotations

import torch

from common import tiny_csv, write_csv
from sol_ext.driver.cli import build_parser, main
from sol_ext.driver.options import train_config

FAST = ["--epochs", "1", "--sigma", "1", "--batch-size", "16", "--embedding-dim", "4",
        "--hidden", "16"]


def resolved(argv: list[str]):
    """The TrainConfig that ``sol-ext train ARGV`` runs with."""
    args = build_parser().parse_args(["train", *argv])
    args.argv = ["train", *argv]
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
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
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
    expect_error(capsys, ["train", "--data", str(data), "--test-fraction", "0", "--print-config"],
                 "--test-fraction 0", "--test-data")
    expect_error(capsys, ["train", "--label-step", "2", "--print-config"], "--label-step", "built-in")
    expect_error(capsys, ["train", "--data", str(data), "--label-min", "9", "--label-max", "3",
                          "--print-config"], "--label-min 9", "--label-max 3")
    expect_error(capsys, ["train", "--data", str(data), "--test-label-column", "grade", "--print-config"],
                 "--test-label-column", "--test-data")
