"""Loaders on tiny temporary files, the shipped Abalone data, splitting and scaling; bad data files get one
clear line naming the file and what was expected."""

import gzip
import os
import re
import struct
import warnings
import zlib

import numpy as np
import pytest
import torch

from sol_ext.driver.cli import build_parser, main
from sol_ext.driver.data import (
    FASHION_MNIST_DIR,
    ImageFiles,
    OrdinalDataset,
    degradation_strengths,
    load_abalone,
    load_dataset,
    load_fashion_mnist_degradation,
    load_image_folder,
    load_npz,
    load_table,
    load_train_test,
    read_inputs,
    split_indices,
    standardize,
    train_test_split,
)
from sol_ext.driver.errors import command_line_flags, user_error_message
from sol_ext.labels import LabelGrid

# --------------------------------------------------------------------------------------------------
# OrdinalDataset


def _tiny(n=10, num_ranks=5):
    return OrdinalDataset(torch.randn(n, 3), torch.arange(n) % num_ranks, LabelGrid(0.0, 1.0, num_ranks),
                          "tiny", "tabular")


def test_dataset_helpers():
    ds = _tiny()
    assert len(ds) == 10 and ds.num_ranks == 5
    assert ds.labels.dtype == torch.float64
    sub = ds.subset([1, 3])
    assert torch.equal(sub.ranks, torch.tensor([1, 3])) and sub.features.shape == (2, 3)
    assert torch.equal(ds.subset(ds.ranks == 0).ranks, torch.tensor([0, 0]))
    zeros = torch.zeros(10, dtype=torch.long)
    assert torch.equal(ds.with_ranks(zeros).ranks, zeros)


def test_dataset_validation():
    enc = LabelGrid(0.0, 1.0, 3)
    x = torch.randn(2, 2)
    x[1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        OrdinalDataset(x, torch.tensor([0, 1]), enc, "d", "tabular")
    with pytest.raises(ValueError, match="empty"):
        OrdinalDataset(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), enc, "d", "tabular")
    with pytest.raises(ValueError, match="0 … 2"):
        OrdinalDataset(torch.zeros(1, 2), torch.tensor([3]), enc, "d", "tabular")
    with pytest.raises(ValueError, match="kind"):
        OrdinalDataset(torch.zeros(1, 2), torch.tensor([0]), enc, "d", "video")
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        OrdinalDataset(torch.zeros(1, 2), torch.tensor([0]), enc, "d", "images")


# --------------------------------------------------------------------------------------------------
# CSV


def _write(path, text):
    path.write_text(text)
    return path


def test_load_csv_basic(tmp_path):
    p = _write(tmp_path / "t.csv", "a,b,age\n1,2,20\n3,4,22\n5,6,21\n")
    ds = load_table(p, "age")
    assert ds.kind == "tabular" and ds.name == "t"
    assert ds.features.dtype == torch.float32 and ds.features.tolist() == [[1, 2], [3, 4], [5, 6]]
    assert ds.grid == LabelGrid(20.0, 1.0, 3)
    assert ds.ranks.tolist() == [0, 2, 1]
    assert ds.feature_names == ("a", "b")
    assert load_table(p, "age", feature_columns=["b"]).features.tolist() == [[2], [4], [6]]


def test_load_csv_gz_and_categorical(tmp_path):
    p = tmp_path / "t.csv.gz"
    with gzip.open(p, "wt") as fh:
        fh.write("sex,x,y\nM,1,0.5\nF,2,0.75\nM,3,1.0\n")
    ds = load_table(p, "y", categorical=["sex"])
    assert ds.feature_names == ("sex=F", "sex=M", "x")
    assert ds.features.tolist() == [[0, 1, 1], [1, 0, 2], [0, 1, 3]]
    assert ds.grid.step == 0.25 and ds.ranks.tolist() == [0, 1, 2]
    fixed = load_table(p, "y", categorical={"sex": ["F", "I", "M"]})
    assert fixed.features.shape == (3, 4)
    with pytest.raises(ValueError, match="outside its categories"):
        load_table(p, "y", categorical={"sex": ["F"]})


