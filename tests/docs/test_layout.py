"""The tests mirror the package: ``tests/<layer>/test_<name>.py`` is named after a module of sol_ext or a
documented feature, and every module with logic has a test file."""

import ast
from pathlib import Path

from common import REPO_ROOT

PACKAGE = REPO_ROOT / "sol_ext"
# Tests are named after the modules of sol_ext/, sol_ext/driver/ and sol_ext/driver/data/.
MODULE_FOLDERS = (PACKAGE, PACKAGE / "driver", PACKAGE / "driver" / "data")

# Features documented across modules, each tested in test_<feature>.py.
FEATURES = {
    "csrc",  # the C++/CUDA sources against their header (csrc/)
    "cuda",  # the CUDA kernels (docs/performance.md)
    "cpu_capability",  # the CPU kernels per instruction set, chosen at run time (docs/performance.md)
    "mixed_precision",  # half precision and autocast (docs/loop.md)
    "probabilities",  # the noise kernel and ordering probabilities (docs/math.md §2, §5)
    "import_graph",  # no import cycle, no private name across modules
    "layers",  # the library imports nothing of the sol-ext program nor the integrations' libraries
    "own_table",  # a user's own table on the command line (docs/data.md)
    "torchrun",  # sol-ext train on several processes (docs/distributed.md)
    "weight_decay",  # --weight-decay auto (docs/driver.md)
    "docs", "readme", "packaging", "layout",  # the documentation, pip install ., this file
}

# Modules whose tests live in the test file of the module or feature that uses them.
TESTED_IN = {
    "sol_ext/_extension.py": "ops/test_cuda.py",
    "sol_ext/_fake.py": "ops/test_autograd.py",  # opcheck's fake-tensor checks
    "sol_ext/_reduction.py": "ops/test_autograd.py",
    "sol_ext/_rows.py": "ops/test_grouped.py",
    "sol_ext/reference.py": "ops/test_ops.py",  # the oracle the fused ops are held to
    "sol_ext/driver/calibration.py": "driver/test_predict.py",  # a run's stored interval calibration
    "sol_ext/driver/compare.py": "driver/test_cli.py",
    "sol_ext/driver/device.py": "driver/test_cli.py",
    "sol_ext/driver/export.py": "driver/test_predict.py",
    "sol_ext/driver/interrupts.py": "driver/test_cli.py",  # a second Ctrl-C, through the command
    "sol_ext/driver/loader.py": "driver/test_images.py",
    "sol_ext/driver/methods.py": "driver/test_train.py",
    "sol_ext/driver/options.py": "driver/test_config_file.py",
    "sol_ext/driver/parallel.py": "driver/test_torchrun.py",
    "sol_ext/driver/plots.py": "driver/test_outputs.py",
    "sol_ext/driver/prepare.py": "driver/test_train.py",
    "sol_ext/driver/report.py": "driver/test_outputs.py",
    "sol_ext/driver/data/builtin.py": "driver/test_data.py",
    "sol_ext/driver/data/encoding.py": "driver/test_data.py",
    "sol_ext/driver/data/image_files.py": "driver/test_images.py",
    "sol_ext/driver/data/inputs.py": "driver/test_data.py",
    "sol_ext/driver/data/load.py": "driver/test_data.py",
    "sol_ext/driver/data/split.py": "driver/test_data.py",
    "sol_ext/driver/data/tables.py": "driver/test_frames.py",
    "sol_ext/driver/data/texts.py": "driver/test_text.py",
}


def module_names() -> set[str]:
    """Each module's name without a leading underscore (``_dispatch`` is tested in test_dispatch), and the
    packages by their folder's name (sol_ext, data)."""
    names = {folder.name for folder in MODULE_FOLDERS}
    for folder in MODULE_FOLDERS:
        names |= {path.stem.lstrip("_") for path in folder.glob("*.py") if not path.stem.startswith("__")}
    return names


def has_logic(path: Path) -> bool:
    """A module that defines a function or a class (not a shim that re-exports or warns by __getattr__)."""
    return any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name != "__getattr__"
               for node in ast.parse(path.read_text(encoding="utf-8")).body)


def layered_test_files() -> list[Path]:
    return sorted((REPO_ROOT / "tests").rglob("test_*.py"))


def test_each_test_file_is_named_after_a_module_or_a_documented_feature():
    modules = module_names()
    assert not FEATURES & modules, "a feature that is also a module belongs to the module"
    strays = [str(path.relative_to(REPO_ROOT)) for path in layered_test_files()
              if path.stem.removeprefix("test_") not in modules | FEATURES]
    assert not strays, f"named after no module of sol_ext and no feature of FEATURES: {strays}"
    stems = {path.stem.removeprefix("test_") for path in layered_test_files()}
    assert FEATURES <= stems, f"features without a test file: {sorted(FEATURES - stems)}"


def test_test_files_have_unique_names_and_sit_in_a_layer():
    paths = layered_test_files() + sorted((REPO_ROOT / "benchmarks").glob("test_*.py"))
    names = [path.name for path in paths]
    assert len(names) == len(set(names)), "two test files share a name: pytest imports them by name"
    layers = {path.parent.name for path in layered_test_files()}
    assert layers == {"ops", "library", "integrations", "driver", "docs"}


def test_every_module_with_logic_has_a_test_file():
    tested = {path.stem.removeprefix("test_") for path in layered_test_files()}
    untested = []
    for folder in MODULE_FOLDERS:
        for path in sorted(folder.glob("*.py")):
            if path.stem.startswith("__") or not has_logic(path) or path.stem.lstrip("_") in tested:
                continue
            where = TESTED_IN.get(str(path.relative_to(REPO_ROOT)))
            if where is None or not (REPO_ROOT / "tests" / where).is_file():
                untested.append(str(path.relative_to(REPO_ROOT)))
    assert not untested, f"no test file, and no entry in TESTED_IN: {untested}"


def test_tested_in_names_existing_modules_without_their_own_test_file():
    tested = {path.stem.removeprefix("test_") for path in layered_test_files()}
    for module, where in TESTED_IN.items():
        assert (REPO_ROOT / module).is_file(), f"{module} is gone: drop it from TESTED_IN"
        assert Path(module).stem.lstrip("_") not in tested, f"{module} has its own test file now"
        assert (REPO_ROOT / "tests" / where).is_file(), where
