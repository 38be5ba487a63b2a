"""``sol-ext train --config FILE`` and ``--print-config``: the file's settings sit between the defaults
(or the paper's settings) and the options typed on the command line; what --print-config writes,
--config reads back to the same TrainConfig; bad files are refused with one line naming the file and
the key."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common import REPO_ROOT, tiny_csv
from sol_ext.driver.cli import build_parser, main
from sol_ext.driver.config import PAPER_SETTINGS, TrainConfig
from sol_ext.driver.config_file import (
    CONFIG_FILE_NAME,
    FIELD_KINDS,
    config_toml,
    read_config_file,
)
from sol_ext.driver.errors import UsageError
from sol_ext.driver.options import train_config


def resolved(argv: list[str]) -> TrainConfig:
    """The TrainConfig that ``sol-ext train ARGV`` runs with (as main() resolves it)."""
    args = build_parser().parse_args(["train", *argv])
    return train_config(args)


def printed(argv: list[str], capsys) -> str:
    """What ``sol-ext train ARGV --print-config`` writes to stdout (it must not train)."""
    capsys.readouterr()
    assert main(["train", *argv, "--print-config"]) == 0
    return capsys.readouterr().out


def one_error_line(argv: list[str], capsys) -> str:
    """The one error line of ``sol-ext train ARGV``, which must exit with status 2."""
    capsys.readouterr()
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sol-ext: error: "), err
    return err


ROUND_TRIPS = [
    [],
    ["--paper"],
    ["--paper", "--tau", "2", "--sigma", "0.5"],
    ["--data", 'my "data" \u00e9t\u00e9\\x.csv', "--label-column", "age", "--delimiter", ";",
     "--test-fraction", "0.25", "--noise", "laplacian", "--kappa", "0.5"],
    ["--method", "l1", "--hidden", "64,32,8", "--embedding-dim", "8", "--no-normalize", "--refine",
     "--patience", "3", "--cs-theta", "0.5", "--weight-decay", "1e-05", "--weight-ema", "0.99",
     "--lr", "3e-4", "--amp", "--label-noise", "1.5", "--epochs", "7", "--seed", "3"],
    ["--encoder", "resnet18", "--weights", "w.pth", "--image-size", "96", "--augment", "crop",
     "--workers", "0", "--no-refine"],
]


@pytest.mark.parametrize("argv", ROUND_TRIPS, ids=range(len(ROUND_TRIPS)))
def test_printed_settings_read_back_to_the_same_config(argv, tmp_path, capsys, monkeypatch):
    """print -> file in the working folder -> --config gives the TrainConfig of the original command
    line, and prints the same text again."""
    monkeypatch.chdir(tmp_path)  # the file's folder: its relative paths read as typed
    text = printed(argv, capsys)
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    assert resolved(["--config", str(path)]) == resolved(argv)
    assert printed(["--config", str(path)], capsys) == text


def test_every_setting_has_a_toml_form_that_reads_back(tmp_path, monkeypatch):
    """Each TrainConfig field has a TOML kind; a config with every optional field set round-trips."""
    monkeypatch.chdir(tmp_path)  # the file's folder: its relative paths read as written
    assert set(FIELD_KINDS) == {f.name for f in dataclasses.fields(TrainConfig)}
    config = TrainConfig(data="a.csv", test_data="b.csv", label_column="y", delimiter="\t",
                         noise="uniform", encoder="resnet18", weights="w.pth", image_size=32,
                         augment="none", workers=2, refine=False, patience=2, cs_theta=1.5,
                         sigma=0.75, label_noise=0.5, weight_decay=0.0, weight_ema=0.0,
                         hidden=(3, 2), lr=1e-30, margin=0.0).validate()
    path = tmp_path / "all.toml"
    path.write_text(config_toml(config))
    assert TrainConfig(**read_config_file(path)) == config


def test_the_readme_example_file_is_read(tmp_path):
    readme = (REPO_ROOT / "docs" / "driver.md").read_text(encoding="utf-8")
    part = readme[readme.index("**Settings in a file**"):]
    path = tmp_path / "run.toml"
    path.write_text(re.search(r"```toml\n(.*?)```", part, re.S).group(1))
    cfg = resolved(["--config", str(path)])
    assert (cfg.data, cfg.label_column, cfg.epochs, cfg.hidden) == (
        str(tmp_path / "my.csv"), "age", 40, (256, 128))  # beside the file


def test_command_line_options_override_the_file(tmp_path):
    """An option typed on the command line wins over the file, even one equal to its default; the
    file wins over the defaults; what neither sets keeps its default."""
    path = tmp_path / "run.toml"
    path.write_text("epochs = 7\nlr = 0.01\ntau = 2\nmethod = \"l1\"\n")
    cfg = resolved(["--config", str(path), "--lr", "0.001", "--tau", "0"])
    assert (cfg.epochs, cfg.lr, cfg.tau, cfg.method) == (7, 0.001, 0, "l1")
    assert cfg.lr == TrainConfig().lr  # typed, and equal to the default: still the command line's
    assert cfg.batch_size == TrainConfig().batch_size and cfg.sigma == "auto"


def test_the_file_sits_between_the_paper_settings_and_the_command_line(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("tau = 2\nmargin = 0.5\n")
    cfg = resolved(["--paper", "--config", str(path), "--margin", "0.1"])
    assert cfg.tau == 2 and cfg.margin == 0.1  # the file over --paper, the command line over the file
    assert cfg.readout == PAPER_SETTINGS["readout"] and cfg.val_fraction == 0.0  # still --paper
    in_file = tmp_path / "paper.toml"
    in_file.write_text("paper = true\ntau = 2\nmargin = 0.5\n")
    assert resolved(["--config", str(in_file), "--margin", "0.1"]) == cfg  # paper = true is --paper


def test_option_spelling_and_whole_numbers_are_accepted(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("embedding-dim = 8\nlr = 1\nsigma = 1\nweight-decay = \"auto\"\n")
    cfg = resolved(["--config", str(path)])
    assert cfg.embedding_dim == 8 and cfg.weight_decay == "auto"
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and isinstance(cfg.sigma, float)
    assert cfg == resolved(["--embedding-dim", "8", "--lr", "1", "--sigma", "1"])


@pytest.mark.parametrize(("text", "words"), [
    ("epoch = 3\n", ["unknown key 'epoch'", "did you mean 'epochs'?"]),
    ("[train]\nepochs = 3\n", ["unknown table [train]", "without a [table]"]),
    ('epochs = "3"\n', ["key 'epochs' must be an integer", 'got "3" (a string)']),
    ("epochs = 3.0\n", ["key 'epochs' must be an integer", "got 3.0 (a number)"]),
    ("lr = true\n", ["key 'lr' must be a number", "(a boolean)"]),
    ('sigma = "wide"\n', ["key 'sigma' must be a number or \"auto\"", 'got "wide"']),
    ("hidden = [128, 1.5]\n", ["key 'hidden' must be a list of integers"]),
    ("normalize = 1\n", ["key 'normalize' must be true or false"]),
    ("data = 3\n", ["key 'data' must be a string"]),
    ("paper = \"yes\"\n", ["key 'paper' must be true or false"]),
    ("embedding_dim = 8\nembedding-dim = 8\n", ["'embedding_dim' and 'embedding-dim' are the same"]),
    ("lr = -1\n", ["learning rate must be > 0, got -1.0"]),
    ('data = ""\n', ["key 'data' is an empty string", "expected a path or a built-in data set's name"]),
    ('test_data = ""\n', ["key 'test_data' is an empty string", "expected a path."]),
    ('output = ""\n', ["key 'output' is an empty string"]),
    ('threads = "4"\n', ["key 'threads' must be an integer"]),
    ('relative_to = "/elsewhere"\n', ["unknown key 'relative_to'"]),  # paths follow the file
    ('missing = "drop"\n', ["--missing 'drop' is not one of skip, impute, error"]),
    ('missing = "mark"\n', ["--missing 'mark' is not one of skip, impute, error"]),  # prediction's
])
def test_bad_settings_are_refused_naming_the_file_and_key(text, words, tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    err = one_error_line(["--config", str(path), "--print-config"], capsys)
    assert f"--config {path}: " in err
    for word in words:
        assert word in err


def test_a_value_refused_for_the_command_line_is_not_blamed_on_the_file(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text("epochs = 3\n")
    err = one_error_line(["--config", str(path), "--lr", "-1", "--print-config"], capsys)
    assert "learning rate must be > 0" in err and str(path) not in err


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p.write_text("epochs = = 3\n"), ["not valid TOML", "line 1"]),
    (lambda p: p.write_bytes(b"data = \"\xff\"\n"), ["not UTF-8 text"]),
    (lambda p: p.mkdir(), ["a folder; expected a TOML file"]),
    (lambda p: None, ["no such file"]),
])
def test_unreadable_files_are_refused_naming_the_file(make, words, tmp_path, capsys):
    path = tmp_path / "run.toml"
    make(path)
    err = one_error_line(["--config", str(path)], capsys)
    assert f"--config {path}: " in err
    for word in words:
        assert word in err


def test_python_before_3_11_asks_for_tomli(tmp_path, monkeypatch):
    path = tmp_path / "run.toml"
    path.write_text("epochs = 3\n")
    monkeypatch.setattr(sys, "version_info", (3, 10, 0, "final", 0))
    monkeypatch.setitem(sys.modules, "tomli", None)  # not installed
    with pytest.raises(UsageError, match=r"needs the tomli package \(pip install tomli\)"):
        read_config_file(path)


def test_a_run_trains_with_the_file_and_keeps_its_settings(tmp_path, capsys):
    """A run from a file has the file's configuration in results.json, and config.toml in the run
    folder reads back to it."""
    data = tiny_csv(tmp_path / "d.csv")
    path = tmp_path / "run.toml"
    path.write_text(f"data = {json.dumps(str(data))}\nepochs = 2\nbatch-size = 16\nembedding_dim = 4\n"
                    f"hidden = [16]\nlr = 0.01\nsigma = 1.0\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(path), "--output", str(out), "--quiet", "--no-plots",
                 "--seed", "1"]) == 0
    expected = resolved(["--config", str(path), "--seed", "1"])
    assert TrainConfig.from_dict(json.loads((out / "results.json").read_text())["config"]) == expected
    assert resolved(["--config", str(out / CONFIG_FILE_NAME)]) == expected


# --------------------------------------------------------------------------------------------------
# Every option, every Unicode plane, and a run's file from another folder

# Three command lines that set, between them, every TrainConfig field to a value other than its
# default (--test-data and --test-fraction exclude each other, as a label noise std and the outlier
# rule do; a text run's options go with no image encoder), and the command's own options --paper, --output and --threads.
EVERY_OPTION = [
    ["--data", "x\U0001F600.csv", "--test-data", "t.csv", "--label-column", "age", "--delimiter", ";",
     "--test-label-column", "true age", "--label-min", "0", "--label-max", "30", "--label-step", "0.5",
     "--id-column", "wine id", "--drop-columns", "a,b", "--categorical", "colour, region",
     "--missing", "impute", "--encoding", "cp1252",
     "--noise", "uniform", "--kappa", "0.5", "--noise-fraction", "0.5", "--encoder", "resnet18",
     "--embedding-dim", "8", "--hidden", "64,32", "--weights", "w.pth", "--image-size", "32",
     "--augment", "crop", "--workers", "1", "--no-normalize", "--sigma", "0.5", "--tau", "2",
     "--margin", "0.5", "--T", "2", "--disc-weight", "0.5", "--beta", "0.8", "--convention",
     "official", "--pairs", "balanced", "--pairs-per-class", "8", "--refine", "--relabel-mass", "0.9",
     "--label-noise", "1.5", "--readout", "nearest", "--momentum", "0.25",
     "--val-fraction", "0.2", "--patience", "3", "--lr", "0.01", "--weight-decay", "0.001",
     "--weight-ema", "0.99", "--epochs", "7", "--batch-size", "32", "--seed", "5", "--device", "cuda",
     "--amp", "--backend", "reference", "--cs-theta", "1.5", "--output", "out dir", "--threads", "1"],
    ["--paper", "--method", "l1", "--test-fraction", "0.3", "--relabel", "outlier", "--no-refine",
     "--data", "mine.csv", "--feature-columns", "a,b"],
    ["--data", "reviews.csv", "--text-column", "review", "--text-encoder", "models/mini lm", "--max-length", "32",
     "--train-layers", "2", "--text-lr", "1e-4", "--warmup", "0.2"],
]


def test_every_option_round_trips_through_print_config(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the files' folder
    default = TrainConfig()
    changed = {f.name for argv in EVERY_OPTION for f in dataclasses.fields(TrainConfig)
               if getattr(resolved(argv), f.name) != getattr(default, f.name)}
    assert changed == {f.name for f in dataclasses.fields(TrainConfig)}  # the test covers them all
    for number, argv in enumerate(EVERY_OPTION):
        text = printed(argv, capsys)
        path = tmp_path / f"every{number}.toml"
        path.write_text(text, encoding="utf-8")
        assert resolved(["--config", str(path)]) == resolved(argv)
        assert printed(["--config", str(path)], capsys) == text
    assert 'output = "out dir"\nthreads = 1\n' in printed(EVERY_OPTION[0], capsys)


def _plane_string(plane: int, count: int = 40) -> str:
    """``count`` characters drawn from the Unicode plane ``plane`` (0 … 16), controls and
    quotes among them in plane 0; no surrogate (not a character on its own)."""
    rng = random.Random(plane)
    chars = []
    while len(chars) < count:
        code = plane * 0x10000 + rng.randrange(0x10000)
        if not 0xD800 <= code <= 0xDFFF:
            chars.append(chr(code))
    if plane == 0:
        chars += ['"', "\\", "'", "\n", "\t", "\x7f", "\x1b", "\u2028"]
    return "".join(chars)


@pytest.mark.parametrize("plane", range(17))
def test_strings_of_every_unicode_plane_round_trip(plane, tmp_path, capsys, monkeypatch):
    """A column name and a data path of characters from any plane (an emoji is outside the BMP)
    are written as TOML and read back to the same strings."""
    monkeypatch.chdir(tmp_path)  # the file's folder
    text = _plane_string(plane)
    argv = ["--data", f"{text}.csv", "--label-column", text, "--delimiter", text[0]]
    printed_text = printed(argv, capsys)
    path = tmp_path / "run.toml"
    path.write_bytes(printed_text.encode("utf-8"))
    assert resolved(["--config", str(path)]) == resolved(argv)
    assert resolved(argv).label_column == text
    assert printed(["--config", str(path)], capsys) == printed_text


def test_a_run_s_config_repeats_it_from_another_folder(tmp_path, capsys, monkeypatch):
    """config.toml of a run trained on a relative path names that run's file by its absolute path,
    and trains on it when read from another folder that has a file of the same name with other
    data."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    tiny_csv(first / "d.csv", seed=0)
    tiny_csv(other / "d.csv", seed=1, num_ranks=6)  # same name, other data
    fast = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16",
            "--lr", "0.01", "--sigma", "1", "--quiet", "--no-plots"]
    monkeypatch.chdir(first)
    assert main(["train", "--data", "d.csv", "--output", "run", *fast]) == 0
    config = first / "run" / CONFIG_FILE_NAME
    assert f"data = {json.dumps(str(first / 'd.csv'))}" in config.read_text()
    monkeypatch.chdir(other)
    assert resolved(["--config", str(config)]).data == str(first / "d.csv")
    assert main(["train", "--config", str(config), "--output", "again", "--quiet", "--no-plots"]) == 0
    before = json.loads((first / "run" / "results.json").read_text())
    again = json.loads((other / "again" / "results.json").read_text())
    assert again["test"] == before["test"] and again["data"] == before["data"]


