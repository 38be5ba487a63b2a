"""PEP 517 build backend of sol_ext: setuptools, built against the torch of the target environment.

A C++ extension only loads beside the torch it was compiled with, so it must be built against the
torch that is installed where it will run. pip's default isolated build hides that torch: it runs
the build with the target environment's interpreter but drops its site-packages from ``sys.path``.
Listing torch in ``build-system.requires`` would not help either: pip would download another copy
(possibly another version) into a throwaway environment and compile against that.

This backend asks the target interpreter, outside pip's isolation, where its torch is, and puts
that folder at the end of ``sys.path`` (so the build tools pip installed still come first). The
build is then the same as ``pip install --no-build-isolation .``, offline and with no second torch.
Without isolation, or when torch is importable anyway, it changes nothing.

Set ``SOL_EXT_TORCH_SITE`` to the folder that holds the torch to build against, to skip the search
(for example with ``pip install --target`` or ``--prefix``, whose target has no interpreter).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  the PEP 517 hooks

__all__ = _setuptools.__all__

# Run by each candidate interpreter: the folder its torch is imported from, and torch's version
# (read from the package metadata: importing torch would take seconds).
_PROBE = r"""
import importlib.metadata, importlib.util, json, os
spec = importlib.util.find_spec("torch")
site = None if spec is None or spec.origin is None else os.path.dirname(os.path.dirname(spec.origin))
try:
    version = importlib.metadata.version("torch")
except importlib.metadata.PackageNotFoundError:
    version = None
print(json.dumps({"site": site, "version": version}))
"""


def _say(message: str) -> None:
    print(f"[sol_ext build] {message}", file=sys.stderr)


def _candidate_interpreters() -> list[str]:
    """The target environment's interpreter: pip runs the build with it (run without pip's
    isolation it also sees the base installation's packages where the venv was made with
    --system-site-packages). Then the active virtual environment's, for tools that build with an
    interpreter of their own."""
    found = [sys.executable]
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        found.append(os.path.join(venv, "bin", "python"))
    unique = []
    for exe in found:
        if exe and os.path.isfile(exe) and exe not in unique:
            unique.append(exe)
    return unique


def _probe(interpreter: str) -> dict:
    """Where ``interpreter`` imports torch from when run as the user runs it: without pip's
    PYTHONPATH (its isolating sitecustomize) and PYTHONNOUSERSITE."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE",
                                                               "PYTHONHOME")}
    try:
        out = subprocess.run([interpreter, "-c", _PROBE], env=env, capture_output=True, text=True,
                             timeout=120, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"site": None, "version": None}


def locate_torch() -> tuple[str, str] | None:
    """``(folder holding torch, torch version)`` of the target environment, or None."""
    given = os.environ.get("SOL_EXT_TORCH_SITE")
    if given:
        if not os.path.isfile(os.path.join(given, "torch", "__init__.py")):
            raise RuntimeError(f"SOL_EXT_TORCH_SITE={given!r} holds no torch package "
                               f"(expected {os.path.join(given, 'torch', '__init__.py')}).")
        return given, "(version not checked)"
    for interpreter in _candidate_interpreters():
        found = _probe(interpreter)
        if found["site"]:
            return found["site"], found["version"] or "(unknown version)"
    return None


def _use_target_torch() -> None:
    if importlib.util.find_spec("torch") is not None and not os.environ.get("SOL_EXT_TORCH_SITE"):
        return  # --no-build-isolation, or a torch put in the build environment on purpose
    found = locate_torch()
    if found is None:
        raise RuntimeError(
            "sol_ext is compiled against the torch installed where it will run, and there is none "
            f"for {sys.executable}. Install torch first (pip install torch), then install sol_ext.")
    site, version = found
    if site not in sys.path:
        sys.path.append(site)  # last: setup.py imports torch here, the build tools stay pip's
    _say(f"building against torch {version} from {site}")


_use_target_torch()
