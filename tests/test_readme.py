"""The README's snippets and commands run as written."""

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from sol_ext.driver.cli import main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
MARK = "<!-- README snippet: tests/test_readme.py runs it -->"


def snippets() -> list[str]:
    """The python blocks right after the marker, in order."""
    return [m.group(1) for m in re.finditer(re.escape(MARK) + r"\n```python\n(.*?)```", README, re.S)]


def section(heading: str) -> str:
    """The README from ``heading`` to the next heading of the same or a higher level."""
    start = README.index(heading + "\n")
    level = len(heading.split()[0])
    lines = README[start:].splitlines(keepends=True)
    fenced, length = False, len(lines[0])
    for line in lines[1:]:
        fenced ^= line.startswith("```")  # a "# comment" in a code block is no heading
        if not fenced and re.match(r"#{1,%d} " % level, line):
            break
        length += len(line)
    return README[start:start + length]


def snippets_in(heading: str) -> list[str]:
    """The marked python blocks of the section ``heading``, in order."""
    return [m.group(1) for m in re.finditer(re.escape(MARK) + r"\n```python\n(.*?)```",
                                            section(heading), re.S)]


def block_after(heading: str, language: str) -> str:
    part = README[README.index(heading):]
    return re.search(rf"```{language}\n(.*?)```", part, re.S).group(1)


def write_scores(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = np.clip(np.round(3 * x[:, 0] + x[:, 1] + 10 + rng.normal(size=n)), 2, 18)
    lines = ["a,b,c,d,score"] + [",".join(f"{v:.4f}" for v in row) + f",{label:g}"
                                 for row, label in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")


def test_the_training_loop_snippet_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = snippets()[0]
    scope: dict = {}
    exec(compile(code, "README: SOL in your own training loop", "exec"), scope)
    assert scope["ranks"].shape == (5,) and scope["probabilities"].shape == (5, 10)
    assert (tmp_path / "sol_model.pt").is_file()


@pytest.mark.slow
def test_use_what_you_trained_runs_as_written(tmp_path, monkeypatch, capsys):
    """In a fresh folder: the snippet that makes the data files, every command, the load_run
    snippet and the exported program's loader, as written."""
    import torch

    monkeypatch.chdir(tmp_path)
    heading = "### Use what you trained"
    make_files, use_run = snippets_in(heading)
    exec(compile(make_files, "README: the data files", "exec"), {})
    assert (tmp_path / "train.csv").is_file() and (tmp_path / "test.csv").is_file()
    for line in block_after(heading, "bash").splitlines():
        command = shlex.split(line.split("#")[0])
        assert command[0] == "sol-ext"
        assert main(command[1:]) == 0, (line, capsys.readouterr().err)
    printed = capsys.readouterr().out
    run = tmp_path / "runs" / "mine"
    assert "MAE" in printed and (tmp_path / "pred.csv").is_file()
    assert (run / "model.pt2").is_file() and (run / "model.json").is_file()
    scope: dict = {}
    exec(compile(use_run, "README: load_run", "exec"), scope)
    labels = scope["model"].label_values
    assert scope["values"].shape == (100,) and scope["p"].shape == (100, len(labels))
    exported = block_after("returns the predicted labels", "python")
    exec(compile(exported, "README: exported program", "exec"), scope)
    assert scope["prediction"].shape == (1,)
    assert float(scope["prediction"][0]) == float(scope["model"].predict(scope["rows"])[0])
    # the loader's check names the expected shape and columns where the program's guard does not
    with pytest.raises(ValueError, match=r"expected \['N', 4\] \(a, b, c, d\), got \[1, 3\]"):
        exec(compile(exported, "README: exported program", "exec"), {**scope, "rows": [[0.1, 0.2, 0.3]]})
    # the keys the README names are the sidecar's
    side = json.loads((run / "model.json").read_text())
    keys = re.findall(r"sidecar's\s+`([\w.]+)`", section(heading))
    assert {"inputs.feature_names", "label_values", "inputs.shape"} <= set(keys), keys
    for key in keys:
        value = side
        for part in key.split("."):
            assert part in value, key
            value = value[part]
    assert side["inputs"]["feature_names"] == scope["model"].feature_names == ["a", "b", "c", "d"]
    torch.testing.assert_close(scope["program"](torch.tensor(scope["rows"], dtype=torch.float64))[0],
                               scope["prediction"])


def test_the_estimator_snippet_runs():
    pytest.importorskip("sklearn")
    scope: dict = {}
    exec(compile(snippets_in("### A scikit-learn estimator")[0], "README: scikit-learn estimator",
                 "exec"), scope)
    assert scope["ranker"].predict(scope["X"][:3]).shape == (3,)
    assert set(scope["search"].best_params_) == {"solranker__margin"}


def _image_list(folder: Path, count: int = 24) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    rows = ["path,label"]
    for i in range(count):
        level = i % 4
        arr = np.clip(rng.normal(50 + 40 * level, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(folder / f"{i}.jpg")
        rows.append(f"{i}.jpg,{level}")
    (folder / "list.csv").write_text("\n".join(rows) + "\n")
    return folder / "list.csv"


@pytest.mark.slow
def test_the_driver_examples_run_as_written(tmp_path, monkeypatch, capsys):
    """Every line of the driver's example block, in order, in a fresh folder, with the files it names
    made there: each command as written plus options that keep it short (one epoch, one seed)."""
    monkeypatch.chdir(tmp_path)
    write_scores(tmp_path / "scores.csv", 200, 0)
    text = (tmp_path / "scores.csv").read_text().replace("score", "age").replace(",", ";")
    (tmp_path / "my.csv").write_text(text)
    write_scores(tmp_path / "noisy_train.csv", 200, 1)
    write_scores(tmp_path / "clean_test.csv", 80, 2)
    for name in ("noisy_train.csv", "clean_test.csv"):  # the label column is "label" by default
        (tmp_path / name).write_text((tmp_path / name).read_text().replace("score", "label"))
    # test labels on the training file's grid
    train_labels = {row.rsplit(",", 1)[1] for row in (tmp_path / "noisy_train.csv").read_text().split()[1:]}
    rows = (tmp_path / "clean_test.csv").read_text().split()
    (tmp_path / "clean_test.csv").write_text(
        "\n".join(rows[:1] + [r for r in rows[1:] if r.rsplit(",", 1)[1] in train_labels]) + "\n")
    lines = block_after("## Training driver", "bash").splitlines()
    if any("--encoder resnet18" in line for line in lines):
        torchvision = pytest.importorskip("torchvision")
        _image_list(tmp_path / "faces")
        import torch

        torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth")
    from sol_ext.driver.data import FASHION_MNIST_DIR

    for line in lines:
        command = shlex.split(line.split("#")[0])
        assert command[0] == "sol-ext", line
        if "fashion-mnist-blur" in command and not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
            continue  # the data are an apt package, not installed here
        short = {"train": ["--epochs", "1", "--quiet", "--no-plots"],
                 "compare": ["--epochs", "1", "--seeds", "0", "--kappas", "0.3", "--noises", "",
                             "--methods", "sol,l1"]}.get(command[1], [])
        if "--resume" in command:
            short = ["--epochs", "2", "--quiet", "--no-plots"]  # one epoch more than the first run
        assert main(command[1:] + short) == 0, (line, capsys.readouterr().err)
    assert (tmp_path / "pred.csv").is_file() and (tmp_path / "model.pt2").is_file()