@pytest.mark.parametrize("text,match", [
    ("a,b\n1,2\n", "no label column 'age'"),
    ("a,age\n1,twenty\n2,30\n", "label column 'age' has a missing or non-numeric value 'twenty'"),
    ("a,age\n1,\n2,30\n", "missing or non-numeric"),
    ("a,age\nx,20\n2,30\n", "feature column 'a' has a non-numeric value 'x'.*categorical="),
    ("a,age\nnan,20\n2,30\n", "feature column 'a' has a missing value \\(NaN\\)"),
    ("a,age\n,20\n2,30\n", "missing value"),
    ("a,age\n1,20\n2,20\n", "one rank"),
    ("", "empty"),
    ("a,age\n", "no data rows"),
    ("a,age\n1,20,3\n", "3 cells but the header has 2"),
])
def test_load_csv_bad_input(tmp_path, text, match):
    p = _write(tmp_path / "bad.csv", text)
    with pytest.raises(ValueError, match=match):
        load_table(p, "age")


def test_load_csv_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_table(tmp_path / "nope.csv", "age")


def test_shared_encoder_for_train_and_test_files(tmp_path):
    train = _write(tmp_path / "train.csv", "x,label\n1,10\n2,14\n3,12\n4,11\n")
    test = _write(tmp_path / "test.csv", "x,label\n5,12\n6,13\n")
    tr, te = load_train_test(train, test)
    assert te.grid == tr.grid == LabelGrid(10.0, 1.0, 5)
    assert te.ranks.tolist() == [2, 3]
    # the same through load_dataset with grid=
    assert load_dataset(test, grid=tr.grid).ranks.tolist() == [2, 3]
    wide = _write(tmp_path / "wide.csv", "x,label\n5,12\n5,30\n")
    with pytest.raises(ValueError, match=r"label value 30 \(data row 1\) is outside"):  # rows as the other errors
        load_train_test(train, wide)
    tr2, te2 = load_train_test(train, wide, min_value=0, max_value=40)
    assert te2.ranks.tolist() == [12, 30]
    with pytest.raises(ValueError, match="either grid= or step"):
        load_table(test, grid=tr.grid, step=1)


# --------------------------------------------------------------------------------------------------
# npz


def test_load_npz_embeddings(tmp_path):
    p = tmp_path / "emb.npz"
    np.savez(p, embeddings=np.arange(12, dtype=np.float64).reshape(4, 3),
             labels=np.array([0.1, 0.3, 0.2, 0.1]))
    ds = load_npz(p)
    assert ds.kind == "embeddings" and ds.features.shape == (4, 3) and ds.features.dtype == torch.float32
    assert ds.grid.step == pytest.approx(0.1) and ds.ranks.tolist() == [0, 2, 1, 0]
    q = tmp_path / "feat.npz"
    np.savez(q, features=np.zeros((2, 5, 6)), labels=np.array([1, 2]))
    img = load_npz(q)
    assert img.kind == "images" and img.features.shape == (2, 1, 5, 6)


@pytest.mark.parametrize("arrays,match", [
    ({"x": np.zeros((2, 2)), "labels": np.array([1, 2])}, "exactly one of the arrays"),
    ({"embeddings": np.zeros((2, 2)), "features": np.zeros((2, 2)), "labels": np.array([1, 2])},
     "exactly one"),
    ({"embeddings": np.zeros((2, 2))}, "no array 'labels'"),
    ({"embeddings": np.zeros((3, 2)), "labels": np.array([1, 2])}, "N = 2"),
    ({"embeddings": np.zeros((2, 2)), "labels": np.array([1.0, np.nan])}, "finite"),
    ({"embeddings": np.array([[0.0], [np.nan]]), "labels": np.array([1, 2])}, "NaN"),
    ({"embeddings": np.zeros((2, 2)), "labels": np.array([3, 3])}, "one rank"),
    ({"embeddings": np.zeros((0, 2)), "labels": np.zeros(0)}, "no samples"),
])
def test_load_npz_bad_input(tmp_path, arrays, match):
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    with pytest.raises(ValueError, match=match):
        load_npz(p)


# --------------------------------------------------------------------------------------------------
# Images


