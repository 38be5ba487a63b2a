"""The documentation site (docs/, mkdocs.yml): its snippets run as written, and it builds.

A page marks each code block a test runs with a comment on the line before it that names the test:

    <!-- docs snippet: tests/docs/test_docs.py runs it -->

This file runs the blocks marked so, page by page, in order, in a fresh folder per page: ``python``
blocks as they are, each in a namespace of its own (a block defines every name it uses, so it runs
as shown when copied alone), and ``bash`` blocks line by line, each line a ``sol-ext`` command. The
files a block writes stay for the blocks below it, as in a reader's working folder (a page that
trains a run with one block and loads it with the next). A marker that names another test
(``tests/docs/test_docs.py::test_name``, or another file) leaves the block to that test.
"""
from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common import REPO_ROOT

ROOT = REPO_ROOT
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# a comment that names a test file (and perhaps a test in it), then the block
MARKED = re.compile(r"^<!-- ([^\n]*?)(tests/(?:\w+/)?\w+\.py)(?:::(\w+))?([^\n]*?) -->\n```(\w+)\n(.*?)^```",
                    re.S | re.M)
RUN_HERE = ("docs snippet: ", "tests/docs/test_docs.py", " runs it")


def pages() -> list[Path]:
    """Every page of the site, the API reference included."""
    return sorted(DOCS.rglob("*.md"))


def page_name(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


def marked_blocks(text: str) -> list[tuple[str, str | None, str, str, int, bool]]:
    """``(test file, test name or None, language, code, line of the code's first line, whether the
    marker is this file's "docs snippet: tests/docs/test_docs.py… runs it")`` for every marked block of
    ``text``, in order."""
    return [(m.group(2), m.group(3), m.group(5), m.group(6), text.count("\n", 0, m.start(6)) + 1,
             (m.group(1), m.group(2), m.group(4)) == RUN_HERE) for m in MARKED.finditer(text)]


def blocks_for(text: str, test: str | None = None) -> list[tuple[str, str, int]]:
    """``(language, code, first line)`` of the blocks marked for this file's ``test`` (None: for the
    file as a whole, which runs them page by page)."""
    return [(language, code, line) for _, name, language, code, line, here in marked_blocks(text)
            if here and name == test]


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """``(language, code, first line)`` of every fenced block of ``text``."""
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1)
            for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def commands(code: str) -> list[list[str]]:
    """The command lines of a shell block (a trailing backslash continues a line; ``#`` comments)."""
    lines = code.replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if shlex.split(line, comments=True)]


def run_blocks(blocks: list[tuple[str, str, int]], where: str, capsys) -> dict:
    """Runs ``blocks`` in order, each python block in a fresh namespace (the current folder is the
    caller's); returns the names they defined, all blocks' together, for the checks."""
    from sol_ext.driver.cli import main

    defined: dict = {}
    for language, code, line in blocks:
        if language == "python":
            scope: dict = {"__name__": "__docs__"}
            # blank lines in front, so that a traceback gives the line of the page
            exec(compile("\n" * (line - 1) + code, where, "exec"), scope)
            defined.update(scope)
        elif language == "bash":
            for command in commands(code):
                assert command[0] == "sol-ext", f"{where}:{line}: a bash snippet runs sol-ext commands only"
                assert main(command[1:]) == 0, (where, command, capsys.readouterr().err)
        else:
            pytest.fail(f"{where}:{line}: no runner for {language} blocks")
    return defined


def _slow_if_it_trains(page: Path):
    runs_commands = any(language == "bash" for language, _, _ in blocks_for(page.read_text(encoding="utf-8")))
    return pytest.param(page, id=page_name(page), marks=[pytest.mark.slow] if runs_commands else [])


PAGES_WITH_SNIPPETS = [_slow_if_it_trains(page) for page in pages() if blocks_for(page.read_text(encoding="utf-8"))]


# ---------------------------------------------------------------------------------------------------
# What some pages' snippets must have made, beyond running.