def test_a_printed_template_reads_its_paths_from_the_file_s_folder(tmp_path, capsys, monkeypatch):
    """--print-config saved into another folder, beside another d.csv, trains on that folder's file
    from any working folder; a path typed on the command line stays the working folder's."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    (there / "sub").mkdir(parents=True)
    tiny_csv(here / "d.csv", seed=0)
    tiny_csv(there / "d.csv", seed=1, num_ranks=6)  # the data the template is saved beside
    tiny_csv(there / "t.csv", seed=2, num_ranks=6)
    monkeypatch.chdir(here)
    template = printed(["--data", "d.csv", "--test-data", "t.csv", "--output", "sub/out",
                        "--epochs", "1", "--batch-size", "16", "--embedding-dim", "4", "--hidden",
                        "16", "--sigma", "1"], capsys)
    assert 'data = "d.csv"' in template and "relative" in template.splitlines()[0]
    (there / "cfg.toml").write_text(template, encoding="utf-8")
    cfg = resolved(["--config", "../there/cfg.toml"])
    assert (cfg.data, cfg.test_data) == (str(Path("../there/d.csv")), str(Path("../there/t.csv")))
    assert resolved(["--config", "../there/cfg.toml", "--data", "d.csv"]).data == "d.csv"
    assert main(["train", "--config", "../there/cfg.toml", "--quiet", "--no-plots"]) == 0
    results = json.loads((there / "sub" / "out" / "results.json").read_text())  # output too
    assert results["config"]["data"] == str(Path("../there/d.csv"))
    assert not (here / "sub").exists()
    monkeypatch.chdir(there)  # from the file's own folder, the paths read as written
    assert resolved(["--config", "cfg.toml"]).data == "d.csv"


def test_a_file_s_missing_data_is_not_taken_from_the_working_folder(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "cfg"
    folder.mkdir()
    path = folder / "run.toml"
    path.write_text('data = "d.csv"\nepochs = 1\n')
    tiny_csv(tmp_path / "d.csv")  # a file of that name here is not the one the file names
    monkeypatch.chdir(tmp_path)
    assert resolved(["--config", str(path)]).data == str(folder / "d.csv")
    assert str(folder / "d.csv") in one_error_line(["--config", str(path), "--quiet"], capsys)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_as_config_is_refused_without_waiting(tmp_path):
    pipe = tmp_path / "run.toml"
    os.mkfifo(pipe)
    root = REPO_ROOT
    proc = subprocess.run([sys.executable, "-m", "sol_ext.driver", "train", "--config", str(pipe)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 2, proc.stderr
    assert f"--config {pipe}: not a regular file (a named pipe" in proc.stderr


def test_a_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "run.toml"
    path.write_bytes(b"\xef\xbb\xbf" + "epochs = 3\nlabel_column = \"\u00e2ge\"\n".encode("utf-8"))
    cfg = resolved(["--config", str(path)])
    assert (cfg.epochs, cfg.label_column) == (3, "\u00e2ge")


def test_output_and_threads_are_read_from_the_file(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "from file"
    path = tmp_path / "run.toml"
    path.write_text(f"data = {json.dumps(str(data))}\noutput = {json.dumps(str(out))}\nthreads = 1\n"
                    f"epochs = 1\nbatch_size = 16\nhidden = [16]\nembedding_dim = 4\nsigma = 1\n")
    text = printed(["--config", str(path)], capsys)
    assert f"output = {json.dumps(str(out))}" in text and "threads = 1" in text
    assert "threads = 2" in printed(["--config", str(path), "--threads", "2"], capsys)  # typed wins
    assert main(["train", "--config", str(path), "--quiet", "--no-plots"]) == 0
    assert (out / "results.json").is_file()
    path.write_text("threads = -1\n")
    err = one_error_line(["--config", str(path), "--print-config"], capsys)
    assert "--threads must be >= 0, got -1" in err


# --------------------------------------------------------------------------------------------------
# One option per setting, generated from its field


def test_each_option_is_generated_from_its_field():
    """The parser has one option per TrainConfig field, spelled as the field, with the field's help;
    --paper's values are the fields' paper values."""
    from sol_ext.driver.config import option_of

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    by_dest = {}
    for action in train._actions:
        if action.help != "==SUPPRESS==":
            by_dest.setdefault(action.dest, action)
    for f in dataclasses.fields(TrainConfig):
        option = option_of(f.name)
        assert option["help"] in by_dest[f.name].help, f.name
    assert PAPER_SETTINGS["readout"] == "nearest" and PAPER_SETTINGS["momentum"] == 0.0
    assert "inference" not in PAPER_SETTINGS


def test_two_config_files_are_refused(tmp_path, capsys):
    """--config twice: the first file would be ignored without a word."""
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text("epochs = 3\n")
    second.write_text("lr = 0.1\n")
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--config", str(first), "--config", str(second), "--print-config"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"--config given twice ({first}, {second}); pass one file" in err
