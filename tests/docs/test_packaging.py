"""`pip install .` builds against the torch of the target environment: the in-tree build backend
finds it from inside pip's isolated build, where the target's site-packages are hidden.

The full `pip install .` into a fresh environment (a few minutes of compiling) runs in `.ci/run`;
here pip's isolation is imitated the way pip sets it up, which takes seconds.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common import REPO_ROOT

ROOT = REPO_ROOT

# What pip's isolated build does (pip/_internal/build_env.py): PYTHONNOUSERSITE=1, and a
# sitecustomize.py on PYTHONPATH that drops the environment's site-packages from sys.path and adds
# the build environment, where pip installed build-system.requires (setuptools, wheel).
ISOLATING_SITECUSTOMIZE = textwrap.dedent("""
    import site, sys
    hidden = set(site.getsitepackages())
    sys.path[:] = [p for p in sys.path if p not in hidden]
    sys.path.append({build_env!r})
""")


def _run_isolated(tmp_path, code):
    import setuptools

    build_env = tmp_path / "build-env"  # setuptools alone, as pip's build environment has it
    build_env.mkdir(exist_ok=True)
    for name in ("setuptools", "pkg_resources", "_distutils_hack"):
        source = Path(setuptools.__file__).parents[1] / name
        if source.exists() and not (build_env / name).exists():
            (build_env / name).symlink_to(source)
    site_dir = tmp_path / "pip-site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / "sitecustomize.py").write_text(
        ISOLATING_SITECUSTOMIZE.format(build_env=str(build_env)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", PYTHONPATH=str(site_dir), SOL_EXT_TORCH_SITE="")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_isolated_build_finds_the_target_environments_torch(tmp_path):
    import torch

    hidden = _run_isolated(tmp_path, "import importlib.util; "
                                     "print(importlib.util.find_spec('torch') is None)")
    assert hidden.returncode == 0 and hidden.stdout.strip() == "True", hidden.stderr  # as in pip

    probe = _run_isolated(tmp_path, "import sys; sys.path.insert(0, 'build_backend'); "
                                    "import sol_ext_backend, torch; print(torch.__file__); "
                                    "print(torch.__version__)")
    assert probe.returncode == 0, probe.stderr
    found, version = probe.stdout.split()
    assert Path(found).resolve() == Path(torch.__file__).resolve() and version == torch.__version__
    assert f"building against torch {torch.__version__.split('+')[0]}" in probe.stderr


def _backend():
    sys.path.insert(0, str(ROOT / "build_backend"))
    try:
        import sol_ext_backend
    finally:
        sys.path.pop(0)
    return sol_ext_backend


def test_build_without_torch_in_the_target_says_to_install_it(tmp_path, monkeypatch):
    """A target environment without torch: the build stops saying what to do; it does not fetch
    a torch of its own."""
    import torch

    backend = _backend()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    bare = str(venv / "bin" / "python")
    monkeypatch.delenv("SOL_EXT_TORCH_SITE", raising=False)
    if backend._probe(bare)["site"] is not None:
        pytest.skip("the base Python has torch, so a new environment sees it")
    assert Path(backend._probe(sys.executable)["site"]) == Path(torch.__file__).parents[1]

    monkeypatch.setattr(backend, "_candidate_interpreters", lambda: [bare])
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="Install torch first"):
        backend._use_target_torch()


def test_pyproject_uses_the_in_tree_backend():
    tomllib = pytest.importorskip("tomllib")
    system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert system["build-backend"] == "sol_ext_backend"
    assert system["backend-path"] == ["build_backend"]
    assert not any(r.split("=")[0].split(">")[0].strip() == "torch" for r in system["requires"])
    assert (ROOT / "build_backend" / "sol_ext_backend.py").is_file()


def test_py_typed_is_shipped():
    """The package ships its type hints (PEP 561): ``py.typed`` in the wheel and the sdist."""
    assert (ROOT / "sol_ext" / "py.typed").is_file()
    setup = ast.parse((ROOT / "setup.py").read_text())
    package_data = next(k.value for node in ast.walk(setup) if isinstance(node, ast.Call)
                        for k in node.keywords if k.arg == "package_data")
    assert "py.typed" in ast.literal_eval(package_data)["sol_ext"]
    assert "include sol_ext/py.typed" in (ROOT / "MANIFEST.in").read_text().splitlines()


def _build_decision(**switches) -> str:
    """What setup.py prints it decided about the CUDA kernels, under the given environment switches."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SOL_EXT_FORCE_CUDA", "SOL_EXT_CPU_ONLY", "TORCH_CUDA_ARCH_LIST")}
    proc = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env={**env, **switches},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return "\n".join(line for line in proc.stderr.splitlines() if "CUDA" in line)


def test_cuda_kernels_are_built_where_a_gpu_can_run_them_or_when_forced():
    """As torchvision: no GPU visible, no CUDA kernels (minutes of compiling saved) unless forced; forced,
    they are built for the A100 and H100/H200 architectures unless TORCH_CUDA_ARCH_LIST says others."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the kernels are built by default")
    default = _build_decision()
    assert "CUDA kernels: off" in default and "SOL_EXT_FORCE_CUDA=1" in default, default
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None or CUDA_HOME is None:
        return  # without a CUDA build of torch and a toolkit, forcing fails (and says why)
    forced = _build_decision(SOL_EXT_FORCE_CUDA="1")
    assert "CUDA kernels: on (SOL_EXT_FORCE_CUDA=1)" in forced and "CUDA architectures: 8.0;9.0" in forced, forced
    chosen = _build_decision(SOL_EXT_FORCE_CUDA="1", TORCH_CUDA_ARCH_LIST="9.0")
    assert "CUDA architectures: 9.0" in chosen, chosen
    assert "CUDA kernels: off (SOL_EXT_CPU_ONLY=1)" in _build_decision(SOL_EXT_CPU_ONLY="1")