def _check_use(scope: dict, folder: Path) -> None:
    """Using a trained model: the commands wrote their files; load_run and the exported program
    give the same prediction; the sidecar's keys the page names exist."""
    import torch

    run = folder / "runs" / "mine"
    assert (folder / "pred.csv").is_file()
    assert (run / "model.pt2").is_file() and (run / "model.pt2.json").is_file()
    labels = scope["model"].label_values
    assert scope["values"].shape == (100,) and scope["p"].shape == (100, len(labels))
    assert scope["prediction"].shape == (1,)
    assert float(scope["prediction"][0]) == float(scope["model"].predict(scope["rows"])[0])
    torch.testing.assert_close(scope["program"](torch.tensor(scope["rows"], dtype=torch.float64))[0],
                               scope["prediction"])
    assert scope["model"].feature_names == ["a", "b", "c", "d"]
    # the loader's check names the expected shape and columns where the program's guard does not
    exported = [code for language, code, _ in blocks_for((DOCS / "use.md").read_text(encoding="utf-8"))
                if "torch.export.load" in code]
    with pytest.raises(ValueError, match=r"expected \['N', 4\] \(a, b, c, d\), got \[1, 3\]"):
        three_features = exported[0].replace("rows = [[0.1, -1.2, 0.3, 0.0]]", "rows = [[0.1, 0.2, 0.3]]")
        assert three_features != exported[0]
        exec(compile(three_features, "docs/use.md", "exec"), {})
    side = json.loads((run / "model.pt2.json").read_text())
    keys = re.findall(r"sidecar's\s+`([\w.]+)`", (DOCS / "use.md").read_text(encoding="utf-8"))
    assert {"inputs.feature_names", "label_values", "inputs.shape"} <= set(keys), keys
    for key in keys:
        value = side
        for part in key.split("."):
            assert part in value, key
            value = value[part]


def _check_sklearn(scope: dict, folder: Path) -> None:
    assert scope["ranker"].predict(scope["X"][:3]).shape == (3,)
    assert set(scope["search"].best_params_) == {"solranker__margin"}
    lower, upper = scope["lower"], scope["upper"]  # through the pipeline's steps, in predict's dtype
    assert lower.shape == upper.shape == (100,) and lower.dtype == scope["pipeline"].predict(scope["rows"][:2]).dtype
    assert (lower <= upper).all() and scope["imputing"].predict(scope["holes"][300:]).shape == (100,)


CHECKS = {"use.md": _check_use, "sklearn.md": _check_sklearn}
NEEDS = {"sklearn.md": "sklearn"}  # the optional package a page's snippets import


@pytest.mark.parametrize("page", PAGES_WITH_SNIPPETS)
def test_the_snippets_of_a_page_run_on_their_own(page: Path, tmp_path, monkeypatch, capsys):
    """In a fresh folder, every block the page marks for this file, top to bottom, as written, each
    python block in a namespace of its own."""
    name = page_name(page)
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    monkeypatch.chdir(tmp_path)
    scope = run_blocks(blocks_for(page.read_text(encoding="utf-8")), f"docs/{name}", capsys)
    if name in CHECKS:
        CHECKS[name](scope, tmp_path)


# ---------------------------------------------------------------------------------------------------
# The driver's example commands: each line as written, with options that keep it short.


