"""The compiled extension, ``sol_ext._C``: loaded once, checked against the installed torch.

Importing it registers the ``torch.ops.sol_ext`` operators (csrc/sol_ext.cpp). A leaf module: it imports
nothing else from sol_ext, so every module that calls the ops can import it first.
"""
from __future__ import annotations

import torch

__all__ = ["cuda_kernels_available"]

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
