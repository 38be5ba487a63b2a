"""The compiled extension, ``sol_ext._C``: loaded once, checked against the installed torch.

Importing it registers the ``torch.ops.sol_ext`` operators (csrc/sol_ext.cpp) and chooses which build of
the CPU kernels runs (:func:`cpu_capability`). A leaf module: it imports nothing else from sol_ext, so every
module that calls the ops can import it first.
"""
from __future__ import annotations

import torch

__all__ = ["cpu_capability", "cuda_kernels_available"]

try:
    from . import _C  # registers the torch.ops.sol_ext operators
except ImportError as error:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "sol_ext's compiled extension (sol_ext._C) could not be loaded: "
        f"{error}.\nBuild it against the torch in this environment with "
        "`pip install --no-build-isolation -e .` (or without -e). If you are running from the source "
        "folder without an editable install, Python is importing the sources, which have no _C."
    ) from error

if _C.torch_version != torch.__version__:  # pragma: no cover
    raise ImportError(
        f"sol_ext was compiled against torch {_C.torch_version} but torch {torch.__version__} is installed; "
        "C++ extensions are tied to the torch they were built with. Rebuild with "
        "`pip install --no-build-isolation --force-reinstall --no-deps .`"
    )

# Read once at import: torch.compile cannot trace the dispatcher query, but it can read a module constant.
CUDA_KERNELS_BUILT = torch._C._dispatch_has_kernel_for_dispatch_key("sol_ext::order_loss", "CUDA")


def cuda_kernels_available() -> bool:
    """Whether CUDA kernels were compiled into this build (says nothing about a GPU being present)."""
    return CUDA_KERNELS_BUILT


# The CPU kernels' build is chosen here, once: a SOL_EXT_CPU_CAPABILITY that names none, or one this build or
# CPU lacks, fails the import with what to set instead (ValueError).
CPU_CAPABILITY = _C.cpu_capability()


def cpu_capability() -> str:
    """The instruction set the CPU kernels run with: ``"AVX512"``, ``"AVX2"`` or ``"DEFAULT"`` (the
    architecture's baseline), named as :func:`torch.backends.cpu.get_cpu_capability` names them.

    The hot CPU kernels (the order loss, the grouped sum, the dissimilarity's loops outside BLAS) are
    compiled once per capability, and the best this CPU supports runs, chosen at import: the environment
    variable ``SOL_EXT_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``) forces one, else
    ``ATEN_CPU_CAPABILITY`` is honoured as ATen honours it (capped at what the CPU supports). Results are
    bitwise the same for any number of threads on one capability; capabilities differ in rounding only.
    See docs/performance.md.
    """
    return _C.cpu_capability()


def _set_cpu_capability(name: str) -> None:
    """Run the CPU kernels of capability ``name`` (``"default"``, ``"avx2"``, ``"avx512"``, any case) from now
    on, in this process: for tests that hold every capability to the reference in one process. ValueError
    for a name this build or CPU lacks. Not thread-safe with respect to running ops."""
    _C._set_cpu_capability(name)


def _cpu_capability_support() -> list:
    """``(name, built, cpu_supports)`` for each capability: whether this build has its kernels, whether this
    CPU runs them."""
    return [tuple(row) for row in _C._cpu_capability_support()]
