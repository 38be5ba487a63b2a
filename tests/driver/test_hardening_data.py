"""Bad data files get one clear line naming the file and what was expected (exit status 2), never a
traceback nor a silent misreading: outlier labels, repeated columns, complex arrays, ``.npy`` files
named ``.npz``, oversized images, Python-only advice, named pipes."""

import os
import re
import struct
import warnings
import zlib

import numpy as np
import pytest

from sol_ext.driver.cli import build_parser, main
from sol_ext.driver.data import load_dataset, load_npz, load_table, read_inputs
from sol_ext.driver.errors import command_line_flags, user_error_message

FLAGS = command_line_flags(build_parser())


def cli_error(capsys, tmp_path, data, *needles, extra=()):
    """``sol-ext train --data data``: exit status 2 and one ``sol-ext: error:`` line holding ``needles``."""
    capsys.readouterr()
    code = main(["train", "--data", str(data), "--output", str(tmp_path / "out"), "--quiet",
                 "--epochs", "1", "--no-plots", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sol-ext: error:"), err
    for needle in needles:
        assert needle in err, err
    return err


def write(path, text):
    path.write_text(text)
    return path


def table(path, labels, header="a,label"):
    return write(path, header + "\n" + "".join(f"{i},{v}\n" for i, v in enumerate(labels)))


def no_python_only_arguments(message):
    """Outside "(in Python: ...)", a message names no argument the command line lacks."""
    outside = re.sub(r"\(in Python:[^)]*\)", "", message)
    for name in re.findall(r"(?<![\w-])([A-Za-z_]\w*)=", outside):
        assert name in FLAGS, f"{name}= in {message!r}"
    for name in ("min_value", "max_value", "features_key", "path_column"):  # (--categorical is a flag)
        assert name not in outside, f"{name} in {message!r}"


# --------------------------------------------------------------------------------------------------
# 4: an outlier label must not merge the real ranks


def test_outlier_label_that_merges_ranks_is_refused(tmp_path, capsys):
    data = table(tmp_path / "ages.csv", [*range(1, 11), "1e15"])
    with pytest.raises(ValueError, match=r"ages\.csv.*label column 'label'.*step.*1e\+15"):
        load_table(data)
    err = cli_error(capsys, tmp_path, data, "ages.csv", "'label'", "1e+15", "one rank")
    no_python_only_arguments(err)


def test_outlier_label_in_an_npz_is_refused(tmp_path):
    np.savez(tmp_path / "e.npz", embeddings=np.zeros((11, 2)), labels=np.r_[np.arange(1, 11), 1e15])
    with pytest.raises(ValueError, match=r"e\.npz.*'labels'.*one rank"):
        load_npz(tmp_path / "e.npz")


# --------------------------------------------------------------------------------------------------
# 5: repeated column names


def test_repeated_feature_column_is_refused(tmp_path, capsys):
    data = write(tmp_path / "d.csv", "f1,f1,f3,label\n" + "".join(f"{i},{2 * i},{i},{i % 3}\n"
                                                                  for i in range(9)))
    with pytest.raises(ValueError, match=r"d\.csv.*'f1'.*more than once"):
        load_table(data)
    cli_error(capsys, tmp_path, data, "d.csv", "'f1'")


def test_repeated_label_column_is_refused(tmp_path, capsys):
    data = write(tmp_path / "d.csv", "a,label,label\n" + "".join(f"{i},{i % 3},{i % 4}\n" for i in range(9)))
    cli_error(capsys, tmp_path, data, "d.csv", "'label'", "more than once")


def test_repeated_column_of_an_image_list_is_refused(tmp_path, capsys):
    data = write(tmp_path / "list.csv", "path,path,label\n" + "".join(f"a.png,b.png,{i % 3}\n"
                                                                      for i in range(6)))
    cli_error(capsys, tmp_path, data, "list.csv", "'path'", "more than once")


# --------------------------------------------------------------------------------------------------
# 6: complex arrays in an .npz


def test_complex_embeddings_are_refused(tmp_path, capsys):
    np.savez(tmp_path / "c.npz", embeddings=np.arange(20).reshape(10, 2) * 1j, labels=np.arange(10) % 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning either: refused before any cast
        cli_error(capsys, tmp_path, tmp_path / "c.npz", "c.npz", "'embeddings'", "complex")


def test_complex_labels_are_refused(tmp_path, capsys):
    np.savez(tmp_path / "c.npz", embeddings=np.zeros((10, 2)), labels=(np.arange(10) % 3) + 1j)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cli_error(capsys, tmp_path, tmp_path / "c.npz", "c.npz", "'labels'", "complex")
        with pytest.raises(ValueError, match="complex"):
            read_inputs(tmp_path / "c.npz", {"format": "npz", "features_key": "embeddings",
                                             "labels_key": "labels"})


# --------------------------------------------------------------------------------------------------
# 12: an .npy file named .npz


def test_npy_file_named_npz(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros((4, 3)))
    os.replace(tmp_path / "a.npy", tmp_path / "a.npz")
    cli_error(capsys, tmp_path, tmp_path / "a.npz", "a.npz is a .npy array, not an .npz archive",
              "numpy.savez(")
    with pytest.raises(ValueError, match="not an .npz archive"):
        read_inputs(tmp_path / "a.npz", {"format": "npz", "features_key": "embeddings"})


# --------------------------------------------------------------------------------------------------
# 13: images whose header claims a huge size


def png(path, width, height, data=True):
    """A grayscale PNG; with ``data=False`` only its header is right (the pixels are missing)."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = (b"\0" + b"\x80" * width) * height if data else b"\0"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return path


def image_list(tmp_path, big):
    for i in range(3):
        png(tmp_path / f"ok{i}.png", 4, 4)
    return write(tmp_path / "list.csv", "path,label\n" + f"{big},0\n"
                 + "".join(f"ok{i % 3}.png,{i % 3}\n" for i in range(6)))


def test_image_beyond_pillows_bomb_limit_is_one_line(tmp_path, capsys):
    pytest.importorskip("PIL")
    png(tmp_path / "huge.png", 30000, 30000, data=False)  # 9e8 pixels claimed: above 2 x the limit
    err = cli_error(capsys, tmp_path, image_list(tmp_path, "huge.png"), "huge.png", "list.csv",
                    "exceeds limit")
    assert ".." not in err


def test_image_in_pillows_warning_range(tmp_path, capsys, monkeypatch):
    Image = pytest.importorskip("PIL.Image")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    png(tmp_path / "big.png", 12, 12)  # 144 pixels: above the limit, below twice it: a warning
    listing = image_list(tmp_path, "big.png")
    with pytest.warns(Image.DecompressionBombWarning):
        assert load_dataset(listing, image_size=4).features.load().shape == (7, 1, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # python -W error
        cli_error(capsys, tmp_path, listing, "big.png", "list.csv")


# --------------------------------------------------------------------------------------------------
# 17: advice the command-line user can follow


def test_non_numeric_feature_says_what_to_do_without_python_arguments(tmp_path, capsys):
    # a column of words is one-hot encoded; a number column with a stray word names the cell
    data = write(tmp_path / "d.csv", "size,label\n" + "".join(
        f"{'x' if i == 4 else i * 0.5},{i % 3}\n" for i in range(9)))
    err = cli_error(capsys, tmp_path, data, "'size'", "non-numeric", "'x'", "data row 5", "--categorical",
                    "--drop-columns")
    no_python_only_arguments(err)


def test_continuous_labels_say_what_to_do_without_python_arguments(tmp_path, capsys):
    data = table(tmp_path / "d.csv", np.random.default_rng(0).random(50) * 80)
    err = cli_error(capsys, tmp_path, data, "continuous", "round")
    no_python_only_arguments(err)


def test_equal_labels_say_what_to_do_without_python_arguments(tmp_path, capsys):
    err = cli_error(capsys, tmp_path, table(tmp_path / "d.csv", [7] * 9), "one rank")
    no_python_only_arguments(err)


def test_test_label_off_the_training_grid(tmp_path, capsys):
    train = table(tmp_path / "train.csv", [1, 2, 3, 1, 2, 3])
    test = table(tmp_path / "test.csv", [1, 2, 9])
    err = cli_error(capsys, tmp_path, train, "test.csv", "9", extra=["--test-data", str(test)])
    no_python_only_arguments(err)


def test_test_file_without_a_training_column(tmp_path, capsys):
    train = write(tmp_path / "train.csv", "a,b,label\n" + "".join(f"{i},{i},{i % 3}\n" for i in range(9)))
    test = table(tmp_path / "test.csv", [0, 1, 2])
    err = cli_error(capsys, tmp_path, train, "test.csv", "'b'", extra=["--test-data", str(test)])
    no_python_only_arguments(err)


def test_npz_with_embeddings_and_features(tmp_path, capsys):
    np.savez(tmp_path / "e.npz", embeddings=np.zeros((6, 2)), features=np.zeros((6, 2)),
             labels=np.arange(6) % 3)
    err = cli_error(capsys, tmp_path, tmp_path / "e.npz", "e.npz", "'embeddings'", "'features'")
    no_python_only_arguments(err)


def test_image_list_without_its_path_column_for_prediction(tmp_path):
    data = table(tmp_path / "new.csv", [1, 2], header="file,label")
    with pytest.raises(ValueError) as info:
        read_inputs(data, {"format": "images", "path_column": "path", "image_size": [4, 4], "channels": 1})
    message = user_error_message(info.value, FLAGS)
    assert "'path'" in message and "new.csv" in message
    no_python_only_arguments(message)


def test_missing_fashion_mnist_says_where_to_put_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sol_ext.driver.data.builtin.FASHION_MNIST_DIR", tmp_path / "fm")
    err = cli_error(capsys, tmp_path, "fashion-mnist", "apt-get install", str(tmp_path / "fm"))
    no_python_only_arguments(err)


# --------------------------------------------------------------------------------------------------
# 19: a folder or a named pipe as --data


def test_folder_named_like_a_csv(tmp_path, capsys):
    (tmp_path / "x.csv").mkdir()
    cli_error(capsys, tmp_path, tmp_path / "x.csv", "x.csv is a folder without labels.csv")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
@pytest.mark.parametrize("name", ["x.csv", "x.npz"])
def test_named_pipe_as_data(tmp_path, capsys, name):
    os.mkfifo(tmp_path / name)
    err = cli_error(capsys, tmp_path, tmp_path / name, f"{name} is not a regular file")
    assert "not found" not in err
    with pytest.raises(ValueError, match="not a regular file"):
        (load_table if name.endswith(".csv") else load_npz)(tmp_path / name)
    with pytest.raises(ValueError, match="not a regular file"):
        read_inputs(tmp_path / name, {"format": "csv", "columns": ["a"]})