@pytest.fixture
def image_folder(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    (tmp_path / "img").mkdir()
    rows = ["path,label"]
    for i, months in enumerate([0, 12, 24, 12]):
        arr = np.full((10, 14), 40 * i, dtype=np.uint8)
        Image.fromarray(arr, mode="L").save(tmp_path / "img" / f"{i}.png")
        rows.append(f"img/{i}.png,{months}")
    _write(tmp_path / "labels.csv", "\n".join(rows) + "\n")
    return tmp_path


def test_load_image_folder_grayscale(image_folder):
    ds = load_image_folder(image_folder / "labels.csv", image_size=8)
    assert ds.kind == "images" and ds.features.shape == (4, 1, 8, 8)
    assert ds.grid == LabelGrid(0.0, 12.0, 3) and ds.ranks.tolist() == [0, 1, 2, 1]
    assert isinstance(ds.features, ImageFiles)  # decoded on access, not at load
    assert ds.features.read(2).mean().item() == pytest.approx(80 / 255, abs=1e-5)
    assert torch.equal(ds.features.load(), load_image_folder(image_folder / "labels.csv", image_size=8,
                                                              in_memory=True).features)
    part = ds.subset(torch.tensor([3, 1]))
    assert part.features.shape == (2, 1, 8, 8) and part.features.rows.tolist() == [3, 1]  # data rows, from 0
    assert torch.equal(part.features.read(0), ds.features.read(3))
    rgb = load_image_folder(image_folder / "labels.csv", image_size=(4, 6), channels=3)
    assert rgb.features.shape == (4, 3, 4, 6)
    # a folder holding labels.csv, and the CSV itself, through load_dataset
    assert load_dataset(str(image_folder), image_size=8).features.shape == (4, 1, 8, 8)
    assert load_dataset(image_folder / "labels.csv", image_size=8).kind == "images"


def test_load_image_folder_rgb_and_16_bit(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    Image.new("RGB", (5, 5), (255, 0, 0)).save(tmp_path / "red.png")
    Image.fromarray(np.full((5, 5), 65535, dtype=np.uint16)).save(tmp_path / "white16.png")
    _write(tmp_path / "list.csv", "file,score\nred.png,1\nwhite16.png,2\n")
    ds = load_image_folder(tmp_path / "list.csv", path_column="file", label_column="score", image_size=5)
    assert ds.features.shape == (2, 3, 5, 5)
    red = ds.features.read(0)
    assert red[0].mean().item() == pytest.approx(1.0) and red[1].max().item() == 0.0
    gray = load_image_folder(tmp_path / "list.csv", path_column="file", label_column="score", image_size=5,
                             channels=1)
    assert gray.features.read(1).mean().item() == pytest.approx(1.0, abs=1e-3)


def test_unreadable_and_missing_images(image_folder):
    (image_folder / "img" / "1.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image .*1.png"):
        load_image_folder(image_folder / "labels.csv", image_size=8)
    (image_folder / "img" / "1.png").unlink()
    with pytest.raises(FileNotFoundError, match="1.png"):
        load_image_folder(image_folder / "labels.csv", image_size=8)


# --------------------------------------------------------------------------------------------------
# Fashion-MNIST degradation


def _fake_idx(folder, n=40, seed=0):
    """A tiny stand-in of the Fashion-MNIST image files: random 28x28 uint8 images in IDX3 format."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    for name in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        with gzip.open(folder / name, "wb") as fh:
            fh.write(struct.pack(">IIII", 2051, n, 28, 28) + data.tobytes())
    return folder


def _roughness(x):
    """Mean absolute difference of horizontally adjacent pixels, per image."""
    return (x[..., 1:] - x[..., :-1]).abs().mean(dim=(1, 2, 3))


def test_degradation_loader_on_small_files(tmp_path):
    root = _fake_idx(tmp_path)
    ds = load_fashion_mnist_degradation(levels=4, samples_per_level=5, root=root, seed=1)
    assert ds.features.shape == (20, 1, 28, 28) and ds.kind == "images"
    assert ds.grid == LabelGrid(0.0, 1.0, 4)
    assert torch.bincount(ds.ranks).tolist() == [5, 5, 5, 5]
    assert float(ds.features.min()) >= 0.0 and float(ds.features.max()) <= 1.0
    rough = _roughness(ds.features)
    per_level = [rough[ds.ranks == k].mean().item() for k in range(4)]
    assert per_level == sorted(per_level, reverse=True)  # more blur, smoother images
    again = load_fashion_mnist_degradation(levels=4, samples_per_level=5, root=root, seed=1)
    assert torch.equal(again.features, ds.features) and torch.equal(again.ranks, ds.ranks)
    noisy = load_fashion_mnist_degradation(levels=4, samples_per_level=5, kind="noise", root=root)
    assert noisy.name == "fashion-mnist-noise"
    with pytest.raises(ValueError, match="exceeds"):
        load_fashion_mnist_degradation(levels=4, samples_per_level=11, root=root)


def test_degradation_strengths():
    blur = degradation_strengths(8, "blur")
    assert blur[0] == 0.0 and blur[1] == pytest.approx(0.5) and blur[-1] == pytest.approx(2.5)
    ratios = np.array(blur[2:]) / np.array(blur[1:-1])
    assert np.allclose(ratios, ratios[0])  # geometric from level 1 on
    assert degradation_strengths(5, "noise", max_strength=0.4) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert degradation_strengths(2, "blur") == [0.0, 2.5]
    with pytest.raises(ValueError, match="levels"):
        degradation_strengths(1)
    with pytest.raises(ValueError, match="kind"):
        degradation_strengths(4, "jpeg")


def test_degradation_loader_missing_data_says_how_to_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install -y dataset-fashion-mnist"):
        load_fashion_mnist_degradation(root=tmp_path)


@pytest.mark.skipif(not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
                    reason="Debian package dataset-fashion-mnist is not installed")
def test_fashion_mnist_blur_from_debian_package():
    ds = load_dataset("fashion-mnist-blur", levels=8, samples_per_level=50)
    assert ds.features.shape == (400, 1, 28, 28) and ds.num_ranks == 8
    rough = _roughness(ds.features)
    assert rough[ds.ranks == 0].mean() > rough[ds.ranks == 7].mean()
    assert load_dataset("fashion-mnist", levels=3, samples_per_level=2).name == "fashion-mnist-blur"
    test = load_fashion_mnist_degradation(levels=8, samples_per_level=10, split="test")
    assert test.features.shape == (80, 1, 28, 28)


# --------------------------------------------------------------------------------------------------
# Abalone, load_dataset, splitting, scaling


@pytest.fixture(scope="module")
def abalone():
    return load_abalone()


def test_abalone(abalone):
    assert abalone.features.shape == (4177, 10) and abalone.kind == "tabular"
    assert abalone.grid == LabelGrid(1.0, 1.0, 29)
    assert int(abalone.ranks.min()) == 0 and int(abalone.ranks.max()) == 28
    assert abalone.labels.min().item() == 1.0 and abalone.labels.max().item() == 29.0
    assert torch.all(abalone.features[:, :3].sum(dim=1) == 1)  # sex one-hot
    assert abalone.feature_names[:3] == ("Sex=F", "Sex=I", "Sex=M")
    assert load_dataset("abalone").features.shape == (4177, 10)


def test_load_dataset_dispatch_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a built-in name"):
        load_dataset("no-such-data")
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(ValueError, match="cannot tell the format"):
        load_dataset(tmp_path / "x.txt")
    with pytest.raises(FileNotFoundError, match="labels.csv"):
        load_dataset(tmp_path)


def test_load_dataset_csv_and_npz(tmp_path):
    p = _write(tmp_path / "t.csv", "f,label\n1,1\n2,2\n")
    assert load_dataset(p).ranks.tolist() == [0, 1]
    q = tmp_path / "e.npz"
    np.savez(q, embeddings=np.zeros((2, 4)), labels=np.array([5, 7]))
    assert load_dataset(str(q)).grid == LabelGrid(5.0, 2.0, 2)


def test_train_test_split_is_deterministic_stratified_and_disjoint(abalone):
    train, test = train_test_split(abalone, test_fraction=0.2, seed=0)
    assert len(train) + len(test) == 4177
    assert abs(len(test) - 0.2 * 4177) <= 1
    again_train, again_test = train_test_split(abalone, test_fraction=0.2, seed=0)
    assert torch.equal(test.features, again_test.features)
    other = train_test_split(abalone, test_fraction=0.2, seed=1)[1]
    assert not torch.equal(test.features, other.features)
    all_counts = torch.bincount(abalone.ranks, minlength=29).double()
    test_counts = torch.bincount(test.ranks, minlength=29).double()
    assert torch.all((test_counts - 0.2 * all_counts).abs() <= 1.0)
    # disjoint and covering, each part in the original order
    ids_train, ids_test = split_indices(abalone.ranks, 0.2, seed=0)
    assert ids_train.dtype == torch.int64
    assert torch.equal(torch.sort(torch.cat([ids_train, ids_test])).values, torch.arange(4177))
    assert torch.all(ids_train[1:] > ids_train[:-1]) and torch.all(ids_test[1:] > ids_test[:-1])
    assert torch.equal(abalone.features[ids_test], test.features)


def test_train_test_split_bad_fraction():
    with pytest.raises(ValueError, match="test_fraction"):
        train_test_split(_tiny(), test_fraction=1.0)
    with pytest.raises(ValueError, match="empty part"):
        train_test_split(_tiny(n=2), test_fraction=0.01)


def test_standardize_fits_on_train_only():
    enc = LabelGrid(0.0, 1.0, 2)
    train = OrdinalDataset(torch.tensor([[1.0, 5.0], [3.0, 5.0]]), torch.tensor([0, 1]), enc, "a", "tabular")
    test = OrdinalDataset(torch.tensor([[5.0, 6.0]]), torch.tensor([1]), enc, "b", "tabular")
    tr, te = standardize(train, test)
    assert tr.features.tolist() == [[-1.0, 0.0], [1.0, 0.0]]  # constant column: centred only
    assert te.features.tolist() == [[3.0, 1.0]]
    img = OrdinalDataset(torch.rand(2, 1, 3, 3), torch.tensor([0, 1]), enc, "i", "images")
    assert standardize(img)[0] is img


# --------------------------------------------------------------------------------------------------
# Wine Quality (red) and CSV delimiters


def test_wine_red_built_in():
    from sol_ext.driver.data import DATASETS_DIR, load_wine_red

    wine = load_dataset("wine-red")
    assert wine.features.shape == (1599, 11) and wine.kind == "tabular" and wine.name == "wine-red"
    assert wine.grid == LabelGrid(3.0, 1.0, 6) and wine.num_ranks == 6
    assert int(wine.ranks.min()) == 0 and int(wine.ranks.max()) == 5
    assert wine.labels.min().item() == 3.0 and wine.labels.max().item() == 8.0
    assert torch.bincount(wine.ranks).tolist() == [10, 53, 681, 638, 199, 18]
    assert wine.feature_names[0] == "fixed acidity" and wine.feature_names[-1] == "alcohol"
    assert "quality" not in wine.feature_names
    assert torch.equal(load_wine_red().features, wine.features)
    # the shipped file is UCI's semicolon CSV with a quoted header: sniffing reads it the same
    sniffed = load_table(DATASETS_DIR / "winequality-red.csv.gz", "quality")
    assert torch.equal(sniffed.features, wine.features) and torch.equal(sniffed.ranks, wine.ranks)


_COMMA_TABLE = "a,b,age\n1,2.5,20\n3,4,22\n5,6,21\n"


def _same_table(ds, ref):
    assert ds.feature_names == ref.feature_names and ds.grid == ref.grid
    assert torch.equal(ds.features, ref.features) and torch.equal(ds.ranks, ref.ranks)


@pytest.mark.parametrize("text", [
    _COMMA_TABLE.replace(",", ";"),
    _COMMA_TABLE.replace(",", "\t"),
    '"a";"b";"age"\n1;2.5;20\n3;4;22\n5;6;21\n',  # UCI style: quoted header
    '"a";"b";"age"\r\n1;2.5;20\r\n3;4;22\r\n5;6;21\r\n',
    "\n" + _COMMA_TABLE.replace(",", "\t") + "\n",  # blank lines around
])
def test_semicolon_and_tab_csv_load_like_comma(tmp_path, text):
    ref = load_table(_write(tmp_path / "comma.csv", _COMMA_TABLE), "age")
    p = _write(tmp_path / "other.csv", text)
    _same_table(load_table(p, "age"), ref)
    _same_table(load_dataset(p, label_column="age"), ref)
    gz = tmp_path / "other.csv.gz"
    with gzip.open(gz, "wt", newline="") as fh:
        fh.write(text)
    _same_table(load_table(gz, "age"), ref)


def test_sniffing_ignores_delimiters_inside_quoted_names(tmp_path):
    p = _write(tmp_path / "q.csv", '"w, kg";"h, cm";age\n1;2;20\n3;4;22\n')
    ds = load_table(p, "age")
    assert ds.feature_names == ("w, kg", "h, cm") and ds.features.tolist() == [[1, 2], [3, 4]]
    t = _write(tmp_path / "t.csv", "w, kg\th\tage\n1\t2\t20\n3\t4\t22\n")  # unquoted comma in a name
    assert load_table(t, "age").feature_names == ("w, kg", "h")


def test_explicit_delimiter_overrides_sniffing(tmp_path):
    piped = _write(tmp_path / "p.csv", _COMMA_TABLE.replace(",", "|"))
    with pytest.raises(ValueError, match="read as one column.*delimiter="):
        load_table(piped, "age")  # not one of the sniffed delimiters
    ref = load_table(_write(tmp_path / "comma.csv", _COMMA_TABLE), "age")
    _same_table(load_table(piped, "age", delimiter="|"), ref)
    _same_table(load_dataset(piped, label_column="age", delimiter="|"), ref)
    tabbed = _write(tmp_path / "t.csv", _COMMA_TABLE.replace(",", "\t"))
    for name in ("\t", "tab", "TAB", "\\t"):
        _same_table(load_table(tabbed, "age", delimiter=name), ref)
    comma = tmp_path / "comma.csv"
    with pytest.raises(ValueError, match="no label column 'age'"):
        load_table(comma, "age", delimiter=";")  # the given delimiter wins over the sniffed comma
    with pytest.raises(ValueError, match="3 cells but the header has 2 columns \\(read with delimiter ';'"):
        load_table(_write(tmp_path / "mixed.csv", "a,b;age\n1;2;20\n"), "age", delimiter=";")


@pytest.mark.parametrize("bad", ["ab", "", "a", "7", " ", '"', ".", 3, b";"])
def test_bad_delimiter_is_a_clear_error(tmp_path, bad):
    p = _write(tmp_path / "comma.csv", _COMMA_TABLE)
    with pytest.raises(ValueError, match="delimiter must be one character"):
        load_table(p, "age", delimiter=bad)
    with pytest.raises(ValueError, match="delimiter must be one character"):
        load_dataset(p, label_column="age", delimiter=bad)


def test_delimiter_applies_to_csv_files_only(tmp_path):
    for spec in ("abalone", "wine-red"):
        with pytest.raises(ValueError, match="delimiter=';' applies to CSV files only"):
            load_dataset(spec, delimiter=";")
    assert load_dataset("wine-red", delimiter=None).features.shape == (1599, 11)


def test_image_folder_with_semicolon_or_tab_listing(image_folder):
    ref = load_dataset(image_folder, image_size=8)
    listing = image_folder / "labels.csv"
    text = listing.read_text()
    for sep in (";", "\t"):
        listing.write_text(text.replace(",", sep))
        ds = load_dataset(image_folder, image_size=8)
        assert torch.equal(ds.features.load(), ref.features.load()) and torch.equal(ds.ranks, ref.ranks)
        assert torch.equal(load_image_folder(listing, image_size=8, delimiter=sep).features.load(),
                           ref.features.load())


# --------------------------------------------------------------------------------------------------
# Damaged files: one ValueError naming the file, not a decoder's exception


def _csv_bytes(rows=20):
    return ("f,label\n" + "".join(f"{i * 0.5},{i % 4}\n" for i in range(rows))).encode()


def _damaged_files(tmp_path):
    """(name, bytes, words of the expected message) for each kind of damage."""
    gz = gzip.compress(_csv_bytes(200))
    bad_checksum, bad_stream = bytearray(gz), bytearray(gz)
    bad_checksum[len(gz) // 2:len(gz) // 2 + 16] = b"\xff" * 16
    bad_stream[30:40] = bytes(10)  # inside the first deflate block
    np.savez(tmp_path / "good.npz", embeddings=np.zeros((8, 2)), labels=np.arange(8) % 3)
    npz = (tmp_path / "good.npz").read_bytes()
    return [
        ("truncated.csv.gz", gz[: len(gz) // 2], "truncated"),
        ("bad_checksum.csv.gz", bytes(bad_checksum), "corrupt"),
        ("bad_stream.csv.gz", bytes(bad_stream), "corrupt"),
        ("not_gzip.csv.gz", _csv_bytes(), "corrupt"),
        ("truncated.npz", npz[: len(npz) // 2], "not a readable .npz"),
        ("random.npz", bytes(np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8)),
         "not an .npz archive"),
        ("latin1.csv", "f,label\n1,1\n2,2\n".replace("label", "\u00e9tiquette").encode("latin-1"),
         "not UTF-8"),
    ]


def test_damaged_data_files_are_named_in_one_clear_error(tmp_path):
    from sol_ext.driver.errors import DataFileError

    for name, data, words in _damaged_files(tmp_path):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DataFileError) as info:
            load_dataset(path, **({"label_column": "\u00e9tiquette"} if "latin" in name else {}))
        assert isinstance(info.value, ValueError)  # callers catching ValueError keep working
        message = str(info.value)
        assert str(path) in message and words in message, (name, message)
        assert len(message.splitlines()) == 1


def test_label_column_applies_to_tables_and_image_folders_only(tmp_path):
    q = tmp_path / "e.npz"
    np.savez(q, embeddings=np.zeros((2, 4)), labels=np.array([5, 7]))
    for spec in ("abalone", str(q)):
        with pytest.raises(ValueError, match=r"label_column='age' applies to tables \(CSV, Parquet, Feather\) and image folders"):
            load_dataset(spec, label_column="age")


# --------------------------------------------------------------------------------------------------
# CSV files as spreadsheets save them


def _spreadsheet_rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    a, b, flag = rng.normal(size=n).round(4), rng.normal(size=n).round(4), rng.random(n) > 0.5
    return a, b, flag, np.clip(np.round(2 * a + flag + 4), 0, 8).astype(int)


def test_true_false_columns_read_as_one_and_zero_as_from_parquet(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    a, b, flag, y = _spreadsheet_rows()
    lines = ["a,b,flag,label"] + [f"{a[i]},{b[i]},{'True' if flag[i] else 'false'},{y[i]}" for i in range(len(y))]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    pq.write_table(pa.table({"a": a, "b": b, "flag": flag, "label": y}), tmp_path / "t.parquet")
    from_csv, from_parquet = load_table(tmp_path / "t.csv"), load_table(tmp_path / "t.parquet")
    assert torch.equal(from_csv.features[:, 2], torch.tensor(flag, dtype=torch.float32))
    assert torch.equal(from_csv.features, from_parquet.features)
    # a missing cell among them is still named as missing, not as a non-number
    (tmp_path / "gap.csv").write_text("\n".join(lines[:3] + [lines[3].replace(",True,", ",,").replace(",false,", ",,")]
                                                + lines[4:]) + "\n")
    with pytest.raises(ValueError, match="'flag' has a missing value .* data row 2"):
        load_table(tmp_path / "gap.csv")


def _spreadsheet_lines(delimiter: str) -> list[str]:
    """The header and rows of columns a, b and label of :func:`_spreadsheet_rows`."""
    a, b, _, y = _spreadsheet_rows()
    return [delimiter.join(["a", "b", "label"])] + [delimiter.join(map(str, row)) for row in zip(a, b, y)]


def test_decimal_commas_read_in_files_whose_delimiter_is_not_a_comma(tmp_path):
    a, b, _, y = _spreadsheet_rows()
    dots = _spreadsheet_lines(";")
    (tmp_path / "dots.csv").write_text("\n".join(dots) + "\n")
    (tmp_path / "commas.csv").write_text("\n".join(line.replace(".", ",") for line in dots) + "\n")
    assert torch.equal(load_table(tmp_path / "commas.csv").features, load_table(tmp_path / "dots.csv").features)
    # in a comma-separated file "1,5" (quoted) may be a thousands separator: refused, as before
    quoted = ["a,b,label"] + [f'"{str(a[i]).replace(".", ",")}",{b[i]},{y[i]}' for i in range(len(y))]
    (tmp_path / "quoted.csv").write_text("\n".join(quoted) + "\n")
    with pytest.raises(ValueError, match="feature column 'a' has a non-numeric value"):
        load_table(tmp_path / "quoted.csv")


def test_a_trailing_delimiter_is_no_column_and_gz_suffixes_in_any_case(tmp_path):
    plain = _spreadsheet_lines(",")
    (tmp_path / "plain.csv").write_text("\n".join(plain) + "\n")
    (tmp_path / "trailing.csv").write_text("\n".join(line + "," for line in plain) + "\n")
    with gzip.open(tmp_path / "upper.CSV.GZ", "wt") as fh:
        fh.write("\n".join(plain) + "\n")
    expected = load_table(tmp_path / "plain.csv")
    for name in ("trailing.csv", "upper.CSV.GZ"):
        got = load_table(tmp_path / name)
        assert list(got.feature_names) == ["a", "b"] and torch.equal(got.features, expected.features), name


# --------------------------------------------------------------------------------------------------
# A label scale that rests on a few labels


GRADES = np.repeat(np.arange(3, 10), 50)  # grades 3 … 9, 50 labels each


@pytest.mark.parametrize("typo, named, ranks", [(60, "label 60 (1 of 351 labels) lies 50 ranks", 58),
                                                 (5.5, "label 5.5 (1 of 351 labels) is the only value off", 13)])
def test_one_typo_label_that_changes_the_scale_is_named(typo, named, ranks):
    from sol_ext.labels import LabelScaleWarning

    with pytest.warns(LabelScaleWarning, match=re.escape(named)):
        enc = LabelGrid.fit(np.r_[GRADES, typo])
    assert enc.num_ranks == ranks  # the scale is the labels' own, as before: the warning says so


def test_a_scale_the_labels_fill_or_the_user_gives_warns_nothing():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert LabelGrid.fit(GRADES).num_ranks == 7
        assert LabelGrid.fit(np.r_[GRADES, 60], min_value=0, max_value=60).num_ranks == 61  # given: meant
        assert LabelGrid.fit(np.r_[GRADES, 5.5], step=0.5).num_ranks == 13
        load_abalone()


# --------------------------------------------------------------------------------------------------
# Bad data files: one clear line naming the file and what was expected (exit status 2), never a
# traceback nor a silent misreading


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
# an outlier label must not merge the real ranks


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
# repeated column names


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
# complex arrays in an .npz


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
# an .npy file named .npz


def test_npy_file_named_npz(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros((4, 3)))
    os.replace(tmp_path / "a.npy", tmp_path / "a.npz")
    cli_error(capsys, tmp_path, tmp_path / "a.npz", "a.npz is a .npy array, not an .npz archive",
              "numpy.savez(")
    with pytest.raises(ValueError, match="not an .npz archive"):
        read_inputs(tmp_path / "a.npz", {"format": "npz", "features_key": "embeddings"})


# --------------------------------------------------------------------------------------------------
# images whose header claims a huge size


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
# advice the command-line user can follow


def test_non_numeric_feature_says_what_to_do_without_python_arguments(tmp_path, capsys):
    # a column of words is one-hot encoded; a number column with a stray word names the cell
    data = write(tmp_path / "d.csv", "size,label\n" + "".join(
        f"{'x' if i == 4 else i * 0.5},{i % 3}\n" for i in range(9)))
    err = cli_error(capsys, tmp_path, data, "'size'", "non-numeric", "'x'", "data row 4", "--categorical",
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
# a folder or a named pipe as --data


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