def write_scores(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = np.clip(np.round(3 * x[:, 0] + x[:, 1] + 10 + rng.normal(size=n)), 2, 18)
    lines = ["a,b,c,d,score"] + [",".join(f"{v:.4f}" for v in row) + f",{label:g}"
                                 for row, label in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")


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
    """Every line of the driver page's example block, in order, in a fresh folder, with the files
    it names made there: each command as written plus options that keep it short (one epoch, one
    seed)."""
    from sol_ext.driver.cli import main
    from sol_ext.driver.data import FASHION_MNIST_DIR

    (block,) = blocks_for((DOCS / "driver.md").read_text(encoding="utf-8"),
                          "test_the_driver_examples_run_as_written")
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
    lines = commands(block[1])
    if any("resnet18" in command for command in lines):
        torchvision = pytest.importorskip("torchvision")
        _image_list(tmp_path / "faces")
        import torch

        torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth")
    for command in lines:
        assert command[0] == "sol-ext", command
        if "fashion-mnist-blur" in command and not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
            continue  # the data are an apt package, not installed here
        short = {"train": ["--epochs", "1", "--quiet", "--no-plots"],
                 "compare": ["--epochs", "1", "--seeds", "0", "--kappas", "0.3", "--noises", "",
                             "--methods", "sol,l1"]}.get(command[1], [])
        if "--resume" in command:
            short = ["--epochs", "2", "--quiet", "--no-plots"]  # one epoch more than the first run
        assert main(command[1:] + short) == 0, (command, capsys.readouterr().err)
    assert (tmp_path / "pred.csv").is_file() and (tmp_path / "model.pt2").is_file()


# ---------------------------------------------------------------------------------------------------
# Hugging Face: the snippet as written, with a tiny model in place of the pretrained one.


def _ratings(count: int, seed: int) -> list[dict]:
    """Rows as a tokenizer gives them, of random token ids whose first token sets the rating 0…4."""
    import torch

    ids = torch.randint(5, 100, (count, 12), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "attention_mask": torch.ones(12, dtype=torch.long),
             "labels": int((row[0] - 5) * 5 // 95)} for row in ids]


@pytest.mark.slow
def test_the_hugging_face_snippet_trains_a_tiny_model(tmp_path, monkeypatch):
    """The page's snippet, with a 2-layer BERT of random weights for the pretrained checkpoint (no
    download) and random token ids for the data: it trains, evaluates and predicts ranks."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    (block,) = blocks_for((DOCS / "hf.md").read_text(encoding="utf-8"),
                          "test_the_hugging_face_snippet_trains_a_tiny_model")
    asked = []

    def tiny_bert(name, *args, **kwargs):
        asked.append(name)
        torch.manual_seed(0)
        return transformers.BertModel(transformers.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=12))

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", tiny_bert)
    monkeypatch.chdir(tmp_path)  # the trainer's output folder
    scope = {"train": _ratings(16, 0), "test": _ratings(8, 1)}
    exec(compile("\n" * (block[2] - 1) + block[1], "docs/hf.md", "exec"), scope)
    assert len(asked) == 1
    ranks = np.asarray(scope["ranks"])
    assert ranks.shape == (8,) and ((0 <= ranks) & (ranks <= 4)).all()


# ---------------------------------------------------------------------------------------------------
# Label issues: the calls of the page on probabilities of a model that is sure of the true rank.


def test_the_label_issues_snippet_runs(capsys):
    """The page's block on its own, where a third of the labels are two ranks off the rank the
    probabilities favour: a mask that finds them, their indices most suspicious first, a quality per
    row."""
    (block,) = blocks_for((DOCS / "label-issues.md").read_text(encoding="utf-8"), "test_the_label_issues_snippet_runs")
    scope: dict = {}
    exec(compile("\n" * (block[2] - 1) + block[1], "docs/label-issues.md", "exec"), scope)
    wrong = np.arange(300) % 3 == 0
    assert scope["mask"].dtype == bool and np.array_equal(scope["mask"], wrong)
    assert sorted(scope["ranked"]) == list(np.flatnonzero(wrong))     # the flagged ones, not every label
    assert scope["quality"].shape == (300,) and scope["quality"][wrong].max() < scope["quality"][~wrong].min()
    assert capsys.readouterr().out.startswith("100 ")


# ---------------------------------------------------------------------------------------------------
# The site as a whole.


def test_every_marker_names_a_test_that_exists():
    """A marker names a test file (and test) that exists and reads the page, over a block of a
    kind a test runs."""
    for page in [README, *pages()]:
        for file, name, language, _, line, _ in marked_blocks(page.read_text(encoding="utf-8")):
            where = f"{page.relative_to(ROOT)}:{line}"
            assert (ROOT / file).is_file(), f"{where}: the marker names {file}, which does not exist"
            assert file == RUN_HERE[1] or f'"{page.name}"' in (ROOT / file).read_text(), \
                f"{where}: {file} does not read {page.name}"
            if name is not None:
                assert re.search(rf"^def {name}\(", (ROOT / file).read_text(), re.M), \
                    f"{where}: {file} has no test {name}"
            assert language in ("python", "bash", "toml"), f"{where}: a marked {language} block"


def test_every_python_block_of_the_site_is_run_by_a_test():
    marked = {(page, line) for page in pages()
              for _, _, _, _, line, _ in marked_blocks(page.read_text(encoding="utf-8"))}
    unmarked = [f"docs/{page_name(page)}:{line}" for page in pages()
                for language, _, line in fenced_blocks(page.read_text(encoding="utf-8"))
                if language == "python" and (page, line) not in marked]
    assert not unmarked, f"python blocks that no test runs (mark them): {unmarked}"


def _paragraphs(text: str) -> set[str]:
    """The paragraphs of prose (three lines or more) of a Markdown text, code blocks left out."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {" ".join(p.split()) for p in re.split(r"\n\s*\n", prose) if p.count("\n") >= 2}


def test_the_readme_and_the_pages_say_each_thing_once():
    """Text lives in one place: no paragraph of the README stands again on a page, nor one page's
    on another (a page shows a part of the README by including it, ``--8<--``)."""
    seen: dict[str, str] = {}
    for source in [README, *pages()]:
        for paragraph in _paragraphs(source.read_text(encoding="utf-8")):
            assert paragraph not in seen, f"{source.relative_to(ROOT)} repeats {seen[paragraph]}: {paragraph[:80]}…"
            seen[paragraph] = str(source.relative_to(ROOT))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (its text lower-cased, punctuation dropped, spaces to -)."""
    text = re.sub(r"`|\*\*", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", prose, re.M)}


def test_the_readme_links_resolve():
    """Each link of the README to one of its headings or to a file, a page's heading included."""
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        assert file.exists(), f"README links to {path}, which does not exist"
        if anchor:
            assert anchor in _anchors(file.read_text(encoding="utf-8")), f"README: no heading #{anchor} in {file.name}"


def test_the_docstrings_sphinx_roles_become_optional_links():
    """docs/hooks.py: a role becomes its code, linked where the site has the target (mkdocs-autorefs
    resolves an optional reference, and leaves it as plain code where there is no entry)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = ("<p>:class:<code>~sol_ext.SOLHead</code>, :meth:<code>SOLHead.update &lt;sol_ext.SOLHead.update&gt;</code>"
            " and :func:<code>sol_ext.order_loss()</code>; <code>:class:</code> alone stays.</p>")
    assert hooks.on_page_content(page) == (
        '<p><autoref identifier="sol_ext.SOLHead" optional><code>SOLHead</code></autoref>, '
        '<autoref identifier="sol_ext.SOLHead.update" optional><code>SOLHead.update</code></autoref> and '
        '<autoref identifier="sol_ext.order_loss" optional><code>sol_ext.order_loss()</code></autoref>; '
        "<code>:class:</code> alone stays.</p>")


def test_the_math_of_a_page_becomes_mathml():
    """docs/hooks.py: what pymdownx.arithmatex keeps of $…$ and $$…$$ is rendered to MathML, so the
    site shows its equations with no script and no network."""
    pytest.importorskip("latex2mathml")
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = ('<p>With <span class="arithmatex">\\(\\sigma^2 &lt; 1\\)</span>:</p>'
            '<div class="arithmatex">\\[\\sum_j P[q, j] = 1\\]</div><p><code>x^2</code></p>')
    rendered = hooks.render_math(page)
    assert "\\(" not in rendered and "\\[" not in rendered
    assert '<span class="arithmatex"><math' in rendered
    assert "<msup><mi>σ</mi><mn>2</mn></msup>" in html.unescape(rendered)
    assert "<mo><</mo>" in html.unescape(rendered)              # the page's &lt; read as the operator
    assert '<div class="arithmatex"><math' in rendered and 'display="block"' in rendered
    assert rendered.endswith("<p><code>x^2</code></p>")        # code stays code


@pytest.mark.slow
def test_the_site_builds_with_no_warning(tmp_path):
    """``mkdocs build --strict``: every page, link, anchor, included part and API entry resolves."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "latex2mathml", "ruff"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"{module} is not installed (pip install .[docs])")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
    check_the_built_site(tmp_path / "site")


def _visible_text(page: str) -> str:
    """A built page's text outside code and rendered math (no tags)."""
    for element in ("pre", "code", "math", "script", "style"):
        page = re.sub(rf"<{element}\b.*?</{element}>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def check_the_built_site(site: Path) -> None:
    """What a reader sees: the math typeset (MathML, no formula left as code or plain text), at
    least three figures whose files are there, the install command and the quickstart on the home
    page, and API entries one per parameter, with wrapped signatures and without torch's hooks."""
    math_page = (site / "math" / "index.html").read_text(encoding="utf-8")
    assert math_page.count("<math") >= 60, math_page.count("<math")
    assert "^2" not in _visible_text(math_page)
    formulas_as_code = [c for c in re.findall(r"<code>(.*?)</code>", math_page, re.S) if re.search(r"\^|sum_", c)]
    assert not formulas_as_code, formulas_as_code[:5]
    assert "\\sum" not in _visible_text(math_page)            # no LaTeX left unrendered
    assert (site / "api" / "loss" / "index.html").read_text(encoding="utf-8").count("<math") >= 3

    figures = set()
    for page in site.rglob("*.html"):
        for source in re.findall(r'<img [^>]*src="([^"]+\.png)"', page.read_text(encoding="utf-8")):
            image = (page.parent / source).resolve()
            assert image.is_file(), (page, source)
            figures.add(image)
    assert len(figures) >= 3, figures
    assert all(image.stat().st_size < 150_000 for image in figures)

    home = html.unescape(re.sub(r"<[^>]+>", "", (site / "index.html").read_text(encoding="utf-8")))
    assert "pip install torch" in home and "sol_ext.SOLHead(" in home and "head.update(" in home

    # signatures wrapped one parameter a line (mkdocstrings formats them with ruff), not one long line
    loss_api = html.unescape(re.sub(r"<[^>]+>", "", (site / "api" / "loss" / "index.html").read_text(encoding="utf-8")))
    assert re.search(r"StochasticOrderLoss\(\n\s+num_ranks: int,\n\s+sigma: float", loss_api)

    head_api = (site / "api" / "head" / "index.html").read_text(encoding="utf-8")
    assert "get_extra_state" not in head_api and "set_extra_state" not in head_api
    for page in site.joinpath("api").rglob("*.html"):
        assert "required" not in _visible_text(page.read_text(encoding="utf-8")), page
    # order_loss_block's labels in an entry of their own, not folded into D's
    ops_api = html.unescape(re.sub(r"<[^>]+>", "", (site / "api" / "ops" / "index.html").read_text(encoding="utf-8")))
    assert re.search(r"\blabels\s*\(\s*Tensor\s*\)\s*–\s*their ranks", ops_api)
