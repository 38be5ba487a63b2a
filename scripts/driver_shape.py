"""Measure the driver's shape: the Python frames from ``sol_ext.driver.cli.main`` to
``StochasticOrderLoss.forward`` during ``sol-ext train`` (sigma auto), the functions of
``sol_ext/driver/`` longer than 60 lines or with more than 6 parameters besides ``self``, and the
length of ``cli.py``. The loaders users call by keyword (``load_table(path, label_column=...,
step=...)``) keep their keyword signatures as thin fronts that build the parameter objects
(``TableRead``, ``LabelSpec``, ``DatasetIdentity``) the code behind them takes, as does
``add_label_noise(ranks, n, noise=..., kappa=...)``: those are listed apart, and still held to 60
lines::

    PYTHONPATH=$PWD python scripts/driver_shape.py
"""

from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, MAX_PARAMS = 60, 6
# Public loaders whose long keyword signature is their API: each builds parameter objects and hands on.
KEYWORD_FRONTS = {
    "sol_ext/driver/data/tables.py:load_table",
    "sol_ext/driver/data/tables.py:load_npz",
    "sol_ext/driver/data/images.py:load_image_folder",
    "sol_ext/driver/data/builtin.py:load_fashion_mnist_degradation",
    "sol_ext/driver/synthetic_noise.py:add_label_noise",
}


def frames_to_the_loss() -> list[str]:
    """The frames between cli.main and StochasticOrderLoss.forward (both included), in the
    driver's and the library's files (torch's own frames, such as Module.__call__, left out)."""
    import sol_ext.loss
    from sol_ext.driver.cli import main

    found: list[str] = []
    forward = sol_ext.loss.StochasticOrderLoss.forward

    def spy(self, *args, **kwargs):
        if not found:
            frame = sys._getframe(1)
            while frame is not None:
                name = frame.f_code.co_filename
                if "/sol_ext/" in name and "/torch/" not in name:
                    found.append(f"{Path(name).name}:{frame.f_code.co_name}")
                if frame.f_code.co_name == "main" and name.endswith("cli.py"):
                    break
                frame = frame.f_back
            found.reverse()
            found.append("loss.py:forward")
        return forward(self, *args, **kwargs)

    sol_ext.loss.StochasticOrderLoss.forward = spy
    with tempfile.TemporaryDirectory() as tmp:
        main(["train", "--epochs", "1", "--quiet", "--no-plots", "--output", f"{tmp}/run"])
    sol_ext.loss.StochasticOrderLoss.forward = forward
    return found


def long_functions(fronts: bool = False) -> list[tuple[str, int, int]]:
    """``(file:function, lines, parameters)`` of every driver function over a limit; with ``fronts``,
    those of ``KEYWORD_FRONTS`` over the parameter limit only (a front over 60 lines counts as long)."""
    over = []
    for path in sorted((ROOT / "sol_ext" / "driver").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                params += [p for p in (a.vararg, a.kwarg) if p is not None]
                lines = node.end_lineno - node.lineno + 1
                name = f"{path.relative_to(ROOT)}:{node.name}"
                is_front = name in KEYWORD_FRONTS and lines <= MAX_LINES
                if (lines > MAX_LINES or len(params) > MAX_PARAMS) and is_front == fronts:
                    over.append((name, lines, len(params)))
    return over


if __name__ == "__main__":
    frames = frames_to_the_loss()
    print(f"frames from cli.main to the loss: {len(frames) - 1} ({' -> '.join(frames)})")
    over = long_functions()
    print(f"driver functions over {MAX_LINES} lines or {MAX_PARAMS} parameters: {len(over)}")
    for name, lines, params in over:
        print(f"  {name}: {lines} lines, {params} parameters")
    fronts = long_functions(fronts=True)
    print(f"public keyword fronts over {MAX_PARAMS} parameters (the users' keyword API): {len(fronts)}")
    for name, lines, params in fronts:
        print(f"  {name}: {lines} lines, {params} parameters")
    print(f"cli.py: {len((ROOT / 'sol_ext/driver/cli.py').read_text().splitlines())} lines")
