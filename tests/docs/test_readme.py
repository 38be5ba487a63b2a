"""The README's snippet runs as written (the site's snippets: tests/docs/test_docs.py)."""

import re

from common import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
MARK = "<!-- README snippet: tests/docs/test_readme.py runs it -->"


def snippets() -> list[str]:
    """The python blocks right after the marker, in order."""
    return [m.group(1) for m in re.finditer(re.escape(MARK) + r"\n```python\n(.*?)```", README, re.S)]


def test_the_training_loop_snippet_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = snippets()
    scope: dict = {}
    exec(compile(code, "README: SOL in your own training loop", "exec"), scope)
    assert scope["ranks"].shape == (5,) and scope["probabilities"].shape == (5, 10)
    assert (tmp_path / "sol_model.pt").is_file()
