"""What imports what: the library (``sol_ext`` outside ``sol_ext/driver/``) imports no module of the
``sol-ext`` program, nor any package but torch and numpy, nor an integration's library; and a trained run
predicts (``sol_ext.driver.load_run``, ``sol-ext predict``) without importing the training loop."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from common import REPO_ROOT, tiny_csv
from sol_ext.driver.cli import main

ROOT = REPO_ROOT
LIBRARY = ROOT / "sol_ext"
PROGRAM = LIBRARY / "driver"
# The training loop: what prediction must not import (the command line still reads the torchrun
# environment, sol_ext.driver.parallel, to refuse running predict under it).
TRAINING_MODULES = ("sol_ext.driver.train", "sol_ext.driver.fit", "sol_ext.refine", "sol_ext.distributed")


def _driver_imports(path: Path, top_level_only: bool) -> list[str]:
    """The driver modules ``path`` imports (at its top level only, or anywhere)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names = [module] + [f"{module}.{a.name}" for a in node.names]
            found += [n for n in names if n.lstrip(".").startswith("driver") or "sol_ext.driver" in n]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("sol_ext.driver")]
    return found


def _library_modules() -> list[Path]:
    return [p for p in sorted(LIBRARY.rglob("*.py")) if PROGRAM not in p.parents]


def test_no_library_module_imports_the_program():
    """The boundary is the package: no module of ``sol_ext`` outside ``sol_ext/driver/`` imports from it."""
    library = _library_modules()
    assert {p.name for p in library} >= {"__init__.py", "ops.py", "loss.py", "head.py", "centroids.py",
                                         "label_issues.py", "metrics.py", "distributed.py", "lightning.py",
                                         "hf.py", "torchmetrics.py", "refine.py", "intervals.py"}
    offending = {str(p.relative_to(ROOT)): _driver_imports(p, top_level_only=False) for p in library}
    assert {name: found for name, found in offending.items() if found} == {}


# What `pip install .` gives is torch and numpy; the program's packages (the `train` extra) and the
# integrations' come only with their extras.
PROGRAM_PACKAGES = ("pyarrow", "matplotlib", "tqdm", "PIL", "tomli_w", "sklearn", "pandas", "polars", "scipy")


def test_the_library_imports_no_package_but_torch_and_numpy():
    modules = sorted(p.stem for p in LIBRARY.glob("*.py")
                     if p.stem not in ("__init__", "lightning", "hf", "torchmetrics"))
    # what torch itself loads when it is there (torch.hub takes tqdm) is torch's, not the library's
    code = ("import sys, numpy, torch\n"
            "before = set(sys.modules)\n"
            "import sol_ext\n"
            f"for name in {modules!r}: __import__('sol_ext.' + name)\n"
            f"print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in {PROGRAM_PACKAGES!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_ast_check_sees_a_driver_import(tmp_path):
    """The check above finds each spelling of an import of the driver."""
    for text in ("from .driver.config import TrainConfig\n", "from .driver import cli\n",
                 "import sol_ext.driver.fit\n", "def f():\n    from sol_ext.driver.model import load_run\n"):
        path = tmp_path / "m.py"
        path.write_text(text)
        assert _driver_imports(path, top_level_only=False), text


def _trained_run(tmp_path) -> Path:
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--output", str(out), "--quiet", "--no-plots",
                 "--epochs", "1", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16",
                 "--sigma", "1"]) == 0
    return out


def _modules_after(code: str, tmp_path) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_load_run_predicts_without_the_training_loop(tmp_path):
    run = _trained_run(tmp_path)
    code = ("import json, sys, torch, sol_ext.driver\n"
            f"model = sol_ext.driver.load_run({str(run)!r})\n"
            "print(model.predict(torch.zeros(3, 2)).shape, file=sys.stderr)\n"
            f"print(json.dumps([m for m in {TRAINING_MODULES!r} if m in sys.modules]))\n")
    assert _modules_after(code, tmp_path) == []


def test_sol_ext_predict_imports_nothing_of_training(tmp_path):
    run = _trained_run(tmp_path)
    code = ("import json, sys\n"
            "from sol_ext.driver.cli import main\n"
            f"assert main(['predict', {str(run)!r}, '--data', {str(tmp_path / 'd.csv')!r}, "
            "'--output', '-']) == 0\n"
            f"print(json.dumps([m for m in {TRAINING_MODULES!r} if m in sys.modules]))\n")
    assert _modules_after(code, tmp_path) == []


def test_no_driver_module_imports_a_private_name_of_another():
    """What one module of the program needs from another has a real name: no ``from X import _name``
    between them (a private module imported as a module is fine)."""
    found = []
    for path in sorted((ROOT / "sol_ext" / "driver").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in private]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


# The integrations' libraries stay optional: `import sol_ext` (and the modules the core uses) loads
# neither Lightning nor transformers; only sol_ext.lightning / sol_ext.hf do.
OPTIONAL = ("lightning", "pytorch_lightning", "transformers", "accelerate")


def test_importing_sol_ext_imports_no_integration_library():
    code = ("import sys, sol_ext, sol_ext.distributed, sol_ext.head, sol_ext.metrics\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
