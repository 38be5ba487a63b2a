"""Measure the driver's shape: the Python frames from ``sol_ext.driver.cli.main`` to
``StochasticOrderLoss.forward`` during ``sol-ext train`` (sigma auto), the functions of
``sol_ext/driver/`` longer than 60 lines or with more than 6 parameters besides ``self``, and the
length of ``cli.py``::

    PYTHONPATH=$PWD python scripts/driver_shape.py
"""

from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, MAX_PARAMS = 60, 6


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


def long_functions() -> list[tuple[str, int, int]]:
    """``(file:function, lines, parameters)`` of every driver function over a limit."""
    over = []
    for path in sorted((ROOT / "sol_ext" / "driver").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                params += [p for p in (a.vararg, a.kwarg) if p is not None]
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES or len(params) > MAX_PARAMS:
                    over.append((f"{path.relative_to(ROOT)}:{node.name}", lines, len(params)))
    return over


if __name__ == "__main__":
    frames = frames_to_the_loss()
    print(f"frames from cli.main to the loss: {len(frames) - 1} ({' -> '.join(frames)})")
    over = long_functions()
    print(f"driver functions over {MAX_LINES} lines or {MAX_PARAMS} parameters: {len(over)}")
    for name, lines, params in over:
        print(f"  {name}: {lines} lines, {params} parameters")
    print(f"cli.py: {len((ROOT / 'sol_ext/driver/cli.py').read_text().splitlines())} lines")
